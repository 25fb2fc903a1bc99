"""Proof that the concurrency rules of the conformance kit
(:mod:`trt_runtime.testing.conformance_concurrency`) catch backends that break them, and
pass the memory backend's correct engine."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from test_conformance_memory import _run_kit as run_kit
from test_conformance_memory import assert_kit_fails
from test_conformance_memory import broken_backend as memory_broken_backend

from trt_runtime.testing.memory import MemoryBackend, MemoryEngine, MemoryLane

pytest_plugins = ["pytester"]

#: Engines a broken backend keeps alive after close() (the leak the kit must see).
_KEPT: list[MemoryEngine] = []


class _SharedOutputLane(MemoryLane):
    """Writes every call's outputs into one buffer per shape and returns that buffer."""

    def run(self, context, call, stream, outputs=None):
        results = super().run(context, call, stream, outputs)
        if outputs is not None:
            return results
        buffers = self.engine.__dict__.setdefault("buffers", {})
        shared = []
        for i, result in enumerate(results):
            buf = buffers.setdefault((i, result.shape, str(result.dtype)), np.empty_like(result))
            np.copyto(buf, result)
            shared.append(buf)
        return shared


class _SharedOutput(MemoryEngine):
    lane_type = _SharedOutputLane


class _CrossTalk(MemoryEngine):
    """Answers a call with whatever call finished last (one result slot, no lock)."""

    def execute(self, *inputs, stream=None, outputs=None):
        self.validate(inputs)
        self.last = self.compute(list(inputs))
        time.sleep(0.0002)
        return [r.copy() for r in self.last]


class _TornSettingsLane(MemoryLane):
    """Gives zeros for a while after each settings change (a torn update)."""

    def _torn(self, results):
        if getattr(self.engine, "changing", False):
            return [np.zeros_like(r) for r in results]
        return results

    def run(self, context, call, stream, outputs=None):
        return self._torn(super().run(context, call, stream, outputs))

    def graph_results(self, context, slot, call, outputs, view, stream):
        return self._torn(super().graph_results(context, slot, call, outputs, view, stream))


class _TornSettings(MemoryEngine):
    """Gives zeros for a while after each settings change (a torn update)."""

    lane_type = _TornSettingsLane

    @property
    def runtime_settings(self):
        return MemoryEngine.runtime_settings.fget(self)

    @runtime_settings.setter
    def runtime_settings(self, value):
        self.changing = True
        MemoryEngine.runtime_settings.fset(self, value)
        time.sleep(0.003)
        self.changing = False


class _CrashesOnClose(MemoryEngine):
    """Tears its state down before it stops taking calls: in-flight calls crash."""

    def close(self):
        self._affine = None
        time.sleep(0.005)
        super().close()


class _LeaksOnClose(MemoryEngine):
    """Keeps every closed engine in a module-level list."""

    def close(self):
        super().close()
        _KEPT.append(self)


BROKEN = {
    "shared_output": _SharedOutput,
    "cross_talk": _CrossTalk,
    "torn_settings": _TornSettings,
    "crashes_on_close": _CrashesOnClose,
    "leaks_on_close": _LeaksOnClose,
    "correct": MemoryEngine,
}


def broken_backend(name: str) -> MemoryBackend:
    return memory_broken_backend(name, BROKEN)


def _run_kit(pytester, broken: str, select: str):
    return run_kit(pytester, broken, select, module="test_conformance_concurrency")


@pytest.mark.parametrize(
    ("broken", "select", "message"),
    [
        (
            "shared_output",
            "test_concurrent_calls_equal_reference and one-context-eager",
            "*differs from the reference*",
        ),
        (
            "cross_talk",
            "test_concurrent_calls_equal_reference and one-context-eager",
            "*concurrent calls: * threads got wrong outputs or errors*",
        ),
        (
            "torn_settings",
            "test_settings_change_while_calls_in_flight and one-context-eager",
            "*calls during settings changes: * threads got wrong outputs*",
        ),
        (
            "torn_settings",
            "test_settings_change_while_calls_in_flight and one-context-outer",
            "*calls during settings changes: * threads got wrong outputs*",
        ),
        (
            "crashes_on_close",
            "test_close_while_calls_in_flight and one-context-eager",
            "*calls while the engine closed: * threads got wrong outputs or errors*",
        ),
        (
            "leaks_on_close",
            "test_close_while_calls_in_flight and one-context-outer",
            "*the closed engine is still referenced*",
        ),
    ],
)
def test_conformance_concurrency_kit_catches_broken_backend(pytester, broken, select, message):
    assert_kit_fails(_run_kit(pytester, broken, select), message)


def test_conformance_concurrency_kit_passes_the_unbroken_engine(pytester):
    select = "concurrent_calls or settings_change_while or close_while"
    started = time.monotonic()
    result = _run_kit(pytester, "correct", select)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 6, result.stdout.str()[-3000:]
    assert time.monotonic() - started < 30  # bounded: a few seconds on the memory backend
    result.stdout.no_fnmatch_line("*lacks supports_multiple_contexts*")  # -q hides reasons; see -rs


@pytest.mark.parametrize("case", ["many-contexts-eager", "many-contexts-outer"])
def test_conformance_concurrency_many_contexts_skip_names_the_capability(pytester, case):
    pytester.syspathinsert(Path(__file__).resolve().parents[1])
    pytester.makepyfile(
        test_skips="""
import pytest
from test_conformance_memory import _StaticConformance
from trt_runtime.testing.memory import MemoryBackend


class TestSkips(_StaticConformance):
    @pytest.fixture
    def backend(self):
        return MemoryBackend(without=("supports_multiple_contexts",))
"""
    )
    select = f"concurrent_calls and {case}"
    result = pytester.runpytest_inprocess("-q", "-rs", "-p", "no:cacheprovider", "-k", select)
    result.stdout.fnmatch_lines(["*SKIPPED*lacks supports_multiple_contexts*"])
