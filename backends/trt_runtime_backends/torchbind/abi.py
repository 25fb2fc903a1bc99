"""The serialized-info list that ``torch.classes.tensorrt.Engine`` is constructed from.

The C++ constructor takes ``std::vector<std::string>``: one string per field, at the slot
``torch.ops.tensorrt.<FIELD>_IDX()`` says, ``SERIALIZATION_LEN()`` slots in all, slot
``ABI_TARGET_IDX`` holding ``ABI_VERSION()``. The layout grows between releases
(torch-tensorrt-rtx 2.11: ABI 8, 11 fields; 2.12/2.13: ABI 9, 12 fields; 2.14: ABI 10,
13 fields), so it is read from the loaded library at run time, never hard-coded, and
checked before any engine byte reaches the C++ side.

The engine field is handed over as Python ``bytes``: torch converts it to the C++
``std::string`` without going through ``str`` (engine bytes are not UTF-8).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from trt_runtime.errors import BackendUnavailableError, EngineError

__all__ = [
    "FIELDS",
    "KNOWN_LAYOUTS",
    "REQUIRED_FIELDS",
    "SerializedLayout",
]

#: Every field this backend knows how to fill, in the order torch-tensorrt added them.
FIELDS = (
    "ABI_TARGET",
    "NAME",
    "DEVICE",
    "ENGINE",
    "INPUT_BINDING_NAMES",
    "OUTPUT_BINDING_NAMES",
    "HW_COMPATIBLE",
    "SERIALIZED_METADATA",
    "TARGET_PLATFORM",
    "REQUIRES_OUTPUT_ALLOCATOR",
    "RESOURCE_ALLOCATION_STRATEGY",
    "REQUIRES_NATIVE_MULTIDEVICE",
    "ALIASED_IO",
)

#: Fields every known ABI has (the C++ constructor reads all of them).
REQUIRED_FIELDS = FIELDS[:11]

#: Layouts of the ABI versions this backend was checked against: ABI -> field count.
#: A library reporting one of these ABIs with another field count is refused.
KNOWN_LAYOUTS: Mapping[str, int] = {"8": 11, "9": 12, "10": 13}


def _flag(value: bool) -> str:
    return "1" if value else "0"


@dataclasses.dataclass(frozen=True, slots=True)
class SerializedLayout:
    """The serialized-info layout of the loaded torch-tensorrt runtime."""

    abi_version: str
    length: int
    indices: Mapping[str, int]
    binding_delimiter: str = "%"
    device_delimiter: str = "%"

    @classmethod
    def read(cls, ops: Any) -> SerializedLayout:
        """Read the layout from ``torch.ops.tensorrt`` and validate it."""
        try:
            abi = str(ops.ABI_VERSION())
            length = int(ops.SERIALIZATION_LEN())
        except Exception as exc:
            raise BackendUnavailableError(
                "torch-tensorrt's runtime library does not report its serialized-info layout "
                f"(torch.ops.tensorrt.ABI_VERSION / SERIALIZATION_LEN): {exc}"
            ) from exc
        indices: dict[str, int] = {}
        for field in FIELDS:
            op = _optional_op(ops, f"{field}_IDX")
            if op is not None:
                indices[field] = int(op())
        binding = _optional_op(ops, "SERIALIZED_ENGINE_BINDING_DELIM")
        device = _optional_op(ops, "SERIALIZED_RT_DEVICE_DELIM")
        layout = cls(
            abi_version=abi,
            length=length,
            indices=indices,
            binding_delimiter=str(binding()) if binding is not None else "%",
            device_delimiter=str(device()) if device is not None else "%",
        )
        layout.validate()
        return layout

    def validate(self) -> None:
        """Refuse a layout this backend cannot fill correctly, naming expected and found values."""
        where = f"torch-tensorrt runtime ABI {self.abi_version!r}"
        if not self.abi_version.isdigit():
            raise BackendUnavailableError(f"{where}: ABI_VERSION() must be a decimal string")
        expected_len = KNOWN_LAYOUTS.get(self.abi_version)
        if expected_len is not None and expected_len != self.length:
            raise BackendUnavailableError(
                f"{where}: expected SERIALIZATION_LEN() == {expected_len} for this ABI; "
                f"found {self.length}"
            )
        missing = [f for f in REQUIRED_FIELDS if f not in self.indices]
        if missing:
            raise BackendUnavailableError(
                f"{where}: the library lacks the index op(s) "
                f"{', '.join(f + '_IDX' for f in missing)} that every known ABI has"
            )
        slots = sorted(self.indices.values())
        if len(set(slots)) != len(slots) or any(not 0 <= s < self.length for s in slots):
            raise BackendUnavailableError(
                f"{where}: field slots must be distinct and in [0, {self.length}); "
                f"found {dict(self.indices)}"
            )
        uncovered = sorted(set(range(self.length)) - set(slots))
        if uncovered:
            raise BackendUnavailableError(
                f"{where}: serialized-info slot(s) {uncovered} of {self.length} belong to fields "
                f"this backend does not know (it knows {', '.join(FIELDS)}); "
                "upgrade trt-runtime or install a torch-tensorrt-rtx it supports"
            )

    def field_names(self) -> list[str]:
        """Field names in slot order."""
        by_slot = {slot: name for name, slot in self.indices.items()}
        return [by_slot[i] for i in range(self.length)]

    def device_string(self, index: int, major: int, minor: int, name: str) -> str:
        """``id%major%minor%device_type%name`` (device type 0 is a GPU)."""
        d = self.device_delimiter
        return f"{index}{d}{major}{d}{minor}{d}0{d}{name}"

    def pack(
        self,
        *,
        name: str,
        device: str,
        engine: bytes,
        inputs: Sequence[str],
        outputs: Sequence[str],
        platform: str,
        requires_output_allocator: bool = False,
        hardware_compatible: bool = False,
        serialized_metadata: str = "",
    ) -> list[Any]:
        """The list to construct ``torch.classes.tensorrt.Engine`` from."""
        if not isinstance(engine, bytes):
            raise TypeError(f"engine must be bytes; got {type(engine).__name__}")
        for kind, names in (("input", inputs), ("output", outputs)):
            bad = [n for n in names if not n or self.binding_delimiter in n]
            if bad:
                raise EngineError(
                    f"{kind} binding name(s) {bad} cannot be serialized: names must be non-empty "
                    f"and free of the delimiter {self.binding_delimiter!r}"
                )
        values: dict[str, Any] = {
            "ABI_TARGET": self.abi_version,
            "NAME": name,
            "DEVICE": device,
            "ENGINE": engine,
            "INPUT_BINDING_NAMES": self.binding_delimiter.join(inputs),
            "OUTPUT_BINDING_NAMES": self.binding_delimiter.join(outputs),
            "HW_COMPATIBLE": _flag(hardware_compatible),
            "SERIALIZED_METADATA": serialized_metadata,
            "TARGET_PLATFORM": platform,
            "REQUIRES_OUTPUT_ALLOCATOR": _flag(requires_output_allocator),
            "RESOURCE_ALLOCATION_STRATEGY": "0",  # static: allocate once per context
            "REQUIRES_NATIVE_MULTIDEVICE": "0",
            "ALIASED_IO": "",
        }
        info: list[Any] = [""] * self.length
        for field, slot in self.indices.items():
            info[slot] = values[field]
        self.check(info)
        return info

    def check(self, info: Sequence[Any]) -> None:
        """Refuse a serialized-info list that does not match this layout."""
        if len(info) != self.length:
            raise EngineError(
                f"serialized engine info has {len(info)} field(s); torch-tensorrt runtime "
                f"ABI {self.abi_version!r} expects {self.length}"
            )
        found = info[self.indices["ABI_TARGET"]]
        if found != self.abi_version:
            raise EngineError(
                f"serialized engine info targets torch-tensorrt ABI {found!r}; "
                f"the loaded runtime expects ABI {self.abi_version!r}"
            )
        if not isinstance(info[self.indices["ENGINE"]], bytes):
            raise EngineError("the engine field of serialized engine info must be bytes")


def _optional_op(ops: Any, name: str) -> Any:
    try:
        return getattr(ops, name)
    except (AttributeError, RuntimeError):  # torch.ops raises either for an unknown op
        return None
