"""The ``trt-runtime`` command line, in-process through ``main([...])`` and as the installed script."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cli_runner import run_cli

from trt_runtime import Availability, TensorSpec, bench, cli
from trt_runtime.cli.demo import write_pte
from trt_runtime.cli.engine_files import backend_reason
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

#: Engines of the numpy ``memory`` backend start with b"TRTMEM1\0", no TensorRT magic:
#: the commands take them only with --force.
FORCE = "--force"


_run = run_cli


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines()
             if ln.strip() and not ln.startswith(("usage:", "trt-runtime: warning: "))]
    assert len(lines) == 1, err
    assert lines[0].startswith("trt-runtime: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _gpu_reason() -> str:
    return backend_reason(None)


@pytest.fixture(scope="module")
def built_dynamic() -> Any:
    """A real TensorRT-RTX engine with a dynamic batch, built on the CPU."""
    pytest.importorskip("tensorrt_rtx", reason="building engines needs tensorrt-rtx")
    from trt_runtime import builders

    return builders.build_dynamic(width=8)


@pytest.fixture(scope="module")
def engine_files(tmp_path_factory: pytest.TempPathFactory, built_dynamic: Any) -> dict[str, Path]:
    """The dynamic engine as a raw plan and a TR01 blob."""
    from trt_runtime.formats import write_plan, write_tr01

    built = built_dynamic
    root = tmp_path_factory.mktemp("engines")
    plan, tr01 = root / "dyn.plan", root / "dyn.tr01"
    write_plan(plan, built.plan)
    write_tr01(tr01, built.plan, (*built.inputs, *built.outputs), device_id=0)
    return {"plan": plan, "tr01": tr01}


@pytest.fixture(scope="module")
def pte_file(tmp_path_factory: pytest.TempPathFactory, built_dynamic: Any) -> Path:
    """The dynamic engine as a single-delegate .pte program."""
    target = tmp_path_factory.mktemp("pte") / "dyn.pte"
    reason = write_pte(built_dynamic, target)
    if reason:
        pytest.skip(f"cannot write a .pte here: {reason}")
    return target


@pytest.fixture
def memory_engine(tmp_path: Path) -> Path:
    """An engine of the numpy ``memory`` backend: ``y = 2 x + 1``, batch 1..8 (opt 2)."""
    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="affine")
    path = tmp_path / "affine.eng"
    path.write_bytes(data)
    return path


# -- demo -----------------------------------------------------------------------------


def test_cli_demo_without_gpu_builds_writes_inspects_and_explains(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the demo builds with tensorrt-rtx")
    reason = _gpu_reason()
    if not reason:
        pytest.skip("a backend can run here; the GPU path is test_cli_demo_gpu_runs_cold_and_warm")
    code, out, err = _run(capsys, "demo", "--out", tmp_path)
    assert code == 0, err
    plans = list(tmp_path.glob("*.plan"))
    blobs = list(tmp_path.glob("*.tr01"))
    assert len(plans) == 1 and len(blobs) == 1
    assert plans[0].read_bytes()[:4] == b"vtrt"  # a real TensorRT-RTX plan
    assert blobs[0].read_bytes()[:4] == b"TR01"
    assert "bindings" in out
    assert "logits" in out  # the TR01 blob lists its bindings on the CPU
    assert "GPU part skipped" in out
    assert " ".join(reason.split()) in " ".join(out.split())  # the backend's own reason
    assert "--no-load" not in out  # the plan was not loaded for want of a GPU, not for a flag


def test_cli_demo_json_reports_files_and_gpu_status(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the demo builds with tensorrt-rtx")
    if not _gpu_reason():
        pytest.skip("a backend can run here; the GPU path is test_cli_demo_gpu_runs_cold_and_warm")
    code, out, err = _run(capsys, "--json", "demo", "--out", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert Path(doc["files"]["plan"]).is_file()
    assert Path(doc["files"]["tr01"]).is_file()
    assert doc["gpu"]["ran"] is False and doc["gpu"]["reason"]
    tr01 = doc["inspect"][Path(doc["files"]["tr01"]).name]
    assert tr01["format"] == "TR01"
    assert [b["name"] for b in tr01["bindings"]] == ["image", "logits"]
    # The engine's optimization profile is recorded in the blob (issue 20: was []).
    assert tr01["bindings"][0]["profiles"] == [[[1, 3, 16, 16], [2, 3, 16, 16], [8, 3, 16, 16]]]
    if doc["source"]["onnx"] is not None:  # made with the onnx package, built by the ONNX parser
        assert Path(doc["source"]["onnx"]).is_file()
    plan = doc["inspect"][Path(doc["files"]["plan"]).name]
    assert plan["bindings"] == [] and "GPU" in plan["bindings_note"]


def test_cli_demo_run_part_with_the_memory_backend(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cold/warm part of the demo, end to end on the CPU: the 'built' engine is a memory engine."""
    from trt_runtime import builders
    from trt_runtime.cli import demo

    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    out_spec = TensorSpec("logits", "float32", (-1, 4), False)
    data = MemoryBackend.build_engine([spec], [AffineOutput("logits", "x", scale=3.0)], name="affine")
    fake = builders.BuiltEngine(
        data, (spec,), (out_spec,), {}, lambda x: [3.0 * np.asarray(x, np.float64)], name="affine"
    )
    monkeypatch.setattr(demo, "_build_engine", lambda outdir, progress: (fake, {"onnx": None, "why": "test"}))
    code, out, err = _run(capsys, "--json", "demo", "--out", tmp_path, "--backend", "memory")
    assert code == 0, err
    doc = json.loads(out)
    runs = doc["gpu"]["runs"]
    assert doc["gpu"]["ran"] is True and doc["gpu"]["backend"] == "memory"
    assert runs["cold"]["runtime_cache"]["existed_before"] is False
    assert runs["warm"]["runtime_cache"]["existed_before"] is True
    assert runs["cold"]["check"]["ok"] and runs["warm"]["check"]["ok"]
    assert runs["warm"]["check"]["outputs"][0]["max_abs_error"] < 1e-5
    # A wrong reference is caught: exit 1 with one line.
    wrong = builders.BuiltEngine(data, (spec,), (out_spec,), {}, lambda x: [np.asarray(x) * 0], name="affine")
    monkeypatch.setattr(demo, "_build_engine",
                        lambda outdir, progress: (wrong, {"onnx": None, "why": "test"}))
    code, _, err = _run(capsys, "demo", "--out", tmp_path / "again", "--backend", "memory")
    assert code == 1
    assert "do not match the numpy reference" in _one_error_line(err)


