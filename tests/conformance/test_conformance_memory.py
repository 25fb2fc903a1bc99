"""The conformance suite run against the in-memory backend, and proof that it catches
backends that break the device contract or the outer CUDA-graph rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trt_runtime import (
    CapabilityError,
    EngineSource,
    InputError,
    RuntimeCache,
    TensorSpec,
    enable_cudagraphs,
)
from trt_runtime.testing import array_kinds
from trt_runtime.testing.conformance import BackendConformance
from trt_runtime.testing.memory import AffineOutput, MemoryBackend, MemoryEngine, MemoryLane

pytest_plugins = ["pytester"]

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
#: The same engine without its data-dependent output: the outer graph can wrap it.
STATIC_OUT = MemoryBackend.build_engine(
    [
        TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),)),
        TensorSpec("b", "int32", (3,), True),
    ],
    [
        AffineOutput("y", "x", scale=2.0, bias=1.0),
        AffineOutput("z", "b", scale=-0.5, bias=3.0, dtype="float32"),
    ],
    name="affine_static",
)


class _MemoryConformance(BackendConformance):
    # The memory backend has no device: outputs= and the outer graph's static buffers are
    # numpy arrays, and host inputs are used where they are (nothing is staged).
    preallocated_output_kinds = (array_kinds.NUMPY,)
    static_output_kinds = (array_kinds.NUMPY,)
    host_staging_logged = False

    @pytest.fixture
    def engine_source(self):
        return EngineSource(ENGINE)

    @pytest.fixture
    def input_kinds(self):
        # numpy is the backend's only array kind: it takes no torch tensors by design.
        return {array_kinds.NUMPY: array_kinds.converter(array_kinds.NUMPY)}

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


class _StaticConformance(_MemoryConformance):
    """The engine without a data-dependent output: every outer-graph test runs."""

    @pytest.fixture
    def engine_source(self):
        return EngineSource(STATIC_OUT)

    @pytest.fixture
    def reference(self):
        return lambda inputs: [2 * inputs[0] + 1, 3.0 - inputs[1] / 2]


class TestMemoryReplace(_MemoryConformance):
    @pytest.fixture
    def backend(self):
        return MemoryBackend(cache_merges=False)


class TestMemoryMerge(_MemoryConformance):
    @pytest.fixture
    def backend(self):
        return MemoryBackend(cache_merges=True)


class TestMemoryReduced(_MemoryConformance):
    """No cache, no CUDA graphs, no outputs=: the suite's preconditions and refusals."""

    @pytest.fixture
    def backend(self):
        return MemoryBackend(
            without=(
                "supports_runtime_cache",
                "supports_cuda_graph_strategy",
                "supports_preallocated_outputs",
                "supports_outer_cuda_graph",
            )
        )


class TestMemoryStatic(_StaticConformance):
    @pytest.fixture
    def backend(self):
        return MemoryBackend()


class TestMemoryStaticReduced(_StaticConformance):
    """The outer graph with only the dynamic-shapes setting to change inside it."""

    @pytest.fixture
    def backend(self):
        return MemoryBackend(without=("supports_runtime_cache", "supports_cuda_graph_strategy"))


# -- the kit catches broken backends -------------------------------------------------------------


class _WrongKindLane(MemoryLane):
    """Right values, wrong kind: lists instead of numpy arrays."""

    def run(self, context, call, stream, outputs=None):
        results = super().run(context, call, stream, outputs)
        return results if outputs is not None else [r.tolist() for r in results]


class _IgnoresOutputsLane(MemoryLane):
    """Returns new arrays and leaves the ``outputs=`` arrays untouched."""

    def run(self, context, call, stream, outputs=None):
        return super().run(context, call, stream, None)


class _StaleReplaysLane(MemoryLane):
    """Replays a graph without copying the new inputs into its static buffers."""

    def copy(self, dst, src, nbytes, stream):
        captured = [s for s in self.lane.outer_graphs.cache.values() if s.graph is not None]
        if not any(dst is s.inputs[0] for s in captured):
            super().copy(dst, src, nbytes, stream)


class _RecapturesLane(MemoryLane):
    """Captures a new graph on every call (replays nothing)."""

    def graph_call(self, call):
        self.lane.outer_graphs.drop()
        return super().graph_call(call)


