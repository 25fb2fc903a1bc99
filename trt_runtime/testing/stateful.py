"""A Hypothesis state machine that drives a real backend and the reference model in lockstep.

Use it through :class:`~trt_runtime.testing.conformance.BackendConformance`, or directly::

    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test
    from trt_runtime.testing.stateful import BackendHarness, BackendStateMachine

    harness = BackendHarness(backend, engine_source, make_inputs, reference)
    run_state_machine_as_test(lambda: BackendStateMachine(harness), settings=settings(max_examples=20))

Rules that need a capability carry a ``@precondition`` on ``backend.capabilities``;
settings the backend cannot honour are still tried, and must raise ``CapabilityError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trt_runtime.contexts import enable_cudagraphs, runtime_config
from trt_runtime.errors import CapabilityError
from trt_runtime.protocols import Backend, EngineSource
from trt_runtime.settings import CudaGraphStrategy, RuntimeSettings
from trt_runtime.testing import array_kinds
from trt_runtime.testing import strategies as tst
from trt_runtime.testing.array_kinds import to_numpy
from trt_runtime.testing.model import EngineModel

__all__ = ["BackendHarness", "BackendStateMachine", "to_numpy"]

_DISABLED = CudaGraphStrategy.DISABLED


@dataclasses.dataclass
class BackendHarness:
    """What the machine needs to know about a backend under test.

    ``make_inputs(rng)`` returns valid inputs for the engine of ``engine_source`` (in the
    backend's input type) from a ``numpy.random.Generator``; ``reference(inputs)`` returns
    the expected outputs (anything :func:`to_numpy` accepts). Outputs are compared with
    ``rtol`` / ``atol``.

    ``input_kinds`` (``{kind: numpy array -> input}``, see :mod:`.array_kinds`) lets the
    machine call with every kind the backend takes and check the kind of the outputs on
    ``device``; ``convert_input`` turns an input of ``make_inputs`` into numpy.
    ``allocate_output(shape, dtype)`` makes arrays for ``outputs=`` (``None``: the machine
    does not preallocate). ``as_backend_input(array, like)`` turns a numpy array into an
    input of the type of ``like`` (default: by its array kind).
    """

    backend: Backend
    engine_source: EngineSource
    make_inputs: Callable[[Any], Sequence[Any]]
    reference: Callable[[Sequence[Any]], Sequence[Any]]
    rtol: float = 1e-5
    atol: float = 1e-6
    convert_output: Callable[[Any], Any] = to_numpy
    input_kinds: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
    device: int = 0
    convert_input: Callable[[Any], Any] = to_numpy
    allocate_output: Callable[[Sequence[int], str], Any] | None = None
    as_backend_input: Callable[[Any, Any], Any] | None = None
    _payload: bytes | None = dataclasses.field(default=None, init=False, repr=False)

    def real_cache_payload(self) -> bytes:
        """Bytes of a real ``serialize()`` after one run with a fresh cache (computed once).

        Empty when the backend has no runtime cache.
        """
        if self._payload is None:
            self._payload = b""
            if self.backend.capabilities.supports_runtime_cache:
                import numpy as np

                from trt_runtime.cache import RuntimeCache

                cache = RuntimeCache()
                engine = self.backend.load_engine(
                    self.engine_source, settings=RuntimeSettings(runtime_cache=cache)
                )
                try:
                    engine.execute(*self.make_inputs(np.random.default_rng(0)))
                    engine.synchronize()
                    self._payload = bytes(cache.serialize())
                finally:
                    engine.close()
        return self._payload


def assert_outputs_close(
    actual: Sequence[Any],
    expected: Sequence[Any],
    *,
    rtol: float,
    atol: float,
    convert: Callable[[Any], Any] = to_numpy,
) -> None:
    """Compare outputs one by one, shapes first; the message names the output index."""
    import numpy as np

    assert len(actual) == len(expected), f"got {len(actual)} outputs, expected {len(expected)}"
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        a_np, e_np = convert(a), to_numpy(e)
        assert a_np.shape == e_np.shape, f"output {index}: shape {a_np.shape} != expected {e_np.shape}"
        np.testing.assert_allclose(
            a_np.astype(np.float64),
            e_np.astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"output {index} differs from the reference",
        )


class BackendStateMachine(RuleBasedStateMachine):
    """Settings, context managers, executions and caches on one engine, checked against
    :class:`~trt_runtime.testing.model.EngineModel` after every step."""

    def __init__(self, harness: BackendHarness) -> None:
        super().__init__()
        self.harness = harness
        self.backend = harness.backend
        self.caps = harness.backend.capabilities
        # Any: the machine also uses EngineBase's reset_graphs() and outer_graph spellings.
        self.engine: Any = harness.backend.load_engine(harness.engine_source)
        self.model = EngineModel(self.caps, data_dependent=self.engine.has_data_dependent_outputs)
        #: Open context managers, innermost last.
        self.stack: list[Any] = []
        #: Cache objects attached so far (kept alive so identities stay unique).
        self.caches: list[Any] = []
        #: Seeds of the calls made so far (their shapes are called again by execute_again).
        self.seeds: list[int] = []
        #: Bytes a real ``serialize()`` of this backend returned after materialization.
        self.payloads: list[bytes] = [p for p in [harness.real_cache_payload()] if p]

    # -- helpers --------------------------------------------------------------------------
    def _cache_choices(self) -> list[Any]:
        return [None, *self.caches]

    def _graph_safe(self, settings: RuntimeSettings) -> RuntimeSettings:
        """Under the outer wrap, TensorRT-RTX's own capture stays off (see the model)."""
        if self.model.outer_graph is not None and settings.cuda_graph_strategy is not _DISABLED:
            return settings.merge(cuda_graph_strategy=_DISABLED)
        return settings

    def _apply(self, settings: RuntimeSettings) -> None:
        settings = self._graph_safe(settings)
        missing = self.model.refusal(settings)
        if missing is None:
            self.engine.runtime_settings = settings
            assert self.model.set_settings(settings)
        else:
            before = self.engine.runtime_settings
            try:
                self.engine.runtime_settings = settings
            except CapabilityError as exc:
                assert missing.removeprefix("supports_") in str(exc), (
                    f"CapabilityError does not name {missing!r}: {exc}"
                )
            else:
                raise AssertionError(f"settings needing {missing!r} were accepted: {settings!r}")
            assert self.engine.runtime_settings == before

    def _enter(self, cm: Any, accepted: bool, label: str) -> None:
        if accepted:
            cm.__enter__()
            self.stack.append(cm)
            return
        before = self.engine.runtime_settings
        try:
            cm.__enter__()
        except CapabilityError:
            pass
        else:
            self.stack.append(cm)
            raise AssertionError(f"{label} was accepted although the backend lacks its capability")
        assert self.engine.runtime_settings == before

    # -- rules: settings --------------------------------------------------------------------
    @rule(data=st.data())
    def set_settings(self, data: st.DataObject) -> None:
        cache = data.draw(st.sampled_from(self._cache_choices()), label="cache")
        settings = data.draw(tst.runtime_settings(caches=st.just(cache)), label="settings")
        self._apply(settings)

    @rule()
    def set_equal_settings(self) -> None:
        """Re-setting the current value keeps the context (no new context at the next call)."""
        self._apply(RuntimeSettings.coerce(self.engine.runtime_settings.to_dict()))

    @rule(data=st.data())
    def enter_runtime_config(self, data: st.DataObject) -> None:
        overrides = data.draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "cuda_graph_strategy": tst.cuda_graph_strategies(spelled=True),
                    "dynamic_shapes_kernel_specialization_strategy": tst.dynamic_shapes_strategies(
                        spelled=True
                    ),
                    "runtime_cache": st.sampled_from(self._cache_choices()),
                },
            ),
            label="overrides",
        )
        if self.model.outer_graph is not None and "cuda_graph_strategy" in overrides:
            overrides["cuda_graph_strategy"] = _DISABLED
        accepted = self.model.enter_config(**overrides)
        self._enter(runtime_config(self.engine, **overrides), accepted, f"runtime_config({overrides})")

    @precondition(lambda self: self.model.outer_graph is None)
    @rule(strategy=tst.cuda_graph_strategies(spelled=True))
    def enter_enable_cudagraphs(self, strategy: Any) -> None:
        accepted = self.model.enter_cudagraphs(strategy)
        self._enter(enable_cudagraphs(self.engine, strategy), accepted, f"enable_cudagraphs({strategy!r})")

    # -- rules: the outer CUDA-graph wrap --------------------------------------------------------
    @rule(outer=st.sampled_from([True, "copy", "view"]))
    def enter_outer_graph(self, outer: Any) -> None:
        """``enable_cudagraphs(engine, outer=...)``: refused without the capability or with
        data-dependent outputs."""
        accepted = self.model.enter_cudagraphs(outer=outer)
        label = f"enable_cudagraphs(outer={outer!r})"
        self._enter(enable_cudagraphs(self.engine, outer=outer), accepted, label)
        assert self.engine.outer_graph == self.model.outer_graph

    @precondition(
        lambda self: not self.stack and self.model.settings.cuda_graph_strategy is _DISABLED
    )
    @rule(outer=st.sampled_from([None, False, True, "copy", "view"]))
    def set_outer_graph(self, outer: Any) -> None:
        """``engine.outer_graph = ...`` outside any block (a block's exit restores settings
        that may hold TensorRT-RTX's own capture, which the machine keeps apart from it)."""
        creations = self.engine.context_creations
        if self.model.set_outer_graph(outer):
            self.engine.outer_graph = outer
        else:
            with_reason = self.model.outer_refusal(outer)
            try:
                self.engine.outer_graph = outer
            except CapabilityError as exc:
                if with_reason == "supports_outer_cuda_graph":
                    assert "outer_cuda_graph" in str(exc), f"CapabilityError does not name the flag: {exc}"
            else:
                raise AssertionError(f"outer_graph={outer!r} was accepted; expected refusal: {with_reason}")
        assert self.engine.context_creations == creations, "setting outer_graph must not create a context"

    @rule()
    def reset_graphs(self) -> None:
        self.engine.reset_graphs()
        self.model.reset_graphs()

    @precondition(lambda self: bool(self.stack))
    @rule()
    def exit_block(self) -> None:
        self.stack.pop().__exit__(None, None, None)
        self.model.exit_config()

    # -- rules: execution -------------------------------------------------------------------
    @rule(seed=st.integers(min_value=0, max_value=2**32 - 1))
    def execute(self, seed: int) -> None:
        import numpy as np

        inputs = list(self.harness.make_inputs(np.random.default_rng(seed)))
        outputs = self.engine.execute(*inputs)
        self.model.execute(self._key(inputs))
        self._check(outputs, self.harness.reference(inputs))
        self.seeds.append(seed)

    @precondition(lambda self: bool(self.seeds))
    @rule(data=st.data())
    def execute_again(self, data: st.DataObject) -> None:
        """Inputs of the shapes of an earlier call, with new values (a replay under the
        outer wrap: it must read the new inputs)."""
        import numpy as np

        seed = data.draw(st.sampled_from(self.seeds), label="earlier seed")
        earlier = list(self.harness.make_inputs(np.random.default_rng(seed)))
        rng = np.random.default_rng(seed + 1)
        inputs = []
        for like in earlier:
            array = np.asarray(self.harness.convert_input(like))
            new = np.ascontiguousarray(array[..., ::-1]) if array.ndim else array.copy()
            if array.dtype.kind == "f":
                new = (new + rng.standard_normal(new.shape)).astype(array.dtype)
            inputs.append(self._as_input(new, like))
        outputs = self.engine.execute(*inputs)
        self.model.execute(self._key(inputs))
        self._check(outputs, self.harness.reference(inputs))

    @precondition(lambda self: bool(self.harness.input_kinds))
    @rule(data=st.data(), seed=st.integers(min_value=0, max_value=2**32 - 1))
    def execute_kind(self, data: st.DataObject, seed: int) -> None:
        """A call with inputs of a kind the backend takes: outputs of the matching kind."""
        import numpy as np

        kind = data.draw(st.sampled_from(sorted(self.harness.input_kinds)), label="kind")
        original = list(self.harness.make_inputs(np.random.default_rng(seed)))
        convert = self.harness.input_kinds[kind]
        inputs = [convert(np.ascontiguousarray(self.harness.convert_input(x))) for x in original]
        outputs = self.engine.execute(*inputs)
        self.model.execute(self._key(inputs))
        expected = [to_numpy(e) for e in self.harness.reference(original)]
        for spec, value, want in zip(self.engine.outputs, outputs, expected, strict=False):
            array_kinds.assert_output(
                kind, value, name=spec.name, dtype=spec.dtype, shape=want.shape, device=self.harness.device
            )
        self._check(outputs, expected)

    @precondition(
        lambda self: self.harness.allocate_output is not None and not self.model.data_dependent
    )
    @rule(seed=st.integers(min_value=0, max_value=2**32 - 1))
    def execute_into(self, seed: int) -> None:
        """``outputs=``: written and returned as given."""
        import numpy as np

        assert self.harness.allocate_output is not None
        inputs = list(self.harness.make_inputs(np.random.default_rng(seed)))
        expected = [to_numpy(e) for e in self.harness.reference(inputs)]
        given = [
            self.harness.allocate_output(want.shape, spec.dtype)
            for spec, want in zip(self.engine.outputs, expected, strict=True)
        ]
        outputs = self.engine.execute(*inputs, outputs=given)
        self.model.execute(self._key(inputs))
        assert len(outputs) == len(given) and all(o is g for o, g in zip(outputs, given, strict=True)), (
            "outputs= arrays must be returned as given"
        )
        if any(array_kinds.kind_of(g) == array_kinds.CUDA_ARRAY for g in given):
            self.engine.synchronize()  # they carry no stream to wait for
        self._check(outputs, expected)

    def _as_input(self, array: Any, like: Any) -> Any:
        if self.harness.as_backend_input is not None:
            return self.harness.as_backend_input(array, like)
        kind = array_kinds.kind_of(like)
        if kind is None or kind == array_kinds.NUMPY:
            return array
        return array_kinds.converter(kind, self.harness.device)(array)

    def _key(self, inputs: Sequence[Any]) -> Any:
        return array_kinds.shape_key(inputs)

    def _check(self, outputs: Sequence[Any], expected: Sequence[Any]) -> None:
        assert_outputs_close(
            outputs,
            expected,
            rtol=self.harness.rtol,
            atol=self.harness.atol,
            convert=self.harness.convert_output,
        )

    @rule()
    def invalidate_context(self) -> None:
        self.engine.invalidate_context()
        self.model.invalidate_context()

    # -- rules: runtime caches ----------------------------------------------------------------
    @precondition(lambda self: self.caps.supports_runtime_cache)
    @rule(data=st.data())
    def attach_cache(self, data: st.DataObject) -> None:
        """A fresh cache with pending bytes from an earlier real serialize (or none)."""
        from trt_runtime.cache import RuntimeCache

        payload = data.draw(st.sampled_from([b"", *self.payloads]), label="payload")
        cache = RuntimeCache()
        if payload:
            cache.load_bytes(payload)
        self.caches.append(cache)
        self.model.track_cache(cache, payload)
        self._apply(self.engine.runtime_settings.merge(runtime_cache=cache))

    @precondition(lambda self: not self.caps.supports_runtime_cache)
    @rule()
    def attach_cache_refused(self) -> None:
        from trt_runtime.cache import RuntimeCache

        self._apply(self.engine.runtime_settings.merge(runtime_cache=RuntimeCache()))

    @precondition(lambda self: self.caps.supports_runtime_cache)
    @rule()
    def detach_cache(self) -> None:
        self._apply(self.engine.runtime_settings.merge(runtime_cache=None))

    @precondition(lambda self: bool(self.caches))
    @rule(data=st.data())
    def serialize_cache(self, data: st.DataObject) -> None:
        cache = data.draw(st.sampled_from(self.caches), label="cache")
        expected = self.model.cache(cache).expected_serialize()
        actual = bytes(cache.serialize())
        if expected is not None:
            assert actual == expected, "serialize() before materialization must return the pending bytes"
        elif actual and actual not in self.payloads:
            self.payloads.append(actual)

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def context_creations_match(self) -> None:
        assert self.engine.context_creations == self.model.context_creations, (
            f"engine created {self.engine.context_creations} contexts; "
            f"the model expects {self.model.context_creations}"
        )

    @invariant()
    def has_context_matches(self) -> None:
        assert self.engine.has_context() == self.model.has_context, (
            f"engine has_context() is {self.engine.has_context()}; the model expects {self.model.has_context}"
        )

    @invariant()
    def settings_match(self) -> None:
        assert self.engine.runtime_settings == self.model.settings, (
            f"engine settings {self.engine.runtime_settings!r}; the model expects {self.model.settings!r}"
        )

    @invariant()
    def outer_graph_matches(self) -> None:
        assert self.engine.outer_graph == self.model.outer_graph, (
            f"engine outer_graph {self.engine.outer_graph!r}; the model expects {self.model.outer_graph!r}"
        )

    @invariant()
    def graph_captures_match(self) -> None:
        assert self.engine.graph_captures == self.model.graph_captures, (
            f"engine captured {self.engine.graph_captures} outer graphs; "
            f"the model expects {self.model.graph_captures} (one per input shapes and context)"
        )

    @invariant()
    def caches_match(self) -> None:
        for cache, model in self.model.caches:
            assert cache.has_cache() == model.has_cache(), "has_cache() differs from the model"
            assert cache.has_pending == model.has_pending, "has_pending differs from the model"
            assert cache.drain_count == model.drain_count, (
                f"pending bytes drained {cache.drain_count} times; the model expects {model.drain_count}"
            )

    def teardown(self) -> None:
        while self.stack:
            self.stack.pop().__exit__(None, None, None)
        self.engine.close()