@pytest.mark.gpu
def test_cli_demo_gpu_runs_cold_and_warm(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    reason = _gpu_reason()
    if reason:
        pytest.skip(f"no CUDA GPU: {reason}")
    code, out, err = _run(capsys, "--json", "demo", "--out", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    runs = doc["gpu"]["runs"]
    assert runs["cold"]["runtime_cache"]["existed_before"] is False
    assert runs["warm"]["runtime_cache"]["existed_before"] is True
    assert runs["warm"]["runtime_cache"]["bytes_after"] > 0
    assert runs["cold"]["check"]["ok"] and runs["warm"]["check"]["ok"]


# -- inspect --------------------------------------------------------------------------


def test_cli_inspect_plan_shows_container_and_why_bindings_are_missing(
    capsys: pytest.CaptureFixture[str], engine_files: dict[str, Path]
) -> None:
    if not _gpu_reason():
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


# -- run ------------------------------------------------------------------------------


def test_cli_run_writes_outputs_and_random_inputs(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path
) -> None:
    outdir = tmp_path / "out"
    code, out, err = _run(
        capsys, "--json", "run", memory_engine, FORCE, "--backend", "memory", "--output-dir", outdir
    )
    assert code == 0, err
    doc = json.loads(out)
    x = np.load(outdir / "inputs" / "x.npy")
    y = np.load(outdir / "y.npy")
    assert x.shape == (2, 4)  # the profile's optimal shape
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
    assert doc["outputs"][0]["shape"] == [2, 4] and doc["backend"] == "memory"
    assert doc["first_call_ms"] > 0


def test_cli_run_takes_given_inputs_settings_and_runtime_cache(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path
) -> None:
    given = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "x.npy", given)
    cache_dir = tmp_path / "private"
    cache_dir.mkdir(mode=0o700)
    cache = cache_dir / "kernels.bin"
    argv = ["--json", "run", memory_engine, FORCE, "--backend", "memory",
            "--input", f"x={tmp_path / 'x.npy'}", "--cuda-graph-strategy", "whole_graph_capture",
            "--dynamic-shapes-kernel-strategy", "eager",
            "--runtime-cache", cache, "--output-dir", tmp_path / "o"]
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    doc = json.loads(out)
    np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), 2 * given + 1)
    assert doc["settings"] == {"cuda_graph_strategy": "whole_graph_capture",
                               "dynamic_shapes_kernel_specialization_strategy": "eager"}
    assert doc["runtime_cache"]["existed_before"] is False
    assert cache.is_file() and doc["runtime_cache"]["bytes_after"] == cache.stat().st_size > 0
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    assert json.loads(out)["runtime_cache"]["existed_before"] is True


