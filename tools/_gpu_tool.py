"""What the GPU measurement tools share (these tools and ``benchmarks/probes/``): the repository on
``sys.path`` (for ``benchmarks``), their command line's ``--out`` (default ``$OUT``, else ``.``)
and the JSON they leave there."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with ``--out``."""
    made = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    made.add_argument("--out", default=os.environ.get("OUT", "."))
    return made


def write_json(out: str, name: str, document: Any) -> Path:
    """``document`` as ``out/name`` (the folder made if needed)."""
    os.makedirs(out, exist_ok=True)
    path = Path(out, name)
    path.write_text(json.dumps(document, indent=1))
    return path


def timing_parser(doc: str | None) -> argparse.ArgumentParser:
    """:func:`parser` with the timing options of the probes: ``--repeats`` samples of
    ``--number`` calls each."""
    made = parser(doc)
    made.add_argument("--repeats", type=int, default=30)
    made.add_argument("--number", type=int, default=200)
    return made


def ok(result: Any, what: str) -> Any:
    """The value of a cuda-python call's ``(error, value...)`` tuple; RuntimeError naming
    ``what`` for an error."""
    err = result[0]
    if int(err):
        raise RuntimeError(f"{what}: {err!r}")
    return result[1] if len(result) == 2 else result[1:]


def torch_cuda_probe(doc: str | None, argv: list[str] | None) -> tuple[Any, Any, Any, Any, Any]:
    """What the copy probes start with: their options (:func:`timing_parser`), torch,
    cuda-python's runtime, its device-to-device copy kind and torch's CUDA device."""
    args = timing_parser(doc).parse_args(argv)
    import torch
    from cuda.bindings import runtime as rt

    return args, torch, rt, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, torch.device("cuda")


def statement_tool(doc: str | None, argv: list[str] | None, workloads: str, name: str,
                   measure: Callable[[str, Any, int, int], dict[str, float]]) -> int:
    """The ``main`` of a tool timing statements per workload (``benchmarks/probes/``:
    ``gpu_step_costs.py``, ``gpu_floor_probe.py``): ``--repeats``, ``--number`` and ``--workloads`` (default
    ``workloads``); ``measure(key, torch, repeats, number)`` for each, printed and written
    to ``--out``/``name``. A label starting with ``nodes`` is a count, not µs."""
    made = parser(doc)
    made.add_argument("--repeats", type=int, default=60)
    made.add_argument("--number", type=int, default=40)
    made.add_argument("--workloads", default=workloads)
    args = made.parse_args(argv)
    import torch

    document: dict[str, Any] = {}
    for key in args.workloads.split(","):
        try:  # one workload's failure is reported; the others still run
            document[key] = measure(key, torch, args.repeats, args.number)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            document[key] = {}
            print(f"== {key}: failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        print(f"== {key}")
        for label, value in document[key].items():
            print(f"  {label:52s} {value:8.2f}{'' if label.startswith('nodes') else ' us'}", flush=True)
    write_json(args.out, name, document)
    return 0
