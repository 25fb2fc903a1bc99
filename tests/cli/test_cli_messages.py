"""Messages that name the real problem: install hints, cache wording, saved files."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests._cli_runner import error_lines, run_cli
from trt_runtime import TensorSpec
from trt_runtime.extras import extras, install_hint
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def test_install_hint_knows_every_extra_of_pyproject() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras()) == set(declared)  # read from the installed metadata, not a copy
    for name in declared:
        assert install_hint(name) == f"pip install -c constraints.txt -e '.[{name}]'"


def test_install_hint_is_the_form_that_works_from_a_checkout() -> None:
    assert install_hint("serve") == "pip install -c constraints.txt -e '.[serve]'"
    with pytest.raises(ValueError, match=r"extra must be one of 'rtx', .*; got 'nope'"):
        install_hint("nope")


def test_no_install_hint_names_a_trt_runtime_distribution() -> None:
    """No index has a ``trt-runtime`` distribution: ``pip install 'trt-runtime[x]'`` cannot work."""
    bad = re.compile(r"pip install [^\n]*trt-runtime\[")
    skip = {"gpu-results.md"}  # a historical log
    files = [*(ROOT / "trt_runtime").rglob("*.py"), *(ROOT / "backends").rglob("*.py"),
             *(p for p in (ROOT / "docs").glob("*.md") if p.name not in skip), ROOT / "README.md"]
    # The serve front (trt_runtime/serve, cli.md's serve section) is being replaced by its owners.
    texts = {p: re.sub(r"\n## serve\n.*?(?=\n## )", "", p.read_text(encoding="utf-8"), flags=re.S)
             for p in files if "trt_runtime/serve" not in p.as_posix()}
    assert [str(p.relative_to(ROOT)) for p, text in texts.items() if bad.search(text)] == []


@pytest.fixture
def affine(tmp_path: Path) -> Path:
    spec = TensorSpec("x", "float32", (-1, 4), is_input=True, profiles=(((1, 4), (2, 4), (8, 4)),))
    path = tmp_path / "affine.mem"
    path.write_bytes(MemoryBackend.build_engine([spec], [AffineOutput("y", "x")], name="affine"))
    return path


def test_run_save_outputs_reports_the_file_it_wrote(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    target = tmp_path / "o.npz"
    code, out, err = run_cli(capsys, "run", affine, "--save-outputs", target)
    assert code == 0, err
    assert target.is_file() and set(np.load(target).files) == {"y"}
    flat = " ".join(out.split())
    assert "not written" not in flat
    assert f"wrote the outputs to {target}" in flat


def test_cache_info_names_a_foreign_file_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "junk.bin").write_bytes(b"JUNKJUNKJUNKJUNK")
    code, out, err = run_cli(capsys, "--json", "cache", "info", "--dir", tmp_path)
    assert code == 0, err
    (note,) = [e["note"] for e in json.loads(out)["entries"]]
    assert note.count("not a trt-runtime cache file") == 1, note
    assert note.startswith("not a trt-runtime cache file (starts with"), note


def test_cache_clear_with_nothing_to_clear_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "never-made"
    monkeypatch.setenv("TRT_RUNTIME_CACHE_DIR", str(directory))
    code, out, err = run_cli(capsys, "cache", "clear", "--yes")
    assert code == 0 and error_lines(err) == []
    assert f"nothing to clear in {directory}" in out
    assert not directory.exists()