def test_cli_run_missing_capability_is_one_line(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_runtime import registry

    monkeypatch.setitem(registry._extra, "nographs",
                        MemoryBackend(name="nographs", without=["supports_cuda_graph_strategy"]))
    code, _, err = _run(capsys, "run", memory_engine, FORCE, "--backend", "nographs",
                        "--cuda-graph-strategy", "whole_graph_capture")
    assert code == 1
    assert "does not support cuda_graph_strategy" in _one_error_line(err)


def test_cli_run_rejects_unknown_input_name(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path
) -> None:
    np.save(tmp_path / "z.npy", np.zeros((2, 4), np.float32))
    code, _, err = _run(capsys, "run", memory_engine, FORCE, "--backend", "memory",
                        "--input", f"z={tmp_path / 'z.npy'}", "--output-dir", tmp_path)
    assert code == 2
    assert "'z'" in _one_error_line(err) and "['x']" in err


# -- bench ----------------------------------------------------------------------------


def test_cli_bench_table_json_and_file(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path
) -> None:
    saved = tmp_path / "bench.json"
    code, out, err = _run(capsys, "bench", memory_engine, FORCE, "--backend", "memory", "--iterations", "7",
                          "--warmup", "2", "--json-out", saved)
    assert code == 0, err
    assert "median" in out and "p99" in out and "memory" in out
    doc = json.loads(saved.read_text())
    (result,) = doc["results"]
    assert result["iterations"] == 7 and len(result["latencies_us"]) == 7
    assert result["median_us"] == pytest.approx(float(np.percentile(result["latencies_us"], 50)))
    assert result["p99_us"] == pytest.approx(float(np.percentile(result["latencies_us"], 99)))
    code, out, err = _run(capsys, "--json", "bench", memory_engine, FORCE, "--backend", "memory",
                          "--backend", "memory", "--iterations", "3", "--warmup", "0")
    assert code == 0, err
    results = json.loads(out)["results"]
    assert [r["label"] for r in results] == ["memory", "memory"]
    assert all(r["throughput_per_s"] > 0 for r in results)


def test_cli_bench_all_skips_backends_that_cannot_load(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, engine_files: dict[str, Path]
) -> None:
    code, out, err = _run(capsys, "--json", "bench", memory_engine, FORCE, "--backend", "all",
                          "--iterations", "2")
    assert code == 0, err
    assert "memory" in [r["label"] for r in json.loads(out)["results"]]
    if _gpu_reason():  # only 'memory' can run here, and it cannot load a TensorRT plan
        code, out, err = _run(capsys, "bench", engine_files["plan"], "--backend", "all")
        assert code == 1
        assert "skipped the 'memory' backend" in out
        assert "no available backend could load" in _one_error_line(err)


def test_cli_bench_plot(capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    code, _, err = _run(capsys, "bench", memory_engine, FORCE, "--backend", "memory", "--iterations", "3",
                        "--plot", png)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert code == 1
        assert "-e '.[plot]'" in _one_error_line(err)
        return
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_percentile_matches_numpy() -> None:
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 10, 50, 90, 99, 100):
        assert bench.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    with pytest.raises(ValueError, match="empty"):
        bench.percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]; got 101"):
        bench.percentile([1.0], 101)


