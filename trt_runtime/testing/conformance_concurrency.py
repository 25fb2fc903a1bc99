"""Concurrency rules of the conformance suite: many callers on one engine.

Every rule runs eagerly and under the outer CUDA-graph wrap (``outer="copy"``, where the
backend has ``supports_outer_cuda_graph``), and with one execution context and with
:attr:`~ConcurrencyTests.concurrency_contexts` of them (``engine.contexts = N``, where
the backend has ``supports_multiple_contexts``; otherwise that case skips and says why):

* ``K`` threads x ``M`` calls with distinct inputs (and so, for a dynamic engine,
  distinct shapes) equal the reference, and every output a caller got still equals it
  after all the other calls ran (no output buffer shared between calls);
* the settings change while calls are in flight, and every call still equals the
  reference;
* ``close()`` while calls are in flight: every call either equals the reference or
  raises :class:`~trt_runtime.errors.EngineError` naming the engine; none hangs, none
  raises anything else, and the closed engine is not kept alive by anything.

The numbers are class attributes, so a slow device can lower them; the defaults take a
fraction of a second on the memory backend.
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trt_runtime.contexts import enable_cudagraphs
from trt_runtime.errors import EngineError
from trt_runtime.protocols import Backend, Engine, EngineSource
from trt_runtime.testing.conformance_base import ConformanceBase
from trt_runtime.testing.stateful import BackendHarness

__all__ = ["ConcurrencyTests"]

#: ``(contexts, mode)`` cases of every rule: ``contexts`` 1 or "many", ``mode`` eager or outer.
_CASES = [(1, "eager"), ("many", "eager"), (1, "outer"), ("many", "outer")]
_IDS = ["one-context-eager", "many-contexts-eager", "one-context-outer", "many-contexts-outer"]


class _Callers:
    """Threads that call one engine with inputs of their own and check every output."""

    def __init__(self, suite: ConcurrencyTests, engine: Engine, harness: BackendHarness) -> None:
        self.suite = suite
        self.engine = engine
        self.harness = harness
        self.calls = 0
        self.closed_errors = 0
        self.failures: list[tuple[int, BaseException]] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def call(self, index: int, number: int) -> tuple[list[Any], list[Any]]:
        """One call with inputs of its own seed; returns (outputs, expected), both checked."""
        import numpy as np

        inputs = list(self.harness.make_inputs(np.random.default_rng(50_000 + index * 10_007 + number)))
        expected = list(self.harness.reference(inputs))
        outputs = self.engine.execute(*inputs)
        self.suite.check_close(self.harness, outputs, expected)
        with self._lock:
            self.calls += 1
        return outputs, expected

    def run(self, count: int, work: Callable[[int], None]) -> None:
        """Run ``work(index)`` in ``count`` threads started together; join them all."""
        barrier = threading.Barrier(count + 1)

        def body(index: int) -> None:
            try:
                barrier.wait(timeout=60)
                work(index)
            except BaseException as exc:  # reported by check(), with the thread's index
                with self._lock:
                    self.failures.append((index, exc))

        self.threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
        for thread in self.threads:
            thread.start()
        barrier.wait(timeout=60)

    def wait_for_calls(self, at_least: int) -> None:
        deadline = time.monotonic() + self.suite.concurrency_timeout
        while self.calls < at_least and not self.failures:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.calls} of {at_least} calls finished in time")
            time.sleep(0.001)

    def join(self) -> None:
        deadline = time.monotonic() + self.suite.concurrency_timeout
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = sum(t.is_alive() for t in self.threads)
        assert not alive, (
            f"{alive} of {len(self.threads)} threads calling the engine did not finish within "
            f"{self.suite.concurrency_timeout} s (a hang or a deadlock)"
        )

    def check(self, what: str) -> None:
        if self.failures:
            index, exc = self.failures[0]
            raise AssertionError(
                f"{what}: {len(self.failures)} of {len(self.threads)} threads got wrong outputs or "
                f"errors; thread {index}: {exc!r}"
            ) from exc


class ConcurrencyTests(ConformanceBase):
    """Many callers on one engine (see the module docstring); ``BackendConformance`` inherits them."""

    #: Threads (K) and calls per thread (M) of the concurrent-calls rule.
    concurrency_threads: int = 8
    concurrency_calls: int = 16
    #: Execution contexts of the "many contexts" case (``engine.contexts = N``).
    concurrency_contexts: int = 4
    #: Seconds any one wait of these rules may take before it counts as a hang.
    concurrency_timeout: float = 120.0
    #: Settings changes made while calls are in flight.
    settings_changes: int = 8

    @pytest.fixture(params=_CASES, ids=_IDS)
    def concurrent_engine(self, request: Any, backend: Backend, engine: Engine) -> Iterator[Engine]:
        """The engine with the case's contexts, under the outer graph in the outer case."""
        yield from self._configured(request.param, backend, engine)

    def _configured(self, case: tuple[Any, str], backend: Backend, engine: Engine) -> Iterator[Engine]:
        contexts, mode = case
        if contexts != 1:
            self._skip_unless(backend, "supports_multiple_contexts")
            if not isinstance(getattr(engine, "contexts", None), int):
                pytest.skip(
                    f"backend {backend.name!r} has supports_multiple_contexts but its engine has no "
                    "int 'contexts' attribute to set (trt_runtime.load(..., contexts=N))"
                )
            engine.contexts = self.concurrency_contexts  # type: ignore[attr-defined]
            assert engine.contexts == self.concurrency_contexts  # type: ignore[attr-defined]
        if mode == "eager":
            yield engine
            return
        self._skip_unless(backend, "supports_outer_cuda_graph")
        if engine.has_data_dependent_outputs:
            pytest.skip("the engine has data-dependent outputs: no outer graph")
        with enable_cudagraphs(engine, outer="copy"):
            yield engine

    # -- K threads x M calls ------------------------------------------------------------------
    def test_concurrent_calls_equal_reference(
        self, concurrent_engine: Engine, harness: BackendHarness
    ) -> None:
        """K threads x M calls with distinct inputs equal the reference, and every output a
        caller got is still right once all calls are done (nothing shared between calls)."""
        callers = _Callers(self, concurrent_engine, harness)
        kept: dict[int, list[tuple[list[Any], list[Any]]]] = {}

        def work(index: int) -> None:
            kept[index] = [callers.call(index, n) for n in range(self.concurrency_calls)]

        callers.run(self.concurrency_threads, work)
        callers.join()
        callers.check("concurrent calls")
        for index, results in sorted(kept.items()):
            for number, (outputs, expected) in enumerate(results):
                try:
                    self.check_close(harness, outputs, expected)
                except AssertionError as exc:
                    raise AssertionError(
                        f"thread {index}, call {number}: its output changed after it was returned "
                        f"(another call wrote into it): {exc}"
                    ) from exc
        assert callers.calls == self.concurrency_threads * self.concurrency_calls

    # -- settings change in flight ------------------------------------------------------------
    def test_settings_change_while_calls_in_flight(
        self, backend: Backend, concurrent_engine: Engine, harness: BackendHarness
    ) -> None:
        """Settings changed while K threads call: every call equals the reference, and the
        engine ends with the settings last set."""
        outer = concurrent_engine.outer_graph is not None
        overrides = self._settings_variant(backend, graph_strategy=not outer)
        base = concurrent_engine.runtime_settings
        variant = base.merge(**overrides)
        callers = _Callers(self, concurrent_engine, harness)

        def work(index: int) -> None:
            number = 0
            while not callers.stop.is_set():
                callers.call(index, number)
                number += 1

        callers.run(self.concurrency_threads, work)
        try:
            callers.wait_for_calls(self.concurrency_threads)
            for change in range(self.settings_changes):
                concurrent_engine.runtime_settings = variant if change % 2 == 0 else base
                callers.wait_for_calls(callers.calls + 2)
            concurrent_engine.runtime_settings = variant
        finally:
            callers.stop.set()
            callers.join()
        callers.check("calls during settings changes")
        assert concurrent_engine.runtime_settings == variant
        callers.call(0, 10**6)  # and the engine still runs with them

    # -- close in flight ----------------------------------------------------------------------
    def test_close_while_calls_in_flight(
        self,
        close_case: tuple[Any, str],
        backend: Backend,
        engine_source: EngineSource,
        harness: BackendHarness,
    ) -> None:
        """``close()`` while K threads call: each call equals the reference or raises an
        EngineError naming the engine; no thread hangs, and nothing keeps the engine alive."""
        own = backend.load_engine(engine_source)
        try:
            self._close_in_flight(close_case, backend, own, harness)
        finally:
            own.close()
        ref = weakref.ref(own)
        del own
        gc.collect()
        kept = ref()
        assert kept is None, "the closed engine is still referenced (a leak), by: " + repr(
            [type(r).__name__ for r in gc.get_referrers(kept)]
        )

    def _close_in_flight(
        self, case: tuple[Any, str], backend: Backend, own: Engine, harness: BackendHarness
    ) -> None:
        import numpy as np

        configured = self._configured(case, backend, own)
        engine = next(configured)
        callers = _Callers(self, engine, harness)
        errors: list[str] = []

        def work(index: int) -> None:
            number = 0
            while True:
                try:
                    callers.call(index, number)
                except EngineError as exc:
                    errors.append(str(exc))
                    return
                number += 1

        callers.run(self.concurrency_threads, work)
        try:
            callers.wait_for_calls(2 * self.concurrency_threads)
        finally:
            engine.close()
            callers.join()
        callers.check("calls while the engine closed")
        assert len(errors) == self.concurrency_threads, "every thread must end on the closed engine"
        assert all(engine.name in message for message in errors), (
            f"EngineError after close() must name the engine {engine.name!r}; got {errors[0]!r}"
        )
        with pytest.raises(EngineError, match=re.escape(engine.name)):
            engine.execute(*harness.make_inputs(np.random.default_rng(1)))
        # Leave the outer graph: it restores the settings of a closed engine.
        with contextlib.suppress(StopIteration, EngineError):
            next(configured)

    @pytest.fixture(params=_CASES, ids=_IDS)
    def close_case(self, request: Any) -> tuple[Any, str]:
        return request.param  # type: ignore[no-any-return]
