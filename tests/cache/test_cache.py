"""RuntimeCache: pending bytes, the drain, binding, stale keys, framing, default paths."""

from __future__ import annotations

import io
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
from _cache_worker import KEY, OTHER_KEY, FakeBackend, FakeHandle
from _threads import all_at_once
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trt_runtime import (
    CacheError,
    CacheKey,
    CacheWarning,
    CapabilityError,
    EngineBase,
    FormatError,
    LostUpdateWarning,
    RuntimeCache,
    RuntimeSettings,
    StaleCacheWarning,
)
from trt_runtime.cache import HEADER_SIZE, MAGIC, decode, default_cache_dir, default_cache_path, encode
from trt_runtime.lane import Lane, LaneOps


def _handle(backend: FakeBackend) -> FakeHandle:
    assert len(backend.handles) == 1, f"expected one handle, backend made {len(backend.handles)}"
    return backend.handles[0]


def _write(path: Path, payload: bytes, key: CacheKey | None = KEY) -> None:
    path.write_bytes(encode(payload, key))


# -- pending and drain ----------------------------------------------------------------------
def test_cache_pending_until_materialized() -> None:
    backend = FakeBackend()
    cache = RuntimeCache()
    cache.load_bytes(b"k1\nk2")
    assert cache.has_pending and not cache.has_cache()
    assert backend.handles == []  # nothing reaches the backend before first use
    native = cache.ensure_materialized("config", backend=backend)
    handle = _handle(backend)
    assert handle.deserialized == [b"k1\nk2"]
    assert native.kernels == [b"k1", b"k2"]
    assert cache.drain_count == 1 and not cache.has_pending and cache.has_cache()
    assert cache.ensure_materialized("config", backend=backend) is native
    assert handle.deserialized == [b"k1\nk2"] and cache.drain_count == 1


def test_cache_materialize_race_32_threads_drains_once() -> None:
    backend = FakeBackend()
    cache = RuntimeCache()
    cache.load_bytes(b"kernel-a\nkernel-b")
    results, errors = all_at_once(lambda _: cache.ensure_materialized(object(), backend=backend), 32, 30)
    assert errors == []
    assert len(results) == 32
    assert len({id(r) for r in results}) == 1
    handle = _handle(backend)
    assert handle.created == 1
    assert handle.deserialized == [b"kernel-a\nkernel-b"]
    assert cache.drain_count == 1


def test_cache_serialize_before_materialization_returns_pending() -> None:
    cache = RuntimeCache()
    assert cache.serialize() == b""
    cache.load_bytes(b"pending-bytes")
    assert cache.serialize() == b"pending-bytes"


def test_cache_save_of_only_loaded_file_keeps_its_kernels(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"old-kernels")
    cache = RuntimeCache(path)
    assert cache.load()
    cache.save()
    assert decode(path.read_bytes()) == (KEY, b"old-kernels")


def test_cache_load_after_materialization_goes_straight_in(tmp_path: Path) -> None:
    backend = FakeBackend()
    cache = RuntimeCache()
    native = cache.ensure_materialized(None, backend=backend)
    assert cache.drain_count == 0 and not cache.has_pending
    cache.load_bytes(b"late")
    handle = _handle(backend)
    assert handle.deserialized == [b"late"] and not cache.has_pending
    path = tmp_path / "c.bin"
    _write(path, b"from-file")
    assert cache.load(path)
    assert handle.deserialized == [b"late", b"from-file"]
    assert native.kernels == [b"from-file"] and cache.drain_count == 0


def test_cache_drain_count_at_most_one_per_load(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"x")
    backend = FakeBackend()
    cache = RuntimeCache(path)
    cache.load()
    cache.load()  # replaces the pending bytes; still one drain
    for _ in range(3):
        cache.ensure_materialized(None, backend=backend)
    assert cache.drain_count == 1 and _handle(backend).deserialized == [b"x"]


def test_cache_empty_payload_is_an_empty_cache() -> None:
    cache = RuntimeCache()
    assert cache.load_from_stream(io.BytesIO(encode(b"", KEY)))
    assert not cache.has_pending and cache.serialize() == b""


