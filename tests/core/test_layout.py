"""The repository's layout says what each file is for: ``tools/`` holds what a contributor runs
(the GPU round, its staging, the docs build's extension, the fixture writer), each probe in
``benchmarks/probes/`` opens with the one question it answers and is listed with it in the
folder's README, every ``tools/``, ``benchmarks/probes/`` or ``tests/`` path the code and docs
name exists, and the tests are grouped by concept in folders, no file over 600 lines."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "benchmarks" / "probes"
TOOLS = ROOT / "tools"
#: A ``tools/`` or ``benchmarks/probes/`` path as code and docs write it.
NAMED_PATH = re.compile(r"\b((?:tools|benchmarks/probes)/[\w.]+\.(?:py|sh|md))")
TESTS = ROOT / "tests"
#: A file under ``tests/`` as code and docs write it.
NAMED_TEST_PATH = re.compile(r"(?<![\w/.])(tests/[\w/]+\.py)\b")
#: The most lines a file under tests/ may have (the charter's limit for every file).
MAX_LINES = 600

#: The GPU results are a log: older entries name the probes run then, some since deleted.
_HISTORY = {"docs/gpu-results.md"}
#: This file names made-up paths to test the pattern.
_HERE = "tests/core/test_layout.py"
#: Files another change rewrites at the same time; they still name ``tools/`` for three probes
#: that moved to ``benchmarks/probes/`` (the merge updates those comments).
_REWRITTEN_ELSEWHERE: set[str] = set()


def _tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    suffixes = {".py", ".md", ".sh", ".yml", ".toml", ".txt"}
    return [ROOT / name for name in listed.stdout.splitlines()
            if Path(name).suffix in suffixes and not name.startswith("tests/fixtures/")]


def _question(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True)
    assert doc, f"{path.name} has no module docstring"
    return doc.splitlines()[0]


def _readme_table() -> dict[str, str]:
    text = (PROBES / "README.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\|\s*`([\w.]+)`\s*\|\s*(.+?)\s*\|\s*$", text, re.M))


def test_layout_each_probe_opens_with_its_question() -> None:
    questions = {p.name: _question(p) for p in sorted(PROBES.glob("*.py"))}
    assert questions, "benchmarks/probes holds the probes"
    unasked = {name: q for name, q in questions.items() if not q.removesuffix(" (GPU host)").endswith("?")}
    assert unasked == {}


def test_layout_probes_readme_lists_each_probe_with_its_question() -> None:
    questions = {p.name: _question(p) for p in sorted(PROBES.glob("*.py"))}
    assert _readme_table() == questions


def test_layout_tools_keeps_what_a_contributor_runs() -> None:
    """Each file of ``tools/`` is run by the GPU round (or its staging), by the docs build, or is
    named by the docs (the GPU results' log aside) as a command to run; the probes moved out."""
    kept = sorted(p.name for p in TOOLS.iterdir() if p.is_file())
    pages = [p for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in _HISTORY]
    users = "\n".join(p.read_text(encoding="utf-8")
                      for p in [TOOLS / "gpu_round.sh", ROOT / "mkdocs.yml", ROOT / "README.md", *pages])
    unused = [name for name in kept if name not in users and name not in ("gpu_round.sh", "_gpu_tool.py")]
    assert unused == []
    assert not (TOOLS / "cpu_call_overhead.py").exists() and (PROBES / "cpu_call_overhead.py").exists()


def test_layout_named_tool_and_probe_paths_exist() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {named}"
        for path in _tracked_text_files()
        if str(path.relative_to(ROOT)) not in {*_HISTORY, *_REWRITTEN_ELSEWHERE, _HERE}
        for named in set(NAMED_PATH.findall(path.read_text(encoding="utf-8")))
        if not (ROOT / named).exists()
    )
    assert missing == []


def test_layout_path_finder_sees_paths_as_written() -> None:
    """The pattern above sees a path as the docs write it."""
    assert NAMED_PATH.findall("run `python3 tools/gpu_probe.py` then benchmarks/probes/x.py.") == [
        "tools/gpu_probe.py", "benchmarks/probes/x.py"]


def _ours(named: str) -> bool:
    """A path of this repository's tests, not another project's (``tests/py/...`` of torch-tensorrt)."""
    parts = Path(named).parts
    return len(parts) == 2 or (TESTS / parts[1]).is_dir()


def test_layout_named_test_paths_exist() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {named}"
        for path in _tracked_text_files()
        if str(path.relative_to(ROOT)) not in {*_HISTORY, _HERE}
        for named in set(NAMED_TEST_PATH.findall(path.read_text(encoding="utf-8")))
        if _ours(named) and not (ROOT / named).exists()
    )
    assert missing == []


def test_layout_tests_live_in_concept_folders() -> None:
    """No test module directly in tests/: each sits in the folder of the concept it tests."""
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    assert sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("_")) == ["conftest.py"]


def test_layout_test_module_names_are_unique() -> None:
    """Without ``__init__.py`` pytest imports each test and helper module by its base name, so
    two folders may not hold the same one."""
    assert sorted(TESTS.rglob("__init__.py")) == []
    seen: dict[str, list[str]] = {}
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and "fixtures" not in path.relative_to(TESTS).parts:
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_layout_no_test_file_over_the_line_limit() -> None:
    lengths = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
               for p in TESTS.rglob("*.py")}
    assert lengths, "tests/ holds Python files"
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
