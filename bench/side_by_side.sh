#!/usr/bin/env bash
# z9 beside graphile-worker on one PostgreSQL, rounds interleaved (issue 14), with the physical
# limits measured in the same run: pgbench's two-commit drain ceiling and pg_test_fsync.
#
#   bench/side_by_side.sh [ROUNDS=5] [N=20000]
#
# Per round (order alternating: z9 first in odd rounds, graphile-worker first in even ones):
#   z9              bench/run.py -w W3 --rounds 1 --n N --concurrency 1,4,16   (its own database)
#   graphile-worker peer_graphile.mjs --workloads drain --n N --concurrency 1,4,16
# then once: pgbench drain ceiling (claim + complete, 2 commits per job, on N pre-filled rows,
# -M prepared, C = 1, 4, 16: ../shared/bench/peers/pgbench_claim.sql), and pg_test_fsync on the
# data directory's file system. Prints the JSON lines of every run, then a summary: per C the
# median of the per-round ratios z9 / graphile-worker, z9 / pgbench ceiling, and the ceiling's
# group-commit gain at 4 and 16 over 1.
#
# Setup, once, outside the repository (the peers' README: ../shared/bench/peers/README.md):
#   PEERBENCH=/some/scratch
#   mkdir -p $PEERBENCH/node22 $PEERBENCH/node
#   (cd $PEERBENCH/node22 && npm init -y && npm install node@22)   # graphile-worker 0.18 needs Node >= 22.18
#   (cd $PEERBENCH/node && npm init -y && npm install graphile-worker@0.18.0 pg@8.23.1)
# Environment:
#   PEERBENCH   that scratch folder (required; results go to $PEERBENCH/results/side_by_side-<time>.jsonl)
#   PGURL       admin URL of the cluster (default postgresql://postgres@127.0.0.1:5432); z9 makes
#               z9_bench_* databases, graphile-worker uses bench_graphile, pgbench z9_sbs_pgbench
#   PEERS       the peers' folder (default: ../shared/bench/peers from the repository)
#   FSYNC_S     seconds per pg_test_fsync test (default 2)
#   SKIP_PGBENCH=1 / SKIP_FSYNC=1 to leave those out; KEEP_DBS=1 keeps graphile-worker's database
# Run it on a quiet machine: every figure is printed with the 1-minute load average.
set -euo pipefail
ROUNDS=${1:-5}
N=${2:-20000}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
: "${PEERBENCH:?set PEERBENCH to the scratch folder holding node22/ and node/ (see the header)}"
PGURL=${PGURL:-postgresql://postgres@127.0.0.1:5432}
PEERS=${PEERS:-$(cd "$REPO/../shared/bench/peers" 2>/dev/null && pwd || echo /work/shared/bench/peers)}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
NODE=${NODE:-$PEERBENCH/node22/node_modules/node/bin/node}
PY=${PY:-$REPO/.venv/bin/python}
FSYNC_S=${FSYNC_S:-2}
mkdir -p "$PEERBENCH/results"
OUT=$PEERBENCH/results/side_by_side-$(date -u +%Y%m%dT%H%M%SZ).jsonl
: > "$OUT"
log() { echo "$*" >&2; }

# graphile-worker's harness imports 'graphile-worker' and 'pg': run a copy beside node_modules
RUNDIR=$PEERBENCH/sbs
mkdir -p "$RUNDIR"
cp "$PEERS/peer_graphile.mjs" "$RUNDIR/"
ln -sfn "$PEERBENCH/node/node_modules" "$RUNDIR/node_modules"
GDSN="$PGURL/bench_graphile"
log "graphile-worker: setting up $GDSN"
"$NODE" "$RUNDIR/peer_graphile.mjs" --setup --dsn "$GDSN" >&2

z9_round() {
  (cd "$REPO" && "$PY" bench/run.py -w W3 --rounds 1 --n "$N" --concurrency 1,4,16 --dsn "$PGURL/postgres") \
    | python3 -c '
import json, sys
for l in sys.stdin:
    if not l.startswith("{"): continue
    d = json.loads(l)
    if d.get("workload") == "drain" and d.get("run") == 1:
        d["run"] = int(sys.argv[1]); d["lib"] = "z9"; print(json.dumps(d), flush=True)' "$1" | tee -a "$OUT"
}
graphile_round() {
  (cd "$RUNDIR" && "$NODE" peer_graphile.mjs --dsn "$GDSN" --workloads drain --n "$N" --concurrency 1,4,16 --run "$1") \
    | grep '"workload":"drain"' | tee -a "$OUT"
}
for r in $(seq 1 "$ROUNDS"); do
  log "round $r of $ROUNDS (load1 $(cut -d' ' -f1 /proc/loadavg))"
  if (( r % 2 )); then z9_round "$r"; graphile_round "$r"; else graphile_round "$r"; z9_round "$r"; fi
done

if [ -z "${SKIP_PGBENCH:-}" ]; then
  PDB=z9_sbs_pgbench
  psql "$PGURL/postgres" -qtAc "SELECT 1 FROM pg_database WHERE datname = '$PDB'" | grep -q 1 \
    || psql "$PGURL/postgres" -qc "CREATE DATABASE $PDB"
  psql "$PGURL/$PDB" -q -f "$PEERS/pgbench_job_schema.sql" 2>/dev/null
  for c in 1 4 16; do
    j=$(( c < 2 ? 1 : 2 ))
    psql "$PGURL/$PDB" -q -c "TRUNCATE pgb_jobs RESTART IDENTITY" \
      -c "INSERT INTO pgb_jobs (payload, run_after) SELECT '{}'::jsonb, now() FROM generate_series(1, $N)" \
      -c "VACUUM ANALYZE pgb_jobs" -c "CHECKPOINT"
    f=$(mktemp)
    "$PGBIN/pgbench" -n -M prepared -f "$PEERS/pgbench_claim.sql" -c $c -j $j -t $(( N / c )) "$PGURL/$PDB" > "$f" 2>&1
    tps=$(grep -oP 'tps = \K[0-9.]+' "$f" | head -1)
    echo "{\"lib\":\"pgbench\",\"workload\":\"drain\",\"concurrency\":$c,\"n\":$N,\"jobs_per_s\":${tps:-null},\"protocol\":\"prepared\",\"commits_per_job\":2,\"load1\":$(cut -d' ' -f1 /proc/loadavg),\"at\":\"$(date -u +%FT%TZ)\"}" | tee -a "$OUT"
    rm -f "$f"
  done
  psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $PDB"
fi

if [ -z "${SKIP_FSYNC:-}" ]; then
  DATADIR=$(psql "$PGURL/postgres" -qtAc "SHOW data_directory" 2>/dev/null || true)
  DIR=$(dirname "${DATADIR:-/tmp/x}")
  [ -w "$DIR" ] || DIR=/tmp
  F=$DIR/z9_pg_test_fsync.$$
  "$PGBIN/pg_test_fsync" -s "$FSYNC_S" -f "$F" > "$PEERBENCH/results/pg_test_fsync.txt" 2>&1 || true
  rm -f "$F"
  python3 - "$PEERBENCH/results/pg_test_fsync.txt" "$DIR" <<'EOF' | tee -a "$OUT"
import json, re, sys
text = open(sys.argv[1]).read()
ops = {}
section = ""
for line in text.splitlines():
    if line.strip().startswith("Compare file sync methods using one 8kB write"): section = "one_8k"
    elif line.strip().startswith("Compare file sync methods using two 8kB writes"): section = "two_8k"
    elif not line.startswith("        "): pass
    m = re.match(r"\s+(\S+)\s+([0-9.]+) ops/sec\s+([0-9]+) usecs/op", line)
    if m and section:
        ops.setdefault(section, {})[m.group(1)] = float(m.group(2))
fd = ops.get("one_8k", {}).get("fdatasync")
print(json.dumps({"lib": "pg_test_fsync", "workload": "fsync", "dir": sys.argv[2], "one_8k_ops_per_s": ops.get("one_8k"),
                  "fdatasync_ops_per_s": fd, "fdatasync_us": round(1e6 / fd, 1) if fd else None}))
EOF
fi

[ -n "${KEEP_DBS:-}" ] || psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS bench_graphile WITH (FORCE)"

python3 - "$OUT" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def med(xs): return round(statistics.median(xs), 3) if xs else None
print("\nsummary (medians over rounds; ratios per round, then their median)")
pgb = {l["concurrency"]: l["jobs_per_s"] for l in lines if l["lib"] == "pgbench" and l.get("jobs_per_s")}
for c in (1, 4, 16):
    z = {l["run"]: l for l in lines if l["lib"] == "z9" and l["concurrency"] == c}
    g = {l["run"]: l for l in lines if l["lib"] == "graphile-worker" and l["concurrency"] == c and l.get("status") == "ok"}
    both = sorted(set(z) & set(g))
    ratios = [z[r]["jobs_per_s"] / g[r]["jobs_per_s"] for r in both]
    zj = med([z[r]["jobs_per_s"] for r in z]); gj = med([g[r]["jobs_per_s"] for r in g])
    out = {"summary": "drain", "concurrency": c, "rounds": len(both), "z9_jobs_per_s": zj, "graphile_jobs_per_s": gj,
           "z9_to_graphile": med(ratios), "ratios": [round(x, 3) for x in ratios],
           "z9_round_trips_per_job": med([z[r]["round_trips_per_job"] for r in z if z[r].get("round_trips_per_job") is not None]),
           "z9_commits_per_job": med([z[r]["commits_per_job"] for r in z if z[r].get("commits_per_job") is not None]),
           "z9_cpu_us_per_job": med([z[r]["client_cpu_us_per_job"] for r in z]),
           "graphile_cpu_us_per_job": med([g[r]["client_cpu_us_per_job"] for r in g]),
           "load1": [max(z[r].get("load1", 0), g[r].get("loadavg1", 0)) for r in both]}
    if c in pgb:
        out["pgbench_ceiling_jobs_per_s"] = pgb[c]
        out["z9_to_ceiling"] = round(zj / pgb[c], 3) if zj else None
        out["graphile_to_ceiling"] = round(gj / pgb[c], 3) if gj else None
        if 1 in pgb:
            out["ceiling_group_commit_gain"] = round(pgb[c] / pgb[1], 2)
    print(json.dumps(out))
for l in lines:
    if l["lib"] == "pg_test_fsync":
        print(json.dumps({"summary": "fsync", "fdatasync_ops_per_s": l["fdatasync_ops_per_s"], "fdatasync_us": l["fdatasync_us"]}))
print("raw lines:", sys.argv[1])
EOF