# -- stale keys ---------------------------------------------------------------------------
def test_cache_stale_key_warns_and_never_deserializes(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"other-gpu", OTHER_KEY)
    backend = FakeBackend()
    cache = RuntimeCache(path)
    assert cache.load() and cache.has_pending
    with pytest.warns(StaleCacheWarning) as record:
        cache.ensure_materialized(None, backend=backend, key=KEY)
    assert len(record) == 1
    message = str(record[0].message)
    assert str(path) in message and OTHER_KEY.slug() in message and KEY.slug() in message
    assert _handle(backend).deserialized == [] and cache.drain_count == 0 and not cache.has_pending


def test_cache_stale_key_from_backend_cache_key(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"other-gpu", OTHER_KEY)
    backend = FakeBackend(key=KEY)
    cache = RuntimeCache(path)
    cache.load()
    with pytest.warns(StaleCacheWarning, match=OTHER_KEY.slug()):
        cache.ensure_materialized(None, backend=backend)
    assert _handle(backend).deserialized == []


def test_cache_stale_key_checked_at_load_once_bound(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"other-gpu", OTHER_KEY)
    cache = RuntimeCache(path)
    cache.bind(FakeBackend(), key=KEY)
    with pytest.warns(StaleCacheWarning, match="not loaded"):
        assert not cache.load()
    assert not cache.has_pending


def test_cache_matching_key_drains(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"mine", KEY)
    backend = FakeBackend()
    cache = RuntimeCache(path)
    cache.load()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.ensure_materialized(None, backend=backend, key=KEY)
    assert _handle(backend).deserialized == [b"mine"]


# -- binding ------------------------------------------------------------------------------
def test_cache_unbound_materialize_is_an_error() -> None:
    with pytest.raises(CacheError, match="not bound to a backend"):
        RuntimeCache().ensure_materialized(None)


def test_cache_bound_to_one_backend() -> None:
    cache = RuntimeCache()
    cache.ensure_materialized(None, backend=FakeBackend("first"))
    with pytest.raises(CacheError, match=r"bound to the 'first' backend.*'second'"):
        cache.ensure_materialized(None, backend=FakeBackend("second"))


def test_cache_bytes_move_across_backends() -> None:
    first, second = FakeBackend("first"), FakeBackend("second")
    a = RuntimeCache()
    a.ensure_materialized(None, backend=first).kernels = [b"k1", b"k2"]
    b = RuntimeCache()
    b.load_bytes(a.serialize())
    native = b.ensure_materialized(None, backend=second)
    assert native.kernels == [b"k1", b"k2"]
    assert _handle(second).deserialized == [b"k1\nk2"]


def test_cache_backend_without_runtime_cache_capability() -> None:
    with pytest.raises(CapabilityError, match="runtime_cache"):
        RuntimeCache().ensure_materialized(None, backend=FakeBackend(runtime_cache=False))


class _Rejecting(FakeHandle):
    def deserialize(self, data: bytes) -> bool:  # type: ignore[override]
        super().deserialize(data)
        return False  # what IRuntimeCache.deserialize says about garbage


class _Refusing(FakeHandle):
    def deserialize(self, data: bytes) -> bool:  # type: ignore[override]
        # the python backend's handle: an error naming TensorRT-RTX's reason
        raise CacheError(f"TensorRT-RTX rejected {len(data)} bytes of runtime cache: fingerprint")


@pytest.mark.parametrize(("handle", "match"), [
    (_Rejecting, r"rejected .*19 bytes\); it starts empty"),
    (_Refusing, r"rejected .*19 bytes.*fingerprint\); it starts empty"),
])
def test_cache_rejected_bytes_warn_and_the_cache_starts_empty(handle: type, match: str) -> None:
    """A handle that says no (False, or a CacheError with the reason) costs a warning, never the
    engine: the cache starts empty (another GPU's cache file was refused so on a 2xH100 host)."""
    backend = FakeBackend()
    backend.create_cache_handle = handle  # type: ignore[method-assign]
    cache = RuntimeCache()
    cache.load_bytes(b"another GPU's cache")
    with pytest.warns(CacheWarning, match=match):
        native = cache.ensure_materialized(None, backend=backend)
    assert native is not None and cache.has_cache()


