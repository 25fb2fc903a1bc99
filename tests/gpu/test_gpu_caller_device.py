"""The caller's device on two GPUs: after every call path on an engine loaded with
``device=1`` (load, natural call, host I/O, pre-bound call, a settings change, outer graphs in
copy and view mode, leased contexts from threads, close), a caller on device 0 still has
torch's current device, ``cudaGetDevice()`` and ``cuCtxGetCurrent()`` as before, on both
backends. The paths are trt_runtime.testing.exit_child.caller_device_paths, which the exit
matrix also runs in a process of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trt_runtime
from trt_runtime.testing.exit_child import WORK_ENV, Work, caller_device_paths
from trt_runtime.testing.exit_scenarios import prepare

pytestmark = pytest.mark.gpu


def _device_count() -> int:
    from cuda.bindings import runtime

    err, count = runtime.cudaGetDeviceCount()
    return int(count) if int(err) == 0 else 0


@pytest.fixture(scope="module")
def two_gpu_work(tmp_path_factory: pytest.TempPathFactory, python_backend: Any) -> Path:
    if _device_count() < 2:
        pytest.skip(f"needs 2 GPUs; this host has {_device_count()}")
    pytest.importorskip("torch", reason="the caller-device paths use torch tensors")
    return prepare(tmp_path_factory.mktemp("caller-device"), logger=python_backend.logger)


@pytest.mark.parametrize("backend", ["python", "torchbind"])
def test_gpu_caller_device_unchanged_by_every_path(
    backend: str, two_gpu_work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = trt_runtime.backend_status().get(backend)
    if not status:
        pytest.skip(f"the {backend} backend cannot run here: {getattr(status, 'reason', 'not installed')}")
    monkeypatch.setenv(WORK_ENV, str(two_gpu_work))
    changed = caller_device_paths(Work(), backend)
    assert changed == [], "\n".join(changed)
