"""Runtime cache reliability: concurrent processes, kills, full disks, unsafe paths, corrupt files.

The numbers in the section titles are the items of issue 7. Multi-process tests run
``tests/_cache_worker.py`` in subprocesses.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from _cache_worker import KEY, FakeBackend, FakeHandle, check_payload, make_payload

from trt_runtime import CacheError, CacheLockTimeout, CacheWarning, LostUpdateWarning, RuntimeCache
from trt_runtime.cache import STALE_TEMP_SECONDS, decode, encode, storage
from trt_runtime.contexts import runtime_cache

WORKER = Path(__file__).resolve().parents[1] / "_cache_worker.py"


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker {proc.args} failed ({proc.returncode}):\n{err}"
    return out


def _wait_for(path: Path, proc: subprocess.Popen[str], limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early ({proc.returncode}): {proc.communicate()[1]}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def _temps(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


def _materialized(path: Path, kernels: list[bytes]) -> tuple[RuntimeCache, FakeHandle]:
    backend = FakeBackend()
    cache = RuntimeCache(path)
    cache.load()
    cache.ensure_materialized(None, backend=backend).kernels = list(kernels)
    return cache, backend.handles[0]


def _seed(path: Path, writer: int = 0, iteration: int = 0) -> bytes:
    blob = encode(make_payload(writer, iteration), KEY)
    path.write_bytes(blob)
    return blob


# -- 1, 2: concurrent savers and readers -------------------------------------------------------
def test_cache_reliability_8_processes_50_saves(tmp_path: Path) -> None:
    path, start = tmp_path / "c.bin", tmp_path / "start"
    _seed(path, writer=999)
    savers = [_spawn("saver", str(path), str(w), "50", str(start)) for w in range(8)]
    start.write_text("go")
    results = [json.loads(_finish(p, timeout=120)) for p in savers]
    for result in results:
        assert len(result["seen"]) == 50  # every load succeeded with a complete cache
        assert all(w in (*range(8), 999) for w, _ in result["seen"])
    final = RuntimeCache(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert final.load()
    writer, iteration = check_payload(final.serialize())
    assert writer in range(8) and iteration == 49  # the last save of some saver
    assert _temps(tmp_path) == []


def test_cache_reliability_readers_see_complete_files(tmp_path: Path) -> None:
    path, start, stop = tmp_path / "c.bin", tmp_path / "start", tmp_path / "stop"
    _seed(path, writer=999)
    readers = [_spawn("reader", str(path), str(stop), str(start)) for _ in range(2)]
    savers = [_spawn("saver", str(path), str(w), "30", str(start)) for w in range(3)]
    start.write_text("go")
    for proc in savers:
        _finish(proc, timeout=120)
    stop.write_text("stop")
    for proc in readers:
        result = json.loads(_finish(proc))  # a torn or mixed file fails the reader
        assert result["reads"] > 0
        assert set(result["writers"]) <= {0, 1, 2, 999}


# -- 4: kill -9 of a saver ---------------------------------------------------------------------------
@pytest.mark.parametrize("point", ["locked", "written", "replaced"])
def test_cache_reliability_kill_during_save(tmp_path: Path, point: str) -> None:
    path, ready = tmp_path / "c.bin", tmp_path / "ready"
    old = _seed(path)
    proc = _spawn("pause", str(path), point, str(ready))
    _wait_for(ready, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    _key, payload = decode(path.read_bytes())  # complete: old or new, never torn
    expected = {"locked": [(0, 0)], "written": [(0, 0)], "replaced": [(99, 1)]}[point]
    assert [check_payload(payload)] == expected
    if point == "written":
        assert path.read_bytes() == old
        assert len(_temps(tmp_path)) == 1  # the killed saver's temp file
    # The lock died with the saver and its temp file goes with the next save.
    cache, _ = _materialized(path, [b"after-kill"])
    cache._state.lock_timeout = 2.0
    started = time.monotonic()
    cache.save()
    assert time.monotonic() - started < 2.0
    assert decode(path.read_bytes())[1] == b"after-kill"
    assert _temps(tmp_path) == []


def test_cache_reliability_kill_at_random_moments(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    _seed(path)
    rng = random.Random(7)
    for attempt in range(3):
        ready = tmp_path / f"ready-{attempt}"
        proc = _spawn("loop", str(path), str(ready))
        _wait_for(ready, proc)
        time.sleep(rng.uniform(0.02, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        check_payload(decode(path.read_bytes())[1])
    cache, _ = _materialized(path, [b"final"])
    cache._state.lock_timeout = 2.0
    cache.save()
    assert decode(path.read_bytes())[1] == b"final"
    assert _temps(tmp_path) == []


def test_cache_reliability_stray_temps_of_live_savers_kept(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    live = tmp_path / f".c.bin.{os.getpid()}.0123456789ab.tmp"  # this process: alive
    old = tmp_path / f".c.bin.{os.getpid()}.ba9876543210.tmp"
    dead = tmp_path / ".c.bin.4194303.aaaaaaaaaaaa.tmp"  # above any default pid_max use
    unrelated = tmp_path / ".other.bin.4194303.aaaaaaaaaaaa.tmp"
    for stray in (live, old, dead, unrelated):
        stray.write_bytes(b"partial")
    past = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(old, (past, past))
    cache, _ = _materialized(path, [b"k"])
    cache.save()
    assert live.exists() and unrelated.exists()
    assert not old.exists() and not dead.exists()


# -- 5: disk full, I/O errors ----------------------------------------------------------------------
def _fail_temp_writes(monkeypatch: pytest.MonkeyPatch, code: int, after: int = 0) -> None:
    real_write = os.write
    written = {"n": 0}

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            if written["n"] >= after:
                raise OSError(code, os.strerror(code))
            n = real_write(fd, bytes(data)[: max(1, (after - written["n"]))])
            written["n"] += n
            return n
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize(("code", "after"), [(errno.ENOSPC, 0), (errno.ENOSPC, 1000), (errno.EIO, 10)])
def test_cache_reliability_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, after: int
) -> None:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell the temp file's descriptor apart")
    path = tmp_path / "c.bin"
    old = _seed(path)
    kernels = [b"new-kernel-%d" % i for i in range(500)]  # a blob larger than `after`
    cache, _ = _materialized(path, kernels)
    _fail_temp_writes(monkeypatch, code, after)
    name = errno.errorcode[code]
    with pytest.raises(CacheError, match=rf"{path}.*errno {code} \({name}\)"):
        cache.save()
    assert path.read_bytes() == old
    assert _temps(tmp_path) == []
    monkeypatch.undo()
    cache.save()  # the kernels are still in memory
    assert decode(path.read_bytes())[1] == b"\n".join(kernels)


def test_cache_reliability_fsync_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.bin"
    old = _seed(path)
    cache, _ = _materialized(path, [b"new"])

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CacheError, match=rf"{path}.*EIO"):
        cache.save()
    assert path.read_bytes() == old and _temps(tmp_path) == []


def test_cache_reliability_disk_full_at_autosave_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell the temp file's descriptor apart")
    path = tmp_path / "c.bin"
    old = _seed(path)
    cache = RuntimeCache(path, autosave=True)
    cache.load()
    cache.ensure_materialized(None, backend=FakeBackend()).kernels = [b"new"]
    _fail_temp_writes(monkeypatch, errno.ENOSPC)
    with pytest.warns(CacheWarning, match=rf"{path}.*ENOSPC") as record:
        cache.close()
    assert len(record) == 1
    assert path.read_bytes() == old and _temps(tmp_path) == []


# -- 6: read-only directory ------------------------------------------------------------------------
def _make_read_only(directory: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """chmod 0555; where that does not stop this user (root), refuse creation in ``directory``."""
    directory.chmod(0o555)
    if not os.access(directory, os.W_OK):
        return "chmod"
    real_open = os.open

    def read_only_open(file: object, flags: int, *args: object, **kwargs: object) -> int:
        if flags & os.O_CREAT and Path(os.path.abspath(os.fspath(file))).parent == directory:  # type: ignore[arg-type]
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(file))  # type: ignore[arg-type]
        return real_open(file, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", read_only_open)
    return "simulated"


def test_cache_reliability_read_only_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "ro"
    directory.mkdir(mode=0o755)
    path = directory / "c.bin"
    old = _seed(path)
    how = _make_read_only(directory, monkeypatch)
    try:
        cache = RuntimeCache(path, autosave=True)
        assert cache.load() and cache.has_pending  # load works
        cache.ensure_materialized(None, backend=FakeBackend()).kernels.append(b"new")
        with pytest.raises(CacheError, match=rf"{path}.*(EACCES|EROFS)"):
            cache.save()
        with pytest.warns(CacheWarning, match=str(path)) as record:
            cache.close()  # autosave: warns, never raises
        assert len(record) == 1, how
        assert path.read_bytes() == old
    finally:
        directory.chmod(0o755)


def test_cache_reliability_read_only_directory_runtime_cache_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "ro"
    directory.mkdir(mode=0o755)
    path = directory / "c.bin"
    _seed(path)

    class Engine:  # the two attributes runtime_cache() needs
        backend = FakeBackend()
        runtime_settings = None  # replaced by runtime_config

        def __init__(self) -> None:
            from trt_runtime import RuntimeSettings

            self.runtime_settings = RuntimeSettings()

        def execute(self) -> None:
            cache = self.runtime_settings.runtime_cache
            cache.ensure_materialized(None, backend=self.backend).kernels.append(b"new")

        def synchronize(self) -> None:
            pass

    _make_read_only(directory, monkeypatch)
    try:
        engine = Engine()
        with pytest.warns(CacheWarning, match=str(path)) as record:
            with runtime_cache(engine, path) as cache:
                assert cache.has_pending
                engine.execute()
        assert len(record) == 1
    finally:
        directory.chmod(0o755)


@pytest.mark.skipif(not hasattr(os, "O_CREAT"), reason="POSIX only")
def test_cache_reliability_read_only_directory_at_exit(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir(mode=0o755)
    path = directory / "c.bin"
    old = _seed(path)
    proc = _spawn("exit-readonly", str(path))
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert "CacheWarning" in err and str(path) in err and "EROFS" in err
    assert err.count("CacheWarning") == 1
    assert path.read_bytes() == old


# -- 7: symlinks and unsafe directories --------------------------------------------------------------
@pytest.fixture
def victim(tmp_path: Path) -> Path:
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    return target


def test_cache_reliability_symlink_at_cache_path(tmp_path: Path, victim: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    path = directory / "c.bin"
    path.symlink_to(victim)
    cache, _ = _materialized(tmp_path / "elsewhere.bin", [b"k"])
    with pytest.raises(CacheError, match=rf"{path}.*symbolic link"):
        cache.save(path)
    with pytest.raises(CacheError, match=rf"{path}.*symbolic link"):
        RuntimeCache(path).load()
    assert victim.read_bytes() == b"precious" and path.is_symlink()


@pytest.mark.parametrize(("where", "message"), [
    ("lock", r"lock path .*c\.bin\.lock is a symbolic link"),
    ("temp", r"temp path .*\.tmp is a symbolic link"),
])
def test_cache_reliability_symlink_at_a_path_save_writes(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch, where: str, message: str
) -> None:
    path = tmp_path / "c.bin"
    if where == "lock":
        Path(str(path) + ".lock").symlink_to(victim)
    else:
        temp_name = f".c.bin.{os.getpid()}.000000000000.tmp"
        (tmp_path / temp_name).symlink_to(victim)
        monkeypatch.setattr(storage, "temp_name", lambda p: temp_name)
    cache, _ = _materialized(path, [b"k"])
    with pytest.raises(CacheError, match=message):
        cache.save()
    assert victim.read_bytes() == b"precious" and not path.exists()


def test_cache_reliability_symlink_swapped_in_during_save(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.bin"
    _seed(path)

    def swap(point: str, target: Path) -> None:
        if point == "written":
            target.unlink()
            target.symlink_to(victim)

    cache, _ = _materialized(path, [b"k"])
    monkeypatch.setattr(storage, "checkpoint", swap)
    with pytest.raises(CacheError, match=rf"{path}.*symbolic link"):
        cache.save()
    assert victim.read_bytes() == b"precious"
    assert path.is_symlink() and _temps(tmp_path) == []


def _cache_and_directory(tmp_path: Path, name: str, mode: int) -> tuple[RuntimeCache, Path, Path]:
    """A cache with a kernel, a directory of ``mode`` and the cache path in it."""
    directory = tmp_path / name
    directory.mkdir()
    directory.chmod(mode)
    cache, _ = _materialized(tmp_path / "x.bin", [b"k"])
    return cache, directory, directory / "c.bin"


def test_cache_reliability_world_writable_directory(tmp_path: Path) -> None:
    cache, directory, path = _cache_and_directory(tmp_path, "open", 0o777)
    with pytest.raises(CacheError, match=rf"{directory} is writable by others \(mode 0777\)"):
        cache.save(path)
    with pytest.raises(CacheError, match="writable by others"):
        RuntimeCache(path).load()
    assert os.listdir(directory) == []


def test_cache_reliability_group_writable_directory_allowed(tmp_path: Path) -> None:
    # umask 002 (per-user private groups) makes project directories 0775: not refused.
    cache, _, path = _cache_and_directory(tmp_path, "shared-group", 0o775)
    cache.save(path)
    fresh = RuntimeCache(path)
    assert fresh.load()
    assert fresh.serialize() == cache.serialize()


def test_cache_reliability_directory_of_another_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o755)
    path = directory / "c.bin"
    if os.geteuid() == 0:
        os.chown(directory, 4242, -1)
    else:  # cannot give the directory away: pretend to be someone else
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(directory).st_uid + 4242)
    cache, _ = _materialized(tmp_path / "x.bin", [b"k"])
    with pytest.raises(CacheError, match=rf"{directory} is owned by uid \d+, expected this user"):
        cache.save(path)
    assert os.listdir(directory) == []


# -- 8: corrupt files --------------------------------------------------------------------------------
def _corrupt(kind: str, good: bytes) -> bytes:
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "bit-flipped":
        data = bytearray(good)
        data[len(data) - 100] ^= 0x04
        return bytes(data)
    if kind == "empty":
        return b""
    return random.Random(3).randbytes(4096)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("truncated", "truncated"),
        ("bit-flipped", "checksum mismatch"),
        ("empty", "empty"),
        ("random", "not a trt-runtime cache file"),
    ],
)
def test_cache_reliability_corrupt_file_ignored(tmp_path: Path, kind: str, reason: str) -> None:
    path = tmp_path / "c.bin"
    path.write_bytes(_corrupt(kind, encode(make_payload(1, 1), KEY)))
    backend = FakeBackend()
    cache = RuntimeCache(path, autosave=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.load() is False
        native = cache.ensure_materialized(None, backend=backend)
        native.kernels = [b"fresh"]
        cache.save()  # overwrites the broken file, without a lost-update warning
        cache.close()
    messages = [str(w.message) for w in record]
    assert len(record) == 1 and issubclass(record[0].category, CacheWarning), messages
    assert str(path) in messages[0] and reason in messages[0]
    assert backend.handles[0].deserialized == []  # the spy: TensorRT never saw the bytes
    assert decode(path.read_bytes())[1] == b"fresh"


def test_cache_reliability_corrupt_shared_cache_reported_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.bin"
    path.write_bytes(b"\x89TRTRC\r\n" + b"\0" * 10)
    backend = FakeBackend()
    cache = RuntimeCache.shared(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(5):
            cache.ensure_materialized(None, backend=backend)
        cache.serialize()
    assert len(record) == 1 and "truncated header" in str(record[0].message)
    assert backend.handles[0].deserialized == []
    cache.close()


# -- 11: the lock ------------------------------------------------------------------------------------
def test_cache_reliability_lock_held_past_timeout(tmp_path: Path) -> None:
    path, ready, release = tmp_path / "c.bin", tmp_path / "ready", tmp_path / "release"
    cache, _ = _materialized(path, [b"kept"])
    cache._state.lock_timeout = 0.3
    holder = _spawn("hold-lock", str(path), str(ready), str(release))
    try:
        _wait_for(ready, holder)
        with pytest.raises(CacheLockTimeout, match=rf"lock file {path}\.lock was held .* 0\.3 s"):
            cache.save()
        assert not path.exists()
        assert cache.serialize() == b"kept"  # still in memory
    finally:
        release.write_text("go")
        _finish(holder)
    cache.save()  # the retry works
    assert decode(path.read_bytes())[1] == b"kept"


def test_cache_reliability_lock_reentrant_in_one_thread(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    cache, _ = _materialized(path, [b"one"])
    other, _ = _materialized(path, [b"two"])
    cache._state.lock_timeout = other._state.lock_timeout = 2.0
    errors: list[BaseException] = []

    def nested() -> None:
        try:
            with cache.locked():
                cache.save()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", LostUpdateWarning)
                    other.save()  # another object, same file, same thread
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=nested)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "re-entrant lock acquisition hung"
    assert errors == []
    assert decode(path.read_bytes())[1] == b"two"


def test_cache_reliability_lock_excludes_other_threads(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    cache, _ = _materialized(path, [b"k"])
    cache._state.lock_timeout = 0.2
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with cache.locked():
            holding.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        with pytest.raises(CacheLockTimeout, match=r"c\.bin\.lock"):
            cache.save()
    finally:
        done.set()
        thread.join(10)
    cache.save()
