"""``trt-runtime cache`` and ``trt-runtime backends``, and how the command line prints: file names
as written, no markup in spinners, plain text without rich, ``--quiet``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from _cli_runner import run_cli as _run
from _cli_shared import FORCE, one_error_line

from trt_runtime import Availability
from trt_runtime.testing.memory import MemoryBackend


def _write_cache(directory: Path, name: str, payload: bytes) -> Path:
    from trt_runtime import CacheKey
    from trt_runtime.cache import encode

    path = directory / name
    path.write_bytes(encode(payload, CacheKey("tensorrt_rtx", "1.6.1.120", "9.0", "13000")))
    return path


def test_cli_cache_path_and_info(capsys: pytest.CaptureFixture[str], cache_dir: Path) -> None:
    code, out, _ = _run(capsys, "cache", "path")
    assert code == 0 and out.strip() == str(cache_dir)
    entry = _write_cache(cache_dir, "runtime-cache-a.bin", b"k" * 100)
    (cache_dir / "runtime-cache-a.bin.lock").write_bytes(b"")
    (cache_dir / "notes.txt").write_text("not a cache file")
    code, out, err = _run(capsys, "--json", "cache", "info")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["path"] == str(cache_dir)
    by_name = {e["name"]: e for e in doc["entries"]}
    assert set(by_name) == {"runtime-cache-a.bin", "runtime-cache-a.bin.lock"}
    assert by_name["runtime-cache-a.bin"]["bytes"] == entry.stat().st_size
    assert by_name["runtime-cache-a.bin"]["key"] == {
        "flavour": "tensorrt_rtx", "version": "1.6.1.120", "compute_capability": "9.0", "driver": "13000",
    }
    code, out, _ = _run(capsys, "cache", "info")
    assert code == 0 and "runtime-cache-a.bin" in out and "1.6.1.120" in out


def test_cli_cache_without_action_shows_directory_and_entries(
    capsys: pytest.CaptureFixture[str], cache_dir: Path
) -> None:
    code, out, err = _run(capsys, "cache")
    assert code == 0, err
    assert f"cache directory: {cache_dir}" in out and "no cache files" in out
    entry = _write_cache(cache_dir, "runtime-cache-a.bin", b"k" * 100)
    code, out, err = _run(capsys, "cache")
    assert code == 0, err
    assert f"cache directory: {cache_dir}" in out
    assert "runtime-cache-a.bin" in out and f"{entry.stat().st_size} B" in out
    assert "tensorrt_rtx 1.6.1.120, compute capability 9.0, driver 13000" in " ".join(out.split())
    code, bare, _ = _run(capsys, "--json", "cache")
    code_info, info, _ = _run(capsys, "--json", "cache", "info")
    assert code == code_info == 0 and json.loads(bare) == json.loads(info)
    other = cache_dir.parent / "other"
    code, out, _ = _run(capsys, "--json", "cache", "--dir", other)
    assert code == 0 and json.loads(out) == {
        "path": str(other), "exists": False, "entries": [], "total_bytes": 0,
    }


def test_cli_cache_clear_needs_confirmation(
    capsys: pytest.CaptureFixture[str], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = _write_cache(cache_dir, "runtime-cache-a.bin", b"k" * 10)
    keep = cache_dir / "notes.txt"
    keep.write_text("not ours")
    monkeypatch.setattr(sys, "stdin", _FakeStdin(tty=False))
    code, _, err = _run(capsys, "cache", "clear")
    assert code == 1 and "pass --yes" in one_error_line(err)
    assert entry.exists()
    monkeypatch.setattr(sys, "stdin", _FakeStdin(tty=True))
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    code, out, _ = _run(capsys, "cache", "clear")
    assert code == 1 and entry.exists() and "nothing deleted" in out
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    code, out, _ = _run(capsys, "cache", "clear")
    assert code == 0 and not entry.exists() and keep.exists()


def test_cli_cache_clear_yes_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    directory = tmp_path / "other"
    directory.mkdir()
    entry = _write_cache(directory, "x.bin", b"abc")
    code, out, err = _run(capsys, "--json", "cache", "clear", "--yes", "--dir", directory)
    assert code == 0, err
    assert json.loads(out)["removed"] == [str(entry)] and not entry.exists()


class _FakeStdin:
    def __init__(self, tty: bool) -> None:
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


# -- backends -------------------------------------------------------------------------


def test_cli_backends_lists_installed_with_reasons_labels_and_capabilities(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trt_runtime import backend_status, installed_backends

    code, out, err = _run(capsys, "--json", "backends")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["backends"]}
    assert sorted(rows) == installed_backends()
    status = backend_status()
    for name, row in rows.items():
        assert row["available"] == bool(status[name])
        assert row["reason"] == status[name].reason
        if not row["available"]:
            assert row["reason"]
        if not row["installed"]:
            assert "pip install" in row["reason"]
    assert rows["memory"]["available"] is True
    assert rows["memory"]["description"].startswith("test backend")
    assert rows["memory"]["capabilities"]["supports_runtime_cache"] is True
    code, out, _ = _run(capsys, "backends")
    text = " ".join(out.split())
    assert code == 0 and "memory (test backend" in text and "runtime_cache" in out
    if not all(row["installed"] for row in rows.values()):
        assert "not installed (pip install" in text
    assert " none " not in text


#: An install hint as backends give it, with text rich would read as markup.
HINT = "pip install -c constraints.txt -e '.[torchbind]' [bold]x[/bold]"


class _HintedBackend(MemoryBackend):
    """A backend that cannot run here, with an install hint rich would read as markup."""

    def is_available(self) -> Availability:
        return Availability(False, f"needs torch-tensorrt-rtx: {HINT}")


def test_cli_backends_prints_install_hint_intact(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rich", reason="the hint was lost by rich markup")
    from trt_runtime import registry

    monkeypatch.setenv("COLUMNS", "400")  # one table row per line
    monkeypatch.setitem(registry._extra, "hinted", _HintedBackend(name="hinted"))
    code, out, err = _run(capsys, "backends")
    assert code == 0, err
    row = next(ln for ln in out.splitlines() if "hinted" in ln)
    assert HINT in row
    torchbind = [ln for ln in out.splitlines() if "torchbind" in ln and "trt-runtime" in ln and ln is not row]
    assert all("-e '.[torchbind]'" in ln for ln in torchbind)


def test_cli_file_names_print_as_written(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rich", reason="only rich reads markup and emoji codes")
    monkeypatch.setenv("COLUMNS", "400")
    odd = tmp_path / "affine[v2][bold]:smile:.eng"
    shutil.copy(memory_engine, odd)
    code, out, err = _run(capsys, "bench", odd, FORCE, "--backend", "memory", "--iterations", "2",
                          "--warmup", "0")
    assert code == 0, err
    assert f"{odd.name}: latency per call" in out
    code, out, err = _run(capsys, "inspect", odd, FORCE, "--backend", "memory")
    assert code == 0, err
    assert str(odd) in out.splitlines()


def test_cli_spinner_text_is_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    rich_console = pytest.importorskip("rich.console", reason="the spinner is rich's")
    from trt_runtime.cli.output import Output

    out = Output()
    out._console = rich_console.Console(file=sys.stdout, force_terminal=True, emoji=False)
    with out.status("pip install -c constraints.txt -e '.[torchbind]'") as update:
        update("now [bold]x[/bold]")
    printed = capsys.readouterr().out
    assert "now [bold]x[/bold]" in printed


def test_cli_plain_text_without_rich(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, memory_engine: Path
) -> None:
    monkeypatch.setitem(sys.modules, "rich.console", None)  # import rich.console -> ImportError
    monkeypatch.setitem(sys.modules, "rich.table", None)
    code, out, err = _run(capsys, "backends")
    assert code == 0, err
    header = next(ln for ln in out.splitlines() if ln.startswith("backend"))
    assert header.split() == ["backend", "available", "capabilities", "reason"]
    assert any(ln.startswith("memory ") and " yes " in ln for ln in out.splitlines())
    code, out, err = _run(capsys, "inspect", memory_engine, FORCE, "--backend", "memory")
    assert code == 0, err
    assert "bindings (from engine" in out and "┃" not in out


def test_cli_quiet_keeps_results_drops_progress(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path
) -> None:
    argv = ["run", memory_engine, FORCE, "--backend", "memory", "--output-dir", tmp_path]
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    assert "first inference" in out and "ran " in out
    code, out, err = _run(capsys, *argv, "--quiet")
    assert code == 0, err
    assert "first inference" not in out and "ran " not in out
    assert "y.npy" in out  # the outputs table is the result
