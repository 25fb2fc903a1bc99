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
``test_capability_missing_refused`` checks the opposite side. Override the hooks
(:meth:`BackendConformance.as_backend_input`, :meth:`BackendConformance.output_to_numpy`)
when the backend's tensors are not numpy arrays, and ``state_machine_settings`` to run
fewer examples on slow hardware.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis.stateful import run_state_machine_as_test

from trt_runtime.contexts import enable_cudagraphs, runtime_config
from trt_runtime.dtypes import DTYPE_NAMES, normalize_dtype
from trt_runtime.errors import CapabilityError, InputError
from trt_runtime.protocols import Backend, Engine, EngineSource, TensorSpec
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
)
from trt_runtime.testing.stateful import (
    BackendHarness,
    BackendStateMachine,
    assert_outputs_close,
    to_numpy,
)

__all__ = ["BackendConformance"]

_SETTINGS_CAPABILITIES = (
    ("supports_cuda_graph_strategy", {"cuda_graph_strategy": "whole_graph_capture"}),
    ("supports_dynamic_shapes_strategy", {"dynamic_shapes_kernel_specialization_strategy": "eager"}),
)


class BackendConformance:
    """Base class of a backend's conformance tests.

    Abstract fixtures (a subclass must define them): ``backend``, ``engine_source``,
    ``make_inputs`` (``rng -> list of inputs`` in the backend's tensor type, from a
    ``numpy.random.Generator``) and ``reference`` (``inputs -> expected outputs``).
    ``tolerance`` returns ``(rtol, atol)`` from the class attributes ``rtol`` and
    ``atol`` unless overridden. The engine's inputs must have static shapes or
    optimization profiles, and ``make_inputs`` must return shapes inside them.
    """

    #: Relative and absolute tolerance of output comparisons.
    rtol: float = 1e-5
    atol: float = 1e-6
    #: Hypothesis settings of :meth:`test_state_machine` (lower them on slow devices).
    state_machine_settings: hypothesis_settings = hypothesis_settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )

    # -- abstract fixtures ------------------------------------------------------------------
    @pytest.fixture
    def backend(self) -> Backend:
        raise NotImplementedError(f"{type(self).__name__} must define the 'backend' fixture")

    @pytest.fixture
    def engine_source(self) -> EngineSource:
        raise NotImplementedError(f"{type(self).__name__} must define the 'engine_source' fixture")

    @pytest.fixture
    def make_inputs(self) -> Callable[[Any], Sequence[Any]]:
        raise NotImplementedError(f"{type(self).__name__} must define the 'make_inputs' fixture")

    @pytest.fixture
    def reference(self) -> Callable[[Sequence[Any]], Sequence[Any]]:
        raise NotImplementedError(f"{type(self).__name__} must define the 'reference' fixture")

    # -- concrete fixtures and hooks ----------------------------------------------------------
    @pytest.fixture
    def tolerance(self) -> tuple[float, float]:
        return (self.rtol, self.atol)

    @pytest.fixture
    def engine(self, backend: Backend, engine_source: EngineSource) -> Any:
        engine = backend.load_engine(engine_source)
        yield engine
        engine.close()

    @pytest.fixture
    def harness(
        self,
        backend: Backend,
        engine_source: EngineSource,
        make_inputs: Callable[[Any], Sequence[Any]],
        reference: Callable[[Sequence[Any]], Sequence[Any]],
        tolerance: tuple[float, float],
    ) -> BackendHarness:
        rtol, atol = tolerance
        return BackendHarness(
            backend,
            engine_source,
            make_inputs,
            reference,
            rtol=rtol,
            atol=atol,
            convert_output=self.output_to_numpy,
        )

    def as_backend_input(self, array: Any, like: Any) -> Any:
        """Turn the numpy ``array`` into the backend's input type, modelled on ``like``
        (an input ``make_inputs`` returned). Default: unchanged (numpy backends)."""
        return array

    def output_to_numpy(self, value: Any) -> Any:
        """A host numpy array of one output (default handles numpy and torch)."""
        return to_numpy(value)

    def input_to_numpy(self, value: Any) -> Any:
        """A host numpy array of one input ``make_inputs`` returned (default as outputs)."""
        return to_numpy(value)

    def run_and_check(self, engine: Engine, harness: BackendHarness, seed: int = 0) -> None:
        """Execute once with inputs of ``seed`` and compare with the reference."""
        import numpy as np

        inputs = list(harness.make_inputs(np.random.default_rng(seed)))
        assert_outputs_close(
            engine.execute(*inputs),
            harness.reference(inputs),
            rtol=harness.rtol,
            atol=harness.atol,
            convert=self.output_to_numpy,
        )

    @staticmethod
    def _skip_unless(backend: Backend, capability: str) -> None:
        if not getattr(backend.capabilities, capability):
            pytest.skip(f"backend {backend.name!r} lacks {capability}")

    def _settings_variant(self, backend: Backend) -> dict[str, Any]:
        """Overrides that differ from the defaults and that the backend accepts."""
        for capability, overrides in _SETTINGS_CAPABILITIES:
            if getattr(backend.capabilities, capability):
                return overrides
        if backend.capabilities.supports_runtime_cache:
            from trt_runtime.cache import RuntimeCache

            return {"runtime_cache": RuntimeCache()}
        pytest.skip(f"backend {backend.name!r} supports no settings but the defaults")

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
            if caps.supports_dynamic_shapes_strategy
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
        self._skip_unless(backend, "supports_dynamic_shapes_strategy")
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
            ("supports_dynamic_shapes_strategy", {"dynamic_shapes_kernel_specialization_strategy": "eager"}),
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

    # -- inputs ----------------------------------------------------------------------------------
    def _valid_inputs(self, harness: BackendHarness) -> list[Any]:
        import numpy as np

        return list(harness.make_inputs(np.random.default_rng(7)))

    def test_bad_input_count_rejected(self, engine: Engine, harness: BackendHarness) -> None:
        inputs = self._valid_inputs(harness)
        names = [s.name for s in engine.inputs]
        with pytest.raises(InputError, match=re.escape(names[0])):
            engine.execute(*inputs, inputs[0])
        with pytest.raises(InputError, match=re.escape(names[0])):
            engine.execute(*inputs[:-1])
        self.run_and_check(engine, harness)

    def test_bad_input_dtype_rejected(self, engine: Engine, harness: BackendHarness) -> None:
        inputs = self._valid_inputs(harness)
        spec = engine.inputs[0]
        wrong = next(d for d in ("float32", "int32", "float16") if d != spec.dtype)
        array = self.input_to_numpy(inputs[0]).astype(wrong)
        bad = [self.as_backend_input(array, inputs[0]), *inputs[1:]]
        with pytest.raises(InputError, match=re.escape(spec.name)):
            engine.execute(*bad)
        self.run_and_check(engine, harness)

    def test_bad_input_shape_rejected(self, engine: Engine, harness: BackendHarness) -> None:
        import numpy as np

        inputs = self._valid_inputs(harness)
        spec = engine.inputs[0]
        good = self.input_to_numpy(inputs[0])
        shapes: list[tuple[int, ...]] = [(1, *good.shape)]  # wrong rank
        static = [i for i, d in enumerate(spec.shape) if d >= 0]
        if static:
            wrong = list(good.shape)
            wrong[static[0]] += 1
            shapes.append(tuple(wrong))
        elif spec.profiles:  # one past the largest max of every profile
            shapes.append(tuple(max(p[2][i] for p in spec.profiles) + 1 for i in range(len(spec.shape))))
        for bad_shape in shapes:
            array = np.zeros(bad_shape, dtype=good.dtype)
            bad = [self.as_backend_input(array, inputs[0]), *inputs[1:]]
            with pytest.raises(InputError, match=re.escape(spec.name)):
                engine.execute(*bad)
        self.run_and_check(engine, harness)

    # -- the state machine -------------------------------------------------------------------------
    def test_state_machine(self, harness: BackendHarness) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            run_state_machine_as_test(
                lambda: BackendStateMachine(harness),  # type: ignore[arg-type,return-value]
                settings=self.state_machine_settings,
            )
