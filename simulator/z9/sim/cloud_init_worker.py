"""Debian's ``cloud-init`` CLI, kept running: run by cloud-init's own interpreter (the ``#!`` of
``/usr/bin/cloud-init``, with ``-I``), never imported by z9 (it imports nothing of z9).

It loads the ``console_scripts`` entry point of the installed cloud-init distribution — what the
``/usr/bin/cloud-init`` wrapper loads — and writes ``{"ready": true}``. Then each line on stdin is a
JSON array of arguments (``["schema", "--config-file", "F"]``); for each it runs what
``/usr/bin/cloud-init ARGS`` runs, ``sys.exit(main())`` with ``argv[0]`` ``cloud-init``, and writes
one JSON line ``{"rc": N, "stdout": B64, "stderr": B64}``: the bytes the CLI would write (stdout
UTF-8 strict, stderr UTF-8 ``backslashreplace``, as Python sets them up under ``LANG=C.UTF-8``), and
``sys.exit``'s rules for the code (None is 0, a text is printed to stderr and is 1). An exception
cloud-init lets out is not answered (``{"crashed": true}``): its traceback names this file, not
the CLI's, so the caller runs the CLI itself for that input. A new ``cloud-init`` process per check
spent about 0.3 s of CPU on its imports alone, 415 times per run of the test suite
(tests/sim/test_sim_cloud_init_worker.py compares the answers with the CLI's). EOF of stdin ends it
(its parent, the simulator, is gone).
"""
import base64
import contextlib
import io
import json
import sys
from importlib.metadata import distribution

# The CLI calls main() from the wrapper's <module>; here <module> → serve → run → main: two frames
# deeper, so recursion-limited input (deeply nested YAML) is cut off where the CLI cuts it off.
sys.setrecursionlimit(sys.getrecursionlimit() + 2)


def entry_point():
    """``cloud-init``'s console script, as the ``/usr/bin/cloud-init`` wrapper loads it."""
    ep = next(e for e in distribution("cloud-init").entry_points
              if e.group == "console_scripts" and e.name == "cloud-init")
    return ep.load()


def run(main, args):
    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, "utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_bytes, "utf-8", errors="backslashreplace", write_through=True)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = ["cloud-init", *args]
        try:
            code = main(["cloud-init", *args])
        except SystemExit as e:
            code = e.code
        except BaseException:  # the CLI would print a traceback of its own frames: not ours to imitate
            return {"crashed": True}
        if code is None:
            rc = 0
        elif isinstance(code, int):
            rc = code
        else:
            print(code, file=sys.stderr)
            rc = 1
        out.flush()
        err.flush()
    return {"rc": rc, "stdout": base64.b64encode(out_bytes.getvalue()).decode(),
            "stderr": base64.b64encode(err_bytes.getvalue()).decode()}


def serve():
    answer = sys.stdout
    sys.stdout = sys.stderr  # whatever cloud-init prints outside a check (a signal handler's message) stays off the answers
    main = entry_point()
    answer.write(json.dumps({"ready": True}) + "\n")
    answer.flush()
    for line in sys.stdin:
        if line.strip():
            answer.write(json.dumps(run(main, json.loads(line))) + "\n")
            answer.flush()


if __name__ == "__main__":
    serve()
