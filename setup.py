"""setuptools' list of packages, found instead of kept by hand: each package of
``[tool.setuptools.package-dir]`` (pyproject.toml) and every directory below it holding an
``__init__.py``. A new resource type's slice (``resources/z9/resources/<type>/`` and its ``jobs/``)
is installed without an edit outside it; a hand-kept list once left the volume slice out of every
non-editable install (a wheel, the Docker image) while the editable one, and so the tests, had it.
Everything else about the package is in pyproject.toml."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def find_packages() -> list[str]:
    """The packages to install, sorted: the mapped ones and their subpackages."""
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for package, directory in mapped.items():
        found.add(package)
        base = ROOT / directory
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            if rel and not any(p.startswith((".", "__")) or p == "node_modules" for p in rel):
                found.add(".".join((package, *rel)))
    return sorted(found)


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__
    from setuptools import setup

    setup(packages=find_packages())
