"""What the python backend knows of torch, behind one small class (as in the torchbind backend).

The backend never imports torch: :class:`TorchBridge` binds itself to the torch of the
first tensor a call passes (its ``Tensor`` type, the engine's CUDA device, each tensor's
torch dtype, the current-stream query, ``torch.empty``). One bridge per lane, shared by
the lane's parts; the hot paths read its fields directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python.arrays import torch_module

__all__ = ["TorchBridge", "torch_dtype"]


class TorchBridge:
    """The torch of a lane's calls; every field is ``None`` (``in_dtypes`` empty) until
    :meth:`is_torch` first sees a torch tensor."""

    __slots__ = ("device", "device_index", "empty", "in_dtypes", "ins", "outs", "raw_stream", "tensor")

    def __init__(self, device_index: int, ins: Sequence[Any], outs: Sequence[Any]) -> None:
        self.device_index = device_index
        #: The lane's TensorInfo of inputs and outputs (their ``torch_dtype`` is set here).
        self.ins = ins
        self.outs = outs
        #: ``torch.Tensor``; ``torch.device("cuda", device_index)``; ``torch.empty``.
        self.tensor: Any = None
        self.device: Any = None
        self.empty: Any = None
        #: The torch dtype of each input, in order.
        self.in_dtypes: tuple[Any, ...] = ()
        #: ``raw_stream(device) -> int``: torch's current stream on ``device``.
        self.raw_stream: Any = None

    def is_torch(self, x: Any) -> bool:
        """Whether ``x`` is a torch tensor (binding the bridge to torch the first time)."""
        torch = torch_module()
        if torch is None or not isinstance(x, torch.Tensor):
            return False
        if self.tensor is None:
            self.device = torch.device("cuda", self.device_index)
            for io in (*self.ins, *self.outs):
                io.torch_dtype = torch_dtype(torch, io.dtype)
            self.in_dtypes = tuple(io.torch_dtype for io in self.ins)
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            self.raw_stream = raw if raw is not None else _current_stream_fallback
            self.empty = torch.empty
            self.tensor = torch.Tensor  # last: the hot paths test it first
        return True


def torch_dtype(torch: Any, name: str) -> Any:
    """The torch dtype of a dtype name (``None`` when this torch lacks it)."""
    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "int64": torch.int64,
        "int32": torch.int32,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
        "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    }[name]


def _current_stream_fallback(device: int) -> int:
    torch = torch_module()
    return int(torch.cuda.current_stream(device).cuda_stream)