# -- streams and framing --------------------------------------------------------------------
def test_cache_stream_round_trip() -> None:
    cache = RuntimeCache()
    cache.ensure_materialized(None, backend=FakeBackend()).kernels = [b"a", b"b"]
    stream = io.BytesIO()
    cache.save_to_stream(stream)
    assert stream.getvalue().startswith(MAGIC)
    assert decode(stream.getvalue()) == (KEY, b"a\nb")
    other = RuntimeCache()
    stream.seek(0)
    assert other.load_from_stream(stream)
    assert other.serialize() == b"a\nb"


def test_cache_stream_corrupt_warns_and_is_ignored() -> None:
    cache = RuntimeCache()
    data = bytearray(encode(b"payload", KEY))
    data[-1] ^= 0xFF
    with pytest.warns(CacheWarning, match="checksum mismatch"):
        assert not cache.load_from_stream(io.BytesIO(bytes(data)))
    assert not cache.has_pending
    assert not cache.load_from_stream(io.BytesIO(b""))  # an empty stream is an empty cache


def test_cache_load_bytes_rejects_non_bytes() -> None:
    with pytest.raises(TypeError, match="takes bytes; got str"):
        RuntimeCache().load_bytes("text")  # type: ignore[arg-type]


_keys = st.none() | st.builds(
    CacheKey,
    flavour=st.sampled_from(["tensorrt_rtx", "tensorrt"]),
    version=st.text(max_size=20),
    compute_capability=st.text(max_size=6),
    driver=st.text(max_size=8),
)
_fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_cache_package_keeps_its_names() -> None:
    """The split into framing / storage / runtime_cache changed no import of trt_runtime.cache."""
    import trt_runtime
    import trt_runtime.cache as package
    from trt_runtime.cache import framing, runtime_cache, storage

    assert sorted(package.__all__) == sorted([
        "FORMAT_VERSION", "HEADER_SIZE", "MAGIC", "STALE_TEMP_SECONDS", "CacheKey", "RuntimeCache",
        "decode", "default_cache_dir", "default_cache_path", "encode",
    ])
    assert package.RuntimeCache is runtime_cache.RuntimeCache is trt_runtime.RuntimeCache
    assert package.encode is framing.encode and package.decode is framing.decode
    assert package.MAGIC == b"\x89TRTRC\r\n" and package.FORMAT_VERSION == 1 and package.HEADER_SIZE == 56
    assert package.default_cache_dir is storage.default_cache_dir
    assert package.STALE_TEMP_SECONDS == storage.STALE_TEMP_SECONDS
    assert package.CacheKey is trt_runtime.CacheKey  # a value of the cache package, not of protocols


def test_cache_storage_checkpoint_hook_sees_every_save_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_runtime.cache import storage

    seen: list[tuple[str, Path]] = []
    monkeypatch.setattr(storage, "checkpoint", lambda point, path: seen.append((point, path)))
    cache = RuntimeCache(tmp_path / "c.bin")
    cache.load_bytes(b"kernels")
    cache.save()
    assert seen == [(p, tmp_path / "c.bin") for p in ("locked", "written", "replaced")]


@_fast
@given(payload=st.binary(max_size=4096), key=_keys)
def test_cache_framing_round_trip(payload: bytes, key: CacheKey | None) -> None:
    assert decode(encode(payload, key)) == (key, payload)


@_fast
@given(payload=st.binary(max_size=512), key=_keys, data=st.data())
def test_cache_framing_detects_any_flipped_byte(
    payload: bytes, key: CacheKey | None, data: st.DataObject
) -> None:
    blob = bytearray(encode(payload, key))
    index = data.draw(st.integers(0, len(blob) - 1), label="index")
    blob[index] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(FormatError):
        decode(bytes(blob))


