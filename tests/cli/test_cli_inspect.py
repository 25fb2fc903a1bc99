"""``trt-runtime inspect`` on plans, TR01 blobs, ``.pte`` programs and memory-backend engines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from _cli_runner import run_cli as _run
from _cli_shared import FORCE, gpu_reason

from trt_runtime.cli.demo import write_pte

# -- inspect --------------------------------------------------------------------------


def test_cli_inspect_plan_shows_container_and_why_bindings_are_missing(
    capsys: pytest.CaptureFixture[str], engine_files: dict[str, Path]
) -> None:
    if not gpu_reason():
        pytest.skip("a backend can run here: the plan's bindings are listed from the engine")
    code, out, err = _run(capsys, "--json", "inspect", engine_files["plan"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "plan"
    assert doc["flavour"] == "tensorrt_rtx" and doc["version"] == "1.6.1.120"
    assert doc["file_bytes"] == engine_files["plan"].stat().st_size
    assert doc["bindings"] == [] and doc["data_dependent_outputs"] is None
    assert "GPU" in doc["bindings_note"]
    code, out, _ = _run(capsys, "inspect", engine_files["plan"])
    assert code == 0
    assert "bindings: not listed" in out and "needs the engine deserialized on a GPU" in " ".join(out.split())


def test_cli_inspect_tr01_lists_bindings_device_and_profiles(
    capsys: pytest.CaptureFixture[str], engine_files: dict[str, Path]
) -> None:
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", engine_files["tr01"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "TR01"
    assert doc["device_id"] == 0
    assert doc["bindings_from"] == "container"
    by_name = {b["name"]: b for b in doc["bindings"]}
    assert by_name["x"]["io"] == "input" and by_name["x"]["shape"] == [-1, 8]
    assert by_name["y"]["io"] == "output" and by_name["y"]["dtype"] == "float32"
    assert doc["data_dependent_outputs"] == []
    code, out, _ = _run(capsys, "inspect", engine_files["tr01"])
    assert code == 0
    assert "TR01" in out and "bindings (from container)" in out


def test_cli_inspect_pte(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    to_pte = pytest.importorskip("trt_runtime.executorch", reason="no .pte writer").to_pte
    from trt_runtime import builders

    built = builders.build_dynamic(width=8)
    target = tmp_path / "dyn.pte"
    reason = write_pte(built, target)
    if reason:
        pytest.skip(f"cannot write a .pte here: {reason} ({to_pte.__name__})")
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", target)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "pte"
    assert [b["name"] for b in doc["bindings"]] == ["x", "y"]


def _with_container_metadata(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> None:
    """Make the format reader add ``extra`` to every EngineSource's metadata (a reader double)."""
    from trt_runtime import formats

    real = formats.read_engine_source

    def reader(source: Any, **options: Any) -> Any:
        found = real(source, **options)
        return dataclasses.replace(found, metadata={**found.metadata, **extra})

    monkeypatch.setattr(formats, "read_engine_source", reader)


def test_cli_inspect_pte_shows_compile_specs_and_warns_on_stderr(
    capsys: pytest.CaptureFixture[str], pte_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = {"target_device": "cuda:0", "note": "[bold]kept[/bold] :smile:"}
    warning = "target_device 'cuda:1' disagrees with the blob's device_id 0 [torchbind]"
    _with_container_metadata(monkeypatch, compile_specs=specs, warnings=[warning])
    monkeypatch.setenv("COLUMNS", "400")
    code, out, err = _run(capsys, "inspect", "--no-load", pte_file)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if "compile specs" in ln)
    assert "target_device=cuda:0" in line and "note=[bold]kept[/bold] :smile:" in line
    assert f"trt-runtime: warning: {warning}" in err.splitlines()
    assert warning not in out
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", pte_file)
    assert code == 0, err
    doc = json.loads(out)  # stdout is only the document; the warning went to stderr
    assert doc["compile_specs"] == specs and doc["warnings"] == [warning]
    assert f"trt-runtime: warning: {warning}" in err


def test_cli_inspect_pte_with_empty_compile_specs_says_none(
    capsys: pytest.CaptureFixture[str], pte_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_container_metadata(monkeypatch, compile_specs={}, warnings=[])
    code, out, err = _run(capsys, "inspect", "--no-load", pte_file)
    assert code == 0, err
    assert any(ln.split() == ["compile", "specs", "none"] for ln in out.splitlines())
    assert "warning" not in err


def test_cli_inspect_pte_reports_what_the_reader_records(
    capsys: pytest.CaptureFixture[str], pte_file: Path
) -> None:
    from trt_runtime.formats import read_engine_source

    metadata = read_engine_source(pte_file).metadata
    if "compile_specs" not in metadata:
        pytest.skip("this .pte reader records no compile specs (see the reader double above)")
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", pte_file)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["compile_specs"] == {str(k): str(v) for k, v in metadata["compile_specs"].items()}
    assert doc["warnings"] == [str(w) for w in metadata.get("warnings") or ()]


def test_cli_inspect_without_compile_specs_shows_no_line(
    capsys: pytest.CaptureFixture[str], engine_files: dict[str, Path]
) -> None:
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", engine_files["tr01"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["compile_specs"] is None and doc["warnings"] == []
    code, out, err = _run(capsys, "inspect", "--no-load", engine_files["tr01"])
    assert code == 0 and "compile specs" not in out and err == ""


def test_cli_inspect_memory_engine_lists_bindings_through_the_backend(
    capsys: pytest.CaptureFixture[str], memory_engine: Path
) -> None:
    code, out, err = _run(capsys, "--json", "inspect", memory_engine, FORCE, "--backend", "memory")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bindings_from"].startswith("engine")
    assert [(b["name"], b["io"]) for b in doc["bindings"]] == [("x", "input"), ("y", "output")]
    assert doc["bindings"][0]["profiles"] == [[[1, 4], [2, 4], [8, 4]]]
