"""The benchmarks package lives next to tests/, not in site-packages: the repository root goes on
sys.path before the tests of this folder import it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
