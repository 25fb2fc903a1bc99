"""The device contract of the torchbind backend: what an input is, which kind of outputs a
call returns, and every check that runs before torch-tensorrt sees anything.

It is the contract of docs/device-contract.md, the one the python backend follows:

- any torch CUDA tensor among the inputs: the call is a *torch* call; outputs are CUDA
  torch tensors on the engine's device;
- CUDA arrays that are not torch tensors (DLPack on a CUDA device, or
  ``__cuda_array_interface__``), and no torch CUDA tensor: a *device* call; outputs are
  device arrays (torch CUDA tensors, which expose ``__cuda_array_interface__`` and
  ``__dlpack__``);
- host arrays only (numpy, CPU torch tensors, lists): a *host* call; outputs are host
  arrays, CPU torch tensors when any input was one, numpy arrays otherwise.

Host inputs of any call are staged to the device. Dtypes are never converted and
non-contiguous arrays are refused, never copied. Messages name the engine, the input,
what was expected and what was given, in the words of the python backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.contract import (
    READ_DEVICE,
    READ_HOST,
    READ_TORCH_CUDA,
    READ_TORCH_HOST,
    CallKind,
    ShapeChecker,
    fmt_shape,
    read_inputs,
)
from trt_runtime.dtypes import normalize_dtype
from trt_runtime.errors import InputError
from trt_runtime.protocols import TensorSpec

if TYPE_CHECKING:
    from .bridge import TensorInfo, TorchBridge

__all__ = ["Call", "Contract"]

#: How many validated input-shape keys (and learned output shapes) an engine remembers.
_KNOWN_SHAPES = 64


class Call:
    """One call's inputs once checked: the tensors to run, their shapes and the call's kind."""

    __slots__ = ("host", "kind", "shapes", "tensors", "torch_host", "views")

    def __init__(self, kind: CallKind, tensors: list[Any], shapes: tuple[tuple[int, ...], ...],
                 host: list[int], torch_host: bool) -> None:
        self.kind = kind
        #: torch tensors: CUDA ones as given (or viewed), host ones still on the host.
        self.tensors = tensors
        self.shapes = shapes
        #: Indices of the host inputs (staged to the device before the op).
        self.host = host
        #: Whether a host input was a CPU torch tensor (host outputs are then CPU tensors).
        self.torch_host = torch_host
        #: torch views of the call's ``outputs=`` once checked (None without outputs=).
        self.views: list[Any] | None = None


class Contract:
    """The checks of one engine's inputs and preallocated outputs.

    ``good_shapes`` holds the input-shape keys already validated (the engine's hot path
    only looks them up); output shapes seen for dynamic engines are remembered so that
    ``outputs=`` can be checked before the op runs.
    """

    def __init__(
        self,
        engine: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        device: int,
        bridge: TorchBridge,
    ) -> None:
        self.engine = engine
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.device = device
        self._bridge = bridge
        self.shapes = ShapeChecker(engine, self.inputs)
        self.good_shapes: set[tuple[Any, ...]] = set()
        static_out = all(not o.is_dynamic and not o.data_dependent for o in self.outputs)
        self._static_out: tuple[tuple[int, ...], ...] | None = (
            tuple(o.shape for o in self.outputs) if static_out else None
        )
        self._out_shapes: dict[tuple[Any, ...], tuple[tuple[int, ...], ...]] = {}
        self._np_dtypes: dict[str, Any] = {}

    # -- inputs --------------------------------------------------------------------------------
    def inspect(self, inputs: Sequence[Any]) -> Call:
        """Check count, kind, dtype, device, contiguity and shapes; raise :class:`InputError`."""
        if len(inputs) != len(self.inputs):
            self.shapes.check_count(len(inputs))
        kind, tensors, key, host, torch_host = read_inputs(self.inputs, inputs, self._read)
        if key not in self.good_shapes:
            self.check_shapes(key)
            if len(self.good_shapes) >= _KNOWN_SHAPES:
                self.good_shapes.clear()
            self.good_shapes.add(key)
        return Call(kind, tensors, key, host or [], torch_host)

    def _read(self, spec: TensorSpec, value: Any) -> tuple[int, Any, tuple[int, ...]]:
        """One input checked, as a torch tensor (the read of :func:`read_inputs`)."""
        info = self._bridge.describe(value)
        if info is not None:  # a torch tensor
            what = READ_TORCH_HOST if info.device_type == "cpu" else READ_TORCH_CUDA
            tensor = value
        else:
            tensor, info = self._view(spec, value)
            what = READ_HOST if info.device_type == "cpu" else READ_DEVICE
        self._check_tensor(spec, info, "input")
        return what, tensor, info.shape

    def _view(self, spec: TensorSpec, value: Any) -> tuple[Any, TensorInfo]:
        """A torch tensor for a non-torch input: a zero-copy view of a CUDA array, or a CPU
        tensor over a host array."""
        bridge = self._bridge
        try:
            view = bridge.device_view(value)
        except Exception as exc:
            raise InputError(
                f"engine {self.engine!r}: input {spec.name!r} ({type(value).__name__}) is not a readable "
                f"device array: {exc}"
            ) from exc
        if view is None:
            view = bridge.from_numpy(self._host_array(spec, value))
        info = bridge.describe(view)
        if info is None:  # pragma: no cover - the bridge always gives torch tensors
            raise InputError(f"engine {self.engine!r}: input {spec.name!r} could not be viewed as a tensor")
        return view, info

    def _host_array(self, spec: TensorSpec, value: Any) -> Any:
        import numpy as np

        if not isinstance(value, np.ndarray):
            if isinstance(value, (list, tuple, int, float, np.generic)):
                value = np.asarray(value, dtype=self._np_dtype(spec))
            elif hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
                value = np.asarray(value)
            else:
                raise InputError(
                    f"engine {self.engine!r}: input {spec.name!r} must be a torch tensor, a CUDA array "
                    "(DLPack or __cuda_array_interface__) or a host array (numpy); "
                    f"got {type(value).__name__}"
                )
        got = _dtype_name(value.dtype)
        if got != spec.dtype:
            raise InputError(
                f"engine {self.engine!r}: input {spec.name!r} must have dtype {spec.dtype}; got {got}"
            )
        if not value.flags.c_contiguous:
            raise InputError(
                f"engine {self.engine!r}: input {spec.name!r} is not C-contiguous; "
                "use numpy.ascontiguousarray"
            )
        return value

    def _np_dtype(self, spec: TensorSpec) -> Any:
        dtype = self._np_dtypes.get(spec.dtype)
        if dtype is None:
            from trt_runtime.dtypes import to_numpy

            try:
                dtype = self._np_dtypes[spec.dtype] = to_numpy(spec.dtype)
            except TypeError as exc:
                raise InputError(f"engine {self.engine!r}: input {spec.name!r}: {exc}") from exc
        return dtype

    def _check_tensor(self, spec: TensorSpec, info: TensorInfo, role: str) -> None:
        """dtype, device and contiguity of one torch tensor (``role``: input or output)."""
        where = f"engine {self.engine!r}: {role} {spec.name!r}"
        if info.dtype != spec.dtype:
            raise InputError(f"{where} must have dtype {spec.dtype}; got {info.dtype}")
        if info.device_type == "cuda":
            if info.device_index != self.device:
                raise InputError(
                    f"{where} is on cuda:{info.device_index}; the engine runs on cuda:{self.device}"
                )
        elif info.device_type != "cpu":
            raise InputError(
                f"{where} is on device {info.device_type!r}; expected cuda:{self.device} or host memory"
            )
        if not info.contiguous:
            raise InputError(
                f"{where} is not contiguous (strides {tuple(info.strides)}); call .contiguous() first"
            )

    def check_shapes(self, shapes: tuple[tuple[int, ...], ...]) -> None:
        """Ranks, static dimensions, and one optimization profile holding every dynamic input."""
        self.shapes.select(shapes)

    # -- preallocated outputs ---------------------------------------------------------------------
    def check_outputs(self, outputs: Sequence[Any], shapes: tuple[tuple[int, ...], ...]) -> list[Any]:
        """Check ``outputs=`` (count, kind, dtype, device, contiguity, shape where it is known
        before the run); return a torch view of each (the tensor itself for torch tensors)."""
        if len(outputs) != len(self.outputs):
            raise InputError(
                f"engine {self.engine!r} has {len(self.outputs)} output(s); outputs= has {len(outputs)}"
            )
        bridge = self._bridge
        expected = self._static_out or self._out_shapes.get(shapes)
        views = []
        for i, (spec, out) in enumerate(zip(self.outputs, outputs, strict=True)):
            where = f"engine {self.engine!r}: output {spec.name!r}"
            if spec.data_dependent:
                raise InputError(f"{where} has a data-dependent shape; it cannot be preallocated")
            info = bridge.describe(out)
            view = out
            if info is None:
                try:
                    view = bridge.device_view(out)
                except Exception as exc:
                    raise InputError(
                        f"{where} ({type(out).__name__}) is not a readable device array: {exc}"
                    ) from exc
                info = None if view is None else bridge.describe(view)
            if info is None or info.device_type != "cuda":
                what = type(out).__name__ if info is None else f"a {info.device_type} tensor"
                raise InputError(
                    f"engine {self.engine!r}: outputs= must hold CUDA arrays; output {spec.name!r} is {what}"
                )
            self._check_tensor(spec, info, "output")
            if expected is not None:
                if info.shape != expected[i]:
                    raise InputError(
                        f"{where} must have shape {fmt_shape(expected[i])}; got {fmt_shape(info.shape)}"
                    )
            elif len(info.shape) != len(spec.shape) or any(
                d >= 0 and d != s for d, s in zip(spec.shape, info.shape, strict=False)
            ):
                raise InputError(
                    f"{where} must have shape {fmt_shape(spec.shape)}; got {fmt_shape(info.shape)}"
                )
            views.append(view)
        return views

    def check_results(self, results: Sequence[Any], views: Sequence[Any]) -> None:
        """After the op: the shapes of a dynamic engine's outputs against ``outputs=``
        (nothing has been written to them yet)."""
        for spec, result, view in zip(self.outputs, results, views, strict=True):
            got, want = tuple(view.shape), tuple(result.shape)
            if got != want:
                raise InputError(
                    f"engine {self.engine!r}: output {spec.name!r} must have shape {fmt_shape(want)}; "
                    f"got {fmt_shape(got)}"
                )

    @property
    def learns_output_shapes(self) -> bool:
        """Whether output shapes depend on the input shapes (and are worth remembering)."""
        return self._static_out is None

    def learn(self, shapes: tuple[tuple[int, ...], ...], results: Sequence[Any]) -> None:
        """Remember the output shapes the engine gave for ``shapes``."""
        if shapes in self._out_shapes:
            return
        if len(self._out_shapes) >= _KNOWN_SHAPES:
            self._out_shapes.clear()
        self._out_shapes[shapes] = tuple(tuple(int(d) for d in r.shape) for r in results)


def _dtype_name(dtype: Any) -> str:
    try:
        return normalize_dtype(dtype)
    except ValueError:
        return str(dtype)