def test_bench_benchmark_counts_calls_and_validates() -> None:
    calls: list[int] = []
    result = bench.benchmark(lambda: calls.append(1), iterations=5, warmup=3, label="noop")
    assert len(calls) == 8 and result.iterations == 5 and result.warmup == 3
    assert result.gpu_times_us is None and result.throughput > 0
    assert result.to_dict()["label"] == "noop"
    with pytest.raises(ValueError, match="iterations must be an int >= 1; got 0"):
        bench.benchmark(lambda: None, iterations=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0; got -1"):
        bench.benchmark(lambda: None, warmup=-1)


# -- errors ---------------------------------------------------------------------------


def test_cli_missing_file_is_one_line_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.plan"
    code, out, err = _run(capsys, "inspect", missing)
    assert code == 1 and out == ""
    assert str(missing) in _one_error_line(err)


def test_cli_malformed_file_is_one_line_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"vtrt" + bytes(6))
    code, out, err = _run(capsys, "--json", "inspect", bad)
    assert code == 1
    assert "too small" in _one_error_line(err)
    assert "too small" in json.loads(out)["error"]["message"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "a command is required"),
        (["run"], "the following arguments are required: file"),
        (["bench", "x.plan", "--iterations", "0"], "--iterations must be >= 1; got 0"),
        (["run", "x.plan", "--cuda-graph-strategy", "fast"], "invalid choice: 'fast'"),
        (["run", "x.plan", "--input", "nofile"], "--input must be NAME=FILE.npy; got 'nofile'"),
        (["cache", "wipe"], "invalid choice: 'wipe'"),
    ],
)
def test_cli_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    argv: list[str], needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.plan").write_bytes(b"\0" * 128)
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert needle in _one_error_line(err)


def test_cli_debug_shows_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"hello")
    code, _, err = _run(capsys, "inspect", bad, "--debug")
    assert code == 1
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("trt-runtime: error: ")


def test_cli_version_and_help_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    from trt_runtime import __version__

    code, out, _ = _run(capsys, "--version")
    assert code == 0 and __version__ in out
    code, out, _ = _run(capsys, "bench", "--help")
    assert code == 0 and "--iterations" in out and "--json-out" in out


# -- files that are not engines ----------------------------------------------------------


@pytest.fixture
def random_file(tmp_path: Path) -> Path:
    """1 MiB of random bytes: no TensorRT, TR01/TR02 or .pte magic."""
    from trt_runtime.formats import PLAN_MAGICS, detect_format

    data = np.random.default_rng(14).bytes(1 << 20)
    assert data[:4] not in PLAN_MAGICS and detect_format(memoryview(data)) == "plan"
    path = tmp_path / "random.bin"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("command", ["inspect", "run", "bench"])
@pytest.mark.parametrize("json_mode", [False, True])
def test_cli_unknown_magic_is_refused(
    capsys: pytest.CaptureFixture[str], random_file: Path, command: str, json_mode: bool
) -> None:
    code, out, err = _run(capsys, *(["--json"] if json_mode else []), command, random_file)
    assert code == 1
    line = _one_error_line(err)
    if json_mode:
        assert json.loads(out) == {"error": {"message": line.removeprefix("trt-runtime: error: "),
                                             "exit_code": 1, "kind": "failure"}}
    else:
        assert out == ""
    assert f"{random_file} is not an engine file (unknown magic" in line
    for magic in ("'vtrt'", "'ptrt'", "'TR01'", "'TR02'", "'ET..'"):
        assert magic in line
    assert "--force" in line


def test_cli_unknown_magic_is_refused_before_any_backend(
    capsys: pytest.CaptureFixture[str], random_file: Path
) -> None:
    # 'memory' runs here: the refusal comes from the magic, not from a missing GPU.
    code, _, err = _run(capsys, "run", random_file, "--backend", "memory")
    assert code == 1 and "is not an engine file" in _one_error_line(err)
    code, _, err = _run(capsys, "bench", random_file, "--backend", "all")
    assert code == 1 and "is not an engine file" in _one_error_line(err)
    with pytest.raises(cli.CliError, match="is not an engine file"):
        cli.inspect_file(random_file, load=False)


