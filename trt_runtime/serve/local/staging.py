"""Engine calls that an engine process's event loop starts and collects later (overlapped calls).

A call made with host arrays waits for the GPU: the engine copies the inputs in, runs, copies the
outputs back and synchronizes, and the loop reads no socket meanwhile. A :class:`CudaStager` runs
the same call without waiting, on an engine that runs under the outer CUDA graph:

1. the batch's rows are gathered straight into page-locked host buffers (:attr:`CudaCall.inputs`);
2. :meth:`CudaCall.launch` queues, on one stream of its own, a copy of each into the engine's
   static inputs (``engine.static_inputs``), the engine call itself (a graph launch: the outer
   graph's ``"view"`` mode hands back its static outputs), a copy of each output back into
   page-locked buffers, and an event;
3. the loop asks :meth:`CudaCall.done` (the event) on its later passes, and splits
   :meth:`CudaCall.outputs` into the requests' answers once it is.

Every call goes on the one stream in order, so a call's copies into the static inputs wait for
the previous call's graph and its copies out. The host buffers of a call are its own until
:meth:`CudaCall.release`, so the loop can fill the next call's while one runs.

:func:`stager_refusal` says which engines qualify (under the outer graph, every dimension but the
batch fixed, static inputs that are CUDA arrays, cuda-python importable; the caller pads each call's
rows to a power of two), and :func:`open_stager` makes one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from trt_runtime.contract import cuda_result, device_address, numel
from trt_runtime.dtypes import itemsize, to_numpy
from trt_runtime.errors import EngineError, SettingsError

__all__ = ["CudaCall", "CudaStager", "open_stager", "stager_refusal"]


def stager_refusal(engine: Any, max_rows: int) -> str | None:
    """Why ``engine`` cannot run overlapped calls of at most ``max_rows`` rows; ``None`` if it can.
    The caller pads each call's rows to a power of two (so a few row counts, each a graph)."""
    graph = getattr(engine, "outer_graph", None)
    if graph is None:
        return "the engine does not run under the outer CUDA graph"
    sizes = max_rows.bit_length() + 1  # (1, 2, 4, ..., max_rows and max_rows itself)
    if graph.max_graphs < sizes:
        return f"the outer graph keeps {graph.max_graphs} graphs; padded batches need up to {sizes}"
    for spec in (*engine.inputs, *engine.outputs):
        if any(d < 0 for d in spec.shape[1:]):
            return f"{spec.name!r} has a dynamic dimension besides the batch: {list(spec.shape)}"
    try:
        from cuda.bindings import runtime  # noqa: F401
    except ImportError as exc:
        return f"cuda-python's runtime bindings do not import: {exc}"
    try:
        statics = engine.static_inputs(*[(max_rows, *spec.shape[1:]) for spec in engine.inputs])
    except Exception as exc:
        return f"the engine gives no static inputs: {exc}"
    for static in statics:
        if not (getattr(static, "is_cuda", False) is True or hasattr(static, "__cuda_array_interface__")):
            return f"the backend's static inputs are not CUDA arrays (a {type(static).__name__})"
    return None


def open_stager(engine: Any, max_rows: int) -> CudaStager | None:
    """A :class:`CudaStager` for ``engine``, or ``None`` where :func:`stager_refusal` says why not.
    It puts the engine's outer graph in its ``"view"`` mode: each call hands back the static
    outputs, which the stager copies out on its stream before the next call can write them."""
    if stager_refusal(engine, max_rows) is not None:
        return None
    from trt_runtime.graphs import OuterGraph

    graph = engine.outer_graph
    if graph.outputs != "view":
        engine.outer_graph = OuterGraph(outputs="view", max_graphs=graph.max_graphs)
    return CudaStager(engine, max_rows)


class _Pinned:
    """One page-locked host buffer, seen as a numpy array of ``shape`` and ``dtype``."""

    def __init__(self, rt: Any, shape: tuple[int, ...], dtype: str) -> None:
        import numpy as np

        nbytes = max(1, numel(shape) * itemsize(dtype))
        self.ptr = int(cuda_result(rt.cudaHostAlloc(nbytes, rt.cudaHostAllocDefault), "cudaHostAlloc"))
        raw = memoryview((ctypes.c_byte * nbytes).from_address(self.ptr)).cast("B")
        self.array = np.frombuffer(raw, dtype=to_numpy(dtype), count=numel(shape)).reshape(shape)
        self.row_bytes = numel(shape[1:]) * itemsize(dtype)


