"""``ModelInfo``: what a served engine looks like from outside (a frozen, picklable value).

Built once from an engine's input and output :class:`~trt_runtime.TensorSpec` (in the
process that loaded it) and handed to every front: the name clients use, the KServe v2
(Open Inference Protocol) metadata with datatypes such as ``FP16`` and ``INT32`` and
shapes with -1, and the :class:`~trt_runtime.serve.validation.RequestChecker` that
every request passes before it is batched. Nothing here imports numpy at import time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trt_runtime.errors import RequestError, SettingsError
from trt_runtime.protocols import TensorSpec
from trt_runtime.serve.validation import RequestChecker

__all__ = ["DATATYPES", "ModelInfo", "model_name"]

#: KServe v2 datatype of each :class:`~trt_runtime.TensorSpec` dtype (numpy names).
DATATYPES: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
}
_DTYPES = {v: k for k, v in DATATYPES.items()}


def model_name(engine: str | os.PathLike[str], name: str | None = None) -> str:
    """The name a model is served under: ``name`` if given, else the engine file's stem."""
    if name is not None:
        if not name or "/" in name:
            raise SettingsError(f"model name must be non-empty and hold no '/'; got {name!r}")
        return name
    return Path(engine).stem


def datatype_of(dtype: str) -> str:
    """The KServe datatype of a spec's dtype; ``RequestError`` (400) for one KServe lacks."""
    return _look_up(DATATYPES, dtype, "dtype {!r} has no KServe datatype")


def dtype_of(datatype: str) -> str:
    """The numpy dtype name of a KServe datatype; ``RequestError`` (400) naming it if unknown."""
    return _look_up(_DTYPES, datatype, "datatype {!r} is not supported")


def _look_up(table: dict[str, str], key: str, refusal: str) -> str:
    try:
        return table[key]
    except (KeyError, TypeError):
        raise RequestError(f"{refusal.format(key)}; expected one of {sorted(table)}", 400) from None


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """A served model: name, input and output specs, batching limit and request checker.

    ``max_batch``: requests the server gathers into one batch (1: no batching).
    Picklable (the engine process sends it to the fronts) and JSON-able
    (:meth:`to_dict` / :meth:`from_dict`).
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch: int = 1
    platform: str = "tensorrt_plan"
    version: str = "1"
    checker: RequestChecker = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise SettingsError(f"model name must be a non-empty string without '/'; got {self.name!r}")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise SettingsError(f"max_batch must be an integer >= 1; got {self.max_batch!r}")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "checker", RequestChecker(self.name, self.inputs, self.outputs))

    @classmethod
    def from_specs(
        cls, name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *, max_batch: int = 1
    ) -> ModelInfo:
        return cls(name, tuple(inputs), tuple(outputs), max_batch=max_batch)

    @classmethod
    def from_engine(cls, engine: Any, name: str, *, max_batch: int = 1) -> ModelInfo:
        """From a loaded engine's ``inputs`` and ``outputs``."""
        return cls.from_specs(name, engine.inputs, engine.outputs, max_batch=max_batch)

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    def metadata(self) -> dict[str, Any]:
        """The KServe v2 model metadata (``GET /v2/models/{name}``)."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": self.platform,
            "inputs": [_tensor_metadata(s) for s in self.inputs],
            "outputs": [_tensor_metadata(s) for s in self.outputs],
        }

    def config(self) -> dict[str, Any]:
        """The model's configuration as Triton writes it (``GET /v2/models/{name}/config``):
        with ``max_batch_size`` > 0 the batch dimension is implicit, left out of ``dims``."""
        batched = self.checker.batchable and self.max_batch > 1
        doc: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "backend": "trt_runtime",
            "max_batch_size": self.max_batch if batched else 0,
            "input": [_tensor_config(s, batched) for s in self.inputs],
            "output": [_tensor_config(s, batched) for s in self.outputs],
        }
        if batched:
            doc["dynamic_batching"] = {}
        return doc

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "max_batch": self.max_batch, "platform": self.platform,
            "version": self.version,
            "inputs": [_spec_dict(s) for s in self.inputs], "outputs": [_spec_dict(s) for s in self.outputs],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelInfo:
        return cls(
            doc["name"], tuple(_spec(d) for d in doc["inputs"]), tuple(_spec(d) for d in doc["outputs"]),
            max_batch=doc["max_batch"], platform=doc["platform"], version=doc["version"],
        )


def _tensor_metadata(spec: TensorSpec) -> dict[str, Any]:
    datatype = DATATYPES.get(spec.dtype, spec.dtype.upper())
    return {"name": spec.name, "datatype": datatype, "shape": list(spec.shape)}


def _tensor_config(spec: TensorSpec, batched: bool) -> dict[str, Any]:
    datatype = DATATYPES.get(spec.dtype, spec.dtype.upper())
    dims = spec.shape[1:] if batched else spec.shape
    return {"name": spec.name, "data_type": f"TYPE_{datatype}", "dims": list(dims)}


def _spec_dict(spec: TensorSpec) -> dict[str, Any]:
    return {
        "name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape), "is_input": spec.is_input,
        "profiles": [[list(p) for p in triple] for triple in spec.profiles],
        "data_dependent": spec.data_dependent,
    }


def _spec(doc: Mapping[str, Any]) -> TensorSpec:
    profiles = tuple(tuple(tuple(p) for p in triple) for triple in doc["profiles"])
    return TensorSpec(
        doc["name"], doc["dtype"], tuple(doc["shape"]), doc["is_input"], profiles,  # type: ignore[arg-type]
        doc["data_dependent"],
    )
