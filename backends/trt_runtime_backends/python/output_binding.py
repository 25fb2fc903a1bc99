"""Outputs of the python backend: allocation, binding, preallocated ``outputs=``, host staging.

:class:`OutputBinding` (a part of each ``PythonEngine`` lane) makes the arrays a call returns,
of the kind of its inputs (new CUDA torch tensors, ``DeviceArray``s, or host arrays
copied from one reused device buffer per output), checks preallocated ``outputs=``,
stages host inputs through device memory, and collects outputs that TensorRT produced
through an ``IOutputAllocator`` (data-dependent shapes). :func:`make_output_allocator`
is that allocator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python.arrays import DeviceArray, torch_module
from trt_runtime_backends.python.contract import Contract, TensorInfo

from trt_runtime.contract import KIND_DEVICE, KIND_TORCH, cuda_result, fmt_shape, numel
from trt_runtime.errors import DataDependentShapeError, InputError

__all__ = ["OutputBinding", "host_memory", "make_output_allocator"]

_log = logging.getLogger("trt_runtime.python")


def host_memory(array: Any) -> tuple[int, int]:
    """``(address, nbytes)`` of a contiguous host array: numpy, or a CPU torch tensor."""
    ctypes_info = getattr(array, "ctypes", None)
    if ctypes_info is not None:
        return int(ctypes_info.data), int(array.nbytes)
    return int(array.data_ptr()), int(array.numel()) * int(array.element_size())


class OutputBinding:
    """Output arrays and host staging of one lane: owns the lane's staging buffers."""

    __slots__ = (
        "contract", "n_out", "outs", "rt", "stage_in", "stage_out", "staged_logged", "state", "stream",
    )

    def __init__(self, contract: Contract, outs: Sequence[TensorInfo], rt: Any, state: Any,
                 stream: Any) -> None:
        #: The lane's input contract: its name, inputs, device and torch bridge are ours too.
        self.contract = contract
        self.outs, self.n_out = outs, len(outs)
        self.rt = rt
        #: The engine's ``cuda.DeviceState`` and stream: buffers are allocated on them.
        self.state, self.stream = state, stream
        #: One reused device buffer per host input and per output of a host call.
        self.stage_in: list[Any] = [None] * contract.n_in
        self.stage_out: list[Any] = [None] * len(outs)
        self.staged_logged = False

    def release(self) -> None:
        """Let go of the staging buffers and the stream (the lane closes)."""
        self.stage_in = [None] * self.contract.n_in
        self.stage_out = [None] * self.n_out
        self.stream = None

    # -- host inputs ------------------------------------------------------------------------

    def log_staging(self, host: list[tuple[int, Any]]) -> None:
        if not self.staged_logged:
            self.staged_logged = True
            names = ", ".join(repr(self.contract.ins[i].name) for i, _ in host)
            _log.info(
                "engine %r: staging host input(s) %s through device memory; pass CUDA arrays "
                "(torch, cupy, ...) to bind them zero-copy", self.contract.name, names,
            )

    def stage_inputs(self, host: list[tuple[int, Any]], ptrs: list[int], ours: int) -> None:
        """Copy host inputs into the engine's staging buffers; put their addresses in ``ptrs``."""
        rt = self.rt
        self.log_staging(host)
        for index, arr in host:
            src, nbytes = host_memory(arr)
            buf = self.stage_in[index]
            if buf is None or buf.size < nbytes:
                buf = self.stage_in[index] = self.state.allocate(nbytes, self.stream)
            ptr = int(buf.handle)
            ptrs[index] = ptr
            if nbytes:
                cuda_result(
                    rt.cudaMemcpyAsync(ptr, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, ours),
                    "cudaMemcpyAsync",
                )

    # -- outputs ------------------------------------------------------------------------------
    def bind_outputs(
        self, ctx: Any, kind: int, outputs: Sequence[Any] | None,
        checked: tuple[list[Any], list[int]] | None = None,
    ) -> tuple[list[Any], list[int]]:
        """The arrays this call returns and their addresses (0 for allocator outputs); host
        outputs are ``(staging buffer, shape)`` pairs until :meth:`to_host`. ``checked``:
        :meth:`check_outputs`' answer for ``outputs``, when the call's validation gave one."""
        shapes = ctx.out_shapes
        if outputs is not None:
            return checked if checked is not None else self.check_outputs(ctx, outputs)
        results: list[Any] = []
        ptrs: list[int] = []
        for io, shape in zip(self.outs, shapes, strict=False):
            if io.name in ctx.allocators:
                results.append(None)
                ptrs.append(0)
                continue
            if kind == KIND_TORCH:
                torch = torch_module()
                t = torch.empty(shape, dtype=io.torch_dtype, device=self.contract.bridge.device)
                results.append(t)
                ptrs.append(t.data_ptr())
            elif kind == KIND_DEVICE:
                nbytes = numel(shape) * io.itemsize
                buf = self.state.allocate(nbytes, self.stream)
                results.append(DeviceArray(buf, shape, io.dtype, self.contract.device))
                ptrs.append(int(buf.handle))
            else:
                nbytes = numel(shape) * io.itemsize
                buf = self.stage_out[io.index]
                if buf is None or buf.size < nbytes:
                    buf = self.stage_out[io.index] = self.state.allocate(nbytes, self.stream)
                results.append((buf, shape))
                ptrs.append(int(buf.handle))
        return results, ptrs

    def check_outputs(self, ctx: Any, outputs: Sequence[Any], shapes: Sequence[tuple[int, ...]] | None = None
                      ) -> tuple[list[Any], list[int]]:
        """Check preallocated ``outputs=`` against ``shapes`` (default: the output shapes of
        ``ctx``, the shapes of the call it is in); their addresses."""
        if len(outputs) != self.n_out:
            raise InputError(
                f"engine {self.contract.name!r} has {self.n_out} output(s); outputs= has {len(outputs)}"
            )
        ptrs = []
        torch_tensor = self.contract.bridge.tensor
        device = self.contract.device
        if shapes is None:
            shapes = ctx.out_shapes
        for io, shape, out in zip(self.outs, shapes, outputs, strict=False):
            if io.name in ctx.allocators:
                raise InputError(
                    f"engine {self.contract.name!r}: output {io.name!r} is produced through an output "
                    "allocator (data-dependent shape, or output_allocator='always'); it cannot be "
                    "preallocated"
                )
            tp = type(out)
            if (
                tp is torch_tensor
                and out.get_device() == device
                and out.dtype is io.torch_dtype
                and out.is_contiguous()
            ):
                got = out.shape
                ptr = out.data_ptr()
            elif tp is DeviceArray and out.dtype == io.dtype and out.device_id == device:
                got = out.shape
                ptr = out.ptr
            elif self.contract.bridge.is_torch(out) and out.is_cuda:
                self.contract.check_torch(io, out)
                got = tuple(out.shape)
                ptr = out.data_ptr()
            elif hasattr(out, "__cuda_array_interface__") or hasattr(out, "__dlpack_device__"):
                ptr, got = self.contract.check_device_array(io, out)
            else:
                raise InputError(
                    f"engine {self.contract.name!r}: outputs= must hold CUDA arrays; output {io.name!r} is "
                    f"{type(out).__name__}"
                )
            if got != shape:
                raise InputError(
                    f"engine {self.contract.name!r}: output {io.name!r} must have shape {fmt_shape(shape)}; "
                    f"got {fmt_shape(tuple(got))}"
                )
            ptrs.append(ptr)
        return list(outputs), ptrs

    def collect_data_dependent(self, ctx: Any, kind: int, results: list[Any], ours: int) -> list[Any]:
        """Wait for the engine, then copy each allocator output into an array of the shape
        TensorRT reported."""
        rt = self.rt
        cuda_result(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        for i, io in enumerate(self.outs):
            allocator = ctx.allocators.get(io.name)
            if allocator is None:
                continue
            shape = allocator.shapes.get(io.name)
            if shape is None and all(d >= 0 for d in ctx.out_shapes[i]):
                shape = ctx.out_shapes[i]  # a shape-inferable output run through the allocator
            if shape is None:
                raise DataDependentShapeError(
                    f"engine {self.contract.name!r}: TensorRT reported no shape for data-dependent "
                    f"output {io.name!r}"
                )
            src = allocator.pointer(io.name)
            nbytes = numel(shape) * io.itemsize
            if kind == KIND_TORCH:
                torch = torch_module()
                t = torch.empty(shape, dtype=io.torch_dtype, device=self.contract.bridge.device)
                dst = t.data_ptr()
                results[i] = t
            elif kind == KIND_DEVICE:
                buf = self.state.allocate(nbytes, self.stream)
                dst = int(buf.handle)
                results[i] = DeviceArray(buf, shape, io.dtype, self.contract.device)
            else:
                results[i] = (allocator.buffers[io.name], shape)
                continue
            if nbytes:
                cuda_result(
                    rt.cudaMemcpyAsync(dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, ours),
                    "cudaMemcpyAsync",
                )
        return results

    def to_host(self, results: list[Any], ours: int, torch_host: bool = False) -> list[Any]:
        """Copy ``(device buffer or pointer, shape)`` pairs into new host arrays (CPU torch
        tensors when ``torch_host``, else numpy) and wait for them."""
        rt = self.rt
        host = []
        d2h = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for io, (buf, shape) in zip(self.outs, results, strict=False):
            if torch_host:
                arr = torch_module().empty(shape, dtype=io.torch_dtype)
            else:
                import numpy as np

                if io.np_dtype is None:
                    from trt_runtime.dtypes import to_numpy

                    io.np_dtype = to_numpy(io.dtype)
                arr = np.empty(shape, dtype=io.np_dtype)
            dst, nbytes = host_memory(arr)
            src = buf if isinstance(buf, int) else int(buf.handle)
            if nbytes:
                cuda_result(rt.cudaMemcpyAsync(dst, src, nbytes, d2h, ours), "cudaMemcpyAsync")
            host.append(arr)
        cuda_result(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        return host


def make_output_allocator(trt: Any, state: Any, stream: Any) -> Any:
    """An ``IOutputAllocator`` growing one device buffer per output on ``stream``."""

    class _OutputAllocator(trt.IOutputAllocator):  # type: ignore[misc, name-defined]
        """Grows one device buffer per output; records the shapes TensorRT reports."""

        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)
            self.buffers: dict[str, Any] = {}
            self.shapes: dict[str, tuple[int, ...]] = {}
            #: Calls of reallocate_output(_async), buffers allocated, shapes notified.
            self.reallocate_calls = 0
            self.allocations = 0
            self.notified: list[tuple[str, tuple[int, ...]]] = []

        def reallocate_output_async(self, name: str, memory: int, size: int, alignment: int,
                                    strm: int) -> int:
            self.reallocate_calls += 1
            buf = self.buffers.get(name)
            if buf is None or buf.size < size:
                try:
                    buf = state.allocate(size, stream)
                except Exception:  # TensorRT expects 0 on failure, not an exception
                    return 0
                self.buffers[name] = buf
                self.allocations += 1
            return int(buf.handle)

        def reallocate_output(self, name: str, memory: int, size: int, alignment: int) -> int:
            return self.reallocate_output_async(name, memory, size, alignment, 0)

        def notify_shape(self, name: str, shape: Any) -> None:
            dims = tuple(int(d) for d in shape)
            self.shapes[name] = dims
            self.notified.append((name, dims))

        def pointer(self, name: str) -> int:
            return int(self.buffers[name].handle)

    return _OutputAllocator()
