"""A real local Ray Serve on loopback serving memory-backend engines: results, batching,
bad requests, a replica that dies while loading and one killed while serving."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _serve_support import (
    HOST,
    PORT_SINGLE,
    get_json,
    keep_ray_on_loopback,
    load_npy,
    npy,
    pair_engine,
    post,
    ray_init_args,
    reference,
    require_serve,
    single_engine,
)

serve = require_serve()

import ray  # noqa: E402

from trt_runtime import EngineError, RequestError  # noqa: E402
from trt_runtime.serve import EngineServer, ServeOptions, build_app  # noqa: E402

# One Ray at a time on this machine: under xdist these modules share one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
BASE = f"http://{HOST}:{PORT_SINGLE}"
MAX_BODY = 4096


@pytest.fixture(scope="module")
def cluster() -> Any:
    keep_ray_on_loopback()
    ray.init(**ray_init_args(num_cpus=2))
    serve.start(http_options={"host": HOST, "port": PORT_SINGLE})
    options = ServeOptions(backend="memory", max_batch=8, batch_wait_ms=50, max_body_bytes=MAX_BODY,
                           runtime_cache=None)
    handles = {
        "single": serve.run(build_app(single_engine(), options, cpus_per_replica=0, name="Single"),
                            name="single", route_prefix="/single"),
        "pair": serve.run(build_app(pair_engine(), options, cpus_per_replica=0, name="Pair"),
                          name="pair", route_prefix="/pair"),
    }
    _wait_for_routes("/single", "/pair")
    yield handles
    serve.shutdown()
    ray.shutdown()


def _wait_for_routes(*prefixes: str, timeout_s: float = 60.0) -> None:
    """``serve.run`` returns once the replicas are up; the HTTP proxy learns the routes a moment
    later (seconds on a loaded machine), and a request before that gets Ray's 404."""
    end = time.monotonic() + timeout_s
    routes: Any = {}
    while time.monotonic() < end:
        try:
            routes = get_json(f"{BASE}/-/routes")
        except OSError:
            routes = {}
        if all(prefix in routes for prefix in prefixes):
            return
        time.sleep(0.2)
    raise AssertionError(f"Ray's proxy routes {routes} lack {prefixes} after {timeout_s} s")


def _calls(handle: Any) -> int:
    return sum(handle.stats.remote().result()["call_rows"].values())


