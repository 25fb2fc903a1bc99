"""What a runtime cache was made for: :class:`CacheKey`, a value with no dependencies.

It lives in ``cache/`` (not in ``protocols``) so that the cache package imports nothing
of the backend boundary: ``protocols`` -> ``cache.key`` is the only direction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trt_runtime.errors import SettingsError

__all__ = ["CacheKey"]


@dataclasses.dataclass(frozen=True, slots=True)
class CacheKey:
    """What a runtime cache was made for; a cache is only fed to a matching stack."""

    flavour: str  # "tensorrt_rtx" or "tensorrt"
    version: str
    compute_capability: str  # "9.0"
    driver: str  # CUDA driver version as reported by the driver, e.g. "13000"

    def slug(self) -> str:
        """A file-name-safe form: ``tensorrt_rtx-1.6.1.120-sm90-drv13000``."""
        cc = self.compute_capability.replace(".", "")
        raw = f"{self.flavour}-{self.version}-sm{cc}-drv{self.driver}"
        return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in raw)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheKey:
        fields = [f.name for f in dataclasses.fields(cls)]
        missing = [f for f in fields if not isinstance(data.get(f), str)]
        if missing:
            raise SettingsError(f"cache key lacks string field(s) {missing}; got {dict(data)!r}")
        return cls(**{f: data[f] for f in fields})
