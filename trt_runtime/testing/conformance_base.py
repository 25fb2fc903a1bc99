"""What every part of :class:`~trt_runtime.testing.conformance.BackendConformance` shares:
the fixtures a backend's test class provides, the hooks it may override, and helpers.

Split from :mod:`trt_runtime.testing.conformance` so the tests of the device contract
(:mod:`.conformance_contract`) and of the outer CUDA-graph wrap (:mod:`.conformance_graphs`)
each live in a module of their own; a backend's test class only ever subclasses
``BackendConformance``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from trt_runtime.protocols import Backend, Engine, EngineSource
from trt_runtime.testing import array_kinds
from trt_runtime.testing.stateful import BackendHarness, assert_outputs_close

__all__ = ["ConformanceBase"]

_SETTINGS_CAPABILITIES = (
    ("supports_cuda_graph_strategy", {"cuda_graph_strategy": "whole_graph_capture"}),
    ("supports_dynamic_shapes_kernel_specialization_strategy",
     {"dynamic_shapes_kernel_specialization_strategy": "eager"}),
)


class ConformanceBase:
    """Fixtures, hooks and helpers of the conformance suite (see ``BackendConformance``)."""

    #: Relative and absolute tolerance of output comparisons.
    rtol: float = 1e-5
    atol: float = 1e-6
    #: Hypothesis settings of ``test_state_machine`` (lower them on slow devices).
    state_machine_settings: hypothesis_settings = hypothesis_settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    #: Kinds of arrays (see :mod:`.array_kinds`) the backend writes into when they are
    #: passed as ``outputs=``; the first one available here is used. GPU backends take
    #: device arrays whatever the inputs' kind; a backend without a device (the memory
    #: backend) takes numpy arrays.
    preallocated_output_kinds: tuple[str, ...] = (array_kinds.TORCH_CUDA, array_kinds.CUDA_ARRAY)
    #: Kinds whose outputs under ``outer_graph="view"`` *are* the engine's static output
    #: buffers (the same memory every call of a shape). Host outputs of a GPU backend are
    #: copied from the device, so they are new arrays in both modes.
    static_output_kinds: tuple[str, ...] = (array_kinds.TORCH_CUDA, array_kinds.CUDA_ARRAY)
    #: Whether host inputs are staged through device memory with the once-per-engine INFO
    #: log (a backend with no device memory stages nothing).
    host_staging_logged: bool = True
    #: Threads and calls per thread of the threaded tests.
    thread_count: int = 16
    thread_calls: int = 4
    #: Cycles of ``torch.cuda._sleep`` queued on the caller's stream before its input is
    #: written, in the caller-stream test (about 0.1 s on a recent GPU).
    stream_sleep_cycles: int = 200_000_000

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

    # -- concrete fixtures ----------------------------------------------------------------------
    @pytest.fixture
    def tolerance(self) -> tuple[float, float]:
        return (self.rtol, self.atol)

    @pytest.fixture
    def engine(self, backend: Backend, engine_source: EngineSource) -> Any:
        engine = backend.load_engine(engine_source)
        yield engine
        engine.close()

    @pytest.fixture
    def device(self, engine: Engine) -> int:
        """The CUDA device index the engine runs on (0 for a backend without devices)."""
        return self.engine_device(engine)

    @pytest.fixture
    def input_kinds(self, backend: Backend, device: int) -> Mapping[str, Callable[[Any], Any]]:
        """``{kind: numpy array -> input of that kind}`` for every kind the backend takes.

        Default: every kind of :data:`~.array_kinds.ALL_KINDS` that can be made here (torch,
        a CUDA device and cuda-python present), host kinds only with ``supports_host_io``.
        The contract wants all of them; override only for a kind the backend cannot take
        by design (and say why), or to supply another maker of a kind.
        """
        return array_kinds.standard_converters(device, host_io=backend.capabilities.supports_host_io)

    @pytest.fixture
    def harness(
        self,
        backend: Backend,
        engine_source: EngineSource,
        make_inputs: Callable[[Any], Sequence[Any]],
        reference: Callable[[Sequence[Any]], Sequence[Any]],
        tolerance: tuple[float, float],
        input_kinds: Mapping[str, Callable[[Any], Any]],
        device: int,
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
            input_kinds=dict(input_kinds),
            device=device,
            convert_input=self.input_to_numpy,
            allocate_output=self._allocator(backend, device),
            as_backend_input=self.as_backend_input,
        )

    # -- hooks ----------------------------------------------------------------------------------
    def as_backend_input(self, array: Any, like: Any) -> Any:
        """Turn the numpy ``array`` into the backend's input type, modelled on ``like``
        (an input ``make_inputs`` returned). Default: the kind of ``like``."""
        kind = array_kinds.kind_of(like)
        if kind is None or kind == array_kinds.NUMPY:
            return array
        device = array_kinds.device_of(like)
        return array_kinds.converter(kind, 0 if device is None else device)(array)

    def output_to_numpy(self, value: Any) -> Any:
        """A host numpy array of one output (default handles every array kind)."""
        return array_kinds.to_numpy(value)

    def input_to_numpy(self, value: Any) -> Any:
        """A host numpy array of one input ``make_inputs`` returned (default as outputs)."""
        return array_kinds.to_numpy(value)

    def engine_device(self, engine: Engine) -> int:
        """The engine's CUDA device index: its ``device`` attribute (an int or a
        ``torch.device``), else 0."""
        value = getattr(engine, "device", None)
        index = getattr(value, "index", value)
        return 0 if index is None else int(index)

    def allocate_output(self, kind: str, shape: Sequence[int], dtype: str, device: int) -> Any:
        """A new array to pass in ``outputs=`` (default :func:`.array_kinds.empty`)."""
        return array_kinds.empty(kind, shape, dtype, device)

    # -- helpers --------------------------------------------------------------------------------
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

    def check_close(self, harness: BackendHarness, actual: Sequence[Any], expected: Sequence[Any]) -> None:
        """Compare outputs with the expected ones within the harness's tolerance."""
        assert_outputs_close(
            actual, expected, rtol=harness.rtol, atol=harness.atol, convert=self.output_to_numpy
        )

    def _check_kinds(self, engine: Engine, kind: str, outputs: Sequence[Any], expected: Sequence[Any],
                     device: int) -> None:
        """Every output is of ``kind`` (on ``device``), of its spec's dtype and the shape expected."""
        assert len(outputs) == len(engine.outputs), f"got {len(outputs)} outputs for {len(engine.outputs)}"
        for spec, value, want in zip(engine.outputs, outputs, expected, strict=True):
            shape = array_kinds.to_numpy(want).shape
            array_kinds.assert_output(
                kind, value, name=spec.name, dtype=spec.dtype, shape=shape, device=device
            )

    @staticmethod
    def _skip_unless(backend: Backend, capability: str) -> None:
        if not getattr(backend.capabilities, capability):
            pytest.skip(f"backend {backend.name!r} lacks {capability}")

    def _settings_variant(self, backend: Backend, *, graph_strategy: bool = True) -> dict[str, Any]:
        """Overrides that differ from the defaults and that the backend accepts.

        ``graph_strategy=False`` leaves TensorRT-RTX's own CUDA graphs out (for changes
        made under the outer wrap, which holds TensorRT's kernels itself).
        """
        order = _SETTINGS_CAPABILITIES if graph_strategy else _SETTINGS_CAPABILITIES[1:]
        for capability, overrides in order:
            if getattr(backend.capabilities, capability):
                return overrides
        if backend.capabilities.supports_runtime_cache:
            from trt_runtime.cache import RuntimeCache

            return {"runtime_cache": RuntimeCache()}
        pytest.skip(f"backend {backend.name!r} supports no settings but the defaults")

    def _converter(
        self, kind: str, backend: Backend, input_kinds: Mapping[str, Callable[[Any], Any]]
    ) -> Callable[[Any], Any]:
        """The converter of ``kind``, or a skip saying why there is none."""
        convert = input_kinds.get(kind)
        if convert is None:
            reason = array_kinds.unavailable(kind, host_io=backend.capabilities.supports_host_io)
            pytest.skip(reason or f"{type(self).__name__}.input_kinds leaves out {kind!r}")
        return convert

    def _output_kind(self, backend: Backend) -> str | None:
        """The first of :attr:`preallocated_output_kinds` that can be made here."""
        for kind in self.preallocated_output_kinds:
            if array_kinds.unavailable(kind, host_io=backend.capabilities.supports_host_io) is None:
                return kind
        return None

    def _allocator(self, backend: Backend, device: int) -> Callable[[Sequence[int], str], Any] | None:
        """``(shape, dtype) -> array`` for ``outputs=``; ``None`` without the capability or
        when no kind of :attr:`preallocated_output_kinds` can be made here."""
        kind = self._output_kind(backend)
        if kind is None or not backend.capabilities.supports_preallocated_outputs:
            return None
        return lambda shape, dtype: self.allocate_output(kind, shape, dtype, device)

    def _kind_inputs(
        self, harness: BackendHarness, convert: Callable[[Any], Any], seed: int
    ) -> tuple[list[Any], list[Any]]:
        """``(inputs of one kind, expected outputs)`` for the inputs ``make_inputs`` gives for ``seed``."""
        import numpy as np

        original = list(harness.make_inputs(np.random.default_rng(seed)))
        converted = [convert(np.ascontiguousarray(self.input_to_numpy(x))) for x in original]
        return converted, list(harness.reference(original))

    def _shape_seeds(self, harness: BackendHarness, tries: int = 400) -> tuple[int, int, int | None]:
        """Seeds of ``make_inputs``: two giving the same input shapes (different values),
        and a third giving other shapes (``None`` when the engine takes one shape only)."""
        import numpy as np

        keys: list[Any] = []
        same: tuple[int, int] | None = None
        for seed in range(tries):
            inputs = harness.make_inputs(np.random.default_rng(seed))
            key = array_kinds.shape_key([self.input_to_numpy(x) for x in inputs])
            if same is None and key in keys:
                same = (keys.index(key), seed)
            keys.append(key)
            if same is not None:
                other = next((s for s, k in enumerate(keys) if k != keys[same[0]]), None)
                if other is not None or seed >= same[1] + 64:
                    return same[0], same[1], other
        pytest.fail(f"make_inputs gave no two calls with equal input shapes in {tries} seeds")
