"""The caller's current device and context, left as the caller had them: the core runs every
call and every state change of an engine inside its backend's device guard; the python
backend's guard switches the driver context only when another is current and gives it back;
the torchbind backend's gives back whatever torch-tensorrt switched to. The GPU check on two
devices is tests/gpu/test_gpu_caller_device.py."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from _device_doubles import FakeDriver, RecordingGuard
from _python_doubles import _fake_engine
from _torchbind_doubles import cuda, make_backend, source
from trt_runtime_backends.python.cuda import CallerDevice
from trt_runtime_backends.python.engine import PythonEngine

import trt_runtime as trt
from trt_runtime import InputError, RuntimeSettings, TensorSpec, enable_cudagraphs
from trt_runtime.testing.memory import AffineOutput, MemoryBackend, MemoryLane


@pytest.fixture
def guarded(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, RecordingGuard, list[int]]:
    """A memory engine whose lanes share a recording guard; ``depths`` holds the guard's
    depth seen by each run of the engine."""
    spec = TensorSpec("x", "float32", (2, 4), is_input=True)
    path = tmp_path / "affine.mem"
    path.write_bytes(MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)]))
    guard = RecordingGuard()
    depths: list[int] = []
    original_run = MemoryLane.run

    def run(self: Any, *args: Any) -> Any:
        depths.append(guard.depth)
        return original_run(self, *args)

    monkeypatch.setattr(MemoryLane, "run", run)
    engine = trt.load(path, "memory")
    engine._set_device_guard(guard)  # (lanes made later get it too)
    return engine, guard, depths


def test_caller_device_every_call_and_change_runs_inside_the_guard(guarded: Any) -> None:
    engine, guard, depths = guarded
    x = np.ones((2, 4), np.float32)
    steps = [
        lambda: engine(x),
        lambda: engine.execute(x, outputs=[np.empty((2, 4), np.float32)]),
        lambda: setattr(engine, "runtime_settings", RuntimeSettings(cuda_graph_strategy="disabled")),
        lambda: engine(x),
        lambda: setattr(engine, "contexts", 2),
        engine.reset_graphs,
        engine.ensure_context,
    ]
    for step in steps:
        before = guard.entered
        step()
        assert guard.entered > before and guard.entered == guard.exited and guard.depth == 0
    with enable_cudagraphs(engine, outer="view"):
        engine.static_inputs((2, 4))
        for _ in range(3):
            np.testing.assert_array_equal(engine(x), np.full((2, 4), 3.0))
    calls = guard.entered

    def worker() -> None:
        for _ in range(5):
            engine(x)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert guard.entered == guard.exited >= calls + 20
    engine.close()
    assert guard.entered == guard.exited and guard.depth == 0
    assert depths and set(depths) == {1}  # every run of the engine was inside the guard


def test_caller_device_guard_exits_when_a_call_fails(guarded: Any) -> None:
    engine, guard, _ = guarded
    with pytest.raises(InputError):
        engine(np.ones((3, 3), np.float32))
    assert guard.entered == guard.exited == 1


def test_caller_device_engines_without_a_guard_run_unchanged(guarded: Any) -> None:
    engine, guard, depths = guarded
    engine._set_device_guard(None)
    np.testing.assert_array_equal(engine(np.ones((2, 4), np.float32)), np.full((2, 4), 3.0))
    assert guard.entered == 0 and depths == [0]


# -- the python backend's guard: driver contexts -----------------------------------------------


class PrimaryState:
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def primary_context(self) -> int:
        return self.handle


@pytest.mark.parametrize(
    ("caller", "sets"),
    [(500, [700, 500]), (0, [700, 0]), (700, [])],
    ids=["other-device", "no-context", "same-device"],
)
def test_caller_device_python_guard_switches_only_when_needed(caller: int, sets: list[int]) -> None:
    driver = FakeDriver(caller)
    guard = CallerDevice(PrimaryState(700), driver=driver)  # type: ignore[arg-type]
    token = guard.enter()
    assert driver.current == 700  # the engine's context for the work
    guard.exit(token)
    assert driver.current == caller and driver.sets == sets


def test_caller_device_python_engine_with_a_guard_leaves_the_thread_alone() -> None:
    driver = FakeDriver(500)
    engine: PythonEngine = _fake_engine()
    engine._set_device_guard(CallerDevice(PrimaryState(700), driver=driver))  # type: ignore[arg-type]
    x = np.ones((2, 4), np.float32)
    for _ in range(3):
        engine.execute(x)
        assert driver.current == 500
    done: list[int] = []

    def worker() -> None:
        engine.execute(x)
        done.append(driver.current)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert done == [500] and engine._state.activations == 0  # no thread left on the engine's device
    assert driver.sets == [700, 500] * 4
    engine.close()
    assert driver.current == 500


# -- the torchbind backend's guard: torch's current device ---------------------------------------
def test_caller_device_torchbind_gives_back_a_device_torch_tensorrt_switched() -> None:
    backend, bridge = make_backend("2.14.0", devices=2)
    ops = bridge.ops
    original = ops.execute_engine
    switch = [True]

    def switching(tensors: Any, native: Any) -> Any:
        if switch[0]:
            bridge.current = 1  # torch-tensorrt's multi-device mode sets the engine's device
        return original(tensors, native)

    ops.execute_engine = switching  # type: ignore[method-assign]
    engine = backend.load_engine(source(device_id=1))
    assert engine._device_guard is not None
    xs = [cuda(np.ones((2, 4)), "cuda:1"), cuda(np.full((2, 4), 2.0), "cuda:1")]
    for _ in range(3):
        engine(*xs)
        assert bridge.current == 0
    assert bridge.device_sets == [0, 0, 0]
    bridge.device_sets.clear()
    switch[0] = False
    engine(*xs)
    assert bridge.device_sets == []  # nothing switched: nothing set
    engine.close()


def test_caller_device_torchbind_single_device_has_no_guard() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    assert engine._device_guard is None
    engine.close()
