"""Run every benchmark row on every workload in one run: ``python benchmarks/bench_all.py --help``.

The same as ``python -m benchmarks`` from the repository root; this file also serves as
the fresh-process entry of the cold/warm cache pairs. The code is the ``benchmarks``
package next to it (see its ``__init__`` and docs/benchmarks.md).
"""

import sys
from pathlib import Path

# Run as a script, this folder is on sys.path but the package's parent is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
