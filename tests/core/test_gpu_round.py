"""The GPU round's suite steps on the CPU: ``tools/gpu_round.sh`` parses, names every step it
runs in its unknown-step message, and ``tools/gpu_suite_summary.py`` gives a run's counts and
failed tests from its log, whether pytest got to its closing line or was cut short."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUND = ROOT / "tools" / "gpu_round.sh"
SUMMARY = ROOT / "tools" / "gpu_suite_summary.py"

_HEAD = """\
============================= test session starts ==============================
created: 4/4 workers
4 workers [6 items]

[gw0] [ 16%] PASSED suite/test_a.py::test_one
[gw1] [ 33%] FAILED suite/test_t.py::test_replays[4-view]
[gw2] [ 50%] SKIPPED suite/test_a.py::test_two
[gw3] [ 66%] ERROR suite/test_b.py::test_three
"""
_TAIL = """\
[gw0] [ 83%] PASSED suite/test_a.py::test_four
[gw1] [100%] PASSED suite/test_a.py::test_five
=========================== short test summary info ============================
FAILED suite/test_t.py::test_replays[4-view] - assert 15 == 16
ERROR suite/test_b.py::test_three - RuntimeError: CUDA error
ERROR suite/test_c.py - ImportError: no module
===== 3 passed, 1 failed, 1 skipped, 2 errors in 152.31s (0:02:32) =====
"""


def _summary(tmp_path: Path, text: str, label: str) -> list[str]:
    log = tmp_path / "suite.log"
    log.write_text(text)
    done = subprocess.run([sys.executable, str(SUMMARY), str(log), "--label", label],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.splitlines()


def test_gpu_round_script_parses_and_names_its_steps() -> None:
    subprocess.run(["bash", "-n", str(ROUND)], check=True, timeout=60)
    text = ROUND.read_text()
    steps = re.findall(r"^ {4}([\w-]+)\)", text, re.MULTILINE)
    (listed,) = re.findall(r"unknown step \$step \(([^)]*)\)", text)
    assert "suite3" in steps and sorted(listed.split()) == sorted(steps)


def test_gpu_round_summary_of_a_complete_run(tmp_path: Path) -> None:
    assert _summary(tmp_path, _HEAD + _TAIL, "run 2") == [
        "run 2: 3 passed, 1 failed, 2 errors",
        "  FAILED suite/test_t.py::test_replays[4-view]",
        "  ERROR suite/test_b.py::test_three",
        "  ERROR suite/test_c.py",
    ]


def test_gpu_round_summary_of_a_run_cut_short(tmp_path: Path) -> None:
    """Killed before its summary: counted from the per-test lines, and said so."""
    assert _summary(tmp_path, _HEAD, "suite") == [
        "suite: 1 passed, 1 failed, 1 errors (cut short: no closing line, counted from the per-test lines)",
        "  FAILED suite/test_t.py::test_replays[4-view]",
        "  ERROR suite/test_b.py::test_three",
    ]
    assert _summary(tmp_path, "", "run 3") == [
        "run 3: 0 passed, 0 failed, 0 errors (cut short: no closing line, counted from the per-test lines)"]
