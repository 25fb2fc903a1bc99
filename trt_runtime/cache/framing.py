"""The file format of a saved runtime cache: a header, the key it was made for, a SHA-256.

A file is ``MAGIC``, the format version, a reserved field, the key and payload lengths,
the SHA-256 digest of everything else, the :class:`~trt_runtime.CacheKey` as JSON and
the raw TensorRT cache bytes. :func:`decode` trusts nothing before the digest over the
whole file has been verified, so a torn, truncated or bit-flipped file is never handed
to TensorRT.
"""

from __future__ import annotations

import hashlib
import json
import struct

from trt_runtime.cache.key import CacheKey
from trt_runtime.errors import FormatError
from trt_runtime.validation import json_document, show

__all__ = ["FORMAT_VERSION", "HEADER_SIZE", "MAGIC", "decode", "encode"]

#: First bytes of every cache file written by trt-runtime (PNG-style: a high byte and CR LF
#: catch text-mode and 7-bit mangling).
MAGIC = b"\x89TRTRC\r\n"
#: Version of the framing written by :func:`encode`; :func:`decode` reads only this version.
FORMAT_VERSION = 1

# magic, format version, reserved (0), key length, payload length; then the sha256 digest of
# (prefix + key JSON + payload), the key JSON and the payload.
_PREFIX = struct.Struct("<8sHHIQ")
_DIGEST_SIZE = 32
#: Bytes before the key JSON: the fixed prefix and the SHA-256 digest.
HEADER_SIZE = _PREFIX.size + _DIGEST_SIZE


def encode(payload: bytes | bytearray | memoryview, key: CacheKey | None = None) -> bytes:
    """Frame a raw TensorRT cache ``payload`` with the header recording ``key``."""
    if key is not None and not isinstance(key, CacheKey):
        raise TypeError(f"key must be a CacheKey or None; got {type(key).__name__}")
    body = bytes(payload)
    key_json = json.dumps(
        None if key is None else key.to_dict(), sort_keys=True, separators=(",", ":")
    ).encode()
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(key_json), len(body))
    digest = hashlib.sha256(prefix + key_json + body).digest()
    return prefix + digest + key_json + body


def decode(data: bytes | bytearray | memoryview) -> tuple[CacheKey | None, bytes]:
    """Check and unframe a cache file; return ``(key, payload)``.

    Raises :class:`~trt_runtime.FormatError` saying what is wrong (empty, truncated,
    bad magic, unsupported version, checksum mismatch, ...). Nothing is trusted before
    the checksum over the whole file has been verified.
    """
    raw = bytes(data)
    size = len(raw)
    if size == 0:
        raise FormatError("the file is empty")
    if size < HEADER_SIZE:
        if MAGIC.startswith(raw[: len(MAGIC)]):
            raise FormatError(f"truncated header: {size} bytes, a header needs {HEADER_SIZE}")
        raise FormatError(f"not a trt-runtime cache file: starts with {raw[:8]!r}, expected {MAGIC!r}")
    magic, version, reserved, key_len, payload_len = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise FormatError(f"not a trt-runtime cache file: starts with {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise FormatError(
            f"unsupported cache format version {version}; this trt-runtime reads {FORMAT_VERSION}"
        )
    if reserved != 0:
        raise FormatError(f"reserved header field is {reserved}, expected 0")
    expected = HEADER_SIZE + key_len + payload_len
    if size < expected:
        raise FormatError(f"truncated: {size} bytes, the header announces {expected}")
    if size > expected:
        raise FormatError(f"{size - expected} trailing bytes after the {expected} the header announces")
    digest = raw[_PREFIX.size : HEADER_SIZE]
    key_json = raw[HEADER_SIZE : HEADER_SIZE + key_len]
    payload = raw[HEADER_SIZE + key_len :]
    if hashlib.sha256(raw[: _PREFIX.size] + key_json + payload).digest() != digest:
        raise FormatError("checksum mismatch (sha256): the file is corrupt")
    # The checksum is no secret: a valid file may still hold hostile JSON (deep nesting,
    # huge numbers), which json_document refuses as FormatError.
    key_data = json_document(key_json, "the cache key in the header", FormatError)
    try:
        key = None if key_data is None else CacheKey.from_dict(key_data)
    except (ValueError, TypeError, AttributeError) as exc:
        raise FormatError(f"cache key in the header is malformed: {show(str(exc))}") from exc
    return key, payload

