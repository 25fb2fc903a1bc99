"""``trt-runtime cache [info|path|clear]``: the per-user runtime cache directory.

Without an action it shows the directory and its entries, as ``info`` does. Only the
files trt-runtime writes there are listed: caches (``*.bin``, with the key each was made
for read from its header), their lock files (``*.bin.lock``) and the temp files of an
interrupted save (``.NAME.bin.PID.HEX.tmp``). ``clear`` deletes only what ``info``
recognises as trt-runtime's: a ``.bin`` without a readable trt-runtime header is listed
("not a trt-runtime cache file") and kept. It removes a cache's files only while holding
that cache's lock (``--lock-timeout``, default as ``RuntimeCache``): files of a cache
whose lock another process holds are kept and named. No action creates the directory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trt_runtime.cli.output import CliError, Output, UsageError, human_size, jsonable

__all__ = ["CACHE_ACTIONS", "LOCK_TIMEOUT", "cache_command", "cache_entries"]

#: What ``trt-runtime cache`` can do; the first is what a bare ``cache`` does.
CACHE_ACTIONS = ("info", "path", "clear")

#: Seconds ``clear`` waits for a cache's lock before keeping it (RuntimeCache's ``lock_timeout``).
LOCK_TIMEOUT = 30.0

#: Files trt-runtime writes in a cache directory: caches (``*.bin``), their lock files and
#: the temp files of an interrupted save. Anything else there is never listed or deleted.
_CACHE_SUFFIXES = (".bin", ".lock", ".tmp")
_LOCK_NAME = re.compile(r"^.+\.bin\.lock$")
_TEMP_NAME = re.compile(r"^\..+\.bin\.\d+\.[0-9a-f]+\.tmp$")


def _cache_dir(args: argparse.Namespace) -> Path:
    if args.dir is not None:
        return Path(args.dir)
    from trt_runtime.cache import default_cache_dir

    return Path(default_cache_dir(create=False))  # clear with nothing to clear creates nothing


def _read_cache_key(path: Path) -> tuple[Any, str]:
    """``(key, '')`` from a cache file's header, or ``(None, why not)``."""
    from trt_runtime.cache import decode
    from trt_runtime.cache.storage import read_file

    try:
        key, _payload = decode(read_file(path) or b"")
    except Exception as exc:
        why = str(exc).removeprefix("not a trt-runtime cache file").lstrip(":; ")
        return None, f"not a trt-runtime cache file ({why or type(exc).__name__}); kept by clear"
    if key is None:
        return None, "not a trt-runtime cache file (no key recorded); kept by clear"
    return key, ""


def cache_entries(directory: Path) -> list[dict[str, Any]]:
    """The files trt-runtime wrote in ``directory``, sorted by name.

    Each is a dict of ``path``, ``name``, ``kind`` (cache, lock, temp), ``bytes``, ``key``
    (what a cache file's header records, or ``None``), ``note`` (why there is no key) and
    ``recognised`` (a file trt-runtime wrote: what ``clear`` deletes).
    """
    if not directory.is_dir():
        return []
    entries = []
    for path in sorted(directory.iterdir()):
        if not path.is_file() or path.suffix not in _CACHE_SUFFIXES:
            continue
        kind = {".bin": "cache", ".lock": "lock", ".tmp": "temp"}[path.suffix]
        if kind == "cache":
            key, note = _read_cache_key(path)
            recognised = key is not None
        else:
            key, note = None, kind + " file"
            recognised = bool((_LOCK_NAME if kind == "lock" else _TEMP_NAME).match(path.name))
            if not recognised:
                note = f"not a trt-runtime {kind} file; kept by clear"
        entries.append({
            "path": os.fspath(path),
            "name": path.name,
            "kind": kind,
            "bytes": path.stat().st_size,
            "key": jsonable(key) if key is not None else None,
            "note": note,
            "recognised": recognised,
        })
    return entries


def _key_text(key: Mapping[str, Any]) -> str:
    return (f"{key.get('flavour')} {key.get('version')}, compute capability "
            f"{key.get('compute_capability')}, driver {key.get('driver')}")