# -- results and batching ---------------------------------------------------------------------
def test_serve_concurrent_http_and_handle_clients_get_their_own_results(cluster: Any) -> None:
    handle = cluster["single"]
    before = handle.stats.remote().result()["batch_sizes"]

    def over_http(i: int) -> np.ndarray:
        x = np.full((1, 4), i, np.float32)
        if i % 2:
            status, body, media = post(f"{BASE}/single/", npy(x), "application/x-npy")
            assert (status, media) == (200, "application/x-npy"), body
            return load_npy(body)
        body = json.dumps(x.tolist()).encode()
        status, body, media = post(f"{BASE}/single/infer", body, "application/json")
        assert (status, media) == (200, "application/json"), body
        return np.asarray(json.loads(body), np.float32)

    def over_handle(i: int) -> np.ndarray:
        return handle.infer.remote(np.full((1, 4), i, np.float32)).result()

    status, body, _ = post(f"{BASE}/single", npy(np.ones((1, 4), np.float32)), "application/x-npy")
    assert status == 200 and load_npy(body).tolist() == [[3.0] * 4], "the route prefix without a slash"
    ids = range(1, 49)
    with ThreadPoolExecutor(max_workers=32) as pool:
        http = list(pool.map(over_http, ids))
        responses = [handle.remote(np.full((1, 4), 1000 + i, np.float32)) for i in ids]
        via_handle = [r.result() for r in responses] + list(pool.map(over_handle, ids))
    for i, got in zip(ids, http, strict=True):
        np.testing.assert_array_equal(got, reference(np.full((1, 4), i, np.float32)))
    for i, got in zip([1000 + i for i in ids] + list(ids), via_handle, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, reference(np.full((1, 4), i, np.float32)))
    after = handle.stats.remote().result()["batch_sizes"]
    grown = {int(k): v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
    assert any(size > 1 for size in grown), f"no batch larger than one request: {after}"
    assert max(grown) <= 8, after


def test_serve_batches_group_requests_by_non_batch_shape(cluster: Any) -> None:
    handle = cluster["single"]
    shapes = [(1, 3), (2, 4), (1, 3), (3, 4), (1, 8), (2, 3)] * 4
    inputs = [np.full(s, 7 * i + 0.5, np.float32) for i, s in enumerate(shapes)]
    responses = [handle.remote(x) for x in inputs]
    for x, r in zip(inputs, responses, strict=True):
        np.testing.assert_array_equal(r.result(), reference(x))


def test_serve_two_inputs_by_name_over_npz_json_and_handle(cluster: Any) -> None:
    handle = cluster["pair"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    k = np.array([[1, 2], [3, 4]], np.int32)
    y, z = handle.infer.remote(x=x, k=k).result()
    np.testing.assert_array_equal(y, reference(x))
    np.testing.assert_array_equal(z, k * 3 - 1)
    assert z.dtype == np.int32
    import io

    buffer = io.BytesIO()
    np.savez(buffer, x=x, k=k)
    status, body, media = post(f"{BASE}/pair/", buffer.getvalue(), "application/x-npz")
    assert (status, media) == (200, "application/x-npz"), body
    answer = np.load(io.BytesIO(body), allow_pickle=False)
    np.testing.assert_array_equal(answer["y"], reference(x))
    np.testing.assert_array_equal(answer["z"], k * 3 - 1)
    status, body, _ = post(f"{BASE}/pair/", json.dumps({"x": x.tolist(), "k": k.tolist()}).encode(),
                           "application/json")
    assert status == 200, body
    assert json.loads(body) == {"y": reference(x).tolist(), "z": (k * 3 - 1).tolist()}


def test_serve_ready_and_stats_routes(cluster: Any) -> None:
    info = get_json(f"{BASE}/single/ready")
    assert info["engine"] == "affine" and info["backend"] == "memory" and info["batchable"] is True
    assert info["inputs"][0]["profiles"] == [[[1, 1], [4, 4], [16, 8]]]
    # one answered request of its own: the test does not lean on the ones before it
    status, _body, _media = post(f"{BASE}/single/", npy(np.ones((1, 4), np.float32)), "application/x-npy")
    assert status == 200
    stats = get_json(f"{BASE}/single/stats")
    assert stats["requests"]["200"] > 0, stats


def test_serve_open_inference_protocol_through_ray(cluster: Any) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(f"{HOST}:{PORT_SINGLE}/pair")
    assert client.is_server_ready() and client.is_model_ready("pair")
    assert [i["datatype"] for i in client.get_model_metadata("pair")["inputs"]] == ["FP32", "INT32"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    k = np.array([[1, 2], [3, 4]], np.int32)
    tensors = [triton.InferInput("x", [2, 4], "FP32"), triton.InferInput("k", [2, 2], "INT32")]
    tensors[0].set_data_from_numpy(x)
    tensors[1].set_data_from_numpy(k, binary_data=False)
    result = client.infer("pair", tensors)
    np.testing.assert_array_equal(result.as_numpy("y"), reference(x))
    np.testing.assert_array_equal(result.as_numpy("z"), k * 3 - 1)


# -- bad requests ---------------------------------------------------------------------------------
def _object_npy() -> bytes:
    header = npy(np.zeros((1, 4), np.float32)).replace(b"'<f4'", b"'|O' ")
    return header


BAD_REQUESTS = [
    ("wrong dtype", "single", npy(np.ones((1, 4), np.float64)), "application/x-npy", 422, "float64"),
    ("outside every profile", "single", npy(np.ones((1, 9), np.float32)), "application/x-npy", 422,
     r"\[1, 9\]"),
    ("batch above the profile", "single", npy(np.ones((17, 4), np.float32)), "application/x-npy", 422,
     r"\[17, 4\]"),
    ("wrong rank", "single", npy(np.ones(4, np.float32)), "application/x-npy", 422, r"\[4\]"),
    ("unknown input name", "single", b'{"q": [[1, 2]]}', "application/json", 422, "'q'"),
    ("missing input", "pair", b'{"x": [[1, 2, 3, 4]]}', "application/json", 422, "missing.*'k'"),
    ("wrong input count", "pair", npy(np.ones((1, 4), np.float32)), "application/x-npy", 422,
     "2 input.*got 1"),
    ("non-integer for int32", "pair", b'{"x": [[1, 2, 3, 4]], "k": [[1.5, 2]]}', "application/json", 422,
     "1.5"),
    ("body too large", "single", npy(np.ones((16, 8), np.float32)) * 9, "application/x-npy", 413,
     str(MAX_BODY)),
    ("malformed JSON", "single", b"[[1, 2", "application/json", 400, "not valid JSON"),
    ("JSON strings", "single", b'[["a", "b"]]', "application/json", 400, "'a'"),
    ("ragged JSON", "single", b"[[1, 2], [3]]", "application/json", 400, "rectangular"),
    ("malformed npy", "single", b"\x93NUMPY garbage", "application/x-npy", 400, "not a valid .npy"),
    ("npy header larger than its data", "single", npy(np.ones((2, 4), np.float32))[:-8],
     "application/x-npy", 400, "shape \\[2, 4\\]"),
    ("npy of objects", "single", _object_npy(), "application/x-npy", 400, "objects"),
    ("malformed npz", "pair", b"PK\x03\x04 not a zip", "application/x-npz", 400, "not a valid .npz"),
    ("unknown content type", "single", b"1,2,3", "text/csv", 415, "text/csv"),
]


@pytest.mark.parametrize(("what", "app", "body", "media", "status", "match"), BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_serve_bad_request_gets_4xx_and_never_reaches_the_engine(
    cluster: Any, what: str, app: str, body: bytes, media: str, status: int, match: str
) -> None:
    import re

    handle = cluster[app]
    calls, pid = _calls(handle), handle.stats.remote().result()["pid"]
    got, text, _ = post(f"{BASE}/{app}/", body, media)
    message = text.decode()
    assert got == status, message
    assert message.count("\n") == 1 and re.search(match, message), message
    assert _calls(handle) == calls, f"{what} reached the engine"
    assert handle.stats.remote().result()["pid"] == pid
    x = np.full((1, 4), 3, np.float32)
    if app == "single":
        np.testing.assert_array_equal(handle.remote(x).result(), reference(x))
    else:
        y, _z = handle.remote(x, np.zeros((1, 2), np.int32)).result()
        np.testing.assert_array_equal(y, reference(x))


def test_serve_bad_request_through_a_handle_raises_request_error(cluster: Any) -> None:
    handle = cluster["single"]
    with pytest.raises(RequestError, match="must have dtype float32; got int64"):
        handle.infer.remote(np.ones((1, 4), np.int64)).result()
    with pytest.raises(RequestError, match=r"outside every optimization profile"):
        handle.infer.remote(np.ones((1, 20), np.float32)).result()
    with pytest.raises(RequestError, match="must be a numpy array; got list"):
        handle.infer.remote([[1.0]]).result()
    np.testing.assert_array_equal(handle.remote(np.ones((1, 2), np.float32)).result(), [[3.0, 3.0]])


def test_serve_wrong_method_and_route(cluster: Any) -> None:
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{BASE}/single/", timeout=10)
    assert info.value.code == 405
    status, body, _ = post(f"{BASE}/single/nowhere", b"[]", "application/json")
    assert status == 404 and b"/nowhere" in body


# -- replicas dying ---------------------------------------------------------------------------------
def test_serve_replica_killed_while_loading_is_restarted(cluster: Any, tmp_path: Path) -> None:
    marker = tmp_path / "died-once"

    class DiesOnceWhileLoading(EngineServer):  # defined here: Ray pickles it by value
        def __init__(self, engine: Any, options: Any, marker: str) -> None:
            if not os.path.exists(marker):
                Path(marker).write_text("x")
                os._exit(1)
            super().__init__(engine, options)

    options = ServeOptions(backend="memory", max_batch=4, batch_wait_ms=5, runtime_cache=None)
    app = serve.deployment(DiesOnceWhileLoading, name="Flaky", max_ongoing_requests=32,
                           ray_actor_options={"num_cpus": 0}).bind(single_engine(), options, str(marker))
    handle = serve.run(app, name="flaky", route_prefix="/flaky")
    try:
        assert marker.exists()
        _check_distinct(handle, range(40))
    finally:
        serve.delete("flaky")


def test_serve_replica_killed_while_serving_recovers_and_never_mixes_answers(cluster: Any) -> None:
    options = ServeOptions(backend="memory", max_batch=4, batch_wait_ms=5, runtime_cache=None)
    handle = serve.run(build_app(single_engine(), options, replicas=2, cpus_per_replica=0, name="Killed"),
                       name="killed", route_prefix="/killed")
    try:
        pids = set()
        deadline = time.monotonic() + 30
        while len(pids) < 2 and time.monotonic() < deadline:
            pids.add(handle.stats.remote().result()["pid"])
        assert len(pids) == 2, pids
        victim = min(pids)
        failures: list[BaseException] = []
        stop = threading.Event()

        def traffic(offset: int) -> None:
            i = offset
            while not stop.is_set():
                x = np.full((1, 4), i, np.float32)
                try:
                    got = handle.remote(x).result(timeout_s=30)
                except Exception as exc:  # a request on the killed replica may fail...
                    failures.append(exc)
                else:  # ...but no answer may belong to another request
                    np.testing.assert_array_equal(got, reference(x))
                i += 4

        with ThreadPoolExecutor(max_workers=4) as pool:
            running = [pool.submit(traffic, k) for k in range(4)]
            time.sleep(0.5)
            os.kill(victim, signal.SIGKILL)
            time.sleep(1.0)
            stop.set()
            for f in running:
                f.result()
        _wait_for_replicas(handle, 2, exclude=victim)
        _check_distinct(handle, range(5000, 5040))
    finally:
        serve.delete("killed")


def _wait_for_replicas(handle: Any, count: int, exclude: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while time.monotonic() < deadline:
        try:
            seen.add(handle.stats.remote().result(timeout_s=10)["pid"])
        except Exception:
            time.sleep(0.2)
            continue
        if len(seen - {exclude}) >= count:
            return
    raise AssertionError(f"only replicas {seen} answered within {timeout} s (killed: {exclude})")


def _check_distinct(handle: Any, ids: Any) -> None:
    inputs = {i: np.full((1, 4), i, np.float32) for i in ids}
    responses = {i: handle.remote(x) for i, x in inputs.items()}
    for i, response in responses.items():
        np.testing.assert_array_equal(response.result(timeout_s=30), reference(inputs[i]))


def test_serve_replica_says_what_auto_resolved_to() -> None:
    """The options ``trt-runtime serve --ray`` passes: a replica of an engine that can batch runs padded
    batches under the outer graph, and its ``/ready`` document says so."""
    options = ServeOptions(backend="memory", runtime_cache=None, outer_graph="auto", pad_batches="auto")
    server = EngineServer(single_engine(), options)
    try:
        assert (server.describe()["outer_graph"], server.describe()["pad_batches"]) == (True, True)
    finally:
        server.close()


def test_serve_health_check_fails_without_a_context() -> None:
    server = EngineServer(single_engine(), ServeOptions(backend="memory", runtime_cache=None))
    try:
        server.check_health()  # constructed: engine and first context exist
        info = server.describe()
        assert (info["engine"], info["max_batch"], info["runtime_cache"]) == ("affine", 16, None)
        assert (info["outer_graph"], info["pad_batches"]) == (False, False)  # (ServeOptions' own default)
        server.engine.invalidate_context()
        with pytest.raises(EngineError, match="'affine' is closed or has no execution context"):
            server.check_health()
    finally:
        server.close()
    with pytest.raises(EngineError, match="closed"):
        server.check_health()
