"""The pure-Python reference model, on its own and replayed against the memory backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trt_runtime import (
    BackendCapabilities,
    CapabilityError,
    CudaGraphStrategy,
    EngineSource,
    RuntimeCache,
    RuntimeSettings,
    TensorSpec,
    enable_cudagraphs,
    runtime_config,
)
from trt_runtime.testing import strategies as tst
from trt_runtime.testing.memory import AffineOutput, MemoryBackend
from trt_runtime.testing.model import CacheModel, EngineModel, missing_capability

FULL = MemoryBackend().capabilities
NONE = BackendCapabilities()
ENGINE = MemoryBackend.build_engine([TensorSpec("x", "float32", (3,), True)], [AffineOutput("y", "x", 2.0)])
X = np.ones(3, np.float32)


def test_reference_model_context_is_lazy_and_counted():
    m = EngineModel(FULL)
    assert (m.has_context, m.context_creations) == (False, 0)
    m.execute()
    m.execute()
    assert (m.has_context, m.context_creations) == (True, 1)
    m.invalidate_context()
    assert not m.has_context
    m.execute()
    assert m.context_creations == 2


def test_reference_model_equal_settings_are_a_no_op():
    m = EngineModel(FULL)
    m.execute()
    assert m.set_settings({"cuda_graph_strategy": "disabled"})
    assert m.has_context
    assert m.set_settings({"cuda_graph_strategy": "whole_graph_capture"})
    assert not m.has_context


def test_reference_model_refuses_missing_capabilities():
    m = EngineModel(NONE)
    m.execute()
    assert m.refusal({"cuda_graph_strategy": 1}) == "supports_cuda_graph_strategy"
    eager = {"dynamic_shapes_kernel_specialization_strategy": "none"}
    assert m.refusal(eager) == "supports_dynamic_shapes_kernel_specialization_strategy"
    assert m.refusal({"runtime_cache": "c.bin"}) == "supports_runtime_cache"
    assert not m.set_settings({"cuda_graph_strategy": 1})
    assert not m.enter_cudagraphs()
    assert m.depth == 0 and m.has_context and m.settings == RuntimeSettings()


def test_reference_model_missing_capability_order():
    both = RuntimeSettings("whole_graph_capture", "eager")
    assert missing_capability(both, NONE) == "supports_cuda_graph_strategy"
    only_graphs = BackendCapabilities(supports_cuda_graph_strategy=True)
    assert missing_capability(both, only_graphs) == "supports_dynamic_shapes_kernel_specialization_strategy"
    assert missing_capability(both, FULL) is None


def test_reference_model_nesting_runtime_config_outside_cudagraphs():
    m = EngineModel(FULL)
    assert m.enter_config(dynamic_shapes_kernel_specialization_strategy="eager")
    assert m.enter_cudagraphs()
    for _ in range(3):
        m.execute()
    assert m.context_creations == 1 and m.depth == 2
    m.exit_config()
    assert m.settings == RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")
    m.exit_config()
    assert m.settings == RuntimeSettings() and not m.has_context
    with pytest.raises(IndexError, match="no runtime_config block is open"):
        m.exit_config()


def test_reference_model_inner_same_value_keeps_context():
    m = EngineModel(FULL)
    m.enter_cudagraphs()
    m.execute()
    m.enter_config(cuda_graph_strategy=CudaGraphStrategy.WHOLE_GRAPH_CAPTURE)
    m.execute()
    m.exit_config()
    m.execute()
    assert m.context_creations == 1


def test_reference_model_cache_drains_once():
    c = CacheModel(pending=b"abc")
    assert c.has_pending and not c.has_cache() and c.expected_serialize() == b"abc"
    c.materialize()
    c.materialize()
    assert c.drain_count == 1 and not c.has_pending and c.has_cache()
    assert c.expected_serialize() is None
    with pytest.raises(ValueError, match="before materialization"):
        c.load_bytes(b"x")


def test_reference_model_empty_cache_does_not_drain():
    c = CacheModel()
    c.materialize()
    assert c.drain_count == 0 and c.has_cache()


def test_reference_model_cache_materialized_by_execute():
    m = EngineModel(FULL)
    cache = RuntimeCache()
    model = m.track_cache(cache, b"payload")
    m.set_settings({"runtime_cache": cache})
    assert not model.materialized
    m.execute()
    assert model.materialized and model.drain_count == 1
    assert m.cache(cache) is model
    with pytest.raises(KeyError, match="not tracked"):
        m.cache(RuntimeCache())


# -- the model agrees with a real engine --------------------------------------------------------


def _replay(capabilities_off, ops):
    backend = MemoryBackend(without=capabilities_off)
    engine = backend.load_engine(EngineSource(ENGINE))
    model = EngineModel(backend.capabilities)
    stack = []
    for op in ops:
        if op.kind == "set":
            accepted = model.set_settings(op.arg)
            if accepted:
                engine.runtime_settings = op.arg
            else:
                with pytest.raises(CapabilityError):
                    engine.runtime_settings = op.arg
        elif op.kind in ("enter_config", "enter_cudagraphs"):
            if op.kind == "enter_config":
                accepted = model.enter_config(**op.arg)
                cm = runtime_config(engine, **op.arg)
            else:
                accepted = model.enter_cudagraphs(op.arg)
                cm = enable_cudagraphs(engine, op.arg)
            if accepted:
                cm.__enter__()
                stack.append(cm)
            else:
                with pytest.raises(CapabilityError):
                    cm.__enter__()
        elif op.kind == "exit":
            if not stack:
                continue
            stack.pop().__exit__(None, None, None)
            model.exit_config()
        elif op.kind == "execute":
            np.testing.assert_allclose(engine.execute(X)[0], 2 * X)
            model.execute()
        elif op.kind == "invalidate":
            engine.invalidate_context()
            model.invalidate_context()
        assert engine.runtime_settings == model.settings
        assert engine.has_context() == model.has_context
        assert engine.context_creations == model.context_creations
        assert len(engine.created_contexts) == model.context_creations
    while stack:
        stack.pop().__exit__(None, None, None)
        model.exit_config()
    assert engine.runtime_settings == model.settings


@settings(max_examples=60)
@given(
    off=st.sampled_from([
        (), ("supports_cuda_graph_strategy",), ("supports_dynamic_shapes_kernel_specialization_strategy",),
    ]),
    ops=tst.operations(),
)
def test_reference_model_matches_memory_engine(off, ops):
    _replay(off, ops)


@given(ops=tst.operations(kinds=("enter_config", "enter_cudagraphs", "execute"), max_size=10))
def test_reference_model_one_context_per_settings_change(ops):
    # With no exits and no invalidation: one context at the first execute, and one more at
    # each execute that follows a change of the settings value (even a change and back).
    m = EngineModel(FULL)
    expected, dirty = 0, True
    for op in ops:
        before = m.settings
        if op.kind == "enter_config":
            m.enter_config(**op.arg)
        elif op.kind == "enter_cudagraphs":
            m.enter_cudagraphs(op.arg)
        else:
            expected += dirty
            dirty = False
            m.execute()
        dirty = dirty or m.settings != before
    assert m.context_creations == expected


# -- the outer CUDA-graph wrap -------------------------------------------------------------------


def test_reference_model_outer_graph_captures_once_per_shape_and_context():
    m = EngineModel(FULL)
    m.execute((1,))
    assert m.set_outer_graph(True) and m.context_creations == 1 and m.has_context
    for key in [(1,), (1,), (2,), (1,), (2,)]:
        m.execute(key)
    assert m.graph_captures == 2 and m.context_creations == 1
    m.set_settings({"dynamic_shapes_kernel_specialization_strategy": "eager"})
    assert m.graphs == set() and m.outer_graph is not None
    m.execute((1,))
    assert m.graph_captures == 3 and m.context_creations == 2
    m.invalidate_context()
    m.execute((1,))
    m.reset_graphs()
    m.execute((1,))
    assert m.graph_captures == 5 and m.context_creations == 3


def test_reference_model_outer_graph_toggle_never_touches_the_context():
    m = EngineModel(FULL)
    m.execute((3,))
    m.set_outer_graph("copy")
    m.execute((3,))
    assert m.set_outer_graph(True) and m.graphs == {(3,)}, "an equal value keeps the graphs"
    assert m.set_outer_graph("view") and m.graphs == set()
    assert m.set_outer_graph(None) and m.outer_graph is None
    m.execute((3,))
    assert m.context_creations == 1 and m.graph_captures == 1


def test_reference_model_outer_graph_refusals():
    assert EngineModel(NONE).outer_refusal(True) == "supports_outer_cuda_graph"
    assert EngineModel(FULL, data_dependent=True).outer_refusal("view") == "data_dependent"
    assert EngineModel(NONE).outer_refusal(None) is None
    m = EngineModel(FULL, data_dependent=True)
    m.set_settings({"cuda_graph_strategy": "whole_graph_capture"})
    m.execute()
    assert not m.set_outer_graph(True) and m.outer_graph is None
    # enable_cudagraphs applies its settings, then the wrap is refused and they are restored.
    assert not m.enter_cudagraphs(outer=True)
    assert m.depth == 0 and m.settings.cuda_graph_strategy is CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    assert not m.has_context
    assert not EngineModel(NONE).enter_cudagraphs(outer="copy")


def test_reference_model_enable_cudagraphs_outer_applies_settings_first():
    m = EngineModel(FULL)
    m.set_settings({"cuda_graph_strategy": "whole_graph_capture"})
    m.execute()
    assert m.enter_cudagraphs(outer="view")
    assert m.settings.cuda_graph_strategy is CudaGraphStrategy.DISABLED and not m.has_context
    m.execute((4,))
    assert m.enter_config(dynamic_shapes_kernel_specialization_strategy="eager")
    m.execute((4,))
    m.exit_config()
    m.execute((4,))
    assert (m.context_creations, m.graph_captures) == (4, 3)
    m.exit_config()
    assert m.outer_graph is None and m.graphs == set()
    assert m.settings.cuda_graph_strategy is CudaGraphStrategy.WHOLE_GRAPH_CAPTURE


def _replay_outer(ops):
    backend = MemoryBackend()
    engine = backend.load_engine(EngineSource(DYNAMIC))
    model = EngineModel(backend.capabilities)
    stack = []
    for kind, arg in ops:
        if kind == "enter":
            assert model.enter_cudagraphs(outer=arg)
            cm = enable_cudagraphs(engine, outer=arg)
            cm.__enter__()
            stack.append(cm)
        elif kind == "exit" and stack:
            stack.pop().__exit__(None, None, None)
            model.exit_config()
        elif kind == "settings":
            value = {"dynamic_shapes_kernel_specialization_strategy": arg}
            model.set_settings(value)
            engine.runtime_settings = value
        elif kind == "execute":
            x = np.full(arg, 1.5, np.float32)
            np.testing.assert_allclose(engine.execute(x)[0], 2 * x)
            model.execute(((arg,),))
        elif kind == "reset":
            engine.reset_graphs()
            model.reset_graphs()
        assert engine.graph_captures == model.graph_captures
        assert engine.context_creations == model.context_creations
        assert engine.outer_graph == model.outer_graph
    while stack:
        stack.pop().__exit__(None, None, None)


DYNAMIC = MemoryBackend.build_engine(
    [TensorSpec("x", "float32", (-1,), True, profiles=(((1,), (2,), (4,)),))], [AffineOutput("y", "x", 2.0)]
)


@settings(max_examples=60)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("enter"), st.sampled_from([True, "copy", "view"])),
            st.tuples(st.just("exit"), st.none()),
            st.tuples(st.just("settings"), st.sampled_from(["lazy", "eager"])),
            st.tuples(st.just("execute"), st.integers(1, 4)),
            st.tuples(st.just("reset"), st.none()),
        ),
        max_size=20,
    )
)
def test_reference_model_outer_graph_matches_memory_engine(ops):
    _replay_outer(ops)


def test_reference_model_operations_rejects_unknown_kinds():
    with pytest.raises(ValueError, match=r"unknown operation kind\(s\) \['jump'\]"):
        tst.operations(kinds=("execute", "jump"))
