"""``BackendConformance``: the pytest suite every trt-runtime backend must pass.

Subclass it in a test module and provide the fixtures; every ``test_*`` method below
then runs against your backend::

    import numpy as np
    import pytest
    from trt_runtime import EngineSource
    from trt_runtime.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        @pytest.fixture
        def backend(self):
            return MyBackend()

        @pytest.fixture
        def engine_source(self):
            return EngineSource(build_affine_engine(scale=2.0, bias=1.0))

        @pytest.fixture
        def make_inputs(self):
            return lambda rng: [rng.standard_normal((2, 4), dtype=np.float32)]

        @pytest.fixture
        def reference(self):
            return lambda inputs: [2.0 * np.asarray(inputs[0]) + 1.0]

Tests that need a capability skip with a reason naming it when the backend lacks it;
the ``*_refused`` tests check the opposite side. The device contract
(docs/device-contract.md) is checked for every array kind the ``input_kinds`` fixture
gives (numpy, CPU and CUDA torch tensors, other CUDA arrays; each kind whose library or
device is missing here skips with the reason). Override the hooks
(:meth:`~.ConformanceBase.as_backend_input`, :meth:`~.ConformanceBase.output_to_numpy`,
:meth:`~.ConformanceBase.allocate_output`) when the backend's tensors are none of these,
the class attributes ``preallocated_output_kinds`` / ``static_output_kinds`` /
``host_staging_logged`` when the backend has no device, and ``state_machine_settings``
to run fewer examples on slow hardware.

The tests live in four classes: the device contract in
:class:`~.conformance_contract.DeviceContractTests`, the outer CUDA-graph wrap in
:class:`~.conformance_graphs.OuterGraphTests`, many concurrent callers in
:class:`~.conformance_concurrency.ConcurrencyTests`, and loading, settings, contexts, caches
and the state machine here.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from trt_runtime.contexts import enable_cudagraphs, runtime_config
from trt_runtime.dtypes import DTYPE_NAMES, normalize_dtype
from trt_runtime.errors import CapabilityError
from trt_runtime.protocols import Backend, Engine, EngineSource, TensorSpec
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
)
from trt_runtime.testing.conformance_concurrency import ConcurrencyTests
from trt_runtime.testing.conformance_contract import DeviceContractTests
from trt_runtime.testing.conformance_graphs import OuterGraphTests
from trt_runtime.testing.stateful import BackendHarness, BackendStateMachine

__all__ = ["BackendConformance"]


class BackendConformance(DeviceContractTests, OuterGraphTests, ConcurrencyTests):
    """Base class of a backend's conformance tests.

    Abstract fixtures (a subclass must define them): ``backend``, ``engine_source``,
    ``make_inputs`` (``rng -> list of inputs`` in the backend's tensor type, from a
    ``numpy.random.Generator``) and ``reference`` (``inputs -> expected outputs``).
    ``tolerance`` returns ``(rtol, atol)`` from the class attributes ``rtol`` and
    ``atol`` unless overridden; ``input_kinds`` returns the converters of every array
    kind the backend takes (see :class:`~.conformance_base.ConformanceBase`). The
    engine's inputs must have static shapes or optimization profiles, and ``make_inputs``
    must return shapes inside them.
    """

    # -- loading and metadata -------------------------------------------------------------------
    def test_backend_is_available(self, backend: Backend) -> None:
        availability = backend.is_available()
        assert availability, f"backend {backend.name!r} is not available: {availability.reason}"
        assert isinstance(backend.name, str) and backend.name

    def test_engine_loads_and_runs(self, engine: Engine, harness: BackendHarness) -> None:
        assert engine.backend is harness.backend
        self.run_and_check(engine, harness)

    def test_engine_io_metadata(self, engine: Engine, harness: BackendHarness) -> None:
        import numpy as np

        specs = [*engine.inputs, *engine.outputs]
        assert engine.inputs and engine.outputs
        assert all(isinstance(s, TensorSpec) for s in specs)
        assert all(s.is_input for s in engine.inputs)
        assert not any(s.is_input for s in engine.outputs)
        names = [s.name for s in specs]
        assert len(names) == len(set(names)), f"tensor names repeat: {names}"
        assert all(s.dtype in DTYPE_NAMES for s in specs), [s.dtype for s in specs]
        assert engine.has_data_dependent_outputs == any(s.data_dependent for s in engine.outputs)
        inputs = list(harness.make_inputs(np.random.default_rng(1)))
        assert len(inputs) == len(engine.inputs)
        outputs = engine.execute(*inputs)
        assert len(outputs) == len(engine.outputs)
        for spec, value in zip(engine.outputs, outputs, strict=True):
            array = self.output_to_numpy(value)
            assert normalize_dtype(str(array.dtype)) == spec.dtype, spec.name
            if not spec.data_dependent:
                assert array.ndim == len(spec.shape), spec.name
                assert all(d < 0 or d == s for d, s in zip(spec.shape, array.shape, strict=True)), spec.name

    # -- settings and contexts ------------------------------------------------------------------
    def test_settings_round_trip_on_engine(self, backend: Backend, engine: Engine) -> None:
        caps = backend.capabilities
        graphs = (
            list(CudaGraphStrategy) if caps.supports_cuda_graph_strategy else [CudaGraphStrategy.DISABLED]
        )
        shapes = (
            list(DynamicShapesKernelSpecializationStrategy)
            if caps.supports_dynamic_shapes_kernel_specialization_strategy
            else [DynamicShapesKernelSpecializationStrategy.LAZY]
        )
        for graph in graphs:
            for shape in shapes:
                wanted = RuntimeSettings(graph, shape)
                engine.runtime_settings = wanted
                got = engine.runtime_settings
                assert got == wanted
                assert RuntimeSettings.from_dict(got.to_dict()) == wanted
                assert RuntimeSettings.from_codes(*got.to_codes()) == wanted

    def test_context_is_lazy_and_counted(self, engine: Engine, harness: BackendHarness) -> None:
        assert not engine.has_context() and engine.context_creations == 0
        self.run_and_check(engine, harness, seed=1)
        assert engine.has_context() and engine.context_creations == 1
        self.run_and_check(engine, harness, seed=2)
        assert engine.context_creations == 1
        engine.runtime_settings = RuntimeSettings.coerce(engine.runtime_settings.to_dict())
        assert engine.has_context(), "setting equal settings must keep the context"
        engine.invalidate_context()
        assert not engine.has_context() and engine.context_creations == 1
        self.run_and_check(engine, harness, seed=3)
        assert engine.context_creations == 2

    def test_context_recreated_after_settings_change(
        self, backend: Backend, engine: Engine, harness: BackendHarness
    ) -> None:
        overrides = self._settings_variant(backend)
        self.run_and_check(engine, harness, seed=1)
        engine.runtime_settings = engine.runtime_settings.merge(**overrides)
        assert not engine.has_context() and engine.context_creations == 1
        self.run_and_check(engine, harness, seed=2)
        self.run_and_check(engine, harness, seed=3)
        assert engine.context_creations == 2
        engine.runtime_settings = RuntimeSettings()
        assert not engine.has_context()
        self.run_and_check(engine, harness, seed=4)
        assert engine.context_creations == 3

    def test_runtime_config_outside_enable_cudagraphs_creates_one_context(
        self, backend: Backend, engine: Engine, harness: BackendHarness
    ) -> None:
        self._skip_unless(backend, "supports_cuda_graph_strategy")
        self._skip_unless(backend, "supports_dynamic_shapes_kernel_specialization_strategy")
        self.run_and_check(engine, harness)
        before = engine.runtime_settings
        with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
            with enable_cudagraphs(engine):
                for seed in range(3):
                    self.run_and_check(engine, harness, seed)
                assert engine.runtime_settings.cuda_graph_strategy is CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
                assert engine.context_creations == 2
            assert engine.runtime_settings.cuda_graph_strategy is CudaGraphStrategy.DISABLED
            assert not engine.has_context()
        assert engine.runtime_settings == before
        self.run_and_check(engine, harness)
        assert engine.context_creations == 3

    def test_enable_cudagraphs_outside_runtime_config_inner_wins(
        self, backend: Backend, engine: Engine, harness: BackendHarness
    ) -> None:
        self._skip_unless(backend, "supports_cuda_graph_strategy")
        with enable_cudagraphs(engine):
            with runtime_config(engine, cuda_graph_strategy="disabled"):
                self.run_and_check(engine, harness)
                assert engine.runtime_settings.cuda_graph_strategy is CudaGraphStrategy.DISABLED
            self.run_and_check(engine, harness)
            assert engine.runtime_settings.cuda_graph_strategy is CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
            # Same value inside: no settings change, the context survives the inner block.
            with enable_cudagraphs(engine):
                self.run_and_check(engine, harness)
            assert engine.has_context()
        assert engine.context_creations == 2

    def test_settings_restored_when_block_raises(self, backend: Backend, engine: Engine) -> None:
        overrides = self._settings_variant(backend)
        before = engine.runtime_settings
        with pytest.raises(RuntimeError, match="boom"), runtime_config(engine, **overrides):
            assert engine.runtime_settings == before.merge(**overrides)
            raise RuntimeError("boom")
        assert engine.runtime_settings == before

    def test_capability_missing_refused(self, backend: Backend, engine: Engine) -> None:
        from trt_runtime.cache import RuntimeCache

        cases: list[tuple[str, dict[str, Any]]] = [
            ("supports_cuda_graph_strategy", {"cuda_graph_strategy": "whole_graph_capture"}),
            ("supports_dynamic_shapes_kernel_specialization_strategy",
             {"dynamic_shapes_kernel_specialization_strategy": "eager"}),
            ("supports_runtime_cache", {"runtime_cache": RuntimeCache()}),
        ]
        missing = [(cap, o) for cap, o in cases if not getattr(backend.capabilities, cap)]
        if not missing:
            pytest.skip(f"backend {backend.name!r} has every settings capability")
        before = engine.runtime_settings
        for capability, overrides in missing:
            with pytest.raises(CapabilityError, match=capability.removeprefix("supports_")):
                engine.runtime_settings = before.merge(**overrides)
            with pytest.raises(CapabilityError), runtime_config(engine, **overrides):
                pass
            assert engine.runtime_settings == before

    # -- runtime caches ------------------------------------------------------------------------
    def test_cache_pending_then_drained_once(
        self, backend: Backend, engine_source: EngineSource, engine: Engine, harness: BackendHarness
    ) -> None:
        self._skip_unless(backend, "supports_runtime_cache")
        from trt_runtime.cache import RuntimeCache

        first = RuntimeCache()
        engine.runtime_settings = engine.runtime_settings.merge(runtime_cache=first)
        assert not first.has_cache()
        self.run_and_check(engine, harness)
        assert first.has_cache(), "executing with a cache must materialize it"
        payload = bytes(first.serialize())
        assert payload, "a materialized cache must serialize to some bytes"

        second = RuntimeCache()
        second.load_bytes(payload)
        assert second.has_pending and not second.has_cache()
        assert bytes(second.serialize()) == payload, "serialize() before materialization returns pending"
        assert second.drain_count == 0
        engine.runtime_settings = engine.runtime_settings.merge(runtime_cache=second)
        other = backend.load_engine(engine_source, settings=engine.runtime_settings)
        try:
            self.run_and_check(engine, harness, seed=1)
            assert second.has_cache() and not second.has_pending
            assert second.drain_count == 1
            engine.invalidate_context()
            self.run_and_check(engine, harness, seed=2)
            self.run_and_check(other, harness, seed=3)  # a second engine sharing the cache
            assert second.drain_count == 1, "pending bytes must be drained exactly once"
            assert other.context_creations == 1
        finally:
            other.close()

    # -- the state machine -------------------------------------------------------------------------
    def test_state_machine(self, harness: BackendHarness) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            run_state_machine_as_test(
                lambda: BackendStateMachine(harness),  # type: ignore[arg-type,return-value]
                settings=self.state_machine_settings,
            )
