"""The ``trt-runtime`` command line: demo, inspect, run, bench, cache, backends.

Exit codes: 0 success, 1 runtime error, 2 usage error, 130 interrupted. Errors are
one line on stderr (``trt-runtime: error: ...``); ``--debug`` adds the traceback.
``--json`` prints one JSON document on stdout for scripts. rich is used for tables
and progress when installed (``trt-runtime[cli]``); plain text otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["CliError", "UsageError", "build_parser", "inspect_file", "main"]

PROG = "trt-runtime"


class CliError(Exception):
    """A runtime failure reported as one line; exit code 1."""

    exit_code = 1


class UsageError(CliError):
    """Bad command-line usage; exit code 2."""

    exit_code = 2


# ----------------------------------------------------------------------------- output
class _Output:
    """Where a command's text goes: rich when installed, plain print otherwise.

    ``quiet`` drops progress and informational lines; results and notices stay.
    ``json_mode`` drops everything but the one JSON document printed by :meth:`emit`.
    """

    def __init__(self, *, quiet: bool = False, json_mode: bool = False, plain: bool = False) -> None:
        self.quiet = quiet
        self.json_mode = json_mode
        self._plain = plain
        self._console: Any = None

    @property
    def console(self) -> Any:
        """A rich Console on the *current* ``sys.stdout`` or ``None`` without rich."""
        if self._plain:
            return None
        if self._console is None or self._console.file is not sys.stdout:
            try:
                from rich.console import Console
            except ImportError:
                self._plain = True
                return None
            # Piped output is read by people too: wider than rich's 80-column default.
            width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
            self._console = Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)
        return self._console

    def _print(self, text: str) -> None:
        console = self.console
        if console is None:
            print(text, flush=True)
        else:
            console.print(text, markup=False)

    def info(self, text: str) -> None:
        """Narrative line; hidden by ``--quiet`` and ``--json``."""
        if not (self.quiet or self.json_mode):
            self._print(text)

    def notice(self, text: str) -> None:
        """A line the user must see (e.g. what was skipped and why); hidden by ``--json`` only."""
        if not self.json_mode:
            self._print(text)

    def emit(self, document: Any) -> None:
        """Print the JSON document of the command (``--json`` only)."""
        if self.json_mode:
            sys.stdout.write(json.dumps(_jsonable(document), indent=2, sort_keys=False) + "\n")
            sys.stdout.flush()

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if self.json_mode:
            return
        cells = [[_cell(v) for v in row] for row in rows]
        console = self.console
        if console is not None:
            from rich.table import Table

            table = Table(title=title or None, title_justify="left")
            for column in columns:
                table.add_column(column, overflow="fold")
            for row in cells:
                table.add_row(*row)
            console.print(table)
            return
        if title:
            print(title)
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
        print("  ".join("-" * w for w in widths))
        for row in cells:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())

    def fields(self, pairs: Sequence[tuple[str, Any]]) -> None:
        """Aligned ``key  value`` lines."""
        if self.json_mode:
            return
        width = max((len(k) for k, _ in pairs), default=0)
        for key, value in pairs:
            self._print(f"  {key.ljust(width)}  {_cell(value)}")

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[Callable[[str], None]]:
        """A spinner while a slow step runs (build, JIT); a plain line when not a terminal.

        Yields ``update(text)``, which changes the spinner's text (a no-op without one).
        """
        if self.quiet or self.json_mode:
            yield lambda _text: None
            return
        console = self.console
        if console is not None and console.is_terminal:
            with console.status(text) as spinner:
                yield lambda new: spinner.update(new)
            return
        self._print(text)
        yield lambda _text: None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def _compact(value: Any) -> str:
    """One line for a nested value: ``k=v, k=v`` for mappings, comma lists for sequences."""
    value = _jsonable(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_compact(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return "[" + ", ".join(_compact(v) for v in value) + "]"
    return _cell(value)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit} ({n:,} bytes)"
        size /= 1024
    return f"{n} B"  # pragma: no cover - loop always returns


# ----------------------------------------------------------------------------- parser
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


_COMMANDS = ("demo", "inspect", "run", "bench", "cache", "backends")
_CUDA_GRAPH_CHOICES = ("disabled", "whole_graph_capture")
_DYNAMIC_CHOICES = ("lazy", "eager", "none")


def _add_globals(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default: Any = argparse.SUPPRESS if suppress else False
    group = parser.add_argument_group("global options")
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="print results only: no progress or informational lines")
    group.add_argument("--json", action="store_true", default=default,
                       help="print one machine-readable JSON document on stdout")
    group.add_argument("--debug", action="store_true", default=default,
                       help="show the traceback of an error")


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cuda-graph-strategy", choices=_CUDA_GRAPH_CHOICES, default=None,
                        help="CUDA graph strategy (default: the engine's default, disabled)")
    parser.add_argument("--dynamic-shapes-kernel-strategy", choices=_DYNAMIC_CHOICES, default=None,
                        help="dynamic-shapes kernel specialization strategy (default: lazy)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``trt-runtime`` (global options work before or after the command)."""
    parser = _Parser(
        prog=PROG,
        description="Build, inspect, run and benchmark TensorRT / TensorRT-RTX engines.",
    )
    _add_globals(parser, suppress=False)
    from trt_runtime import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_globals(p, suppress=True)
        return p

    p = command("demo", "build a small engine, write it as plan / TR01 / .pte, inspect and run it")
    p.add_argument("--out", metavar="DIR", type=Path, default=None,
                   help="output directory (default: a new temporary directory, printed)")
    p.add_argument("--backend", metavar="NAME", default=None,
                   help="backend for the GPU part (default: the first available)")
    p.set_defaults(handler=_cmd_demo)

    p = command("inspect", "show what an engine file is: format, bindings, device, version")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    p.add_argument("--backend", metavar="NAME", default=None,
                   help="backend used to deserialize a raw plan on a GPU (default: first available)")
    p.add_argument("--no-load", action="store_true",
                   help="never deserialize the engine; show only what the container records")
    p.set_defaults(handler=_cmd_inspect)

    p = command("run", "run an engine once on random or given inputs; write outputs as .npy")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    p.add_argument("--backend", metavar="NAME", default=None, help="backend (default: first available)")
    p.add_argument("--input", metavar="NAME=FILE.npy", action="append", default=[],
                   help="take input NAME from a .npy file (repeatable); others are random")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    _add_settings(p)
    p.add_argument("--runtime-cache", metavar="PATH", type=Path, default=None,
                   help="load the runtime cache from PATH (if it exists) and save it back after the run")
    p.add_argument("--output-dir", metavar="DIR", type=Path, default=None,
                   help="where outputs (NAME.npy) and generated inputs (inputs/NAME.npy) go "
                        "(default: a new temporary directory, printed)")
    p.add_argument("--device", type=int, default=None, help="CUDA device (default: the container's)")
    p.set_defaults(handler=_cmd_run)

    p = command("bench", "per-call latency and throughput of one engine on one or more backends")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    p.add_argument("--backend", metavar="NAME", action="append", default=[],
                   help="backend to measure (repeatable; 'all' = every available; default: first available)")
    p.add_argument("--iterations", type=int, default=200, help="timed calls per backend (default: 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls first (default: 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    _add_settings(p)
    p.add_argument("--json-out", dest="json_path", metavar="PATH", type=Path, default=None,
                   help="also write the results, with raw samples, as JSON to PATH")
    p.add_argument("--plot", metavar="PATH", type=Path, default=None,
                   help="write a latency box plot PNG to PATH (needs matplotlib: trt-runtime[plot])")
    p.add_argument("--device", type=int, default=None, help="CUDA device (default: the container's)")
    p.set_defaults(handler=_cmd_bench)

    p = command("cache", "show or clear the per-user runtime cache directory")
    p.add_argument("action", choices=("info", "path", "clear"), help="what to do")
    p.add_argument("--dir", metavar="DIR", type=Path, default=None,
                   help="cache directory (default: trt_runtime.cache.default_cache_dir())")
    p.add_argument("-y", "--yes", action="store_true", help="clear without asking")
    p.set_defaults(handler=_cmd_cache)

    p = command("backends", "list installed backends, whether they can run here, and their capabilities")
    p.set_defaults(handler=_cmd_backends)
    return parser


# ----------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help and --version
            return int(exc.code or 0) if not isinstance(exc.code, str) else 2
        debug = args.debug
        if args.command is None:
            raise UsageError(f"a command is required: one of {', '.join(_COMMANDS)}")
        out = _Output(quiet=args.quiet, json_mode=args.json)
        code = args.handler(args, out)
        return int(code or 0)
    except KeyboardInterrupt:
        _error("interrupted", debug)
        return 130
    except CliError as exc:
        hint = f" (see '{PROG} --help')" if isinstance(exc, UsageError) else ""
        _error(f"{exc}{hint}", debug)
        return exc.exit_code
    except Exception as exc:
        _error(_describe_exception(exc), debug)
        return 1


def _error(message: str, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    line = " ".join(str(message).split())  # one line, whatever the message held
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)


def _describe_exception(exc: BaseException) -> str:
    from trt_runtime.errors import TrtRuntimeError

    if isinstance(exc, TrtRuntimeError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename}"
    if isinstance(exc, IsADirectoryError):
        return f"is a directory, not a file: {exc.filename}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}"
    if isinstance(exc, (OSError, ValueError, TypeError, ImportError)):
        return f"{exc}" if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)"


