"""Imports match folders: every ``z9.`` import names a file that a reader, or a tool reading import
lines as text, finds by its path under one of the source roots listed in pyproject.toml — each
top-level folder holds its part of the ``z9`` namespace (PEP 420) as ``<root>/z9/<name>/``."""
from __future__ import annotations

import ast
import runpy
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCE_ROOTS = [ROOT / r for r in PYPROJECT["tool"]["pyright"]["extraPaths"]]
find_packages = runpy.run_path(str(ROOT / "setup.py"), run_name="z9_setup")["find_packages"]


#: top-level folders that are source roots, not packages: importing them works only by accident
FOLDERS_NOT_PACKAGES = {"libs", "services", "simulator", "db", "resources"}


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    for root in SOURCE_ROOTS:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        if base.is_dir() and parts == ["z9"]:  # the namespace itself
            return base
    return None


def _python_files() -> list[Path]:
    files = []
    for top in [*SOURCE_ROOTS, ROOT / "tests", ROOT / "bench", ROOT / "docs"]:
        for f in top.rglob("*.py"):
            if ".venv" not in f.parts and "node_modules" not in f.parts:
                files.append(f)
    return sorted(set(files))


def test_every_z9_import_names_a_file_under_a_source_root() -> None:
    missing = []
    count = 0
    for f in _python_files():
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # ``from z9.x import y``: y is a submodule (z9/x/y.py) or a name in z9/x
                names = [node.module]
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if _module_file(sub) is not None:
                        names.append(sub)
            for name in names:
                if name.split(".")[0] in FOLDERS_NOT_PACKAGES:
                    missing.append(f"{f.relative_to(ROOT)}:{node.lineno} {name} (a folder, not a package: import z9.…)")
                if name == "z9" or name.startswith("z9."):
                    count += 1
                    if _module_file(name) is None:
                        missing.append(f"{f.relative_to(ROOT)}:{node.lineno} {name}")
    assert count > 400, count  # the walk did see the code base
    assert not missing, "imports whose file is not <root>/z9/…:\n" + "\n".join(missing)


def test_the_source_roots_are_the_package_directories() -> None:
    """The roots static tools are given (pyright, mypy) are where setuptools installs from, and no
    root holds a ``z9/__init__.py`` (that would make ``z9`` a regular package hiding the others)."""
    tool = PYPROJECT["tool"]
    assert tool["mypy"]["mypy_path"] == tool["pyright"]["extraPaths"]
    for package, directory in tool["setuptools"]["package-dir"].items():
        rel = Path(directory)
        assert rel.parts[-2:] == tuple(package.split(".")), (package, directory)
        assert str(Path(*rel.parts[:-2]) or ".") in {str(Path(r)) for r in tool["pyright"]["extraPaths"]}, directory
    for root in SOURCE_ROOTS:
        assert not (root / "z9" / "__init__.py").exists(), root
    for package in find_packages():
        assert _module_file(package) is not None, package


def test_every_package_directory_is_installed_and_every_slice_with_it() -> None:
    """setup.py finds the packages (no hand-kept list): every directory with an ``__init__.py``
    under a source root is one, each registered resource type's slice and its ``jobs`` among them
    (a listed one left the volume slice out of every wheel)."""
    found = set(find_packages())
    for root in SOURCE_ROOTS:
        for init in (root / "z9").rglob("__init__.py"):
            if "__pycache__" not in init.parts and "node_modules" not in init.parts:
                assert ".".join(init.parent.relative_to(root).parts) in found, init
    from z9 import resources

    slices = resources.slice_modules("jobs")
    assert len(slices) == len(resources.REGISTRY)
    for rtype, jobs in slices:
        assert {jobs.__name__, jobs.__name__.rsplit(".", 1)[0]} <= found, rtype.name
    assert "packages" not in PYPROJECT["tool"]["setuptools"], "the packages are found by setup.py, not listed"
