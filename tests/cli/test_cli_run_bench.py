"""``trt-runtime run`` and ``trt-runtime bench``: outputs, inputs, settings, the runtime cache,
tables, JSON, plots, and the bench helpers they use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _cli_runner import run_cli as _run
from _cli_shared import FORCE, gpu_reason, one_error_line

from trt_runtime import bench
from trt_runtime.testing.memory import MemoryBackend

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
    assert "does not support cuda_graph_strategy" in one_error_line(err)


def test_cli_run_rejects_unknown_input_name(
    capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path
) -> None:
    np.save(tmp_path / "z.npy", np.zeros((2, 4), np.float32))
    code, _, err = _run(capsys, "run", memory_engine, FORCE, "--backend", "memory",
                        "--input", f"z={tmp_path / 'z.npy'}", "--output-dir", tmp_path)
    assert code == 2
    assert "'z'" in one_error_line(err) and "['x']" in err


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
    if gpu_reason():  # only 'memory' can run here, and it cannot load a TensorRT plan
        code, out, err = _run(capsys, "bench", engine_files["plan"], "--backend", "all")
        assert code == 1
        assert "skipped the 'memory' backend" in out
        assert "no available backend could load" in one_error_line(err)


def test_cli_bench_plot(capsys: pytest.CaptureFixture[str], memory_engine: Path, tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    code, _, err = _run(capsys, "bench", memory_engine, FORCE, "--backend", "memory", "--iterations", "3",
                        "--plot", png)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert code == 1
        assert "-e '.[plot]'" in one_error_line(err)
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
