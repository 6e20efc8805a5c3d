"""Every job kind is a JobKind (z9.executor.kind): checked by a type checker (mypy, over each
registered kind module assigned to the Protocol) and at run time (the registry refuses a kind that
lacks a phase)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

from z9.executor import jobs
from z9.executor.kind import PHASES, JobKind

ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_kind_has_every_phase() -> None:
    assert jobs.REGISTRY
    for kind, module in jobs.REGISTRY.items():
        assert module.KIND == kind
        assert isinstance(module, JobKind), kind  # runtime_checkable: every member present
        for phase in PHASES:
            assert callable(getattr(module, phase)), (kind, phase)


def test_a_kind_lacking_a_phase_is_refused() -> None:
    class Half:
        KIND = "HalfKind"

        async def observe(self, ctx: object) -> None: ...

    with pytest.raises(TypeError, match="lacks plan"):
        jobs.register(Half())  # type: ignore[arg-type]
    assert "HalfKind" not in jobs.REGISTRY


@pytest.mark.skipif(shutil.which("mypy") is None and not (Path(sys.executable).parent / "mypy").exists(),
                    reason="mypy is a test dependency; not installed here")
def test_the_type_checker_holds_every_kind_to_the_contract(tmp_path: Path) -> None:
    lines = ["from z9.executor.kind import JobKind", "from z9.executor.jobs import UnknownKind", ""]
    for i, (kind, module) in enumerate(sorted(jobs.REGISTRY.items())):
        if isinstance(module, types.ModuleType):
            lines += [f"import {module.__name__} as k{i}", f"_k{i}: JobKind = k{i}"]
        else:  # one of a module's JOB_KINDS: checked as the attribute it is
            home = sys.modules[type(module).__module__]
            (name,) = [n for n, v in vars(home).items() if v is module]
            lines += [f"from {home.__name__} import {name} as k{i}", f"_k{i}: JobKind = k{i}"]
    lines.append('_unknown: JobKind = UnknownKind("x")')
    check = tmp_path / "kinds_check.py"
    check.write_text("\n".join(lines) + "\n")
    mypy_path = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["mypy_path"]
    exe = shutil.which("mypy") or str(Path(sys.executable).parent / "mypy")
    out = subprocess.run([exe, "--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary",
                          "--cache-dir", str(tmp_path / "cache"), "--namespace-packages", "--explicit-package-bases",
                          str(check)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={"MYPYPATH": ":".join(str(ROOT / p) for p in mypy_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
