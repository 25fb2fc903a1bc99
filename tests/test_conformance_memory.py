"""The conformance suite run against the in-memory backend (replace, merge, reduced)."""

from __future__ import annotations

import numpy as np
import pytest

from trt_runtime import EngineSource, RuntimeCache, TensorSpec
from trt_runtime.testing.conformance import BackendConformance
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

ENGINE = MemoryBackend.build_engine(
    [
        TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),)),
        TensorSpec("b", "int32", (3,), True),
    ],
    [
        AffineOutput("y", "x", scale=2.0, bias=1.0),
        AffineOutput("z", "b", scale=-0.5, bias=3.0, dtype="float32"),
        AffineOutput("positive", "x", data_dependent=True),
    ],
    name="affine",
)


class _MemoryConformance(BackendConformance):
    @pytest.fixture
    def engine_source(self):
        return EngineSource(ENGINE)

    @pytest.fixture
    def make_inputs(self):
        def make(rng):
            rows = int(rng.integers(1, 9))
            x = rng.standard_normal((rows, 4)).astype(np.float32)
            b = rng.integers(-100, 100, size=3).astype(np.int32)
            return [x, b]

        return make

    @pytest.fixture
    def reference(self):
        # Written out by hand: not the backend's own code path.
        def ref(inputs):
            x, b = inputs
            return [2 * x + 1, 3.0 - b / 2, x[x > 0]]

        return ref


class TestMemoryReplace(_MemoryConformance):
    @pytest.fixture
    def backend(self):
        return MemoryBackend(cache_merges=False)


class TestMemoryMerge(_MemoryConformance):
    @pytest.fixture
    def backend(self):
        return MemoryBackend(cache_merges=True)


class TestMemoryReduced(_MemoryConformance):
    """No cache, no CUDA graphs: the suite's capability preconditions and refusals."""

    @pytest.fixture
    def backend(self):
        return MemoryBackend(without=("supports_runtime_cache", "supports_cuda_graph_strategy"))


# -- memory-specific behaviour the suite cannot know --------------------------------------


def _run_with(backend, cache, rows):
    engine = backend.load_engine(EngineSource(ENGINE), settings={"runtime_cache": cache})
    engine.execute(np.ones((rows, 4), np.float32), np.zeros(3, np.int32))
    return engine


@pytest.mark.parametrize("merges", [False, True])
def test_conformance_memory_deserialize_semantics(merges):
    backend = MemoryBackend(cache_merges=merges)
    assert backend.capabilities.cache_deserialize_merges is merges
    one, two = RuntimeCache(), RuntimeCache()
    _run_with(backend, one, rows=1)
    _run_with(backend, two, rows=2)
    payload_one = one.serialize()
    # two has an entry for 2 rows; loading one's bytes into it replaces or merges
    two.load_bytes(payload_one)
    after = two.serialize()
    if merges:
        assert b"x=1x4" in after and b"x=2x4" in after
    else:
        assert after == payload_one


def test_conformance_memory_drain_reaches_handle_once():
    backend = MemoryBackend()
    seed = RuntimeCache()
    _run_with(backend, seed, rows=3)
    cache = RuntimeCache()
    cache.load_bytes(seed.serialize())
    engine = _run_with(backend, cache, rows=3)
    engine.invalidate_context()
    engine.execute(np.ones((3, 4), np.float32), np.zeros(3, np.int32))
    handle = backend.handles[-1]
    assert handle.deserialize_calls == 1
    assert handle.materialize_calls == 2
    assert engine.contexts[0].config.runtime_cache is engine.contexts[1].config.runtime_cache


def test_conformance_memory_serialize_changes_after_run():
    backend = MemoryBackend()
    cache = RuntimeCache()
    engine = _run_with(backend, cache, rows=1)
    first = cache.serialize()
    engine.execute(np.ones((5, 4), np.float32), np.zeros(3, np.int32))
    assert cache.serialize() != first
    assert b"x=5x4" in cache.serialize()


def test_conformance_memory_context_records_settings():
    backend = MemoryBackend()
    engine = backend.load_engine(EngineSource(ENGINE))
    x, b = np.ones((1, 4), np.float32), np.zeros(3, np.int32)
    engine.execute(x, b)
    engine.runtime_settings = {"cuda_graph_strategy": "whole_graph_capture"}
    engine.execute(x, b)
    graphs = [str(s.cuda_graph_strategy) for s in engine.context_settings]
    assert graphs == ["disabled", "whole_graph_capture"]
    assert engine.contexts[0].destroyed and not engine.contexts[1].destroyed
    assert engine.current_context.config.cuda_graph_strategy == "whole_graph_capture"


# -- the memory engine format and input validation --------------------------------------------


def _doc_bytes(doc) -> bytes:
    import json

    return b"TRTMEM1\0" + json.dumps(doc).encode()


