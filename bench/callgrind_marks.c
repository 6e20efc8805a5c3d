/* Callgrind's client requests for bench/executor_child.py (Z9_BENCH_CALLGRIND): instructions are
 * counted from the first no-op job's handler (noop.observe) to the executor's stop, so the drain's
 * instructions per job leave out start-up and imports. Built at run time by executor_child.py
 * (cc -shared -fPIC); needs valgrind's headers (Debian: valgrind). */
#include <valgrind/callgrind.h>

void z9_cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void z9_cg_stop(void) { CALLGRIND_DUMP_STATS_AT("z9-drain"); CALLGRIND_STOP_INSTRUMENTATION; }
