"""The Ray-free parts of serving: options, request checks, HTTP codec, batching, replica loading."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _serve_support import npy, pair_engine, reference, single_engine

import trt_runtime
from trt_runtime import RequestError, TensorSpec
from trt_runtime.extras import install_hint
from trt_runtime.serve import RequestChecker, ServeOptions, node_cache_path, open_engine
from trt_runtime.serve.batching import BatchRunner
from trt_runtime.serve.codec import decode_body, encode_result, read_npy
from trt_runtime.testing.memory import AffineOutput, MemoryBackend


def _engine(data: bytes) -> trt_runtime.Engine:
    return trt_runtime.load(data, "memory")


def test_import_trt_runtime_and_serve_do_not_import_ray() -> None:
    code = "import sys, trt_runtime, trt_runtime.serve; print('ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_serve_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import trt_runtime.serve as serving

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(trt_runtime.BackendUnavailableError, match=re.escape(install_hint("serve"))):
        serving.require_ray()


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("max_batch", 0, "max_batch must be an integer >= 1; got 0"),
     ("contexts", 1.5, "contexts must be an integer >= 1; got 1.5"),
     ("batch_wait_ms", -1, r"batch_wait_ms must be .* got -1"),
     ("runtime_cache", 3, "runtime_cache must be 'auto', a path or None; got 3"),
     ("device", -2, "device must be None or a CUDA device index >= 0; got -2")],
)
def test_serve_options_refuse_bad_values(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ServeOptions(**{field: value})  # type: ignore[arg-type]


def test_serve_options_coerce() -> None:
    assert ServeOptions.coerce(None) == ServeOptions()
    assert ServeOptions.coerce({"max_batch": 1}).batching is False
    assert ServeOptions(runtime_cache="x.bin").runtime_cache == Path("x.bin")
    with pytest.raises(TypeError, match="got int"):
        ServeOptions.coerce(3)  # type: ignore[arg-type]


# -- request checks ---------------------------------------------------------------------------
def test_checker_batch_axis_and_max_rows() -> None:
    engine = _engine(single_engine())
    checker = RequestChecker("affine", engine.inputs, engine.outputs)
    assert checker.batchable
    assert checker.max_rows((("float32", (8,)),)) == 16
    assert checker.max_rows((("float32", (9,)),)) == 1  # no profile takes width 9
    assert checker.fits((np.zeros((16, 8), np.float32),))
    assert not checker.fits((np.zeros((17, 8), np.float32),))
    x = TensorSpec("x", "float32", (1, 4), True)
    static = RequestChecker("static", [x], [TensorSpec("y", "float32", (1, 4), False)])
    assert not static.batchable and static.max_rows((("float32", (4,)),)) == 1


def test_checker_refusals_name_the_bad_value() -> None:
    engine = _engine(pair_engine())
    checker = RequestChecker("pair", engine.inputs, engine.outputs)
    x, k = np.zeros((2, 4), np.float32), np.zeros((2, 2), np.int32)
    cases = [
        (([x], {}), "takes 2 input"),
        (((), {"x": x, "q": k}), r"unknown \['q'\]; missing \['k'\]"),
        (([x], {"k": k}), "either by position or by name"),
        (([x, k.astype(np.int64)], {}), "must have dtype int32; got int64"),
        (([x, np.zeros((3, 2), np.int32)], {}), "same batch size"),
        (([x[:, :3], k], {}), r"must have shape \[-1, 4\]"),
        (([np.zeros((17, 4), np.float32), np.zeros((17, 2), np.int32)], {}), "outside every"),
        (([x.tolist(), k], {}), "must be a numpy array; got list"),
    ]
    for (args, named), match in cases:
        with pytest.raises(RequestError, match=match) as info:
            checker.check(args, named)
        assert info.value.status == 422


def test_checker_makes_arrays_contiguous() -> None:
    engine = _engine(single_engine())
    checker = RequestChecker("affine", engine.inputs, engine.outputs)
    (got,) = checker.check([np.zeros((4, 2), np.float32).T], {})
    assert got.flags.c_contiguous


# -- HTTP codec -------------------------------------------------------------------------------
def test_codec_json_npy_npz_round_trips() -> None:
    inputs = _engine(pair_engine()).inputs
    decoded = decode_body("application/json", b'{"x": [[1, 2, 3, 4]], "k": [[5, 6]]}', inputs, 1 << 20)
    assert decoded.encoding == "json" and not decoded.bare
    assert decoded.named["k"].dtype == np.int32 and decoded.named["x"].dtype == np.float32
    buffer = io.BytesIO()
    np.savez(buffer, x=np.ones((1, 4), np.float32))
    assert decode_body("application/x-npz", buffer.getvalue(), inputs, 1 << 20).named["x"].shape == (1, 4)
    single = _engine(single_engine()).inputs
    got = decode_body("application/x-npy; charset=binary", npy(np.ones((2, 3), ">f4")), single, 1 << 20)
    assert got.bare and got.args[0].dtype == np.float32 and got.args[0].dtype.isnative
    fortran = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(read_npy(npy(fortran), "x"), fortran)
    body, media = encode_result([np.ones((1, 2), np.float32)], ["y"], "json", True)
    assert (json.loads(body), media) == ([[1.0, 1.0]], "application/json")
    body, media = encode_result([np.ones(2), np.zeros(2)], ["y", "z"], "npy", True)
    assert media == "application/x-npz" and set(np.load(io.BytesIO(body))) == {"y", "z"}


@pytest.mark.parametrize(
    ("media", "body", "status", "match"),
    [("text/plain", b"1", 415, "text/plain"),
     ("application/json", b"[1, 2", 400, "not valid JSON"),
     ("application/json", b'"x"', 400, "array or an object"),
     ("application/json", b"[[1, 2], [3]]", 400, "rectangular"),
     ("application/json", b"[[1e40]]", None, None),
     ("application/x-npy", b"\x93NUMPY\x01\x00", 400, "not a valid .npy"),
     ("application/x-npy", b"x" * 200, 413, "limit of 100 bytes"),
     ("application/x-npz", b"not a zip", 400, "not a valid .npz")],
)
def test_codec_refusals(media: str, body: bytes, status: int | None, match: str | None) -> None:
    inputs = _engine(single_engine()).inputs
    if status is None:
        decode_body(media, body, inputs, 100)  # float32 overflow is inf, as numpy casts
        return
    with pytest.raises(RequestError, match=match) as info:
        decode_body(media, body, inputs, 100)
    assert info.value.status == status


def test_codec_int_inputs_refuse_lossy_json() -> None:
    inputs = _engine(pair_engine()).inputs
    with pytest.raises(RequestError, match=r"non-integer JSON number 2\.5"):
        decode_body("application/json", b'{"k": [[1, 2.5]]}', inputs, 1 << 20)
    with pytest.raises(RequestError, match="out of its range"):
        decode_body("application/json", b'{"k": [[1, 99999999999]]}', inputs, 1 << 20)


def test_codec_npz_bomb_is_refused_by_declared_size() -> None:
    inputs = _engine(pair_engine()).inputs
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.zeros((1000, 1000), np.float32))
    with pytest.raises(RequestError, match="unpacks to") as info:
        decode_body("application/x-npz", buffer.getvalue(), inputs, 1 << 20)
    assert info.value.status == 413


# -- batching -----------------------------------------------------------------------------------
def test_batch_runner_groups_packs_and_splits() -> None:
    engine = _engine(single_engine())
    checker = RequestChecker("affine", engine.inputs, engine.outputs)
    calls: list[int] = []
    runner = BatchRunner(engine.execute, checker, row_limit=5, on_call=calls.append)
    requests = [(np.full((n, w), 10 * i + w, np.float32),) for i, (n, w) in
                enumerate([(1, 4), (2, 3), (3, 4), (1, 3), (2, 4), (1, 8)])]
    answers = runner.run(requests)
    for (x,), answer in zip(requests, answers, strict=True):
        assert not isinstance(answer, BaseException)
        np.testing.assert_array_equal(answer[0], reference(x))
    # width 4: 1 + 3 rows, then 2 (5-row limit); width 3: 2 + 1; width 8: 1
    assert sorted(calls) == [1, 2, 3, 4]


def test_batch_runner_works_out_limits_and_profile_fits_once_per_shape() -> None:
    """A group's row limit and a batch's profile fit are remembered (they cost tens of µs each and
    repeat every batch), and kept apart by width: each width still gets its own answer."""
    engine = _engine(single_engine())
    checker = RequestChecker("affine", engine.inputs, engine.outputs)
    asked: list[str] = []
    real_rows, real_fits = checker.max_rows, checker.fits
    checker.max_rows = lambda sig: asked.append("rows") or real_rows(sig)  # type: ignore[method-assign]
    checker.fits = lambda arrays: asked.append("fits") or real_fits(arrays)  # type: ignore[method-assign]
    runner = BatchRunner(engine.execute, checker, row_limit=5)
    for _ in range(20):
        requests = [(np.full((1, w), w, np.float32),) for w in (4, 4, 3, 4, 3)]
        for (x,), answer in zip(requests, runner.run(requests), strict=True):
            np.testing.assert_array_equal(answer[0], reference(x))  # type: ignore[index]
    assert asked.count("rows") == 2 and asked.count("fits") == 2, asked  # one per width


def test_batch_runner_failure_answers_only_its_call() -> None:
    engine = _engine(single_engine())
    checker = RequestChecker("affine", engine.inputs, engine.outputs)

    def execute(x: np.ndarray) -> list[np.ndarray]:
        if x.shape[1] == 3:
            raise RuntimeError("boom")
        return engine.execute(x)

    answers = BatchRunner(execute, checker).run(
        [(np.ones((1, 3), np.float32),), (np.ones((1, 4), np.float32),), (np.ones((1, 3), np.float32),)]
    )
    assert isinstance(answers[0], RuntimeError) and answers[0] is answers[2]
    np.testing.assert_array_equal(answers[1][0], [[3, 3, 3, 3]])


def test_batch_runner_copies_view_outputs() -> None:
    engine = _engine(single_engine())
    engine.outer_graph = "view"
    checker = RequestChecker("affine", engine.inputs, engine.outputs)
    runner = BatchRunner(engine.execute, checker, copy_outputs=True)
    first = runner.run([(np.ones((1, 4), np.float32),)])[0]
    runner.run([(np.zeros((1, 4), np.float32),)])
    np.testing.assert_array_equal(first[0], [[3, 3, 3, 3]])


# -- replica loading ------------------------------------------------------------------------------
def test_open_engine_uses_and_fills_a_cache_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRT_RUNTIME_CACHE_DIR", str(tmp_path))
    backend = trt_runtime.get_backend("memory")
    path = node_cache_path(backend, node="node/a")
    assert path.parent == tmp_path and path.name == "runtime-cache-memory-1-sm00-drv0-node_a.bin"
    options = ServeOptions(backend="memory", outer_graph=True)
    engine, cache = open_engine(single_engine(), options)
    assert engine.has_context() and engine.outer_graph is not None and cache is not None
    assert cache.path == node_cache_path(backend) and cache.path.stat().st_size > 0
    engine.close()
    cache.close()
    warm, warm_cache = open_engine(single_engine(), ServeOptions(backend="memory", warmup=False))
    assert warm_cache is not None and warm.has_context()
    assert b"affine|x=4x4" in warm_cache.serialize()  # the first replica's warm-up kernel
    warm.close()
    none, no_cache = open_engine(single_engine(), ServeOptions(backend="memory", runtime_cache=None))
    assert no_cache is None and none.runtime_settings.runtime_cache is None


def test_open_engine_contexts_reach_load(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_load(source: object, backend: object, **kwargs: object) -> object:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(trt_runtime, "load", fake_load)
    with pytest.raises(RuntimeError, match="stop here"):
        open_engine(single_engine(), ServeOptions(backend="memory", contexts=3, runtime_cache=None))
    assert seen["contexts"] == 3
    seen.clear()
    with pytest.raises(RuntimeError):
        open_engine(single_engine(), ServeOptions(backend="memory", runtime_cache=None))
    assert "contexts" not in seen


def test_static_engine_is_served_one_request_per_call() -> None:
    data = MemoryBackend.build_engine([TensorSpec("x", "float32", (2, 2), True)],
                                      [AffineOutput("y", "x", 1.0, 1.0)], name="static")
    engine = _engine(data)
    checker = RequestChecker("static", engine.inputs, engine.outputs)
    calls: list[int] = []
    answers = BatchRunner(engine.execute, checker, on_call=calls.append).run(
        [(np.zeros((2, 2), np.float32),), (np.ones((2, 2), np.float32),)])
    assert calls == [2, 2]
    np.testing.assert_array_equal(answers[1][0], np.full((2, 2), 2.0))


def test_checker_refuses_after_accepting_the_same_input_in_another_shape_or_dtype() -> None:
    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    checker = RequestChecker("e", [spec], [TensorSpec("y", "float32", (-1, 4), False)])
    for _ in range(2):  # the second time from what the first one accepted
        (got,) = checker.check((np.zeros((2, 4), np.float32),), {})
        assert got.shape == (2, 4)
    with pytest.raises(RequestError, match=r"outside every optimization profile"):
        checker.check((np.zeros((9, 4), np.float32),), {})
    with pytest.raises(RequestError, match=r"must have dtype float32; got float64"):
        checker.check((np.zeros((2, 4), np.float64),), {})
    with pytest.raises(RequestError, match=r"must have shape \[-1, 4\]"):
        checker.check((np.zeros((2, 5), np.float32),), {})


# -- the outer graph and padding left to the engine ("auto", trt-runtime serve's default) ----------
def _static_engine() -> bytes:
    x = TensorSpec("x", "float32", (2, 4), True)
    return MemoryBackend.build_engine([x], [AffineOutput("y", "x", 2.0, 1.0)], name="static")


@pytest.mark.parametrize(
    ("source", "max_batch", "graph"),
    [(single_engine, 16, True), (single_engine, 1, False), (_static_engine, 16, False)],
    ids=["batching an engine that can batch", "batching off", "an engine that cannot batch"],
)
def test_open_engine_auto_runs_the_outer_graph_and_pads_where_batches_form(source: object, max_batch: int,
                                                                          graph: bool) -> None:
    from trt_runtime.serve.replica import CallModes, call_modes

    options = ServeOptions(backend="memory", runtime_cache=None, max_batch=max_batch, outer_graph="auto",
                           pad_batches="auto", warmup=False)
    engine, _ = open_engine(source(), options)  # type: ignore[operator]
    try:
        assert (engine.outer_graph is not None) is graph  # type: ignore[attr-defined]
        # (the outer graph's "copy" mode returns new arrays: nothing to copy again)
        assert call_modes(engine, options) == CallModes(graph, graph, copy_outputs=False)
        never = ServeOptions(backend="memory", pad_batches=False, max_batch=max_batch)
        assert call_modes(engine, never).pad_batches is False
        if graph:  # the warm-up ran (made by "auto" even with warmup=False) and captured its graph
            assert engine.graph_captures >= 1  # type: ignore[attr-defined]
    finally:
        engine.close()


def test_open_engine_auto_runs_eagerly_an_engine_whose_context_cannot_be_captured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trt_runtime.errors import CapabilityError
    from trt_runtime.serve.replica import CallModes, call_modes
    from trt_runtime.testing.memory import MemoryLane

    def refuse(*args: object, **kwargs: object) -> None:
        raise CapabilityError("this context cannot be captured (test)")

    monkeypatch.setattr(MemoryLane, "capture", refuse)
    options = ServeOptions(backend="memory", runtime_cache=None, outer_graph="auto", pad_batches="auto")
    engine, _ = open_engine(single_engine(), options)
    try:
        assert engine.outer_graph is None  # type: ignore[attr-defined]
        assert call_modes(engine, options) == CallModes(False, False, False)
        x = np.full((3, 4), 0.5, np.float32)
        np.testing.assert_array_equal(engine.execute(x)[0], reference(x))
    finally:
        engine.close()
    with pytest.raises(CapabilityError, match="cannot be captured"):  # asked for, not left to "auto"
        open_engine(single_engine(), ServeOptions(backend="memory", runtime_cache=None, outer_graph=True))


def test_call_modes_copy_outputs_only_of_an_outer_graph_in_view_mode() -> None:
    """Views of the graph's static buffers are overwritten by the next call: a batcher copies them."""
    from trt_runtime.serve.replica import CallModes, call_modes

    options = ServeOptions(backend="memory", runtime_cache=None, outer_graph="view", pad_batches=True)
    engine, _ = open_engine(single_engine(), options)
    try:
        assert call_modes(engine, options) == CallModes(True, True, copy_outputs=True)
    finally:
        engine.close()


def test_serve_options_take_auto_and_refuse_other_words() -> None:
    options = ServeOptions(outer_graph="auto", pad_batches="auto")
    assert (options.outer_graph, options.pad_batches) == ("auto", "auto")
    with pytest.raises(ValueError, match="pad_batches must be True, False or 'auto'; got 'sometimes'"):
        ServeOptions(pad_batches="sometimes")
    with pytest.raises((TypeError, ValueError), match="fast"):
        ServeOptions(outer_graph="fast")
