"""What ``run`` says about outputs: a summary of each array, and a comparison with a reference.

:func:`summarize` gives shape, dtype, min, max, mean and std (in float64).
:func:`compare` checks each output against a reference array of the same name the way
``numpy.allclose`` does, element by element ``|out - ref| <= atol + rtol * |ref|`` (NaN
never matches), and reports the largest absolute and relative error, the number of
elements off, and pass or fail. numpy is imported only when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["compare", "compare_rows", "render_outputs", "report_outputs", "summarize", "summary_rows"]


def summarize(array: Any) -> dict[str, Any]:
    """``{"shape", "dtype", "min", "max", "mean", "std"}`` of a numpy array (stats ``None`` if empty)."""
    import numpy as np

    values = np.asarray(array)
    stats: dict[str, Any] = {"shape": list(values.shape), "dtype": str(values.dtype)}
    if values.size == 0:
        return {**stats, "min": None, "max": None, "mean": None, "std": None}
    wide = values.astype(np.float64)
    return {**stats, "min": float(wide.min()), "max": float(wide.max()),
            "mean": float(wide.mean()), "std": float(wide.std())}


def compare(
    outputs: Mapping[str, Any], reference: Mapping[str, Any], *, atol: float, rtol: float
) -> list[dict[str, Any]]:
    """One report per output: ``name``, ``ok``, ``max_abs_error``, ``max_rel_error``, ``mismatched``,
    ``note``.

    An output missing from ``reference``, or of another shape, fails with a note saying so.
    The relative error is taken over elements whose reference is not 0.
    """
    import numpy as np

    reports = []
    for name, value in outputs.items():
        got = np.asarray(value)
        report: dict[str, Any] = {"name": name, "ok": False, "max_abs_error": None,
                                  "max_rel_error": None, "mismatched": None, "note": ""}
        if name not in reference:
            report["note"] = f"not in the reference (it has {sorted(reference)})"
        elif tuple(np.shape(reference[name])) != got.shape:
            expected = list(np.shape(reference[name]))
            report["note"] = f"shape {list(got.shape)} differs from the reference's {expected}"
        else:
            a = got.astype(np.float64)
            b = np.asarray(reference[name]).astype(np.float64)
            diff = np.abs(a - b)
            close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=False)
            nonzero = b != 0
            report.update(
                ok=bool(close.all()),
                max_abs_error=float(np.nanmax(diff)) if diff.size else 0.0,
                max_rel_error=float(np.nanmax(diff[nonzero] / np.abs(b[nonzero]))) if nonzero.any() else 0.0,
                mismatched=int((~close).sum()),
            )
            if np.isnan(a).any():
                report["note"] = f"{int(np.isnan(a).sum())} NaN value(s)"
        reports.append(report)
    return reports


def _stat(value: Any) -> str:
    return "-" if value is None else f"{value:.6g}"


def summary_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    """Table rows: name, dtype, shape, min, max, mean, std."""
    return [[name, s["dtype"], tuple(s["shape"]), _stat(s["min"]), _stat(s["max"]),
             _stat(s["mean"]), _stat(s["std"])] for name, s in summaries.items()]


def compare_rows(reports: list[dict[str, Any]]) -> list[list[Any]]:
    """Table rows: name, max abs error, max rel error, elements off, PASS/FAIL (note)."""
    return [[r["name"], _stat(r["max_abs_error"]), _stat(r["max_rel_error"]),
             "-" if r["mismatched"] is None else r["mismatched"],
             ("PASS" if r["ok"] else "FAIL") + (f" ({r['note']})" if r["note"] else "")] for r in reports]


def report_outputs(
    args: Any, document: dict[str, Any], inputs: Mapping[str, Any], outputs: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """Summaries, ``--save-inputs``/``--save-outputs`` and ``--compare`` into ``document``.

    Returns the comparison reports (``None`` without ``--compare``).
    """
    from trt_runtime.cli.arrays import load_npz, npz_names, save_npz

    document["summaries"] = {name: summarize(array) for name, array in outputs.items()}
    for flag, arrays in (("save_inputs", inputs), ("save_outputs", outputs)):
        path = getattr(args, flag, None)
        if path is not None:
            save_npz(path, arrays)
            document[flag] = str(path)
    if getattr(args, "compare", None) is None:
        return None
    # Only the members named like outputs are inflated, within 16 bytes per output element.
    budget = 16 * sum(int(getattr(o, "size", 0)) for o in outputs.values()) + 2**20
    reference = load_npz(args.compare, "--compare", names=list(outputs), max_bytes=budget)
    reports = compare(outputs, reference, atol=args.atol, rtol=args.rtol)
    document["compare"] = {
        "reference": str(args.compare),
        "atol": args.atol,
        "rtol": args.rtol,
        "ok": all(r["ok"] for r in reports),
        "outputs": reports,
        "ignored": sorted(set(npz_names(args.compare, "--compare")) - set(outputs)),
    }
    return reports


def render_outputs(document: Mapping[str, Any], out: Any, reports: list[dict[str, Any]] | None) -> int:
    """Print the summaries and the comparison; :class:`CliError` (exit 1) when an output is off."""
    from trt_runtime.cli.output import CliError

    for flag in ("save_inputs", "save_outputs"):
        if document.get(flag):
            out.info(f"wrote the {flag.split('_')[1]} to {document[flag]} (--{flag.replace('_', '-')})")
    out.table("output values", ["name", "dtype", "shape", "min", "max", "mean", "std"],
              summary_rows(document["summaries"]))
    if reports is None:
        return 0
    info = document["compare"]
    out.table(f"compared with {info['reference']} (atol {info['atol']:g}, rtol {info['rtol']:g})",
              ["output", "max abs error", "max rel error", "elements off", "result"], compare_rows(reports))
    if info["ignored"]:
        out.info(f"not outputs of the engine, not compared: {', '.join(info['ignored'])}")
    failed = [r["name"] for r in reports if not r["ok"]]
    if failed:
        raise CliError(
            f"{len(failed)} of {len(reports)} output(s) differ from {info['reference']} beyond "
            f"atol={info['atol']:g} + rtol={info['rtol']:g} * |ref|: {', '.join(failed)}"
        )
    return 0
