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