# ----------------------------------------------------------------------------- helpers
def _spec_dict(spec: Any) -> dict[str, Any]:
    return {
        "name": spec.name,
        "io": "input" if spec.is_input else "output",
        "dtype": spec.dtype,
        "shape": list(spec.shape),
        "profiles": [[list(s) for s in triple] for triple in spec.profiles],
        "data_dependent": bool(spec.data_dependent),
    }


def _profile_text(spec: Mapping[str, Any]) -> str:
    if not spec["profiles"]:
        return "-"
    return "; ".join(" / ".join(str(tuple(s)) for s in triple) for triple in spec["profiles"])


def _check_file(path: Path) -> None:
    if not path.exists():
        raise CliError(f"no such file: {path}")
    if path.is_dir():
        raise CliError(f"is a directory, not an engine file: {path}")


def _backend_reason(name: str | None) -> str:
    """Why ``get_backend(name)`` fails here, or '' if it succeeds."""
    from trt_runtime import get_backend

    try:
        get_backend(name)
    except Exception as exc:
        return str(exc)
    return ""


def _first_present(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key)
        if value not in (None, ""):
            return value
    return None


def _describe_container(path: Path) -> dict[str, Any]:
    from trt_runtime.formats import describe

    return dict(describe(path))


def inspect_file(
    path: str | os.PathLike[str],
    *,
    backend: str | None = None,
    load: bool = True,
) -> dict[str, Any]:
    """What ``trt-runtime inspect`` reports about ``path``, as a JSON-ready dict.

    Bindings come from the container when it records them (TR01/TR02/.pte); for a
    raw plan they need the engine deserialized, which needs a GPU: without one the
    dict says so under ``bindings_note``.
    """
    from trt_runtime.formats import read_engine_source

    file = Path(path)
    _check_file(file)
    source = read_engine_source(file)
    container = _describe_container(file)
    metadata = dict(source.metadata or {})
    merged = {**metadata, **container}
    report: dict[str, Any] = {
        "path": os.fspath(file),
        "format": container.get("format", source.format),
        "file_bytes": file.stat().st_size,
        "engine_bytes": len(source.data),
        "name": source.name,
        "device_id": source.device_id,
        "flavour": _first_present(merged, "flavour", "flavor", "trt_flavour"),
        "version": _first_present(merged, "version", "trt_version", "tensorrt_version"),
        "bindings": [_spec_dict(s) for s in source.bindings],
        "bindings_from": "container" if source.bindings else None,
        "bindings_note": "",
        "container": container,
        "metadata": metadata,
    }
    if not source.bindings:
        reason = _backend_reason(backend) if load else "not loaded (--no-load)"
        specs: tuple[Any, ...] = ()
        if load and not reason:
            from trt_runtime import get_backend

            chosen = get_backend(backend)
            try:
                engine = chosen.load_engine(source)
            except Exception as exc:  # the container is fine; say why the engine is not
                reason = f"the {chosen.name!r} backend could not deserialize it: {_describe_exception(exc)}"
            else:
                try:
                    specs = (*engine.inputs, *engine.outputs)
                finally:
                    engine.close()
                report["bindings_from"] = f"engine (deserialized by the {chosen.name!r} backend)"
        if specs:
            report["bindings"] = [_spec_dict(s) for s in specs]
        else:
            report["bindings_note"] = (
                f"a {report['format']} container records no bindings; listing them needs the engine "
                f"deserialized on a GPU (or a TR01 blob with metadata): {reason}"
            )
    outputs = [b for b in report["bindings"] if b["io"] == "output"]
    report["data_dependent_outputs"] = (
        [b["name"] for b in outputs if b["data_dependent"]]
        if report["bindings"]
        else container.get("data_dependent_outputs")
    )
    return report


