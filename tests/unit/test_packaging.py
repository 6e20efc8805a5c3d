"""The image builds from the versions the tests passed with, and the licence is stated
(issue 13 §5)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, 1)[0].strip().lower().replace("_", "-")


def test_constraints_pin_every_dependency_and_the_dockerfile_uses_them() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[name.lower().replace("_", "-")] = version
    deps = project["dependencies"] + project["optional-dependencies"]["test"]
    missing = [d for d in deps if _name(d) not in pins]
    assert not missing, f"constraints.txt lacks {missing}: regenerate it (its header says how)"
    docker = (ROOT / "Dockerfile").read_text()
    assert "pip install -c constraints.txt ." in docker
    assert re.search(r"^COPY .*constraints\.txt", docker, re.M)


def test_license_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
