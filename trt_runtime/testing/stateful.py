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
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trt_runtime.contexts import enable_cudagraphs, runtime_config
from trt_runtime.errors import CapabilityError
from trt_runtime.protocols import Backend, Engine, EngineSource
from trt_runtime.settings import RuntimeSettings
from trt_runtime.testing import strategies as tst
from trt_runtime.testing.model import EngineModel

__all__ = ["BackendHarness", "BackendStateMachine", "to_numpy"]


def to_numpy(value: Any) -> Any:
    """A host numpy array of ``value`` (numpy arrays, torch tensors on any device, lists)."""
    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    return np.asarray(value)


@dataclasses.dataclass
class BackendHarness:
    """What the machine needs to know about a backend under test.

    ``make_inputs(rng)`` returns valid inputs for the engine of ``engine_source`` (in the
    backend's input type) from a ``numpy.random.Generator``; ``reference(inputs)`` returns
    the expected outputs (anything :func:`to_numpy` accepts). Outputs are compared with
    ``rtol`` / ``atol``.
    """

    backend: Backend
    engine_source: EngineSource
    make_inputs: Callable[[Any], Sequence[Any]]
    reference: Callable[[Sequence[Any]], Sequence[Any]]
    rtol: float = 1e-5
    atol: float = 1e-6
    convert_output: Callable[[Any], Any] = to_numpy
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
        self.engine: Engine = harness.backend.load_engine(harness.engine_source)
        self.model = EngineModel(self.caps)
        #: Open context managers, innermost last.
        self.stack: list[Any] = []
        #: Cache objects attached so far (kept alive so identities stay unique).
        self.caches: list[Any] = []
        #: Bytes a real ``serialize()`` of this backend returned after materialization.
        self.payloads: list[bytes] = [p for p in [harness.real_cache_payload()] if p]

    # -- helpers --------------------------------------------------------------------------
    def _cache_choices(self) -> list[Any]:
        return [None, *self.caches]

    def _apply(self, settings: RuntimeSettings) -> None:
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
        accepted = self.model.enter_config(**overrides)
        self._enter(runtime_config(self.engine, **overrides), accepted, f"runtime_config({overrides})")

    @rule(strategy=tst.cuda_graph_strategies(spelled=True))
    def enter_enable_cudagraphs(self, strategy: Any) -> None:
        accepted = self.model.enter_cudagraphs(strategy)
        self._enter(enable_cudagraphs(self.engine, strategy), accepted, f"enable_cudagraphs({strategy!r})")

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
        self.model.execute()
        assert_outputs_close(
            outputs,
            self.harness.reference(inputs),
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