def _render_inspect(report: Mapping[str, Any], out: _Output) -> None:
    device = report["device_id"]
    out.notice(f"{report['path']}")
    dd = report["data_dependent_outputs"]
    out.fields([
        ("format", report["format"]),
        ("size", _human_size(report["file_bytes"])),
        ("engine", _human_size(report["engine_bytes"])),
        ("flavour", report["flavour"] or "not recorded"),
        ("version", report["version"] or "not recorded"),
        ("device", device if device is not None else "not recorded (runs on the current device)"),
        ("data-dependent outputs",
         "unknown (bindings not listed)" if dd is None else (", ".join(dd) if dd else "none")),
    ])
    if report["bindings"]:
        out.table(
            f"bindings (from {report['bindings_from']})",
            ["io", "name", "dtype", "shape", "profile min / opt / max", "data-dependent"],
            [
                [b["io"], b["name"], b["dtype"], tuple(b["shape"]), _profile_text(b), b["data_dependent"]]
                for b in report["bindings"]
            ],
        )
    else:
        out.notice(f"  bindings: not listed: {report['bindings_note']}")
    shown = {"format", "name", "size", "device_id", "flavour", "version", "bindings",
             "data_dependent_outputs", "delegates"}
    extra = {k: v for k, v in report["container"].items() if k not in shown}
    if extra:
        out.info("  container fields:")
        out.fields([(k, _compact(v)) for k, v in extra.items()])


