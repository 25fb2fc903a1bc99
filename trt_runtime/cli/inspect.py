"""``trt-runtime inspect FILE``: what an engine file is, without running it.

Format, sizes, flavour and version, device, bindings and data-dependent outputs; for a
``.pte`` program also the compile specs its TensorRT delegate records and the warnings
the reader raised (printed on stderr). Bindings come from the container when it records
them (TR01/TR02/``.pte``); a raw plan needs its engine deserialized, hence a GPU.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trt_runtime.cli.engine_files import (
    backend_reason,
    declared_magics,
    engine_file_backend,
    spec_dict,
    unknown_magic,
)
from trt_runtime.cli.output import Output, compact, describe_exception, human_size

__all__ = ["TABLE_ROWS", "inspect_command", "inspect_file", "render_inspect"]

#: Bindings the text table lists before a "... N more" line (``--all`` lists every one).
TABLE_ROWS = 50


def _first_present(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key)
        if value not in (None, ""):
            return value
    return None


def _profile_text(spec: Mapping[str, Any]) -> str:
    if not spec["profiles"]:
        return "-"
    return "; ".join(" / ".join(str(tuple(s)) for s in triple) for triple in spec["profiles"])


def inspect_file(
    path: str | os.PathLike[str],
    *,
    backend: str | None = None,
    load: bool = True,
    force: bool = False,
    not_loaded: str = "not loaded (--no-load)",
) -> dict[str, Any]:
    """What ``trt-runtime inspect`` reports about ``path``, as a JSON-ready dict.

    Bindings come from the container when it records them (TR01/TR02/.pte); for a
    raw plan they need the engine deserialized, which needs a GPU: without one the
    dict says so under ``bindings_note``. A file whose first bytes match no known magic
    raises :class:`CliError` unless ``force``, which reads it as a plan of unknown
    flavour and says so under ``warnings``. ``compile_specs`` (``.pte``: what the
    program records for its TensorRT delegate, or ``None`` when the reader gives none)
    and ``warnings`` (what the reader found questionable) come from the container.
    ``not_loaded`` is why the bindings are not listed when ``load`` is false.
    """
    from trt_runtime.formats import describe, read_engine_source

    file = Path(path)
    chosen_name = engine_file_backend(file, backend, force=force, require=False)
    warnings: list[str] = []
    magic_reason = unknown_magic(file)
    if magic_reason:  # taken with force, or engine_file_backend had refused it
        warnings.append(f"{magic_reason}; read as a plan of unknown flavour (--force)")
    source = read_engine_source(file)
    container = dict(describe(file))
    metadata = dict(source.metadata or {})
    merged = {**metadata, **container}
    specs_recorded = metadata.get("compile_specs")
    compile_specs = None if specs_recorded is None else {str(k): str(v) for k, v in specs_recorded.items()}
    warnings.extend(str(w) for w in metadata.get("warnings") or ())
    declared = [what for magic, what in declared_magics().items() if bytes(source.data[:len(magic)]) == magic]
    report: dict[str, Any] = {
        "path": os.fspath(file),
        "format": declared[0] if declared else container.get("format", source.format),
        "file_bytes": file.stat().st_size,
        "engine_bytes": len(source.data),
        "name": source.name,
        "device_id": source.device_id,
        "flavour": _first_present(merged, "flavour", "flavor", "trt_flavour"),
        "version": _first_present(merged, "version", "trt_version", "tensorrt_version"),
        "compile_specs": compile_specs,
        "warnings": warnings,
        "bindings": [spec_dict(s) for s in source.bindings],
        "bindings_from": "container" if source.bindings else None,
        "bindings_note": "",
        "container": container,
        "metadata": metadata,
    }
    if not source.bindings:
        reason = backend_reason(chosen_name) if load else not_loaded
        specs: tuple[Any, ...] = ()
        if load and not reason:
            from trt_runtime import get_backend

            chosen = get_backend(chosen_name)
            try:
                engine = chosen.load_engine(source)
            except Exception as exc:  # the container is fine; say why the engine is not
                reason = f"the {chosen.name!r} backend could not deserialize it: {describe_exception(exc)}"
            else:
                try:
                    specs = (*engine.inputs, *engine.outputs)
                finally:
                    engine.close()
                report["bindings_from"] = f"engine (deserialized by the {chosen.name!r} backend)"
        if specs:
            report["bindings"] = [spec_dict(s) for s in specs]
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


def render_inspect(report: Mapping[str, Any], out: Output, *, all_rows: bool = False) -> None:
    """Print a report of :func:`inspect_file`; its warnings go to stderr.

    The bindings table stops after :data:`TABLE_ROWS` rows with a ``... N more`` line
    unless ``all_rows`` (``--all``); ``--json`` always carries every binding.
    """
    for warning in report.get("warnings") or ():
        out.warn(warning)
    device = report["device_id"]
    out.notice(f"{report['path']}")
    dd = report["data_dependent_outputs"]
    pairs: list[tuple[str, Any]] = [
        ("format", report["format"]),
        ("size", human_size(report["file_bytes"])),
        ("engine", human_size(report["engine_bytes"])),
        ("flavour", report["flavour"] or "not recorded"),
        ("version", report["version"] or "not recorded"),
        ("device", device if device is not None else "not recorded (runs on the current device)"),
        ("data-dependent outputs",
         "unknown (bindings not listed)" if dd is None else (", ".join(dd) if dd else "none")),
    ]
    specs = report.get("compile_specs")
    if specs is not None:
        pairs.append(("compile specs", compact(specs) if specs else "none"))
    out.fields(pairs)
    bindings = report["bindings"]
    if bindings:
        shown_rows = bindings if all_rows else bindings[:TABLE_ROWS]
        out.table(
            f"bindings (from {report['bindings_from']})",
            ["io", "name", "dtype", "shape", "profile min / opt / max", "data-dependent"],
            [
                [b["io"], b["name"], b["dtype"], tuple(b["shape"]), _profile_text(b), b["data_dependent"]]
                for b in shown_rows
            ],
        )
        if len(shown_rows) < len(bindings):
            more = len(bindings) - len(shown_rows)
            out.notice(f"  … {more} more bindings (--all lists them; --json has them)")
    else:
        out.notice(f"  bindings: not listed: {report['bindings_note']}")
    shown = {"format", "name", "size", "device_id", "flavour", "version", "bindings",
             "data_dependent_outputs", "delegates", "compile_specs", "warnings"}
    extra = {k: v for k, v in report["container"].items() if k not in shown}
    if extra:
        out.info("  container fields:")
        out.fields([(k, compact(v)) for k, v in extra.items()])


def inspect_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime inspect``."""
    report = inspect_file(args.file, backend=args.backend, load=not args.no_load, force=args.force)
    out.emit(report)
    render_inspect(report, out, all_rows=getattr(args, "all_rows", False))
    return 0
