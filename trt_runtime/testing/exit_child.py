"""What an exit scenario's process uses (:mod:`trt_runtime.testing.exit_scenarios`): the
engines the driver prepared, inputs per backend, output checks against the float64
reference, and the caller-device probe.

Importing this module imports neither torch nor TensorRT (a scenario decides when torch
is imported); the functions import what they need.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: The environment variable naming the folder :func:`exit_scenarios.prepare` filled.
WORK_ENV = "TRT_EXIT_WORK"
#: What a scenario prints last on stdout when all its work was done and checked.
DONE = "SCENARIO-OK"


class Work:
    """The prepared engines of one scenario process (``$TRT_EXIT_WORK``)."""

    def __init__(self) -> None:
        self.dir = Path(os.environ[WORK_ENV])
        self.tolerance = tuple(float(v) for v in (self.dir / "tolerance.txt").read_text().split())

    def path(self, model: str = "mlp", fmt: str = "plan") -> Path:
        """The file of ``model`` (``mlp``, ``dynamic``) in ``fmt`` (``plan``, ``tr01``, ``pte``)."""
        return self.dir / f"{model}.{fmt}"

    def load(self, backend: str, model: str = "mlp", fmt: str = "plan", **kwargs: Any) -> Any:
        import trt_runtime

        return trt_runtime.load(self.path(model, fmt), backend, **kwargs)

    def host(self, model: str = "mlp", batch: int = 8) -> np.ndarray:
        return np.load(self.dir / f"{model}_x{batch}.npy")

    def want(self, model: str = "mlp", batch: int = 8) -> np.ndarray:
        return np.load(self.dir / f"{model}_y{batch}.npy")

    def cuda(self, model: str = "mlp", batch: int = 8, device: int | None = None) -> Any:
        """The input as a torch CUDA tensor (on ``device``, default the current one)."""
        import torch

        where = torch.device("cuda", device) if device is not None else torch.device("cuda")
        return torch.from_numpy(self.host(model, batch)).to(where)

    def check(self, got: Any, model: str = "mlp", batch: int = 8) -> None:
        """Raise AssertionError unless ``got`` matches the reference output of ``batch``."""
        if hasattr(got, "detach"):
            got = got.detach().cpu().numpy()
        rtol, atol = self.tolerance
        np.testing.assert_allclose(np.asarray(got, np.float64), self.want(model, batch),
                                   rtol=rtol * 10, atol=atol * 10)

    def threads(self, count: int, body: Callable[[int], None]) -> None:
        """Run ``body(i)`` on ``count`` threads at once; re-raise the first failure."""
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            for _ in pool.map(body, range(count)):
                pass

    @staticmethod
    def done() -> None:
        print(DONE, flush=True)


# -- the caller's device ------------------------------------------------------------------------
def caller_state() -> tuple[int, int, int]:
    """(torch's current device, ``cudaGetDevice()``, ``cuCtxGetCurrent()``) of this thread."""
    import torch
    from cuda.bindings import driver, runtime

    err, device = runtime.cudaGetDevice()
    if int(err):
        raise RuntimeError(f"cudaGetDevice: {err!r}")
    err, ctx = driver.cuCtxGetCurrent()
    if int(err):
        raise RuntimeError(f"cuCtxGetCurrent: {err!r}")
    return torch.cuda.current_device(), int(device), int(ctx)


def caller_device_paths(work: Work, backend: str) -> list[str]:
    """Run every call path on an engine loaded with ``device=1`` from a caller on device 0;
    return one line per path after which the caller's device or context changed."""
    import torch

    import trt_runtime
    from trt_runtime import RuntimeSettings, enable_cudagraphs

    torch.cuda.set_device(0)
    torch.empty(1, device="cuda")  # the caller's context exists
    changed: list[str] = []

    def step(what: str, action: Callable[..., Any], *args: Any) -> Any:
        before = caller_state()
        result = action(*args)
        after = caller_state()
        if after != before:
            changed.append(f"{backend} {what}: (torch, cudaGetDevice, cuCtxGetCurrent) {before} -> {after}")
        return result

    engine = step("load(device=1)", lambda: work.load(backend, device=1))
    x = work.cuda(device=1)
    work.check(step("natural call", lambda: engine(x)))
    work.check(step("host I/O call", lambda: engine(work.host())))
    y = torch.empty(tuple(engine.outputs[0].shape), dtype=x.dtype, device="cuda:1")
    stream = torch.cuda.Stream(device=1)
    step("pre-bound call", lambda: engine.execute(x, outputs=[y], stream=stream))
    stream.synchronize()
    work.check(y)
    step("settings change", lambda: setattr(engine, "runtime_settings",
                                             RuntimeSettings(cuda_graph_strategy="disabled")))
    work.check(step("call after settings change", lambda: engine(x)))
    for mode in ("copy", "view"):
        wrap = enable_cudagraphs(engine, outer=mode)
        step(f"enable_cudagraphs(outer={mode!r}) entered", wrap.__enter__)
        for i in range(3):
            work.check(step(f"outer {mode} call {i}", lambda: engine(x)))
        static_inputs = functools.partial(engine.static_inputs, tuple(x.shape), as_torch=True)
        (static,) = step(f"outer {mode} static_inputs", static_inputs)
        static.copy_(x)
        work.check(step(f"outer {mode} call on the static input", engine, static))
        step(f"enable_cudagraphs(outer={mode!r}) left", wrap.__exit__, None, None, None)
    step("contexts=2", lambda: setattr(engine, "contexts", 2))

    def leased(i: int) -> None:
        torch.cuda.set_device(0)
        for _ in range(5):
            work.check(step(f"thread {i} leased call", lambda: engine(x)))

    work.threads(4, leased)
    step("close", engine.close)
    step("load without device (device from the caller)", lambda: trt_runtime.load(
        work.path(), backend).close())
    return changed