def test_cli_known_magics_come_from_the_formats_module(
    capsys: pytest.CaptureFixture[str], random_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_runtime.formats import PLAN_MAGICS

    monkeypatch.setitem(PLAN_MAGICS, random_file.read_bytes()[:4], "future_flavour")
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", random_file)
    assert code == 0, err
    assert json.loads(out)["flavour"] == "future_flavour" and err == ""


def test_cli_force_reads_unknown_magic_as_a_plan(
    capsys: pytest.CaptureFixture[str], random_file: Path
) -> None:
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", "--force", random_file)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "plan" and doc["flavour"] == "unknown"
    assert doc["file_bytes"] == 1 << 20
    assert len(doc["warnings"]) == 1 and "read as a plan of unknown flavour (--force)" in doc["warnings"][0]
    assert err.startswith("trt-runtime: warning: ") and "is not an engine file" in err
    report = cli.inspect_file(random_file, load=False, force=True)
    assert report["flavour"] == "unknown"


@pytest.mark.parametrize("command", ["run", "bench"])
def test_cli_force_passes_unknown_magic_on_to_the_backend(
    capsys: pytest.CaptureFixture[str], random_file: Path, command: str
) -> None:
    code, _, err = _run(capsys, command, random_file, "--force", "--backend", "memory")
    assert code == 1
    assert "reading it as a plan of unknown flavour (--force)" in err
    line = _one_error_line(err)  # now the backend's own refusal
    assert "is not an engine file" not in line and "memory" in line.lower()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "is empty (0 bytes)"),
        (b"vtrt", "too small"),
        (b"TR09" + bytes(100), "unknown magic b'TR09'"),
    ],
)
def test_cli_files_the_format_checks_explain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, needle: str
) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(content)
    for command in ("inspect", "run", "bench"):
        code, _, err = _run(capsys, command, bad, "--backend", "memory")
        assert code == 1
        line = _one_error_line(err)
        assert needle in line and "is not an engine file" not in line


# -- cache ----------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default cache directory, moved under ``tmp_path`` through XDG_CACHE_HOME."""
    if sys.platform != "linux":
        pytest.skip("XDG_CACHE_HOME moves the platformdirs cache directory on Linux only")
    monkeypatch.setenv("XDG_CACHE_HOME", os.fspath(tmp_path / "xdg"))
    from trt_runtime.cache import default_cache_dir

    directory = default_cache_dir()
    assert directory.is_relative_to(tmp_path)
    return directory


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
    assert code == 1 and "pass --yes" in _one_error_line(err)
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


# -- the installed console script -------------------------------------------------------


def _script() -> str:
    found = Path(sys.executable).with_name("trt-runtime")
    if found.is_file():
        return os.fspath(found)
    which = shutil.which("trt-runtime")
    if which is None:
        pytest.skip("the trt-runtime console script is not installed (pip install -e .)")
    return which


def _script_run(*argv: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_script(), *map(os.fspath, argv)], capture_output=True, text=True, timeout=300,
                          check=False)


def test_cli_entry_point_demo_and_errors(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the demo builds with tensorrt-rtx")
    done = _script_run("--json", "demo", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert Path(doc["files"]["plan"]).is_file() and Path(doc["files"]["tr01"]).is_file()
    assert doc["gpu"]["ran"] is (not _gpu_reason())
    done = _script_run("inspect", tmp_path / "missing.plan")
    assert done.returncode == 1 and done.stdout == ""
    assert _one_error_line(done.stderr).endswith(str(tmp_path / "missing.plan"))
    done = _script_run("--quiet", "nope")
    assert done.returncode == 2
    _one_error_line(done.stderr)


def test_cli_runs_as_python_dash_m() -> None:
    done = subprocess.run([sys.executable, "-m", "trt_runtime.cli", "--version"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.startswith("trt-runtime "), done.stderr


def test_cli_package_exports_its_public_names() -> None:
    from trt_runtime.cli import (  # noqa: F401
        CliError,
        UsageError,
        backend_report,
        build_parser,
        inspect_file,
        main,
        make_inputs,
    )

    assert callable(main) and issubclass(UsageError, CliError)
    assert sorted(cli.__all__) == sorted(
        ["CliError", "UsageError", "backend_report", "build_parser", "inspect_file", "main", "make_inputs"]
    )