GOOD_DOC = {
    "name": "e",
    "inputs": [{"name": "x", "dtype": "float32", "shape": [2]}],
    "outputs": [{"name": "y", "input": "x"}],
}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "expected magic"),
        (b"PLANxxxxxxxx", "not a memory engine"),
        (b"TRTMEM1\0{", "JSON is malformed"),
        (_doc_bytes([1]), "must be an object"),
        (_doc_bytes({**GOOD_DOC, "name": ""}), "'name' must be a non-empty string"),
        (_doc_bytes({**GOOD_DOC, "inputs": []}), "at least one input"),
        (_doc_bytes({**GOOD_DOC, "inputs": [{"name": "x", "dtype": "float99", "shape": [2]}]}), "float99"),
        (
            _doc_bytes({**GOOD_DOC, "inputs": [{"name": "x", "dtype": "int8", "shape": [-1]}]}),
            "no optimization",
        ),
        (_doc_bytes({**GOOD_DOC, "inputs": [{"name": "x", "dtype": "int8", "shape": [-2]}]}), ">= -1"),
        (_doc_bytes({**GOOD_DOC, "outputs": [{"name": "y", "input": "w"}]}), r"reads input 'w'.*\['x'\]"),
        (_doc_bytes({**GOOD_DOC, "outputs": [{"name": "x", "input": "x"}]}), r"repeated: \['x'\]"),
        (_doc_bytes({**GOOD_DOC, "outputs": [{"name": "y", "input": "x", "scale": "2"}]}), "scale must be"),
        (
            _doc_bytes(
                {
                    **GOOD_DOC,
                    "inputs": [{"name": "x", "dtype": "int8", "shape": [-1], "profiles": [[[4], [2], [8]]]}],
                }
            ),
            "min <= opt <= max",
        ),
    ],
)
def test_conformance_memory_malformed_engine_rejected(data, message):
    from trt_runtime import FormatError

    with pytest.raises(FormatError, match=message):
        MemoryBackend().load_engine(EngineSource(data))


def test_conformance_memory_build_engine_refuses_bad_specs():
    from trt_runtime import FormatError

    with pytest.raises(FormatError, match="reads input 'nope'"):
        MemoryBackend.build_engine([TensorSpec("x", "float32", (1,), True)], [AffineOutput("y", "nope")])


def test_conformance_memory_engine_metadata_and_device():
    backend = MemoryBackend()
    engine = backend.load_engine(EngineSource(ENGINE, device_id=3), device=None)
    assert engine.name == "affine" and engine.device == 3
    assert backend.load_engine(EngineSource(ENGINE, device_id=3), device=0).device == 0
    assert [s.name for s in engine.inputs] == ["x", "b"]
    assert [(s.name, s.dtype, s.shape) for s in engine.outputs] == [
        ("y", "float32", (-1, 4)),
        ("z", "float32", (3,)),
        ("positive", "float32", (-1,)),
    ]
    assert engine.has_data_dependent_outputs and engine.data_dependent_outputs == ["positive"]
    assert backend.cache_key(0).to_dict() == {
        "flavour": "memory",
        "version": "1",
        "compute_capability": "0.0",
        "driver": "0",
    }


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([np.ones((1, 4), np.float32)], r"takes 2 input\(s\) \['x', 'b'\]; got 1"),
        ([np.ones((1, 4), np.float64), np.zeros(3, np.int32)], "'x' .* must have dtype float32; got float64"),
        (
            [np.ones((1, 5), np.float32), np.zeros(3, np.int32)],
            r"'x' .* must have shape \[-1, 4\].*got \[1, 5\]",
        ),
        ([np.ones((9, 4), np.float32), np.zeros(3, np.int32)], r"'x' .* outside every optimization profile"),
        ([np.ones((1, 4), np.float32), np.zeros((1, 3), np.int32)], r"'b' .* got \[1, 3\]"),
        ([[1.0, 2.0, 3.0, 4.0], np.zeros(3, np.int32)], "'x' .* must be a numpy array; got list"),
    ],
)
def test_conformance_memory_bad_inputs_named(inputs, message):
    from trt_runtime import InputError

    engine = MemoryBackend().load_engine(EngineSource(ENGINE))
    with pytest.raises(InputError, match=message):
        engine.execute(*inputs)
    assert engine.runs == 0


def test_conformance_memory_cache_handle_rejects_garbage():
    from trt_runtime import CacheWarning

    backend = MemoryBackend()
    cache = RuntimeCache()
    cache.load_bytes(b"not a memory cache")
    engine = backend.load_engine(EngineSource(ENGINE), settings={"runtime_cache": cache})
    with pytest.warns(CacheWarning, match="rejected"):
        engine.execute(np.ones((1, 4), np.float32), np.zeros(3, np.int32))
    handle = backend.handles[-1]
    assert handle.deserialize_calls == 1
    assert handle.deserialize(b"junk") is False
    assert handle.native is not None and list(handle.native.entries) == ["affine|x=1x4,b=3|disabled|lazy"]


def test_conformance_memory_unknown_capability_flag():
    with pytest.raises(ValueError, match=r"unknown capability flag\(s\) \['supports_teleport'\]"):
        MemoryBackend(without=("supports_teleport",))