class _RemembersBindingsLane(MemoryLane):
    """Remembers each call's results by the identities of its arrays (a stale fast path)."""

    def run(self, context, call, stream, outputs=None):
        memo = self.engine.__dict__.setdefault("memo", {})
        key = tuple(map(id, call)) + tuple(map(id, outputs or ()))
        if key not in memo:
            memo[key] = [r.copy() for r in super().run(context, call, stream, outputs)]
        if outputs is None:
            return [r.copy() for r in memo[key]]
        for given, result in zip(outputs, memo[key], strict=True):
            np.copyto(given, result)
        return list(outputs)


def _with_lanes(lane_type: type[MemoryLane]) -> type[MemoryEngine]:
    """A memory engine whose lanes are ``lane_type``."""
    return type(lane_type.__name__.removesuffix("Lane"), (MemoryEngine,), {"lane_type": lane_type})


_WrongKind = _with_lanes(_WrongKindLane)
_IgnoresOutputs = _with_lanes(_IgnoresOutputsLane)
_StaleReplays = _with_lanes(_StaleReplaysLane)
_Recaptures = _with_lanes(_RecapturesLane)
_RemembersBindings = _with_lanes(_RemembersBindingsLane)


class _ConvertsDtype(MemoryEngine):
    """Silently converts inputs of the wrong dtype."""

    def validate(self, inputs):
        fixed = [np.asarray(x).astype(s.dtype) for s, x in zip(self._inputs, inputs, strict=False)]
        return super().validate(fixed + list(inputs[len(fixed) :]))


class _Racy(MemoryEngine):
    """Not thread-safe: keeps a call's inputs in one shared slot, outside the lock."""

    def execute(self, *inputs, stream=None, outputs=None):
        import time

        self.validate(inputs)
        self.shared = list(inputs)
        time.sleep(0.001)
        return self.compute(self.shared)


BROKEN = {
    "wrong_kind": _WrongKind,
    "ignores_outputs": _IgnoresOutputs,
    "stale_replays": _StaleReplays,
    "recaptures": _Recaptures,
    "remembers_bindings": _RemembersBindings,
    "converts_dtype": _ConvertsDtype,
    "racy": _Racy,
    "correct": MemoryEngine,
}


def broken_backend(name: str, table: dict | None = None) -> MemoryBackend:
    """A memory backend whose engines are ``(table or BROKEN)[name]``."""
    backend = MemoryBackend()
    backend.engine_class = (BROKEN if table is None else table)[name]
    return backend


def _run_kit(pytester, broken: str, select: str, module: str = "test_conformance_memory"):
    """Run the kit's tests matching ``select`` against ``module.broken_backend(broken)``."""
    pytester.syspathinsert(Path(__file__).resolve().parents[1])
    pytester.makepyfile(
        test_broken=f"""
import pytest
from hypothesis import HealthCheck, Phase, settings
from test_conformance_memory import _StaticConformance
from {module} import broken_backend


class TestBroken(_StaticConformance):
    # Enough to find each break; no shrinking (the failure, not its minimal form, is the point).
    state_machine_settings = settings(
        max_examples=60, stateful_step_count=20, deadline=None, database=None, derandomize=True,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
    )

    @pytest.fixture
    def backend(self):
        return broken_backend({broken!r})
"""
    )
    return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "-k", select)


@pytest.mark.parametrize(
    ("broken", "select", "message"),
    [
        ("wrong_kind", "test_output_kind_follows_input", "*inputs of kind 'numpy' must give outputs*"),
        ("wrong_kind", "test_state_machine", "*must give outputs of kind 'numpy'*"),
        (
            "ignores_outputs",
            "test_preallocated_outputs_written_and_returned",
            "*not returned as the array given*",
        ),
        (
            "remembers_bindings",
            "test_preallocated_outputs_written_and_returned",
            "*differs from the reference*",
        ),
        ("stale_replays", "test_outer_graph_equals_eager", "*differs from the reference*"),
        ("stale_replays", "test_outer_graph_output_modes", "*differs from the reference*"),
        ("recaptures", "test_outer_graph_equals_eager", "*a replay is not a capture*"),
        ("recaptures", "test_state_machine", "*the model expects*one per input shapes and context*"),
        ("converts_dtype", "test_bad_input_dtype_rejected", "*DID NOT RAISE*"),
        ("racy", "test_threads_share_one_engine and not outer", "*threads got wrong results or errors*"),
    ],
)
def test_conformance_memory_kit_catches_broken_backend(pytester, broken, select, message):
    assert_kit_fails(_run_kit(pytester, broken, select), message)


def assert_kit_fails(result, message: str) -> None:
    """At least one test of a pytester ``result`` failed, with ``message`` in the output."""
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([message])


