"""Session checks shared by every test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# The helper modules shared by every folder (``_python_doubles``, ``_cli_runner``, ...) live in
# tests/ and are imported by name; pytest's default import mode puts only each test file's own
# folder on sys.path, so tests/ goes there once for all of them.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# pytest-xdist starts its workers with COLUMNS=80 (and LINES=24); a plain run has neither, and
# the CLI draws its tables 120 wide when stdout is no terminal and COLUMNS is unset. Tests see
# the same output however they are run.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

_SOURCES = {"trt_runtime": ROOT / "trt_runtime",
            "trt_runtime_backends": ROOT / "backends" / "trt_runtime_backends"}


def stale_modules() -> list[str]:
    """Source files missing from a strict editable install's link tree (added after the install).

    ``pip install -e`` links each file into ``build/__editable__.*`` (pyproject's
    ``[tool.distutils.editable_wheel]``), so a module added later is not importable until
    the install runs again. Empty for a wheel or an up-to-date install.
    """
    import importlib.util

    missing = []
    for package, source in _SOURCES.items():
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        installed = Path(spec.origin).parent
        if installed.resolve() == source.resolve() or "__editable__" not in str(installed):
            continue
        for path in source.rglob("*.py"):
            relative = path.relative_to(source)
            if not (installed / relative).exists():
                missing.append(f"{package}/{relative.as_posix()}")
    return sorted(missing)


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = stale_modules()
    if missing:
        raise pytest.UsageError(
            f"the editable install predates {', '.join(missing)}: run "
            "pip install -c constraints.txt -e '.[rtx,cuda,cli,test]' again (a strict editable "
            "install links each file; new modules need the install run again)"
        )


# xdist groups (``--dist loadgroup``) are module or test marks (``xdist_group``): the Ray modules of
# tests/serve and the docs-site tests carry them. xdist reads them while collecting, before any
# conftest hook could add them: marks added in pytest_collection_modifyitems were never seen.
