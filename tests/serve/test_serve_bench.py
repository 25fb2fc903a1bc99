"""``benchmarks/bench_serve.py --smoke``: the serving benchmark end to end on the CPU (memory backend)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KEYS = {"front", "workers", "gpus", "batching", "body", "clients", "req_s", "p50_ms", "p99_ms", "wrong",
        "errors"}


def test_bench_serve_smoke_writes_checked_rows_for_every_front_and_the_targets(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--smoke", "--out", str(tmp_path),
         "--port", "18624"],
        capture_output=True, text=True, timeout=170, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads((tmp_path / "bench_serve.json").read_text())
    assert doc["skipped"] == [] and "partial" not in doc
    rows = doc["rows"]
    assert all(set(r) >= KEYS for r in rows)
    fronts = {(r["front"], r["body"], r["batching"]) for r in rows}
    assert fronts == {("direct", "none", False), ("direct-outer", "none", False),
                      ("trivial", "binary", False),
                      ("baseline", "binary", False), ("baseline", "json", False), ("local", "binary", True),
                      ("local", "json", True), ("local", "binary", False)}
    for r in rows:
        assert r["req_s"] > 0 and r["wrong"] == 0 and r["errors"] == 0, r
        assert r["p50_ms"] <= r["p99_ms"]
    for r in rows:
        if r["front"] == "local":  # the profile of every part: CPU by role, batching figures
            assert set(r["cpu"]) == {"front", "engine", "engine_loop", "engine_threads", "supervisor", "load"}
            assert r["cpu"]["engine"]["mean"] > 0 and r["cpu"]["front"]["max"] >= r["cpu"]["front"]["mean"]
            assert r["engine"]["requests_per_batch"] >= 1 and 0 < r["engine"]["engine_busy"] < 1
        elif r["body"] != "none":
            assert r["cpu"]["load"]["mean"] > 0
    assert "cpu% front" in result.stdout and "| batch" in result.stdout
    targets = doc["targets"]
    assert targets["wrong"] == 0 and targets["one_gpu"]["clean"] is True
    assert targets["load_generator_x_best_served"] > 0


def test_bench_serve_plot_labels_name_each_server() -> None:
    from benchmarks.bench_serve import _label

    def row(front: str, workers: int = 1, gpus: int = 1, batching: bool = True, body: str = "binary") -> dict:
        return {"front": front, "workers": workers, "gpus": gpus, "batching": batching, "body": body}

    assert _label(row("local", 16, 2)) == "local, 16 fronts, 2 GPUs"
    assert _label(row("local", 1, 1, False, "json")) == "local, 1 front, 1 GPU, no batching, JSON"
    assert _label({**row("local", 4), "variant": "loop+overlap"}) == "local, 4 fronts, 1 GPU, loop+overlap"
    assert _label(row("ray", 2, 2)) == "Ray path, 2 replicas, 2 GPUs"
    assert _label(row("ray-noop", 1, 0, False)) == "no-op Ray Serve, 1 replica"
    assert _label(row("baseline", body="json")) == "30-line app, JSON"
    assert _label(row("trivial", 8, 0)).startswith("trivial endpoint")


def test_bench_serve_render_draws_a_saved_run_or_says_why_not(tmp_path: Path) -> None:
    """``--render``: the plot of a saved run's rows (both panels need rows at several client
    counts and at 64), or exit 2 with one line: no rows, or no matplotlib on this machine."""
    import importlib.util

    from benchmarks.bench_serve import main

    keys = ("front", "workers", "gpus", "clients", "req_s")
    rows = [{**dict(zip(keys, values, strict=True)), "batching": True, "body": "binary"}
            for values in (("local", 4, 1, 16, 900.0), ("local", 4, 1, 64, 2000.0),
                           ("baseline", 1, 1, 64, 100.0), ("trivial", 8, 0, 64, 9000.0))]
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"rows": rows}))
    out = tmp_path / "out"
    code = main(["--render", str(saved), "--out", str(out)])
    if importlib.util.find_spec("matplotlib") is not None:
        assert code == 0 and (out / "bench_serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert code == 2 and not (out / "bench_serve.png").exists()
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    assert main(["--render", str(broken), "--out", str(out)]) == 2


def test_bench_serve_load_generator_counts_wrong_answers() -> None:
    import numpy as np

    from benchmarks.bench_serve import Workload
    from benchmarks.serve_load import Expect

    x = np.ones((1, 4), np.float32)
    w = Workload("t", Path("t.mem"), "memory", x, x.astype(np.float64) * 3, (1e-6, 1e-6))
    expect = w.expect("binary")
    assert expect.right(w.answer())
    off = Workload("t", Path("t.mem"), "memory", x, x.astype(np.float64) * 3 + 0.01, (1e-6, 1e-6))
    assert not expect.right(off.answer())
    assert not expect.right(b"garbage")
    assert Expect("json", [[3.0] * 4], 1e-6, 1e-6).right(b"[[3.0, 3.0, 3.0, 3.0]]")
    assert not Expect("json", [[3.0] * 4], 1e-6, 1e-6).right(b"[[3.0, 3.0, 3.0]]")


def test_bench_serve_variants_parse_to_the_server_options_they_name() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.bench_serve import Variant, parse_variant
    finally:
        sys.path.remove(str(ROOT))
    assert parse_variant("loop+pad+outer") == Variant("loop", None, True, True)
    assert parse_variant("threads+si50") == Variant("threads", 50, False, False)
    assert parse_variant("loop+outer") == Variant("loop", None, False, True)
    assert parse_variant("loop+pad+outer+pin") == Variant("loop", None, True, True, True)
    assert parse_variant("loop+pad+outer+pin").options() == ["--pad-batches", "--outer-graph"]
    assert parse_variant("threads+si50").options() == []
    assert parse_variant("loop+shared") == Variant("loop", None, False, False, False, True)
    assert parse_variant("loop+shared").options() == []  # (an environment variable, not an option)
    polled = parse_variant("loop+poll500+fpoll200+outer")
    assert (polled.engine_poll_us, polled.front_poll_us, polled.outer) == (500, 200, True)
    assert polled.options() == ["--outer-graph", "--engine-poll-us", "500", "--front-poll-us", "200"]
    assert parse_variant("loop+poll0").options() == ["--engine-poll-us", "0"]
    assert parse_variant("loop+eager").options() == ["--no-outer-graph", "--no-pad-batches"]
    assert parse_variant("loop+overlap").options() == ["--overlap"]
    assert parse_variant("loop+fly1").in_flight == 1 and parse_variant("loop+fly1").options() == []
    import argparse

    for bad in ("loop+outer+outer", "fast", "loop+padded", "threads+si", "loop+si5+si6", "loop+pin+pin",
                "loop+shared+shared", "loop+eager+eager", "loop+overlap+overlap", "loop+fly",
                "loop+poll", "loop+poll5+poll6", "loop+fpollx", "loop+si-5"):
        with pytest.raises(argparse.ArgumentTypeError, match="threads\\|loop"):
            parse_variant(bad)


def test_serve_profile_probe_profiles_every_engine_and_front_process(tmp_path: Path) -> None:
    """``TRT_RUNTIME_SERVE_PROFILE_DIR``: each process of the local server writes its cProfile stats
    when it stops; the probe serves, stops and reads them."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "probes" / "gpu_serve_profile.py"), "--smoke", "--out",
         str(tmp_path), "--port", "18625", "--top", "12"],
        capture_output=True, text=True, timeout=170, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrong 0, errors 0" in result.stdout
    (folder,) = tmp_path.glob("profile-*")
    assert len(list(folder.glob("engine-*.prof"))) == 1 and len(list(folder.glob("front-*.prof"))) == 2
    report = (tmp_path / "profile.txt").read_text()
    assert "--- engine processes: 1 process(es)" in report and "--- one front: 1 process(es)" in report
    assert "batcher.py" in report and "_run_on_loop" in report  # the engine process's own functions


