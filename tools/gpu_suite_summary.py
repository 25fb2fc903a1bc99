"""Summarize one GPU suite run from its pytest log, a run cut short by a time limit included:
``LABEL: X passed, Y failed, Z errors`` and then the failed and errored tests, one a line.

    python3 tools/gpu_suite_summary.py LOG [--label "run 1"]

``tools/gpu_round.sh`` runs it after each suite run (steps ``suite`` and ``suite3``). The counts
come from pytest's closing line when the run got there; else from the per-test lines of a
verbose run (``-v`` under xdist: ``[gw0] [  5%] PASSED tests/...``), and the line says the run
was cut short. The names come from those lines and from the ``-rfE`` summary. Always exits 0:
the suite's own exit status is the round's to report.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

#: pytest's closing line: ``==== 330 passed, 1 failed, 25 skipped in 152.31s (0:02:32) ====``.
CLOSING = re.compile(r"^=+ (?P<counts>.*\d+ \w+.*) in [\d.]+s\b.*=+$")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")
#: One test's outcome in a verbose run, under xdist or not.
OUTCOMES = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
PER_TEST = (re.compile(rf"^\[gw\d+\] \[\s*\d+%\] (?P<outcome>{OUTCOMES}) (?P<name>\S+::\S+)"),
            re.compile(rf"^(?P<name>\S+::\S+) (?P<outcome>{OUTCOMES})\b"))
#: A line of the ``-rfE`` short summary.
SHORT = re.compile(r"^(?P<outcome>FAILED|ERROR) (?P<name>\S+\.py(?:::\S+)?)")


def summarize(text: str) -> tuple[dict[str, int], list[str], bool]:
    """``({"passed": X, "failed": Y, "errors": Z}, ["FAILED name", ...], complete)`` of a log."""
    per_test = {"passed": 0, "failed": 0, "errors": 0}
    closing: dict[str, int] | None = None
    bad: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        if match := CLOSING.match(line):
            closing = {"passed": 0, "failed": 0, "errors": 0}
            for number, word in COUNT.findall(match["counts"]):
                key = "errors" if word.startswith("error") else word
                if key in closing:
                    closing[key] = int(number)
            continue
        found = next((m for m in (p.match(line) for p in (*PER_TEST, SHORT)) if m), None)
        if found is None:
            continue
        outcome = found["outcome"]
        key = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors"}.get(outcome)
        if key is not None and found.re is not SHORT:
            per_test[key] += 1
        entry = f"{outcome} {found['name']}"
        if outcome in ("FAILED", "ERROR") and entry not in bad:
            bad.append(entry)
    return (closing if closing is not None else per_test), bad, closing is not None


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    args.add_argument("log", type=Path)
    args.add_argument("--label", default="suite")
    parsed = args.parse_args(argv)
    text = parsed.log.read_text(encoding="utf-8", errors="replace") if parsed.log.exists() else ""
    counts, bad, complete = summarize(text)
    cut = "" if complete else " (cut short: no closing line, counted from the per-test lines)"
    passed, failed, errors = counts["passed"], counts["failed"], counts["errors"]
    print(f"{parsed.label}: {passed} passed, {failed} failed, {errors} errors{cut}")
    for entry in bad:
        print(f"  {entry}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
