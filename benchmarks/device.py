"""The GPU side of a run: device synchronize, CUDA-event timers with a spin gate, streams.

Every row is synchronized the same way (a device-wide synchronize, so a row whose work
ends on a stream other than its caller's is still waited for), and timed on the stream
its work is ordered on. Needs torch with CUDA; imported only when a row can run.
"""

from __future__ import annotations

from typing import Any

from trt_runtime.contract import stream_handle

__all__ = ["TorchDevice", "TorchEventTimer", "stream_handle"]


class TorchEventTimer:
    """:class:`trt_runtime.bench.GpuTimer` on one stream, with torch CUDA events.

    The gate is ``torch.cuda._sleep`` (a spin kernel) on that stream; its clock rate is
    measured once per device (:meth:`TorchDevice.cycles_per_us`).
    """

    def __init__(self, torch: Any, stream: Any, cycles_per_us: float | None) -> None:
        self._torch = torch
        self._stream = stream
        self._cycles_per_us = cycles_per_us
        self._events: list[Any] = []

    def gate(self, us: float) -> bool:
        if not self._cycles_per_us or us <= 0:
            return False
        with self._torch.cuda.stream(self._stream):
            self._torch.cuda._sleep(int(us * self._cycles_per_us))
        return True

    def record(self, index: int) -> None:
        while len(self._events) <= index:
            self._events.append(self._torch.cuda.Event(enable_timing=True))
        self._events[index].record(self._stream)

    def elapsed_us(self, first: int, second: int) -> float:
        return float(self._events[first].elapsed_time(self._events[second])) * 1000.0

    def synchronize(self) -> None:
        if self._events:
            self._events[-1].synchronize()


class TorchDevice:
    """Device 0 through torch: synchronize, streams, event timers and the spin gate."""

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU: torch.cuda.is_available() is False")
        self.torch = torch
        self._cycles: float | None = None
        self._calibrated = False
        try:
            from cuda.bindings import runtime as cudart

            sync = cudart.cudaDeviceSynchronize
            ok = cudart.cudaError_t.cudaSuccess

            def synchronize() -> None:
                err = sync()[0]
                if err != ok:
                    raise RuntimeError(f"cudaDeviceSynchronize failed: {err!r}")

            self.synchronize = synchronize
        except ImportError:
            self.synchronize = torch.cuda.synchronize

    def current_stream(self) -> Any:
        """torch's current stream (the legacy default stream unless a caller changed it)."""
        return self.torch.cuda.current_stream()

    def new_stream(self) -> Any:
        return self.torch.cuda.Stream()

    def as_torch_stream(self, handle: int) -> Any:
        """A torch stream object for ``handle`` (0 is the legacy default stream)."""
        if handle == 0:
            return self.torch.cuda.default_stream()
        return self.torch.cuda.ExternalStream(handle)

    def cycles_per_us(self) -> float | None:
        """GPU clock cycles per µs of ``torch.cuda._sleep``, measured once; None without it."""
        if self._calibrated:
            return self._cycles
        self._calibrated = True
        torch = self.torch
        if not hasattr(torch.cuda, "_sleep"):
            return None
        try:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cycles = 2_000_000
            torch.cuda._sleep(cycles)  # first launch loads the kernel
            torch.cuda.synchronize()
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1000.0
            self._cycles = cycles / us if us > 0 else None
        except Exception:
            self._cycles = None
        return self._cycles

    def timer(self, handle: int) -> TorchEventTimer:
        return TorchEventTimer(self.torch, self.as_torch_stream(handle), self.cycles_per_us())
