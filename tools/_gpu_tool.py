"""What the GPU measurement tools share: the repository on ``sys.path`` (for ``benchmarks``),
their command line's ``--out`` (default ``$OUT``, else ``.``) and the JSON they leave there."""

from __future__ import annotations

import argparse
import json
import os
import sys
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