def _show(directory: Path, out: Output) -> int:
    entries = cache_entries(directory)
    total = sum(e["bytes"] for e in entries)
    out.emit({"path": os.fspath(directory), "exists": directory.is_dir(),
              "entries": entries, "total_bytes": total})
    out.notice(f"cache directory: {directory}" + ("" if directory.is_dir() else " (does not exist yet)"))
    if entries:
        out.table(
            f"{len(entries)} file(s), {human_size(total)}",
            ["file", "size", "made for"],
            [[e["name"], human_size(e["bytes"]), _key_text(e["key"]) if e["key"] else e["note"]]
             for e in entries],
        )
    else:
        out.notice("no cache files")
    return 0


def _cache_of(entry: Mapping[str, Any]) -> Path:
    """The cache file an entry belongs to: itself, the cache of a lock, or of a temp file."""
    path = Path(entry["path"])
    if entry["kind"] == "lock":
        return path.with_name(path.name[: -len(".lock")])
    if entry["kind"] == "temp":
        return path.with_name(path.name[1:].rsplit(".", 3)[0])
    return path


def _remove_under_lock(cache: Path, entries: list[dict[str, Any]], timeout: float) -> str:
    """Remove ``entries`` of ``cache`` while holding its lock; ``''`` or why they were skipped.

    Under the lock no save of this cache is in progress, so its temp files are strays. The
    lock file goes last, still held: a process that then locks the inode no path names
    any more sees it unlinked and locks the path afresh (filelock checks ``st_nlink``).
    """
    from trt_runtime.cache.storage import lock_path, locked
    from trt_runtime.errors import CacheError

    try:
        with locked(cache, timeout):
            for entry in sorted(entries, key=lambda e: e["kind"] == "lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry["path"])
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path(cache))  # also the one taking the lock just created
    except CacheError as exc:  # CacheLockTimeout: another process holds it; or a symlinked lock
        return str(exc).split("; the cache stays in memory")[0]
    return ""


def _clear(directory: Path, out: Output, *, yes: bool, timeout: float) -> int:
    entries = [e for e in cache_entries(directory) if e["recognised"]]
    total = sum(e["bytes"] for e in entries)
    if not entries:
        out.emit({"path": os.fspath(directory), "removed": [], "removed_bytes": 0, "skipped": []})
        out.notice(f"nothing to clear in {directory}")
        return 0
    if not yes:
        if not sys.stdin or not sys.stdin.isatty():
            raise CliError(f"refusing to delete {len(entries)} cache file(s) in {directory} "
                           "without confirmation; pass --yes")
        answer = input(f"delete {len(entries)} cache file(s) ({human_size(total)}) in {directory}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            out.notice("nothing deleted")
            return 1
    groups: dict[Path, list[dict[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(_cache_of(entry), []).append(entry)
    removed: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for cache, group in groups.items():
        reason = _remove_under_lock(cache, group, timeout)
        if reason:
            skipped.extend({"path": e["path"], "reason": reason} for e in group)
            out.warn(f"kept {len(group)} file(s) of {cache.name}: {reason}")
        else:
            removed.extend(e for e in group)
    removed_bytes = sum(e["bytes"] for e in removed)
    out.emit({"path": os.fspath(directory), "removed": [e["path"] for e in removed],
              "removed_bytes": removed_bytes, "skipped": skipped})
    out.notice(f"deleted {len(removed)} file(s), {human_size(removed_bytes)}, from {directory}"
               + (f"; kept {len(skipped)} whose lock another process holds" if skipped else ""))
    return 1 if skipped else 0


def cache_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime cache``; no action means ``info``."""
    directory = _cache_dir(args)
    if args.action == "path":
        out.emit({"path": os.fspath(directory)})
        if not out.json_mode:
            print(directory)
        return 0
    if args.action == "info":
        return _show(directory, out)
    timeout = getattr(args, "lock_timeout", LOCK_TIMEOUT)
    if not timeout >= 0 or timeout == float("inf"):
        raise UsageError(f"--lock-timeout must be a finite number of seconds >= 0; got {timeout}")
    return _clear(directory, out, yes=args.yes, timeout=timeout)
