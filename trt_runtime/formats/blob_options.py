"""What a TR01/TR02 blob records beside the engine and its bindings, as one options value.

:class:`BlobOptions` holds the six keywords that every blob writer takes
(:func:`~trt_runtime.formats.write_tr01`, :func:`~trt_runtime.formats.pack_tr01`,
:func:`~trt_runtime.formats.encode_metadata`, :func:`trt_runtime.executorch.to_pte`):
each writer builds it once with :meth:`BlobOptions.coerce` from an options value, a mapping
or its keyword arguments, so the keywords are checked in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from trt_runtime.errors import SettingsError

__all__ = ["AliasedIO", "BlobKeywords", "BlobOptions"]

#: Aliased output->input bindings: ``{output: input}`` (kind ``kv_cache_update``),
#: ``{output: (input, kind)}`` or ``(output, input, kind)`` triples.
AliasedIO = Mapping[str, "str | tuple[str, str]"] | Iterable[tuple[str, str, str]]


class BlobKeywords(TypedDict, total=False):
    """The keyword arguments of the blob writers, typed (the fields of :class:`BlobOptions`)."""

    aliased_io: AliasedIO
    device_id: int
    hardware_compatible: bool
    serialized_metadata: str
    target_platform: str | None
    record_profiles: bool


@dataclasses.dataclass(frozen=True, slots=True)
class BlobOptions:
    """The metadata a blob records, checked when made.

    ``aliased_io``: outputs that alias inputs (a blob with any is written as TR02; the names
    are checked against the bindings when the blob is encoded). ``device_id``: the CUDA
    device the engine runs on, in ``[0, 2**31)``. ``hardware_compatible``,
    ``serialized_metadata`` and ``target_platform`` (``None``: this machine's, such as
    ``linux_x86_64``) are torch-tensorrt's fields. ``record_profiles=False`` leaves the
    inputs' optimization profiles out, as torch-tensorrt's own writer does.
    """

    aliased_io: AliasedIO = ()
    device_id: int = 0
    hardware_compatible: bool = False
    serialized_metadata: str = ""
    target_platform: str | None = None
    record_profiles: bool = True

    def __post_init__(self) -> None:
        device_id = self.device_id
        if not isinstance(device_id, int) or isinstance(device_id, bool) or not 0 <= device_id < 2**31:
            raise SettingsError(f"device_id must be an integer in [0, 2**31); got {device_id!r}")
        for key in ("hardware_compatible", "record_profiles"):
            value = getattr(self, key)
            if not isinstance(value, bool):
                raise SettingsError(f"{key} must be a boolean (True or False); got {value!r}")
        for key in ("serialized_metadata", "target_platform"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{key} must be a string; got {type(value).__name__}")
        if isinstance(self.aliased_io, (str, bytes)):
            raise SettingsError(
                "aliased_io must be a mapping {output: input} or (output, input, kind) triples; "
                f"got {self.aliased_io!r}"
            )

    @classmethod
    def coerce(
        cls, options: BlobOptions | Mapping[str, Any] | None = None, /, **keywords: Any
    ) -> BlobOptions:
        """``options`` (``None``, a mapping of the fields or an instance) with ``keywords``
        on top, as one checked :class:`BlobOptions`. An unknown name raises
        :class:`TypeError` naming it and the known ones."""
        if isinstance(options, cls):
            if not keywords:
                return options
            given: dict[str, Any] = {f.name: getattr(options, f.name) for f in dataclasses.fields(cls)}
        elif options is None:
            given = {}
        elif isinstance(options, Mapping):
            given = dict(options)
        else:
            raise TypeError(
                f"blob options must be a BlobOptions, a mapping or None; got {type(options).__name__}"
            )
        given.update(keywords)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise TypeError(f"unknown blob option(s) {unknown}; expected some of {', '.join(known)}")
        return cls(**given)