def test_conformance_memory_kit_passes_the_unbroken_engine(pytester):
    select = (
        "test_output_kind or test_preallocated or test_outer_graph or test_bad_input_dtype "
        "or (test_threads_share_one_engine and not outer)"
    )
    result = _run_kit(pytester, "correct", select)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 8, result.stdout.str()[-3000:]


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
    assert engine.created_contexts[0].config.runtime_cache is engine.created_contexts[1].config.runtime_cache


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
    assert engine.created_contexts[0].destroyed and not engine.created_contexts[1].destroyed
    assert engine.current_context.config.cuda_graph_strategy == "whole_graph_capture"


def test_conformance_memory_outer_graph_simulation():
    engine = MemoryBackend().load_engine(EngineSource(STATIC_OUT))
    x, b = np.ones((2, 4), np.float32), np.arange(3, dtype=np.int32)
    with enable_cudagraphs(engine, outer="view"):
        y1, z1 = engine.execute(x, b)
        (slot,) = engine._lanes[0].outer_graphs.cache.values()
        graph = slot.graph
        assert graph.context is engine.current_context and graph.replays == 0
        assert y1 is slot.outputs[0] and z1 is slot.outputs[1]
        y2, _ = engine.execute(x * 3, b)
        assert y2 is y1 and graph.replays == 1
        np.testing.assert_allclose(y1, 2 * (x * 3) + 1)  # the static buffer was overwritten
        # The static input buffers themselves skip the copy and are read as they are.
        slot.inputs[0][:] = 5
        (y3, _) = engine.execute(*slot.inputs)
        np.testing.assert_allclose(y3, np.full((2, 4), 11.0))
        assert engine.current_context.captures == 1 and engine.graph_captures == 1
    assert len(engine._lanes[0].outer_graphs) == 0 and graph.destroyed and engine.outer_graph is None
    assert engine.context_creations == 1


def test_conformance_memory_outer_graph_refusals():
    with pytest.raises(CapabilityError, match=r"\['positive'\] have data-dependent shapes"):
        MemoryBackend().load_engine(EngineSource(ENGINE)).outer_graph = True
    reduced = MemoryBackend(without=("supports_outer_cuda_graph",))
    engine = reduced.load_engine(EngineSource(STATIC_OUT))
    with pytest.raises(CapabilityError, match="outer_cuda_graph: turned off in MemoryBackend"):
        engine.outer_graph = "copy"


def test_conformance_memory_preallocated_outputs():
    engine = MemoryBackend().load_engine(EngineSource(STATIC_OUT))
    x, b = np.ones((2, 4), np.float32), np.arange(3, dtype=np.int32)
    y, z = np.empty((2, 4), np.float32), np.empty(3, np.float32)
    got = engine.execute(x, b, outputs=[y, z])
    assert got[0] is y and got[1] is z
    np.testing.assert_allclose(y, 3.0)
    cases = [
        ([y], r"has 2 output\(s\) \['y', 'z'\]; outputs= has 1"),
        ([y.astype(np.float64), z], "'y' .* must have dtype float32; got float64"),
        ([np.empty((3, 4), np.float32), z], r"'y' .* must have shape \[2, 4\]; got \[3, 4\]"),
        ([y.tolist(), z], "outputs= must hold numpy arrays .* 'y' .* is list"),
        ([np.empty((4, 2), np.float32).T, z], "'y' .* C-contiguous, writeable"),
    ]
    for outputs, message in cases:
        with pytest.raises(InputError, match=message):
            engine.execute(x, b, outputs=outputs)
    dd = MemoryBackend().load_engine(EngineSource(ENGINE))
    with pytest.raises(InputError, match=r"'positive' .* data-dependent shape"):
        dd.execute(x, b, outputs=[y, z, np.empty(8, np.float32)])


def test_conformance_memory_without_host_io_refuses_numpy():
    engine = MemoryBackend(without=("supports_host_io",)).load_engine(EngineSource(STATIC_OUT))
    with pytest.raises(InputError, match=r"'x' .* without supports_host_io"):
        engine.execute(np.ones((1, 4), np.float32), np.zeros(3, np.int32))
    assert not engine.has_context()


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
        ([np.ones((1, 8), np.float32)[:, ::2], np.zeros(3, np.int32)], "'x' .* not C-contiguous"),
    ],
)
def test_conformance_memory_bad_inputs_named(inputs, message):
    engine = MemoryBackend().load_engine(EngineSource(ENGINE))
    with pytest.raises(InputError, match=message):
        engine.execute(*inputs)
    assert engine.runs == 0 and not engine.has_context()


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