def test_serve_pinning_gives_each_engine_and_front_a_core_and_the_load_the_rest() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.serve_pinning import plan_cores
    finally:
        sys.path.remove(str(ROOT))
    cores = plan_cores(range(32), engines=2, fronts=16)
    assert cores == {"engine": [[0], [1]], "front": [[c] for c in range(2, 18)],
                     "rest": [list(range(18, 32))]}
    assert plan_cores([5, 3, 9], engines=1, fronts=1) == {"engine": [[3]], "front": [[5]], "rest": [[9]]}
    assert plan_cores(range(18), engines=2, fronts=16) is None  # every process its own core, and one over


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and two allowed cores")
def test_serve_pinning_pins_every_thread_and_gives_the_load_its_cores_back() -> None:
    """Real processes: an engine stand-in with a second thread, a load-generator stand-in."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.serve_pinning import pinned
    finally:
        sys.path.remove(str(ROOT))
    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    engine = subprocess.Popen([sys.executable, "-c", code])
    load = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    allowed = sorted(os.sched_getaffinity(0))
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{engine.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        with pinned({"engine": [engine.pid]}, [load.pid]) as cores:
            assert cores is not None and cores["engine"] == [[allowed[0]]]
            tasks = [int(t) for t in os.listdir(f"/proc/{engine.pid}/task")]
            assert len(tasks) >= 2 and all(os.sched_getaffinity(t) == {allowed[0]} for t in tasks)
            assert os.sched_getaffinity(load.pid) == set(allowed[1:])
        assert os.sched_getaffinity(load.pid) == set(allowed)  # the load generator serves other servers next
    finally:
        engine.kill()
        load.kill()
        engine.wait()
        load.wait()


@pytest.mark.parametrize(("probe", "args", "expect"), [
    ("cpu_wakeup.py", ["--pings", "50", "--gaps-us", "0,200"],
     r"gap +200 µs: block [\d.]+ / .* loop-poll [\d.]+"),
    ("cpu_shm_queue.py", ["--fronts", "4", "--per-front", "1,3", "--rounds", "100"],
     r"shm, 3 per front: +[\d.]+ rounds/s, engine +[\d.]+ µs per round"),
])
def test_transport_probes_measure_every_mode(probe: str, args: list[str], expect: str) -> None:
    """The two probes behind the polling options and the next transport: every mode runs, every message
    comes back (the queue probe stops with an error when its engine process saw fewer requests)."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probes" / probe), *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(expect, result.stdout), result.stdout