@_fast
@given(payload=st.binary(max_size=512), key=_keys, data=st.data())
def test_cache_framing_detects_truncation_anywhere(
    payload: bytes, key: CacheKey | None, data: st.DataObject
) -> None:
    blob = encode(payload, key)
    cut = data.draw(st.integers(0, len(blob) - 1), label="cut")
    with pytest.raises(FormatError, match=r"truncated|empty|not a trt-runtime"):
        decode(blob[:cut])
    with pytest.raises(FormatError, match="trailing"):
        decode(blob + b"\0")


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "empty"),
        (MAGIC[:5], "truncated header"),
        (b"GARBAGE!" * 10, "not a trt-runtime cache file"),
        (encode(b"x")[:8] + b"\x07\x00" + encode(b"x")[10:], "unsupported cache format version 7"),
    ],
)
def test_cache_framing_messages(blob: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        decode(blob)


def test_cache_header_layout() -> None:
    blob = encode(b"payload", KEY)
    assert blob[:8] == MAGIC
    assert blob.endswith(b"payload")
    assert b'"compute_capability":"9.0"' in blob[HEADER_SIZE:]


# -- default location, shared caches, lifetime ----------------------------------------------------
def test_cache_default_dir_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    directory = default_cache_dir()
    assert directory == tmp_path / "xdg" / "trt-runtime"
    assert stat.S_IMODE(directory.stat().st_mode) & 0o077 == 0
    assert default_cache_path(KEY) == directory / "runtime-cache-tensorrt_rtx-1.6.1.120-sm90-drv13000.bin"
    assert default_cache_path(KEY) != default_cache_path(OTHER_KEY)
    with pytest.raises(TypeError, match="CacheKey"):
        default_cache_path("sm90")  # type: ignore[arg-type]


def test_cache_default_is_bound_and_keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    backend = FakeBackend()
    cache = RuntimeCache.default(backend)
    assert cache.path == default_cache_path(KEY)
    assert cache.backend is backend and cache.key == KEY
    cache.ensure_materialized(None, backend=backend).kernels = [b"k"]
    cache.save()
    assert decode(default_cache_path(KEY).read_bytes()) == (KEY, b"k")


def test_cache_shared_one_instance_lazy_load_autosave(tmp_path: Path) -> None:
    path = tmp_path / "shared.bin"
    _write(path, b"from-disk")
    cache = RuntimeCache.shared(path)
    assert RuntimeCache.shared(str(path)) is cache
    assert cache.autosave
    backend = FakeBackend()
    native = cache.ensure_materialized(None, backend=backend)  # first use loads the file
    assert _handle(backend).deserialized == [b"from-disk"] and cache.drain_count == 1
    native.kernels.append(b"compiled")
    cache.close()
    assert decode(path.read_bytes()) == (KEY, b"from-disk\ncompiled")
    assert RuntimeCache.shared(path) is not cache  # a closed shared cache is replaced


def test_cache_context_manager_closes_and_autosaves(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    with RuntimeCache(path, autosave=True) as cache:
        assert isinstance(cache, RuntimeCache)
        cache.ensure_materialized(None, backend=FakeBackend()).kernels = [b"k"]
    assert cache.closed
    assert decode(path.read_bytes()) == (KEY, b"k")
    cache.close()  # idempotent
    with pytest.raises(CacheError, match="closed"):
        cache.ensure_materialized(None)


def test_cache_without_autosave_does_not_write(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    with RuntimeCache(path) as cache:
        cache.ensure_materialized(None, backend=FakeBackend()).kernels = [b"k"]
    assert not path.exists()


def test_cache_autosave_on_garbage_collection(tmp_path: Path) -> None:
    import gc

    path = tmp_path / "c.bin"
    cache = RuntimeCache(path, autosave=True)
    cache.ensure_materialized(None, backend=FakeBackend()).kernels = [b"gc"]
    del cache
    gc.collect()
    assert decode(path.read_bytes()) == (KEY, b"gc")


def test_cache_autosave_skips_unchanged_file(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"disk")
    before = path.stat().st_mtime_ns, path.stat().st_ino
    with RuntimeCache(path, autosave=True) as cache:
        cache.load()
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before


@pytest.mark.parametrize("bad", [-1, "30", True, None])
def test_cache_lock_timeout_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="lock_timeout must be a number of seconds >= 0"):
        RuntimeCache(lock_timeout=bad)  # type: ignore[arg-type]


def test_cache_path_is_absolute_and_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert RuntimeCache("rel.bin").path == tmp_path / "rel.bin"
    assert RuntimeCache().path is None
    with pytest.raises(CacheError, match="has no path"):
        RuntimeCache().save()
    with pytest.raises(ValueError, match="must not be empty"):
        RuntimeCache("")


def test_cache_missing_file_is_empty(tmp_path: Path) -> None:
    cache = RuntimeCache(tmp_path / "none" / "c.bin")
    assert cache.load() is False and not cache.has_pending


# -- lost updates -----------------------------------------------------------------------------
def _two_writers(path: Path, merges: bool) -> tuple[RuntimeCache, RuntimeCache]:
    """Two caches of one file, each with a kernel of its own; the first has saved."""
    _write(path, b"base")
    a, b = RuntimeCache(path), RuntimeCache(path)
    for cache in (a, b):
        cache.load()
        cache.ensure_materialized(None, backend=FakeBackend(merges=merges))
    a.ensure_materialized(None).kernels.append(b"from-a")
    b.ensure_materialized(None).kernels.append(b"from-b")
    a.save()
    return a, b


def test_cache_lost_update_warns_when_deserialize_replaces(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _, b = _two_writers(path, merges=False)
    with pytest.warns(LostUpdateWarning, match=f"{path}.*last writer wins"):
        b.save()
    assert decode(path.read_bytes())[1] == b"base\nfrom-b"
    with warnings.catch_warnings():  # b's view of the file is now current
        warnings.simplefilter("error")
        b.save()


def test_cache_lost_update_merged_when_backend_merges(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _, b = _two_writers(path, merges=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b.save()
    assert decode(path.read_bytes())[1] == b"base\nfrom-a\nfrom-b"


def test_cache_unmaterialized_save_adopts_newer_file(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _write(path, b"old")
    reader = RuntimeCache(path)
    reader.load()
    _write(path, b"newer")  # another process saved since
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reader.save()
    assert decode(path.read_bytes())[1] == b"newer"
    assert reader.serialize() == b"newer"


def test_cache_repr_names_state(tmp_path: Path) -> None:
    cache = RuntimeCache(tmp_path / "c.bin")
    assert "empty" in repr(cache)
    cache.load_bytes(b"x")
    assert "pending" in repr(cache)
    cache.ensure_materialized(None, backend=FakeBackend())
    assert "materialized" in repr(cache) and "'fake'" in repr(cache)


# -- the engine side ----------------------------------------------------------------------------
class _Ops(LaneOps):
    """A lane whose context materializes the cache the way real backends do."""

    def __init__(self, engine: EngineBase) -> None:
        self.engine = engine

    def create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> object:
        native = None if cache is None else cache.ensure_materialized("config", backend=self.engine.backend)
        return {"native": native}

    def destroy_context(self, context: object) -> None:
        pass

    def run(self, context: object, call: object, stream: object, outputs: Sequence[object] | None
            ) -> list[object]:
        return [context["native"]]  # type: ignore[index]


class _Engine(EngineBase):
    def _new_ops(self, lane: Lane) -> LaneOps:
        return _Ops(self)


def test_cache_engines_with_a_path_share_one_cache(tmp_path: Path) -> None:
    path = tmp_path / "engines.bin"
    _write(path, b"warm")
    backend = FakeBackend()
    settings = {"runtime_cache": path}
    first = _Engine(backend, name="a", inputs=(), outputs=(), settings=settings)  # type: ignore[arg-type]
    second = _Engine(backend, name="b", inputs=(), outputs=(), settings=settings)  # type: ignore[arg-type]
    native = first.execute()[0]
    assert second.execute()[0] is native
    handle = _handle(backend)
    assert handle.created == 1 and handle.deserialized == [b"warm"]
    native.kernels.append(b"compiled")
    shared = RuntimeCache.shared(path)
    assert shared.drain_count == 1
    shared.close()  # what interpreter exit does
    assert decode(path.read_bytes()) == (KEY, b"warm\ncompiled")


def test_cache_default_dir_honours_env_override(tmp_path, monkeypatch):
    from trt_runtime.cache import default_cache_dir

    target = tmp_path / "custom"
    monkeypatch.setenv("TRT_RUNTIME_CACHE_DIR", str(target))
    assert default_cache_dir() == target
    assert target.is_dir() and (target.stat().st_mode & 0o777) == 0o700
