"""The warm cloud-init (z9.sim.cloud_init_worker) answers as the CLI: for every kind of user-data the
guests are given — valid, a schema error, a YAML error, deprecated keys, not a mapping, a
hostile text — the exit code, stdout and stderr of the worker are those of a new ``cloud-init
schema --config-file F`` process, and the simulator's verdict is the same both ways."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from z9.sim import guest
from z9.sim.guest import _WarmCloudInit, cloud_init_binary, schema_check

USER_DATA = {
    "valid": "#cloud-config\nhostname: web-1\nssh_authorized_keys: ['ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI x@y']\n",
    "schema_error": "#cloud-config\nhostname: 5\nruncmd: 7\n",
    "yaml_error": "#cloud-config\nfoo: [\n",
    "deprecated": "#cloud-config\nuser: admin\napt_update: true\n",
    "not_a_mapping": "#cloud-config\n- a\n- b\n",
    "unknown_key": "#cloud-config\nno_such_module_key: 1\n",
    "hostile": "#cloud-config\nwrite_files:\n- path: /etc/x\n  content: \"\\u0000\\u202e\"\n  permissions: 'rwx'\n",
    "empty": "#cloud-config\n",
}


@pytest.fixture
def binary() -> str:
    path = cloud_init_binary()
    if path is None:
        if os.environ.get("Z9_REQUIRE_GUEST_TOOLS") == "1":
            pytest.fail("cloud-init is not installed (Z9_REQUIRE_GUEST_TOOLS=1): apt-get install cloud-init")
        pytest.skip("cloud-init is not installed")
    return path


@pytest.mark.parametrize("name", sorted(USER_DATA))
def test_the_warm_worker_answers_as_the_cli(binary: str, tmp_path: Path, name: str) -> None:
    f = tmp_path / f"{name}.user-data"
    f.write_text(USER_DATA[name])
    args = ["schema", "--config-file", str(f)]
    cli = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LANG": "C.UTF-8"})
    warm = _WarmCloudInit().run(binary, args, timeout_s=60)
    assert warm == (cli.returncode, cli.stdout, cli.stderr)


def test_the_verdicts_are_the_same_with_and_without_the_worker(binary: str, monkeypatch: pytest.MonkeyPatch) -> None:
    warm = {}
    for name, text in USER_DATA.items():
        guest._SCHEMA_CACHE.pop(__import__("hashlib").sha256(text.encode()).hexdigest(), None)
        warm[name] = schema_check(text.encode())
    monkeypatch.setattr(guest._WARM_CLOUD_INIT, "run", lambda *a, **k: None)  # the CLI, a process per check
    monkeypatch.setattr(guest, "_SCHEMA_CACHE", {})
    cold = {name: schema_check(text.encode()) for name, text in USER_DATA.items()}
    assert warm == cold
    assert warm["valid"] == ("valid", "") and warm["schema_error"][0] == "invalid"
    assert "not valid yaml" in warm["yaml_error"][1]


def test_a_worker_that_died_is_replaced(binary: str, tmp_path: Path) -> None:
    f = tmp_path / "u.user-data"
    f.write_text(USER_DATA["valid"])
    warm = _WarmCloudInit()
    assert warm.run(binary, ["schema", "--config-file", str(f)], 60)[0] == 0
    (proc,) = warm._idle
    proc.kill()
    proc.wait()
    assert warm.run(binary, ["schema", "--config-file", str(f)], 60)[0] == 0
    (fresh,) = warm._idle
    assert fresh is not proc and fresh.poll() is None
