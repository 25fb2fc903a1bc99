"""``trt-runtime check-contexts`` on the GPU: it passes an engine whose contexts may overlap
(the benchmark's MLP), it counts an output that differs from its serial output as wrong,
and it reports what the conv net does (TensorRT-RTX 1.6.1 gives wrong outputs there when
two executions overlap: docs/concurrency.md), on both backends."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trt_runtime  # noqa: E402
from trt_runtime import cli  # noqa: E402

pytestmark = pytest.mark.gpu


def _plan(tmp_path: Path, key: str) -> Path:
    from benchmarks import workloads

    built, _ = workloads.build(workloads.WORKLOADS_BY_KEY[key], echo=lambda _text: None)
    path = tmp_path / f"{key}.plan"
    path.write_bytes(built.plan)
    return path


def _check(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, dict[str, Any]]:
    code = cli.main(["--json", "check-contexts", *map(os.fspath, argv)])
    out = capsys.readouterr().out
    return code, json.loads(out)


def _backend(name: str) -> None:
    status = trt_runtime.backend_status().get(name)
    if not status:
        pytest.skip(f"the {name!r} backend cannot run here: {getattr(status, 'reason', 'not installed')}")


@pytest.mark.parametrize("outer", [False, True], ids=["eager", "outer"])
def test_gpu_check_contexts_passes_the_mlp(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, outer: bool
) -> None:
    pytest.importorskip("torch", reason="check-contexts needs torch with CUDA")
    _backend("python")
    plan = _plan(tmp_path, "mlp")
    code, doc = _check(capsys, plan, "--backend", "python", "--contexts", "4", "--rounds", "40",
                       *(["--outer"] if outer else []))
    assert code == 0, doc
    assert doc["wrong"] == 0 and doc["checked"] == 4 * 40 and doc["outer"] is outer
    assert doc["backend"] == "python" and doc["max_relative_difference"] <= doc["tolerance"]


def test_gpu_check_contexts_counts_an_output_off_its_serial_one(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="check-contexts needs torch with CUDA")
    _backend("python")
    import numpy as np

    from trt_runtime.testing import overlap

    with trt_runtime.load(_plan(tmp_path, "mlp"), "python", contexts=2) as engine:
        (spec,) = engine.inputs
        shape = tuple(8 if d < 0 else d for d in spec.shape)
        inputs = [[np.random.default_rng(i).standard_normal(shape).astype(spec.dtype)] for i in range(2)]
        callers = [overlap._Caller(torch, engine, arrays, 1e-3) for arrays in inputs]
        callers[1].serial[0] = callers[1].serial[0] + 1.0  # what a wrong output looks like
        overlap._run_rounds(torch, callers, 3)
        clean = overlap.check_overlap(engine, inputs, 3, torch=torch)  # the public entry, same engine
    assert [(c.checked, c.wrong) for c in callers] == [(3, 0), (3, 3)]
    assert callers[0].worst == 0.0 and callers[1].worst > 1e-3
    assert clean == overlap.OverlapResult(checked=6, wrong=0, max_relative_difference=0.0)


@pytest.mark.parametrize("backend", ["python", "torchbind"])
def test_gpu_check_contexts_on_the_conv_net(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, backend: str, report_measurement: Any
) -> None:
    """Reported, not asserted either way: whether the conv net's outputs go wrong is
    TensorRT-RTX's (it may be fixed); the command must say what it saw, consistently."""
    pytest.importorskip("torch", reason="check-contexts needs torch with CUDA")
    _backend(backend)
    code, doc = _check(capsys, _plan(tmp_path, "convnet"), "--backend", backend, "--contexts", "8",
                       "--rounds", "200")
    assert doc["checked"] == 8 * 200
    assert (code == 1) == (doc["wrong"] > 0), doc
    worst = doc["max_relative_difference"]
    report_measurement(f"check-contexts convnet {backend}",
                       f"{doc['wrong']} of {doc['checked']} wrong (up to {worst:.2e} of the peak), "
                       f"exit {code}")


@pytest.mark.parametrize("backend", ["python", "torchbind"])
def test_gpu_contexts_warn_on_this_build_and_the_check_does_not(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, backend: str, report_measurement: Any
) -> None:
    """On the TensorRT-RTX 1.6 build of this host, ``contexts > 1`` warns once, naming the
    build its backend reports; ``check-contexts`` (what the warning asks for) does not."""
    import warnings

    from trt_runtime.hazards import overlap_hazard

    pytest.importorskip("torch", reason="check-contexts needs torch with CUDA")
    _backend(backend)
    plan = _plan(tmp_path, "mlp")
    engine = trt_runtime.load(plan, backend)
    try:
        build = overlap_hazard(engine.backend.cache_key(engine.device))
        if build is None:
            pytest.skip(f"no known overlap hazard for {engine.backend.cache_key(engine.device)}")
        with pytest.warns(trt_runtime.ContextOverlapWarning) as caught:
            engine.contexts = 2
            engine.contexts = 4
        assert len(caught) == 1 and build in str(caught[0].message) and caught[0].filename == __file__
        assert engine.contexts == 4
    finally:
        engine.close()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code, doc = _check(capsys, plan, "--backend", backend, "--contexts", "2", "--rounds", "5")
    assert code == 0 and doc["wrong"] == 0, doc
    assert not [w for w in seen if issubclass(w.category, trt_runtime.ContextOverlapWarning)]
    report_measurement(f"contexts warning {backend}", str(caught[0].message)[:160])
