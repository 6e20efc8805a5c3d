"""The warm cloud-init (z9.sim.cloud_init_worker) answers as the CLI: for every kind of user-data the
guests are given — valid, a schema error, a YAML error, deprecated keys, not a mapping, a
hostile text, a lone surrogate, input that makes cloud-init raise, nesting at the recursion limit —
the exit code and the bytes of stdout and stderr are those of a new ``cloud-init schema
--config-file F`` process, and the simulator's verdict is the same both ways. A worker that died
is replaced, a script that is not cloud-init's wrapper is run as it is, a process with high file
descriptors still gets answers, and no more than KEEP idle workers are kept."""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from z9.sim import guest
from z9.sim.guest import _WarmCloudInit, schema_check

USER_DATA = {
    "valid": b"#cloud-config\nhostname: web-1\nssh_authorized_keys: ['ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI x@y']\n",
    "schema_error": b"#cloud-config\nhostname: 5\nruncmd: 7\n",
    "yaml_error": b"#cloud-config\nfoo: [\n",
    "deprecated": b"#cloud-config\nuser: admin\napt_update: true\n",
    "not_a_mapping": b"#cloud-config\n- a\n- b\n",
    "unknown_key": b"#cloud-config\nno_such_module_key: 1\n",
    "hostile": b"#cloud-config\nwrite_files:\n- path: /etc/x\n  content: \"\\u0000\\u202e\"\n  permissions: 'rwx'\n",
    "empty": b"#cloud-config\n",
    "invalid_utf8": b"#cloud-config\nhostname: \xff\xfe\n",
    # a lone surrogate in a key: the CLI's stderr writes it backslash-escaped
    "surrogate": b'#cloud-config\napt:\n  sources:\n    "\\udcff":\n      keyid: 5\n',
    # cloud-init raises (Python's int-to-str digit limit): the traceback is the CLI's own
    "raises": b"#cloud-config\nhostname: " + b"9" * 5000 + b"\n",
}


@pytest.fixture
def binary(cloud_init_tool: str) -> str:
    return cloud_init_tool


def _cli(binary: str, args: list[str]) -> tuple[int, bytes, bytes]:
    r = subprocess.run([binary, *args], capture_output=True, timeout=60, env={**os.environ, "LANG": "C.UTF-8"})
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("name", sorted(set(USER_DATA) - {"raises"}))
def test_the_warm_worker_answers_as_the_cli(binary: str, tmp_path: Path, name: str) -> None:
    f = tmp_path / f"{name}.user-data"
    f.write_bytes(USER_DATA[name])
    args = ["schema", "--config-file", str(f)]
    assert _WarmCloudInit().run(binary, args, timeout_s=60) == _cli(binary, args)


def test_input_that_makes_cloud_init_raise_is_left_to_the_cli(binary: str, tmp_path: Path) -> None:
    f = tmp_path / "raises.user-data"
    f.write_bytes(USER_DATA["raises"])
    warm = _WarmCloudInit()
    assert warm.run(binary, ["schema", "--config-file", str(f)], 60) is None  # not answered: the CLI runs it
    assert not warm._idle  # the worker cloud-init raised in is not reused
    rc, _, err = _cli(binary, ["schema", "--config-file", str(f)])
    assert rc == 1 and b"/usr/bin/cloud-init" in err and b"cloud_init_worker" not in err


def test_nesting_at_the_recursion_limit_is_cut_off_where_the_cli_cuts_it_off(binary: str, tmp_path: Path) -> None:
    def nested(n: int) -> list[str]:
        f = tmp_path / f"deep-{n}.user-data"
        f.write_bytes(b"#cloud-config\nruncmd: " + b"[" * n + b"]" * n + b"\n")
        return ["schema", "--config-file", str(f)]

    lo, hi = 300, 800  # the CLI's limit, by bisection: lo is answered, hi hits "maximum recursion depth" (491 here)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b"recursion" in _cli(binary, nested(mid))[2]:
            hi = mid
        else:
            lo = mid
    warm = _WarmCloudInit()
    assert b"recursion" in _cli(binary, nested(hi))[2] and b"recursion" not in _cli(binary, nested(lo))[2]
    for n in (lo - 1, lo, hi, hi + 1):
        assert warm.run(binary, nested(n), 60) in (_cli(binary, nested(n)), None), n


def test_the_verdicts_are_the_same_with_and_without_the_worker(binary: str, monkeypatch: pytest.MonkeyPatch) -> None:
    warm = {}
    for name, data in USER_DATA.items():
        guest._SCHEMA_CACHE.pop(hashlib.sha256(data).hexdigest(), None)
        warm[name] = schema_check(data)
    monkeypatch.setattr(guest._WARM_CLOUD_INIT, "run", lambda *a, **k: None)  # the CLI, a process per check
    monkeypatch.setattr(guest, "_SCHEMA_CACHE", {})
    cold = {name: schema_check(data) for name, data in USER_DATA.items()}
    assert warm == cold
    assert warm["valid"] == ("valid", "") and warm["schema_error"][0] == "invalid"
    assert "not valid yaml" in warm["yaml_error"][1]
    for verdict in warm.values():
        verdict[1].encode("utf-8")  # no lone surrogate reaches a verdict (it is stored and served as JSON)


def test_a_worker_that_died_is_replaced(binary: str, tmp_path: Path) -> None:
    f = tmp_path / "u.user-data"
    f.write_bytes(USER_DATA["valid"])
    warm = _WarmCloudInit()
    assert warm.run(binary, ["schema", "--config-file", str(f)], 60)[0] == 0
    (proc,) = warm._idle
    proc.kill()
    proc.wait()
    assert warm.run(binary, ["schema", "--config-file", str(f)], 60)[0] == 0
    (fresh,) = warm._idle
    assert fresh is not proc and fresh.poll() is None


def test_at_most_keep_idle_workers_stay(binary: str, tmp_path: Path) -> None:
    f = tmp_path / "u.user-data"
    f.write_bytes(USER_DATA["schema_error"])
    warm = _WarmCloudInit()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: warm.run(binary, ["schema", "--config-file", str(f)], 60), range(12)))
    assert {a[0] for a in answers} == {1}
    assert 1 <= len(warm._idle) <= _WarmCloudInit.KEEP


def test_a_process_with_high_file_descriptors_still_gets_answers(binary: str, tmp_path: Path) -> None:
    f = tmp_path / "u.user-data"
    f.write_bytes(USER_DATA["schema_error"])
    held = []
    try:
        while not held or held[-1] < 1100:  # select() refuses a descriptor of 1024 or more
            held.append(os.open(os.devnull, os.O_RDONLY))
        args = ["schema", "--config-file", str(f)]
        assert _WarmCloudInit().run(binary, args, 60) == _cli(binary, args)
    finally:
        for fd in held:
            os.close(fd)


def test_a_script_that_is_not_cloud_inits_wrapper_is_run_as_it_is(binary: str, tmp_path: Path) -> None:
    python = _WarmCloudInit.interpreter(binary)
    assert python is not None  # Debian's /usr/bin/cloud-init is the console-script wrapper
    fake = tmp_path / "cloud-init"
    fake.write_text(f"#!{python}\nimport sys\nprint('fake')\nsys.exit(3)\n")
    fake.chmod(0o755)
    assert _WarmCloudInit.interpreter(str(fake)) is None
    assert _WarmCloudInit().run(str(fake), ["schema", "--config-file", "/dev/null"], 60) is None
