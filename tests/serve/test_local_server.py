"""The local server end to end on the CPU: 2 front processes, one engine process (memory backend).

tritonclient.http against it (metadata, JSON and binary tensors), concurrent clients,
readiness, a killed front or engine process replaced, SIGINT drains in-flight requests and
exits 0, a busy port or a missing GPU exits 2.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _local_server import ServerProcess
from _serve_support import HOST, load_npy, npy, post, reference, single_engine, static_engine

pytestmark = pytest.mark.slow


def _free_ports(count: int) -> list[int]:
    """Distinct ports nothing listens on now (fixed numbers collided with Ray's worker ports,
    10002-19999, when Ray tests ran beside these)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


PORT, PORT_DRAIN, PORT_BUSY, PORT_ORPHAN, PORT_TWO, PORT_STATIC = _free_ports(6)


@pytest.fixture(scope="module", params=["threads", "loop", "loop-polling"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The server with each ``--engine-calls``, and with its loops polling instead of sleeping
    (``--engine-poll-us``, ``--front-poll-us``): the same tests hold for all. The threads run the
    calls eagerly (``--no-outer-graph --no-pad-batches``); the loops under the outer graph with
    padded batches, the default for an engine that can batch."""
    engine = tmp_path_factory.mktemp("local") / "affine.mem"
    engine.write_bytes(single_engine())
    calls, _, polling = request.param.partition("-")
    polls = ["--engine-poll-us", "3000", "--front-poll-us", "1000"] if polling else []
    eager = ["--no-outer-graph", "--no-pad-batches"] if calls == "threads" else []
    srv = ServerProcess(engine, PORT, "--workers", "2", "--max-batch", "16", "--max-queue-delay-us", "2000",
                        "--engine-calls", calls, *polls, *eager)
    srv.engine_calls = calls  # type: ignore[attr-defined]
    yield srv
    code = srv.stop()
    assert code == 0, "".join(srv.stderr)[-3000:]


def _client(url: str) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url.removeprefix("http://"), concurrency=8)


def test_local_two_fronts_and_one_engine_process_are_up(server: ServerProcess) -> None:
    pids = server.doc["pids"]
    assert len(pids["fronts"]) == 2 and len(pids["engines"]) == 1
    assert len({*pids["fronts"], *pids["engines"], server.proc.pid}) == 4
    assert server.doc["url"] == server.url
    assert server.get("/v2/health/live")[0] == 200
    assert server.get("/v2/health/ready")[0] == 200
    assert server.doc["engine_calls"] == server.engine_calls
    graphs = server.engine_calls == "loop"  # (the threads' server runs with --no-outer-graph)
    assert (server.doc["outer_graph"], server.doc["pad_batches"]) == (graphs, graphs)
    assert server.doc["overlap"] is False  # (off unless --overlap)


def test_local_tritonclient_reads_metadata_and_infers_json_and_binary(server: ServerProcess) -> None:
    import tritonclient.http as httpclient

    client = _client(server.url)
    assert client.is_server_ready() and client.is_model_ready("affine")
    meta = client.get_model_metadata("affine")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}]
    assert meta["outputs"][0]["name"] == "y"
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    for binary in (False, True):
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        result = client.infer("affine", [tensor],
                              outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)])
        np.testing.assert_array_equal(result.as_numpy("y"), reference(x))
    client.close()


def test_local_concurrent_clients_get_their_own_answers_in_batches(server: ServerProcess) -> None:
    def one(i: int) -> bool:
        x = np.full((1 + i % 3, 4), i / 8, np.float32)
        status, body, _ = post(server.url + "/", npy(x), "application/x-npy")
        return status == 200 and np.array_equal(load_npy(body), reference(x))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(400)))
    status, metrics = server.get("/metrics")
    assert status == 200
    sizes: dict[str, float] = {}
    for line in metrics.decode().splitlines():
        if line.startswith("trt_runtime_batch_size_bucket{") and 'le="1.0"' in line:
            sizes["le1"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("trt_runtime_batch_size_count{"):
            sizes["count"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(("trt_runtime_request_seconds_",
                               "trt_runtime_engine_round_trip_seconds_")):
            key = line.split("{", 1)[0]
            sizes[key] = sizes.get(key, 0.0) + float(line.rsplit(" ", 1)[1])  # summed over the fronts
    assert sizes["count"] > 0 and sizes["le1"] < sizes["count"], sizes  # some engine calls ran > 1 row
    # where the time went: every request timed at its route and on its round trip to the engine
    trip, route = "trt_runtime_engine_round_trip_seconds", "trt_runtime_request_seconds"
    assert sizes[f"{trip}_count"] >= 400 and sizes[f"{route}_count"] >= 400, sizes
    assert 0 < sizes[f"{trip}_sum"] < sizes[f"{route}_sum"], sizes  # the round trip is part of the route


def test_local_engine_that_cannot_batch_keeps_its_calls_on_a_thread(tmp_path: Path) -> None:
    """``--engine-calls auto`` (the default) with batching asked for, on an engine of static shape:
    every request runs alone, so the engine process keeps a thread for its calls."""
    engine = tmp_path / "static.mem"
    engine.write_bytes(static_engine())
    srv = ServerProcess(engine, PORT_STATIC, "--workers", "1", "--max-batch", "16")
    try:
        assert srv.doc["engine_calls"] == "threads"
        assert (srv.doc["outer_graph"], srv.doc["pad_batches"]) == (False, False)  # ("auto": cannot batch)
        values = np.arange(8, dtype=np.float32).reshape(2, 4)
        status, body, _ = post(srv.url + "/", npy(values), "application/x-npy")
        assert status == 200 and np.array_equal(load_npy(body), reference(values))
    finally:
        assert srv.stop() == 0, "".join(srv.stderr)[-3000:]


def test_local_bad_request_gets_400_naming_the_value(server: ServerProcess) -> None:
    status, body, _ = post(server.url + "/", npy(np.ones((2, 4), np.int64)), "application/x-npy")
    assert 400 <= status < 500 and b"int64" in body


def _wait_restarted(server: ServerProcess, role: str, index: int) -> None:
    """The supervisor logs the death; readiness drops, then comes back."""
    server.wait_ready(False, 10, poll_s=0.005)
    server.wait_ready(True, 60)
    line = f"{role} {index} exited with code -9; starting it again"
    end = time.monotonic() + 10  # stderr is read on a thread
    while not any(line in seen for seen in server.stderr) and time.monotonic() < end:
        time.sleep(0.05)
    assert any(line in seen for seen in server.stderr), server.stderr[-5:]


@pytest.mark.parametrize("role", ["front", "engine"])
def test_local_killed_process_is_replaced_and_later_requests_succeed(server: ServerProcess,
                                                                     role: str) -> None:
    victim = server.doc["pids"][role + "s"][0]
    os.kill(victim, signal.SIGKILL)
    _wait_restarted(server, role, 0)
    x = np.full((2, 3), 0.5, np.float32)
    for _ in range(20):  # both fronts, by the kernel's spread of connections
        status, body, _ = post(server.url + "/", npy(x), "application/x-npy")
        assert status == 200, body
        np.testing.assert_array_equal(load_npy(body), reference(x))


def test_local_sigint_finishes_in_flight_requests_and_exits_0(tmp_path: Path) -> None:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    # Requests wait up to 1.5 s for a batch to fill: SIGINT arrives while they are queued.
    srv = ServerProcess(engine, PORT_DRAIN, "--workers", "2", "--max-batch", "64",
                        "--max-queue-delay-us", "1500000", "--drain-s", "20")
    x = np.full((1, 4), 3.0, np.float32)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post, srv.url + "/", npy(x), "application/x-npy") for _ in range(4)]
        end = time.monotonic() + 20
        while _inflight(srv) < 4 and time.monotonic() < end:  # all four reached a front
            time.sleep(0.02)
        srv.proc.send_signal(signal.SIGINT)
        answers = [f.result(timeout=30) for f in futures]
    code = srv.stop(timeout=60)
    assert code == 0, "".join(srv.stderr)[-3000:]
    for status, body, _ in answers:
        assert status == 200, body
        np.testing.assert_array_equal(load_npy(body), reference(x))
    assert "stopped" in "".join(srv.stderr)
    with socket.socket() as sock:
        assert sock.connect_ex((HOST, PORT_DRAIN)) != 0, "a front outlived the command"


def test_local_two_engine_processes_share_the_load_and_one_may_die(tmp_path: Path) -> None:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    script = Path(__file__).with_name("_two_engines.py")
    srv = ServerProcess(engine, PORT_TWO, command=[sys.executable, str(script), str(engine), str(PORT_TWO)])
    try:
        assert len(srv.doc["pids"]["engines"]) == 2

        def wrong(i: int) -> tuple[int, int, bytes] | None:
            """``None`` for a right answer, else what came back (shown when the test fails)."""
            x = np.full((1, 4), i / 4, np.float32)
            status, body, _ = post(srv.url + "/", npy(x), "application/x-npy")
            if status == 200 and np.array_equal(load_npy(body), reference(x)):
                return None
            return i, status, body[:300]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            failed = [f for f in pool.map(wrong, range(200)) if f]
            assert not failed, failed
            os.kill(srv.doc["pids"]["engines"][1], signal.SIGKILL)
            failed = [f for f in pool.map(wrong, range(200)) if f]
            assert not failed, failed  # the other engine process answers meanwhile
        srv.wait_ready(True, 60)
    finally:
        code = srv.stop()
    assert code == 0, "".join(srv.stderr)[-3000:]
    assert any("engine 1 exited with code -9" in line for line in srv.stderr)


def test_local_children_exit_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    srv = ServerProcess(engine, PORT_ORPHAN, "--workers", "2")
    children = [*srv.doc["pids"]["fronts"], *srv.doc["pids"]["engines"]]
    srv.stop(signal.SIGKILL)
    end = time.monotonic() + 20
    while any(_alive(pid) for pid in children) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children), "an orphaned child kept running"
    with socket.socket() as sock:
        assert sock.connect_ex((HOST, PORT_ORPHAN)) != 0, "an orphaned front still listens"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waits for init to reap it: it is gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _inflight(server: ServerProcess) -> float:
    _status, body = server.get("/metrics")
    for line in body.decode().splitlines():
        if line.startswith("trt_runtime_inflight_requests{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trt_runtime.cli", "serve", *args],
                          capture_output=True, text=True, timeout=60)


def test_local_busy_port_and_missing_gpu_exit_2_with_one_line(tmp_path: Path) -> None:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    with socket.socket() as taken:
        taken.bind((HOST, PORT_BUSY))
        taken.listen()
        result = _run_cli(str(engine), "--port", str(PORT_BUSY))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"trt-runtime: error: cannot listen on {HOST}:{PORT_BUSY}: Address already in use"]
    result = _run_cli(str(engine), "--port", str(PORT_BUSY), "--gpus", "0,99")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "GPU index" in line and "does not exist" in line and "(see 'trt-runtime serve --help')" in line
    result = _run_cli(str(engine), "--port", str(PORT_BUSY), "--engine-calls", "loop", "--contexts", "2")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "engine_calls='loop' runs one context on the event loop; got contexts=2" in line
    result = _run_cli(str(engine), "--ray", "--engine-calls", "loop")
    assert result.returncode == 2 and "--engine-calls, --engine-poll-us," in result.stderr
    result = _run_cli(str(engine), "--port", str(PORT_BUSY), "--engine-poll-us", "-5")
    assert result.returncode == 2
    assert "engine_poll_us must be an integer number of µs in [0, 1000000]; got -5" in result.stderr
    result = _run_cli(str(engine), "--port", str(PORT_BUSY), "--engine-poll-us", "100", "--engine-calls",
                      "threads")
    assert result.returncode == 2
    assert "engine_poll_us polls an engine process's event loop" in result.stderr
    assert "got engine_calls='threads', contexts=1" in result.stderr
    result = _run_cli(str(engine), "--port", str(PORT_BUSY), "--front-poll-us", "2000000")
    assert result.returncode == 2
    assert "front_poll_us must be" in result.stderr and "got 2000000" in result.stderr


def test_local_bad_switch_interval_exits_1_naming_it(tmp_path: Path) -> None:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    env = {**os.environ, "TRT_RUNTIME_SERVE_SWITCH_INTERVAL_US": "0.1ms"}
    result = subprocess.run([sys.executable, "-m", "trt_runtime.cli", "serve", str(engine), "--port", "0"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    message = "TRT_RUNTIME_SERVE_SWITCH_INTERVAL_US must be microseconds in [1, 1000000]; got '0.1ms'"
    assert message in result.stderr


def test_local_bad_engine_file_exits_1_with_runs_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"not an engine at all")
    served = _run_cli(str(bad))
    ran = subprocess.run([sys.executable, "-m", "trt_runtime.cli", "run", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert served.returncode == ran.returncode == 1
    assert served.stderr.strip() == ran.stderr.strip() and len(served.stderr.strip().splitlines()) == 1