def _cmd_inspect(args: argparse.Namespace, out: _Output) -> int:
    report = inspect_file(args.file, backend=args.backend, load=not args.no_load)
    out.emit(report)
    _render_inspect(report, out)
    return 0


# -- run ---------------------------------------------------------------------------
def _settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if getattr(args, "cuda_graph_strategy", None):
        overrides["cuda_graph_strategy"] = args.cuda_graph_strategy
    if getattr(args, "dynamic_shapes_kernel_strategy", None):
        overrides["dynamic_shapes_kernel_specialization_strategy"] = args.dynamic_shapes_kernel_strategy
    return overrides


def _settings_dict(engine: Any) -> dict[str, Any]:
    """The engine's settings as strings, without the cache (a path or handle)."""
    settings = engine.runtime_settings.to_dict()
    settings.pop("runtime_cache", None)
    return dict(_jsonable(settings))


def _parse_given_inputs(items: Sequence[str]) -> dict[str, Path]:
    given: dict[str, Path] = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--input must be NAME=FILE.npy; got {item!r}")
        if name in given:
            raise UsageError(f"--input {name!r} given twice")
        given[name] = Path(file)
    return given


def _concrete_shape(spec: Any) -> tuple[int, ...]:
    if not spec.is_dynamic:
        return tuple(spec.shape)
    if spec.profiles:
        return tuple(spec.profiles[0][1])  # the profile's optimal shape
    return tuple(1 if d < 0 else d for d in spec.shape)


