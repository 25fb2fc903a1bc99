"""Hostile hosts: fork and spawn, hostile cache files, killed and starved writers, special files.

Each test is one cause of issue 21 (see docs/reliability.md, "Hostile files and hosts").
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import threading
import warnings
from pathlib import Path

import pytest
from _hostile_worker import load_and_save, run_with_cache, save_held_cache

from trt_runtime import CacheWarning, FormatError, RuntimeCache, StorageError, TensorSpec
from trt_runtime.cache import decode, encode
from trt_runtime.cache.framing import _PREFIX, FORMAT_VERSION, MAGIC
from trt_runtime.cli import main as cli_main
from trt_runtime.files import STALE_TEMP_SECONDS
from trt_runtime.formats import write_plan, write_tr01

START_METHODS = [m for m in ("fork", "spawn", "forkserver") if m in multiprocessing.get_all_start_methods()]
SPEC = (TensorSpec("x", "float32", (2,), True), TensorSpec("y", "float32", (2,), False))


@pytest.fixture
def private_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "private"
    directory.mkdir(mode=0o700)
    return directory


# -- cause 3: a forked or spawned worker can load and save any cache its parent touched ---------


@pytest.mark.parametrize("method", START_METHODS)
def test_hostile_worker_saves_a_cache_its_parent_saved(private_dir: Path, method: str) -> None:
    path = private_dir / "c.bin"
    parent = RuntimeCache(path)
    parent.load_bytes(b"parent-kernels;")
    parent.save()  # the parent now holds a lock object for this path
    with parent.locked():  # ... and has used it
        pass
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=load_and_save, args=(os.fspath(path), b"child-kernels;", queue))
    child.start()
    status, loaded, before = queue.get(timeout=60)
    child.join(30)
    assert (status, loaded, before) == ("ok", True, b"parent-kernels;"), loaded
    assert child.exitcode == 0
    assert decode(path.read_bytes())[1] == b"parent-kernels;child-kernels;"
    again = RuntimeCache(path)  # and the parent still saves after its child did
    again.load()
    again.save()


@pytest.mark.skipif("fork" not in START_METHODS, reason="needs the fork start method")
def test_hostile_fork_while_another_thread_holds_the_cache_lock(private_dir: Path) -> None:
    path = private_dir / "c.bin"
    cache = RuntimeCache(path)
    cache.load_bytes(b"k;")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._state.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        with warnings.catch_warnings():  # Python 3.12+ warns about fork with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            child = ctx.Process(target=save_held_cache, args=(cache, queue))
            child.start()
        status = queue.get(timeout=30)
        child.join(10)
    finally:
        release.set()
        holder.join()
    assert status[0] == "ok", status
    assert decode(path.read_bytes())[1] == b"k;"


# -- cause 4: a cache file with a hostile key (valid checksum) ---------------------------------


def _framed(key_json: bytes, payload: bytes = b"kernels") -> bytes:
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(key_json), len(payload))
    return prefix + hashlib.sha256(prefix + key_json + payload).digest() + key_json + payload


@pytest.mark.parametrize(
    "key_json",
    [b"[" * 100_000 + b"]" * 100_000, b"[" * 65 + b"]" * 65, b'{"flavour":' + b"9" * 5000 + b"}"],
    ids=["nesting-100000", "nesting-65", "5000-digits"],
)
def test_hostile_cache_key_is_ignored_with_a_warning(private_dir: Path, key_json: bytes) -> None:
    with pytest.raises(FormatError, match="cache key in the header"):
        decode(_framed(key_json))
    path = private_dir / "c.bin"
    path.write_bytes(_framed(key_json))
    cache = RuntimeCache(path)
    with pytest.warns(CacheWarning, match="ignored runtime cache file"):
        assert cache.load() is False
    cache.load_bytes(b"fresh")
    cache.save()  # replaces the hostile file
    assert decode(path.read_bytes())[1] == b"fresh"


def test_hostile_cache_key_through_the_cli_is_one_warning_line(
    private_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_with_cache(private_dir, _framed(b"[" * 100_000 + b"]" * 100_000), "-q") == 0
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert any("ignored runtime cache file" in line and "nests containers" in line for line in lines), err
    assert all(line.startswith("trt-runtime: warning: ") for line in lines), err
    assert ".py:" not in err and "CacheWarning" not in err


# -- also seen: writers killed mid-write, and disks that fill up --------------------------------


@pytest.mark.parametrize("writer", ["plan", "tr01"])
def test_hostile_writer_removes_temps_of_killed_writers(tmp_path: Path, writer: str) -> None:
    target = tmp_path / "model.bin"
    dead = tmp_path / f".model.bin.{2**22 + 12345}.0123456789ab.tmp"  # a pid that cannot exist
    old = tmp_path / f".model.bin.{os.getpid()}.00000000000a.tmp"
    live = tmp_path / f".model.bin.{os.getpid()}.00000000000b.tmp"
    for stale in (dead, old, live):
        stale.write_bytes(b"torn")
    os.utime(old, (0, os.path.getmtime(old) - STALE_TEMP_SECONDS - 60))
    unrelated = tmp_path / ".other.bin.1.0123456789ab.tmp"
    unrelated.write_bytes(b"keep")
    if writer == "plan":
        write_plan(target, b"vtrt" + b"\x00" * 60)
    else:
        write_tr01(target, b"\x00" * 64, SPEC)
    assert not dead.exists() and not old.exists()
    assert live.exists() and unrelated.exists()  # a live writer's temp, another file's temp
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == sorted(
        [live.name, unrelated.name]
    )


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
def test_hostile_writer_disk_error_names_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    target = tmp_path / "model.tr01"
    write_tr01(target, b"\x01" * 64, SPEC)
    before = target.read_bytes()

    def fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(
        StorageError, match=rf"could not write {target}: errno {code} \({errno.errorcode[code]}\)"
    ) as info:
        write_tr01(target, b"\x02" * 64, SPEC)
    assert isinstance(info.value, OSError) and info.value.errno == code
    assert info.value.filename == os.fspath(target)
    assert target.read_bytes() == before  # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["model.tr01"]  # no temp left


def test_hostile_writer_into_a_missing_directory_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=rf"could not write {tmp_path}/missing/m.plan: errno 2 \(ENOENT\)"):
        write_plan(tmp_path / "missing" / "m.plan", b"vtrt" + b"\x00" * 60)


# -- cause 1, for cache files: `trt-runtime cache info` never blocks on a FIFO -------------------


def test_hostile_cache_info_with_a_fifo_in_the_cache_directory(
    private_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(private_dir / "runtime-cache-x.bin")
    (private_dir / "runtime-cache-y.bin").write_bytes(encode(b"k"))
    assert cli_main(["--json", "cache", "info", "--dir", os.fspath(private_dir)]) == 0
    names = [e["name"] for e in json.loads(capsys.readouterr().out)["entries"]]
    assert names == ["runtime-cache-y.bin"]  # the FIFO is skipped, never opened
