"""``benchmarks/bench_serve.py --smoke``: the serving benchmark end to end on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _serve_support import require_serve

require_serve()
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_bench_serve_smoke_writes_cells_direct_calls_and_targets(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--smoke", "--out", str(tmp_path),
         "--port", "18624"],
        capture_output=True, text=True, timeout=170, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads((tmp_path / "serve.json").read_text())
    kinds = {(c["kind"], c["clients"], c["replicas"]) for c in doc["cells"]}
    assert kinds == {("engine", 4, 1), ("noop", 4, 1)}
    for cell in doc["cells"]:
        assert cell["completed"] > 0 and cell["errors"] == 0 and cell["p50_ms"] <= cell["p99_ms"]
    assert [d["outer_graph"] for d in doc["direct"]] == [False, True]
    assert doc["direct"][0]["batch1"]["calls_per_s"] > 0 and doc["direct"][0]["batch_max"]["rows"] == 64
    (target,) = doc["targets"]
    assert target["floor_rps"] > 0 and isinstance(target["throughput_ok"], bool)
    table = (tmp_path / "serve.md").read_text()
    assert "| engine | smoke | on | off | 1 | 4 |" in table and "## Targets" in table
