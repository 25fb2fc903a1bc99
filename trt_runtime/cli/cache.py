"""``trt-runtime cache [info|path|clear]``: the per-user runtime cache directory.

Without an action it shows the directory and its entries, as ``info`` does. Only the
files trt-runtime writes there are listed: caches (``*.bin``, with the key each was made
for read from its header), their lock files (``*.bin.lock``) and the temp files of an
interrupted save (``.NAME.bin.PID.HEX.tmp``). ``clear`` deletes only what ``info``
recognises as trt-runtime's: a ``.bin`` without a readable trt-runtime header is listed
("not a trt-runtime cache file") and kept. No action creates the directory.
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

from trt_runtime.cli.output import CliError, Output, human_size, jsonable

__all__ = ["CACHE_ACTIONS", "cache_command", "cache_entries"]

#: What ``trt-runtime cache`` can do; the first is what a bare ``cache`` does.
CACHE_ACTIONS = ("info", "path", "clear")

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


def _clear(directory: Path, out: Output, *, yes: bool) -> int:
    entries = [e for e in cache_entries(directory) if e["recognised"]]
    total = sum(e["bytes"] for e in entries)
    if not entries:
        out.emit({"path": os.fspath(directory), "removed": [], "removed_bytes": 0})
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
    removed = []
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry["path"])
        removed.append(entry["path"])
    out.emit({"path": os.fspath(directory), "removed": removed, "removed_bytes": total})
    out.notice(f"deleted {len(removed)} file(s), {human_size(total)}, from {directory}")
    return 0


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
    return _clear(directory, out, yes=args.yes)
