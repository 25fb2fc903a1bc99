"""The replay's graph launch and copies made with the GIL held (``trt_runtime_backends._held``),
with stand-ins for the CUDA driver library, cuda-python's runtime and its driver module."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from trt_runtime_backends import _held


class _CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_INVALID_HANDLE = 400


class _Driver:
    CUresult = _CUresult


class _Function:
    """A ctypes function stand-in: records its calls, returns the next queued result."""

    def __init__(self, results: list[int]) -> None:
        self.results = results
        self.calls: list[tuple[Any, ...]] = []
        self.argtypes: Any = None
        self.restype: Any = None

    def __call__(self, *args: Any) -> int:
        self.calls.append(args)
        return self.results.pop(0) if self.results else 0


class _Library:
    def __init__(self, launch: list[int] | None = None, copy: list[int] | None = None) -> None:
        self.cuGraphLaunch = _Function(launch or [])
        self.cuMemcpyAsync = _Function(copy or [])


class _Runtime:
    class cudaMemcpyKind(enum.IntEnum):
        cudaMemcpyDeviceToDevice = 3

    def __init__(self, err: int = 0) -> None:
        self.err = err
        self.calls: list[tuple[Any, ...]] = []

    def cudaGraphLaunch(self, graph: Any, stream: int) -> tuple[int]:
        self.calls.append(("launch", graph, stream))
        return (self.err,)

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind: Any, stream: int) -> tuple[int]:
        self.calls.append(("copy", dst, src, nbytes, kind, stream))
        return (self.err,)


class _Graph:
    def __int__(self) -> int:
        return 0xABC0


def test_held_calls_go_to_the_driver_with_addresses() -> None:
    library, runtime = _Library(), _Runtime()
    calls = _held.ReplayCalls(runtime, library, _Driver)
    assert calls.held
    assert calls.launch(_Graph(), 7) == 0
    assert calls.launch_ptr(0x10, 8) == 0
    assert calls.copy(0x100, 0x200, 64, 9) == 0
    assert library.cuGraphLaunch.calls == [(0xABC0, 7), (0x10, 8)]
    assert library.cuMemcpyAsync.calls == [(0x100, 0x200, 64, 9)]
    assert runtime.calls == []


def test_held_calls_name_a_driver_error() -> None:
    calls = _held.ReplayCalls(_Runtime(), _Library(launch=[400], copy=[1, 12345]), _Driver)
    err = calls.launch(_Graph(), 7)
    assert err == 400 and err is _CUresult.CUDA_ERROR_INVALID_HANDLE
    assert calls.copy(1, 2, 3, 4) is _CUresult.CUDA_ERROR_INVALID_VALUE
    assert calls.copy(1, 2, 3, 4) == 12345  # a code this cuda-python does not know stays a number


def test_held_calls_without_a_current_context_go_through_the_runtime_once() -> None:
    library, runtime = _Library(launch=[201], copy=[201]), _Runtime()
    calls = _held.ReplayCalls(runtime, library, _Driver)
    assert calls.launch(_Graph(), 7) == 0
    assert calls.copy(0x100, 0x200, 64, 9) == 0
    assert runtime.calls == [("launch", 0xABC0, 7), ("copy", 0x100, 0x200, 64, 3, 9)]
    assert len(library.cuGraphLaunch.calls) == 1


def test_held_calls_report_the_runtime_error_of_the_retry() -> None:
    calls = _held.ReplayCalls(_Runtime(err=999), _Library(launch=[201]), _Driver)
    assert calls.launch(_Graph(), 7) == 999


def test_plain_calls_release_the_gil_through_the_runtime() -> None:
    runtime = _Runtime(err=5)
    calls = _held.ReplayCalls(runtime)
    graph = _Graph()
    assert not calls.held
    assert calls.launch(graph, 7) == 5
    assert calls.copy(1, 2, 3, 4) == 5
    assert runtime.calls == [("launch", graph, 7), ("copy", 1, 2, 3, 3, 4)]


def test_replay_calls_of_a_stand_in_runtime_are_plain() -> None:
    assert not _held.replay_calls(_Runtime()).held


def test_replay_calls_are_plain_by_default() -> None:
    """Off by default: held calls cost concurrent callers calls/s (see the module docstring)."""
    runtime = pytest.importorskip("cuda.bindings.runtime", reason="needs cuda-python")
    assert _held.HOLD_GIL is False
    assert not _held.replay_calls(runtime).held


def test_replay_calls_held_when_asked_and_the_driver_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = pytest.importorskip("cuda.bindings.runtime", reason="needs cuda-python")
    monkeypatch.setattr(_held, "HOLD_GIL", True)
    monkeypatch.setattr(_held.ctypes, "PyDLL", lambda name: _Library())
    _held._held.cache_clear()
    try:
        assert _held.replay_calls(runtime).held
        assert not _held.replay_calls(_Runtime()).held  # a stand-in runtime: never held
    finally:
        _held._held.cache_clear()


def test_replay_calls_without_the_driver_library_are_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = pytest.importorskip("cuda.bindings.runtime", reason="needs cuda-python")
    monkeypatch.setattr(_held, "HOLD_GIL", True)

    def missing(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(_held.ctypes, "PyDLL", missing)
    _held._held.cache_clear()
    try:
        assert not _held.replay_calls(runtime).held
    finally:
        _held._held.cache_clear()
