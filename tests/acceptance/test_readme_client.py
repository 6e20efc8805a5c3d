"""The README's client walkthrough, pasted into a fresh shell against a fresh ``z9 dev``: every
fenced block of "Walkthrough with the client" runs as written (``bash -e``: the first failing
line fails the test), twice in a row (a re-run must not collide with the first run's names), and
so does its Python snippet. Only the API port is changed (a free one instead of 8080)."""
from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import free_port
from tests.acceptance.test_dev import _metrics_base, _start, _stop, _wait_banner

README = Path(__file__).resolve().parents[2] / "README.md"


def client_blocks() -> tuple[list[str], list[str]]:
    """(bash blocks, python blocks) of the README's "Walkthrough with the client" section."""
    text = README.read_text()
    section = text[text.index("## Walkthrough with the client"):text.index("## Walkthrough with curl")]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    return [b for lang, b in blocks if lang == "bash"], [b for lang, b in blocks if lang == "python"]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.timeout(1800)  # two runs of the walkthrough, each a few dozen commands, a cluster among them
async def test_the_readme_client_walkthrough_runs_as_pasted_twice(tmp_path: Path) -> None:
    bash, python = client_blocks()
    assert len(bash) >= 2 and len(python) == 1
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the README's `.venv/bin/z9`
    port, metrics_base = free_port(), _metrics_base()
    proc = _start(work / ".z9", port, metrics_base)
    try:
        await asyncio.to_thread(_wait_banner, proc)
        # a fresh shell: nothing of ours but PATH and an empty HOME (no context, no ssh key, no kubeconfig)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
        script = "\n".join(bash).replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        for run in (1, 2):
            out = await asyncio.to_thread(_run, ["bash", "-e", "-o", "pipefail", "-x", "-c", script], work, env, 900)
            assert out.returncode == 0, (run, out.stdout[-3000:], out.stderr[-5000:])
            await asyncio.sleep(1.1)  # RUN=$(date +%s): the next run's names differ
        kube = home / ".kube" / "config"
        assert stat.S_IMODE(kube.stat().st_mode) == 0o600
        contexts = [c["name"] for c in yaml.safe_load(kube.read_text())["contexts"]]
        assert len(contexts) == 2 and all(c.startswith("z9-demo-") for c in contexts), contexts
        snippet = python[0].replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        for run in (1, 2):
            out = await asyncio.to_thread(_run, [sys.executable, "-c", snippet], work, env, 300)
            assert out.returncode == 0, (run, out.stdout[-3000:], out.stderr[-3000:])
            assert "succeeded running" in out.stdout, out.stdout
    finally:
        await asyncio.to_thread(_stop, proc)
