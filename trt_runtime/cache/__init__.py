"""The runtime cache: kernels TensorRT-RTX compiled, kept across engines and processes.

:class:`RuntimeCache` (:mod:`~trt_runtime.cache.runtime_cache`) is what callers use.
Beneath it, :mod:`~trt_runtime.cache.framing` is the file format (header, key,
SHA-256: :func:`encode` / :func:`decode`) and :mod:`~trt_runtime.cache.storage` keeps
the file safe (per-user directory, file lock, atomic replace, refusal of unsafe
locations). See ``docs/cache.md``.
"""

from __future__ import annotations

from trt_runtime.cache.framing import FORMAT_VERSION, HEADER_SIZE, MAGIC, decode, encode
from trt_runtime.cache.key import CacheKey
from trt_runtime.cache.runtime_cache import RuntimeCache
from trt_runtime.cache.storage import STALE_TEMP_SECONDS, default_cache_dir, default_cache_path

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "STALE_TEMP_SECONDS",
    "CacheKey",
    "RuntimeCache",
    "decode",
    "default_cache_dir",
    "default_cache_path",
    "encode",
]
