"""``trt-runtime cache clear`` respects a held lock: it removes a cache's files only while
holding that cache's lock, keeps (and names) those of a cache another process holds, and
the lock keeps excluding other processes throughout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _cli_runner import run_cli

from trt_runtime.cache import CacheKey, encode
from trt_runtime.cache.storage import locked
from trt_runtime.errors import CacheLockTimeout

KEY = CacheKey("tensorrt_rtx", "1.6.1.120", "9.0", "13000")

HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from trt_runtime.cache.storage import locked

    with locked(Path(sys.argv[1]), 5):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes stdin
""")


def _cache(directory: Path, name: str) -> Path:
    path = directory / name
    path.write_bytes(encode(b"k" * 10, KEY))
    return path


def _hold(cache: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(cache)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_cache_clear_keeps_the_files_of_a_held_lock(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    held = _cache(tmp_path, "runtime-cache-held.bin")
    free = _cache(tmp_path, "runtime-cache-free.bin")
    (tmp_path / "runtime-cache-free.bin.lock").write_bytes(b"")
    stray = tmp_path / ".runtime-cache-free.bin.999999.abcdef.tmp"
    stray.write_bytes(b"x")
    holder = _hold(held)
    try:
        code, out, err = run_cli(capsys, "--json", "cache", "clear", "--yes", "--dir", tmp_path,
                                 "--lock-timeout", "0.2")
        assert code == 1, err
        document = json.loads(out)
        assert sorted(document["removed"]) == sorted(
            str(p) for p in (free, tmp_path / "runtime-cache-free.bin.lock", stray))
        assert {s["path"] for s in document["skipped"]} == {str(held), str(held) + ".lock"}
        reasons = [s["reason"] for s in document["skipped"]]
        assert all("was held by another process for more than 0.2 s" in r for r in reasons)
        (warning,) = [ln for ln in err.splitlines() if "warning" in ln]
        assert "kept 2 file(s) of runtime-cache-held.bin" in warning
        assert held.exists() and (tmp_path / "runtime-cache-held.bin.lock").exists()
        assert not free.exists() and not stray.exists()
        # The lock still excludes a third process: its save would wait, not write.
        with pytest.raises(CacheLockTimeout, match="was held by another process"), locked(held, 0.2):
            pass  # pragma: no cover
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    code, out, err = run_cli(capsys, "--json", "cache", "clear", "--yes", "--dir", tmp_path)
    assert code == 0, err
    assert sorted(json.loads(out)["removed"]) == sorted([str(held), str(held) + ".lock"])
    assert not list(tmp_path.iterdir())


def test_cache_clear_lock_timeout_must_be_finite(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _cache(tmp_path, "a.bin")
    code, _, err = run_cli(capsys, "cache", "clear", "--yes", "--dir", tmp_path, "--lock-timeout", "nan")
    assert code == 2 and "--lock-timeout must be a finite number of seconds >= 0; got nan" in err