class CudaCall:
    """One call's page-locked buffers and event; reused through the stager's free list."""

    def __init__(self, stager: CudaStager) -> None:
        rt = stager.rt
        self._stager = stager
        rows = stager.max_rows
        self._in = [_Pinned(rt, (rows, *shape), dtype) for shape, dtype in stager.in_rows]
        self._out = [_Pinned(rt, (rows, *shape), dtype) for shape, dtype in stager.out_rows]
        self._event = cuda_result(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming), "cudaEventCreate")
        self._rows = 0
        self.inputs: list[Any] = []

    def take(self, rows: int) -> CudaCall:
        """Ready for a call of ``rows`` rows: :attr:`inputs` are the host buffers to fill."""
        self._rows = rows
        self.inputs = [p.array[:rows] for p in self._in]
        return self

    def launch(self) -> None:
        """Queue the copies in, the engine call, the copies out and the event; returns at once."""
        stager, rows = self._stager, self._rows
        rt, stream = stager.rt, stager.stream
        h2d, d2h = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        statics, addresses = stager.static_inputs(rows)
        for pinned, address in zip(self._in, addresses, strict=True):
            copied = rt.cudaMemcpyAsync(address, pinned.ptr, rows * pinned.row_bytes, h2d, stream)
            cuda_result(copied, "cudaMemcpyAsync (inputs)")
        outputs = stager.engine.execute(*statics, stream=stager.stream_handle)
        for pinned, output in zip(self._out, outputs, strict=True):
            if int(output.shape[0]) != rows:
                raise EngineError(f"engine output of shape {list(output.shape)} does not have the call's "
                                  f"{rows} rows first")
            source = device_address(output)
            copied = rt.cudaMemcpyAsync(pinned.ptr, source, rows * pinned.row_bytes, d2h, stream)
            cuda_result(copied, "cudaMemcpyAsync (outputs)")
        cuda_result(rt.cudaEventRecord(self._event, stream), "cudaEventRecord")

    def done(self) -> bool:
        """Whether the call, its copies out included, has ended on the GPU (raises its CUDA error)."""
        rt = self._stager.rt
        err = rt.cudaEventQuery(self._event)[0]
        if err == rt.cudaError_t.cudaSuccess:
            return True
        if err == rt.cudaError_t.cudaErrorNotReady:
            return False
        raise EngineError(f"the engine call failed on the GPU: {err}")

    def outputs(self) -> list[Any]:
        """The call's outputs: views of its host buffers, valid until :meth:`release`."""
        rows = self._rows
        return [p.array[:rows] for p in self._out]

    def release(self) -> None:
        """Hand the buffers back for a later call (after :meth:`done`, or once the stream is idle)."""
        self.inputs = []
        self._stager.free.append(self)

    def destroy(self) -> None:
        rt = self._stager.rt
        rt.cudaEventDestroy(self._event)
        for pinned in (*self._in, *self._out):
            rt.cudaFreeHost(pinned.ptr)


class CudaStager:
    """Overlapped calls of ``engine`` (see the module): page-locked buffers of up to ``max_rows``
    rows per call, one stream. Used from one thread (the engine process's loop); the engine runs
    under the outer graph in its ``"view"`` mode (:func:`open_stager`)."""

    def __init__(self, engine: Any, max_rows: int) -> None:
        from cuda.bindings import runtime as rt

        self.rt = rt
        self.engine = engine
        self.max_rows = max_rows
        self.in_rows = [(tuple(s.shape[1:]), s.dtype) for s in engine.inputs]
        self.out_rows = [(tuple(s.shape[1:]), s.dtype) for s in engine.outputs]
        if getattr(getattr(engine, "outer_graph", None), "outputs", None) != "view":
            raise SettingsError("a CudaStager needs the engine's outer graph in its \"view\" mode "
                                "(open_stager sets it)")
        device = getattr(engine, "device", 0)
        cuda_result(rt.cudaSetDevice(device), f"cudaSetDevice({device})")
        self.stream = cuda_result(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreate")
        self.stream_handle = int(self.stream)
        self.free: list[CudaCall] = []
        self._made: list[CudaCall] = []
        self._statics: dict[int, tuple[list[Any], list[int]]] = {}
        self._closed = False

    def call(self, rows: int) -> CudaCall:
        """A call of ``rows`` rows (1 to :attr:`max_rows`): its host input buffers to fill."""
        if not 1 <= rows <= self.max_rows:
            raise EngineError(f"an overlapped call takes 1 to {self.max_rows} rows; got {rows}")
        if self._closed:
            raise EngineError("the stager is closed")
        if not self.free:
            made = CudaCall(self)
            self._made.append(made)
            return made.take(rows)
        return self.free.pop().take(rows)

    def in_use(self) -> int:
        """How many calls hold their buffers (started and not released)."""
        return len(self._made) - len(self.free)

    def static_inputs(self, rows: int) -> tuple[list[Any], list[int]]:
        """The engine's static inputs for ``rows`` rows and their addresses (asked once per row count:
        they stay the engine's while nothing drops its graphs, and nothing does in an engine process;
        the first time, once the device has finished filling them)."""
        found = self._statics.get(rows)
        if found is None:
            shapes: Sequence[tuple[int, ...]] = [(rows, *shape) for shape, _ in self.in_rows]
            statics = self.engine.static_inputs(*shapes)
            # New buffers are filled on the backend's stream (torch zero-fills them on its current
            # one), which this stream does not wait for: a copy in could land before the fill and
            # be wiped (the torchbind backend answered zeros so, on the H200 host). Once per row count.
            cuda_result(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            found = self._statics[rows] = (statics, [device_address(s) for s in statics])
        return found

    def wait(self) -> None:
        """Wait for every call started on the stream."""
        if not self._closed:
            self.rt.cudaStreamSynchronize(self.stream)

    def close(self) -> None:
        """Wait for the stream, free every buffer and the stream; idempotent. Close the engine
        first: a backend may keep the last stream a call was ordered on (the torchbind backend
        synchronizes it when its context is dropped), and this one is destroyed here."""
        if self._closed:
            return
        self._closed = True
        rt = self.rt
        rt.cudaStreamSynchronize(self.stream)
        for made in self._made:
            made.destroy()
        self._made.clear()
        self.free.clear()
        self._statics.clear()
        rt.cudaStreamDestroy(self.stream)
