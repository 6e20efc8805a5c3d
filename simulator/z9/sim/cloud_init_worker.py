"""Debian's ``cloud-init`` CLI, kept running: run by cloud-init's own interpreter (the ``#!`` of
``/usr/bin/cloud-init``), never imported by z9 (it imports nothing of z9).

Each line on stdin is a JSON array of arguments (``["schema", "--config-file", "F"]``); for each,
it runs what ``/usr/bin/cloud-init ARGS`` runs — the ``console_scripts`` entry point of the
installed cloud-init distribution, ``sys.exit(main())`` with ``argv[0]`` ``cloud-init`` — and
writes one JSON line ``{"rc": N, "stdout": "...", "stderr": "..."}`` (``sys.exit``'s rules for the
code: None is 0, a text is printed to stderr and is 1). A new ``cloud-init`` process per check
spent about 0.3 s of CPU on its imports alone, 415 times per run of the test suite; the verdicts
and texts are the same (tests/sim/test_sim_cloud_init_worker.py compares them with the CLI's).
EOF-of-stdin ends it (its parent, the simulator, is gone).
"""
import contextlib
import io
import json
import sys
from importlib.metadata import distribution


def entry_point():
    """``cloud-init``'s console script, as the ``/usr/bin/cloud-init`` wrapper loads it."""
    ep = next(e for e in distribution("cloud-init").entry_points
              if e.group == "console_scripts" and e.name == "cloud-init")
    return ep.load()


def run(main, args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        argv = ["cloud-init", *args]
        sys.argv = list(argv)
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except Exception as e:  # what the interpreter would print before exiting 1
            import traceback

            traceback.print_exception(e)
            code = 1
        if code is None:
            rc = 0
        elif isinstance(code, int):
            rc = code
        else:
            print(code, file=sys.stderr)
            rc = 1
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def serve():
    main = entry_point()
    stdout = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        stdout.write(json.dumps(run(main, json.loads(line))) + "\n")
        stdout.flush()


if __name__ == "__main__":
    serve()