def make_inputs(specs: Sequence[Any], given: Mapping[str, Path] | None = None, seed: int = 0) -> list[Any]:
    """numpy arrays for ``specs``: loaded from ``given`` files by name, random otherwise."""
    import numpy as np

    from trt_runtime.dtypes import to_numpy

    given = dict(given or {})
    names = [s.name for s in specs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise UsageError(f"--input names {unknown} are not inputs of the engine; its inputs are {names}")
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        dtype = to_numpy(spec.dtype)
        if spec.name in given:
            file = given[spec.name]
            _check_file(file)
            try:
                array = np.load(file, allow_pickle=False)
            except ValueError as exc:
                raise CliError(f"--input {spec.name}={file} is not a .npy array: {exc}") from exc
            arrays.append(np.ascontiguousarray(array))
            continue
        shape = _concrete_shape(spec)
        if dtype.kind == "f":
            array = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            array = rng.integers(0, 2, shape).astype(bool)
        else:
            array = rng.integers(0, 8, shape).astype(dtype)
        arrays.append(array)
    return arrays


def _to_numpy(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch
        return value.detach().cpu().numpy()
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # cupy
        return value.get()
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except Exception:
        return np.from_dlpack(value)


def _new_dir(path: Path | None, prefix: str) -> tuple[Path, bool]:
    if path is None:
        return Path(tempfile.mkdtemp(prefix=prefix)), True
    path.mkdir(parents=True, exist_ok=True)
    return path, False


def _cmd_run(args: argparse.Namespace, out: _Output) -> int:
    import numpy as np

    import trt_runtime

    _check_file(args.file)
    given = _parse_given_inputs(args.input)
    backend_name = args.backend
    reason = _backend_reason(backend_name)
    if reason:
        raise CliError(f"cannot run {args.file}: {reason}")
    engine = trt_runtime.load(args.file, backend=backend_name, device=args.device,
                              settings=_settings_overrides(args))
    with contextlib.closing(engine):
        inputs = make_inputs(engine.inputs, given, args.seed)
        outdir, fresh = _new_dir(args.output_dir, "trt-runtime-run-")
        if fresh:
            out.info(f"output directory: {outdir}")
        cache_cm: Any = contextlib.nullcontext()
        cache_existed = None
        if args.runtime_cache is not None:
            cache_existed = args.runtime_cache.exists()
            cache_cm = trt_runtime.runtime_cache(engine, args.runtime_cache)
        with cache_cm:
            with out.status("first inference (execution context + kernel JIT)..."):
                t0 = time.perf_counter()
                results = engine.execute(*inputs)
                engine.synchronize()
                first_ms = (time.perf_counter() - t0) * 1000.0
            t0 = time.perf_counter()
            engine.execute(*inputs)
            engine.synchronize()
            second_ms = (time.perf_counter() - t0) * 1000.0
        written = []
        (outdir / "inputs").mkdir(exist_ok=True)
        for spec, array in zip(engine.inputs, inputs, strict=True):
            np.save(outdir / "inputs" / f"{spec.name}.npy", array)
        for spec, value in zip(engine.outputs, results, strict=True):
            array = _to_numpy(value)
            target = outdir / f"{spec.name}.npy"
            np.save(target, array)
            written.append({"name": spec.name, "path": os.fspath(target),
                            "dtype": str(array.dtype), "shape": list(array.shape)})
        document = {
            "file": os.fspath(args.file),
            "backend": engine.backend.name,
            "settings": _settings_dict(engine),
            "runtime_cache": None if args.runtime_cache is None else {
                "path": os.fspath(args.runtime_cache),
                "existed_before": cache_existed,
                "bytes_after": args.runtime_cache.stat().st_size if args.runtime_cache.exists() else 0,
            },
            "first_call_ms": first_ms,
            "second_call_ms": second_ms,
            "output_dir": os.fspath(outdir),
            "outputs": written,
        }
    out.emit(document)
    out.info(f"ran {args.file} on the {document['backend']!r} backend")
    out.fields([("first call", f"{first_ms:.2f} ms (includes context creation and JIT)"),
                ("second call", f"{second_ms:.3f} ms")])
    out.table("outputs", ["name", "dtype", "shape", "file"],
              [[w["name"], w["dtype"], tuple(w["shape"]), w["path"]] for w in written])
    return 0


# -- bench -------------------------------------------------------------------------
def _cmd_bench(args: argparse.Namespace, out: _Output) -> int:
    import trt_runtime
    from trt_runtime import bench

    _check_file(args.file)
    if args.iterations < 1:
        raise UsageError(f"--iterations must be >= 1; got {args.iterations}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0; got {args.warmup}")
    from trt_runtime.errors import TrtRuntimeError

    names: list[str | None] = list(args.backend) or [None]
    every = "all" in names
    if every:
        names = list(trt_runtime.available_backends())
        if not names:
            raise CliError(f"no backend can run here: {_backend_reason(None)}")
    for name in names:
        reason = _backend_reason(name)
        if reason:
            raise CliError(f"cannot benchmark on {name or 'the default backend'}: {reason}")
    overrides = _settings_overrides(args)
    results = []
    inputs: list[Any] | None = None
    for name in names:
        try:
            engine = trt_runtime.load(args.file, backend=name, device=args.device, settings=overrides)
        except TrtRuntimeError as exc:
            if not every:
                raise
            # 'all' includes backends for other engine kinds (the test backend 'memory').
            out.notice(f"skipped the {name!r} backend: it cannot load {args.file}: {exc}")
            continue
        with contextlib.closing(engine):
            if inputs is None:
                inputs = make_inputs(engine.inputs, None, args.seed)
            label = engine.backend.name
            with out.status(f"benchmarking on {label!r}: {args.warmup} warmup + {args.iterations} calls..."):
                results.append(bench.bench_engine(
                    engine, inputs, iterations=args.iterations, warmup=args.warmup, label=label,
                    metadata={"settings": _settings_dict(engine)},
                ))
    if not results:
        raise CliError(f"no available backend could load {args.file}")
    meta = {"file": os.fspath(args.file), "iterations": args.iterations, "warmup": args.warmup}
    if args.json_path is not None:
        bench.write_json(results, args.json_path, meta)
        out.info(f"wrote {args.json_path}")
    if args.plot is not None:
        bench.plot_results(results, args.plot, title=f"{args.file.name}")
        out.info(f"wrote {args.plot}")
    summary = [{k: v for k, v in r.to_dict().items() if k not in ("latencies_us", "gpu_times_us")}
               for r in results]
    out.emit({**meta, "results": summary})
    out.table(
        f"{args.file.name}: latency per call (µs)",
        ["backend", "median", "p90", "p99", "calls/s", "GPU median"],
        [[r.label, r.median_us, r.p90_us, r.p99_us, r.throughput, r.gpu_median_us] for r in results],
    )
    for r in results:
        if r.gpu_times_us is None:
            out.info(f"{r.label}: no GPU time ({r.gpu_note})")
    return 0


# -- cache -------------------------------------------------------------------------
#: Files trt-runtime writes in a cache directory: caches (``*.bin``), their lock files and
#: the temp files of an interrupted save. Anything else there is never listed or deleted.
_CACHE_SUFFIXES = (".bin", ".lock", ".tmp")


def _cache_dir(args: argparse.Namespace) -> Path:
    if args.dir is not None:
        return Path(args.dir)
    from trt_runtime.cache import default_cache_dir

    return Path(default_cache_dir())


def _read_cache_key(path: Path) -> tuple[Any, str]:
    """``(key, '')`` from a cache file's header, or ``(None, why not)``."""
    from trt_runtime.cache import decode

    try:
        key, _payload = decode(path.read_bytes())
    except Exception as exc:
        return None, f"unreadable: {exc}"
    if key is None:
        return None, "no key recorded"
    return key, ""


def _cache_entries(directory: Path) -> list[dict[str, Any]]:
    if not directory.is_dir():
        return []
    entries = []
    for path in sorted(directory.iterdir()):
        if not path.is_file() or path.suffix not in _CACHE_SUFFIXES:
            continue
        kind = {".bin": "cache", ".lock": "lock", ".tmp": "temp"}[path.suffix]
        key, note = _read_cache_key(path) if kind == "cache" else (None, kind + " file")
        entries.append({
            "path": os.fspath(path),
            "name": path.name,
            "kind": kind,
            "bytes": path.stat().st_size,
            "key": _jsonable(key) if key is not None else None,
            "note": note,
        })
    return entries


def _cmd_cache(args: argparse.Namespace, out: _Output) -> int:
    directory = _cache_dir(args)
    if args.action == "path":
        out.emit({"path": os.fspath(directory)})
        if not out.json_mode:
            print(directory)
        return 0
    entries = _cache_entries(directory)
    total = sum(e["bytes"] for e in entries)
    if args.action == "info":
        out.emit({"path": os.fspath(directory), "exists": directory.is_dir(),
                  "entries": entries, "total_bytes": total})
        out.notice(f"cache directory: {directory}" + ("" if directory.is_dir() else " (does not exist yet)"))
        if entries:
            out.table(
                f"{len(entries)} file(s), {_human_size(total)}",
                ["file", "size", "made for"],
                [[e["name"], _human_size(e["bytes"]), _key_text(e["key"]) if e["key"] else e["note"]]
                 for e in entries],
            )
        else:
            out.notice("no cache files")
        return 0
    # clear
    if not entries:
        out.emit({"path": os.fspath(directory), "removed": [], "removed_bytes": 0})
        out.notice(f"nothing to clear in {directory}")
        return 0
    if not args.yes:
        if not sys.stdin or not sys.stdin.isatty():
            raise CliError(f"refusing to delete {len(entries)} cache file(s) in {directory} "
                           "without confirmation; pass --yes")
        answer = input(f"delete {len(entries)} cache file(s) ({_human_size(total)}) in {directory}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            out.notice("nothing deleted")
            return 1
    removed = []
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry["path"])
        removed.append(entry["path"])
    out.emit({"path": os.fspath(directory), "removed": removed, "removed_bytes": total})
    out.notice(f"deleted {len(removed)} file(s), {_human_size(total)}, from {directory}")
    return 0


def _key_text(key: Mapping[str, Any]) -> str:
    return (f"{key.get('flavour')} {key.get('version')}, compute capability "
            f"{key.get('compute_capability')}, driver {key.get('driver')}")


# -- backends ----------------------------------------------------------------------
def backend_report() -> list[dict[str, Any]]:
    """Every installed backend: availability, reason, capabilities (JSON-ready)."""
    from trt_runtime import registry

    rows = []
    for name, availability in registry.backend_status().items():
        capabilities: dict[str, Any] | None = None
        try:
            # Capabilities do not depend on availability; registry has no public
            # accessor for an unavailable backend's instance.
            instance = registry.load_backend(name)
            capabilities = _jsonable(instance.capabilities)
        except Exception:
            capabilities = None
        rows.append({
            "name": name,
            "available": bool(availability),
            "reason": availability.reason,
            "capabilities": capabilities,
        })
    return rows


def _cmd_backends(args: argparse.Namespace, out: _Output) -> int:
    rows = backend_report()
    out.emit({"backends": rows})
    if not rows:
        out.notice("no trt-runtime backends are installed")
        return 0

    def caps(row: Mapping[str, Any]) -> str:
        if row["capabilities"] is None:
            return "unknown"
        flags = [k.removeprefix("supports_") for k, v in row["capabilities"].items() if v is True]
        return ", ".join(flags) or "none"

    out.table(
        "installed backends",
        ["backend", "available", "capabilities", "reason"],
        [[r["name"], r["available"], caps(r), r["reason"] or "-"] for r in rows],
    )
    return 0


# -- demo --------------------------------------------------------------------------
def _write_pte(built: Any, target: Path) -> str:
    """Write ``built`` as a single-delegate ``.pte``; return '' or why it was not written."""
    try:
        from trt_runtime.executorch import to_pte
    except ImportError as exc:
        return f"the .pte writer is not available ({exc})"
    try:
        to_pte(built.plan, (*built.inputs, *built.outputs), target)
    except ImportError as exc:
        return f"{exc}"
    return ""


def _run_in_subprocess(args: Sequence[str]) -> dict[str, Any]:
    """``trt-runtime --json ARGS`` in a fresh interpreter (a fresh process has no JIT state)."""
    command = [sys.executable, "-m", "trt_runtime.cli", "--json", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {done.returncode}"
        raise CliError(f"'trt-runtime {' '.join(args)}' failed: {last.removeprefix(PROG + ': error: ')}")
    # The document is the last thing printed; a library may have logged to stdout before it.
    lines = done.stdout.splitlines()
    start = max((i for i, ln in enumerate(lines) if ln == "{"), default=0)
    try:
        document: dict[str, Any] = json.loads("\n".join(lines[start:]))
    except json.JSONDecodeError as exc:
        raise CliError(f"'trt-runtime {' '.join(args)}' printed no JSON: {exc}") from exc
    return document


def _check_against_reference(built: Any, run_doc: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the outputs a ``run`` wrote with the builder's float64 numpy reference."""
    import numpy as np

    outdir = Path(run_doc["output_dir"])
    inputs = [np.load(outdir / "inputs" / f"{s.name}.npy") for s in built.inputs]
    expected = built.reference(*inputs)
    rtol, atol = built.tolerance
    checks = []
    for spec, want in zip(built.outputs, expected, strict=True):
        got = np.load(outdir / f"{spec.name}.npy").astype(np.float64)
        want = np.asarray(want, np.float64)
        same_shape = got.shape == want.shape
        err = float(np.max(np.abs(got - want))) if same_shape and got.size else float("nan")
        checks.append({
            "output": spec.name,
            "max_abs_error": err,
            "ok": bool(same_shape and np.allclose(got, want, rtol=rtol, atol=atol)),
            "rtol": rtol,
            "atol": atol,
        })
    return {"ok": all(c["ok"] for c in checks), "outputs": checks}


def _cmd_demo(args: argparse.Namespace, out: _Output) -> int:
    from trt_runtime import builders
    from trt_runtime.formats import write_plan, write_tr01

    outdir, fresh = _new_dir(args.out, "trt-runtime-demo-")
    out.notice(f"demo output directory: {outdir}" + (" (new temporary directory)" if fresh else ""))
    document: dict[str, Any] = {"output_dir": os.fspath(outdir), "files": {}, "inspect": {}, "gpu": {}}

    # 1. build ---------------------------------------------------------------------
    with out.status("building a ResNet-style conv net with the TensorRT-RTX builder...") as update:
        t0 = time.perf_counter()
        built = builders.build_convnet(
            batch=None, max_batch=8,
            progress=lambda phase, step, total: update(f"building engine: {phase} {step}/{total}"),
        )
        build_s = time.perf_counter() - t0
    document["engine"] = {
        "name": built.name,
        "build_seconds": build_s,
        "plan_bytes": len(built.plan),
        "inputs": [_spec_dict(s) for s in built.inputs],
        "outputs": [_spec_dict(s) for s in built.outputs],
    }
    out.info(f"built {built.name} in {build_s:.2f} s ({_human_size(len(built.plan))}); "
             "TensorRT-RTX compiles its kernels at the first inference")

    # 2. write -----------------------------------------------------------------------
    plan_path = outdir / f"{built.name}.plan"
    tr01_path = outdir / f"{built.name}.tr01"
    pte_path = outdir / f"{built.name}.pte"
    write_plan(plan_path, built.plan)
    write_tr01(tr01_path, built.plan, (*built.inputs, *built.outputs))
    document["files"]["plan"] = os.fspath(plan_path)
    document["files"]["tr01"] = os.fspath(tr01_path)
    pte_reason = _write_pte(built, pte_path)
    document["files"]["pte"] = None if pte_reason else os.fspath(pte_path)
    document["pte_skipped"] = pte_reason or None
    out.info(f"wrote {plan_path.name}, {tr01_path.name}" + ("" if pte_reason else f", {pte_path.name}"))
    if pte_reason:
        out.notice(f"skipped the .pte: {pte_reason}")

    # 3. inspect ---------------------------------------------------------------------
    gpu_reason = _backend_reason(args.backend)
    written = [p for p in (plan_path, tr01_path, pte_path) if p.exists()]
    for path in written:
        report = inspect_file(path, backend=args.backend, load=not gpu_reason)
        document["inspect"][path.name] = report
        if not out.json_mode and not out.quiet:
            out.info("")
            _render_inspect(report, out)

    # 4. GPU: cold and warm runtime cache, each in a fresh process ------------------------
    if gpu_reason:
        document["gpu"] = {"ran": False, "reason": gpu_reason}
        out.info("")
        out.notice(f"GPU part skipped: could not run the engine here: {gpu_reason}")
        out.notice("the CPU part (build, write, inspect) succeeded; on a machine with an NVIDIA GPU "
                   "this demo also runs the engine cold and with a warm runtime cache")
        out.emit(document)
        return 0

    cache_path = outdir / "demo.runtime-cache"
    cache_path.unlink(missing_ok=True)
    backend_args = ["--backend", args.backend] if args.backend else []
    runs = {}
    for label, note in (("cold", "empty runtime cache: kernels are JIT-compiled"),
                        ("warm", "runtime cache loaded from the cold run")):
        with out.status(f"{label} run in a fresh process ({note})..."):
            runs[label] = _run_in_subprocess([
                "run", os.fspath(plan_path), *backend_args,
                "--runtime-cache", os.fspath(cache_path),
                "--output-dir", os.fspath(outdir / label),
            ])
        runs[label]["check"] = _check_against_reference(built, runs[label])
    document["gpu"] = {"ran": True, "backend": runs["cold"]["backend"], "runs": runs,
                       "runtime_cache": os.fspath(cache_path)}
    out.info("")
    out.table(
        f"first inference on the {runs['cold']['backend']!r} backend (each in a fresh process)",
        ["run", "first call (ms)", "second call (ms)", "cache bytes after", "matches numpy", "max abs error"],
        [[label, f"{r['first_call_ms']:.2f}", f"{r['second_call_ms']:.3f}", r["runtime_cache"]["bytes_after"],
          r["check"]["ok"], f"{max(c['max_abs_error'] for c in r['check']['outputs']):.2e}"]
         for label, r in runs.items()],
    )
    cold_ms, warm_ms = runs["cold"]["first_call_ms"], runs["warm"]["first_call_ms"]
    if warm_ms > 0:
        out.info(f"warm runtime cache: first inference {cold_ms / warm_ms:.1f}x faster than cold")
    out.emit(document)
    if not all(r["check"]["ok"] for r in runs.values()):
        raise CliError("engine outputs do not match the numpy reference (see the table above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
