"""make_app with test doubles for ``infer`` and readiness, driven through ASGI directly:
status mapping, readiness, routing refusals and the metrics every answer leaves."""

from __future__ import annotations

import asyncio
import io
import json
import re
from typing import Any

import numpy as np
import pytest

from trt_runtime import RequestError, TensorSpec
from trt_runtime.serve import ModelInfo, ServeMetrics, make_app

_X = TensorSpec("x", "float32", (-1, 2), True, profiles=(((1, 2), (2, 2), (4, 2)),))
_MODEL = ModelInfo.from_specs("m", [_X], [TensorSpec("y", "float32", (-1, 2), False)], max_batch=4)
_BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()


def _call(app: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
          root: str = "") -> tuple[int, dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": path, "root_path": root, "query_string": b"",
             "headers": raw, "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1)}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    answer = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, answer


class _Doubles:
    def __init__(self) -> None:
        self.up = True
        self.fail: BaseException | None = None
        self.metrics = ServeMetrics("m")
        self.app = make_app(
            _MODEL, self.infer, metrics=self.metrics, ready=lambda: self.up, max_body_bytes=512
        )

    async def infer(self, arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        if self.fail is not None:
            raise self.fail
        return [arrays[0] * 2 + 1]

    def series(self, name: str) -> float:
        text = self.metrics.render()[0].decode()
        found = re.search(re.escape(name) + r" (\S+)", text)
        return float(found.group(1)) if found else 0.0


@pytest.fixture
def doubles() -> _Doubles:
    return _Doubles()


def test_app_answers_infer_under_its_version_and_counts_it(doubles: _Doubles) -> None:
    status, _, body = _call(doubles.app, "POST", "/v2/models/m/versions/1/infer", _BODY)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [3.0, 5.0]
    assert doubles.series('trt_runtime_requests_total{code="200",model="m"}') == 1
    assert doubles.series('trt_runtime_inflight_requests{model="m"}') == 0


@pytest.mark.parametrize(
    ("fail", "status", "message"),
    [(RuntimeError("boom"), 500, "model 'm' failed: RuntimeError: boom"),
     (RequestError("no engine process is up; try again shortly", 503), 503, "no engine process is up"),
     (RequestError("input 'x' is odd", 422), 422, "input 'x' is odd")],
)
def test_app_maps_what_infer_raises_to_a_status(doubles: _Doubles, fail: BaseException, status: int,
                                               message: str) -> None:
    doubles.fail = fail
    for path in ("/v2/models/m/infer", "/"):
        body = _BODY if path != "/" else b"[[1, 2]]"
        got, headers, answer = _call(doubles.app, "POST", path, body, {"Content-Type": "application/json"})
        assert got == status and headers["content-type"] == "application/json"
        assert answer.endswith(b"}\n") and answer.count(b"\n") == 1
        assert message in json.loads(answer)["error"]
    assert doubles.series(f'trt_runtime_requests_total{{code="{status}",model="m"}}') == 2
    assert doubles.series('trt_runtime_inflight_requests{model="m"}') == 0


def test_app_readiness_follows_ready(doubles: _Doubles) -> None:
    assert _call(doubles.app, "GET", "/v2/health/ready")[0] == 200
    doubles.up = False
    assert _call(doubles.app, "GET", "/v2/health/ready")[0] == 503
    assert _call(doubles.app, "GET", "/v2/models/m/ready")[0] == 503
    assert _call(doubles.app, "GET", "/v2/health/live")[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "message"),
    [("GET", "/nowhere", {}, 404, "no route '/nowhere'"),
     ("GET", "/v2/models/m/infer", {}, 405, "method GET is not allowed on '/v2/models/m/infer'"),
     ("GET", "/v2/models/m/versions/2", {}, 404, "unknown model 'm' version '2'"),
     ("POST", "/v2/models/other/infer", {}, 404, "unknown model 'other'"),
     ("POST", "/v2/models/m/infer", {"Content-Length": "9999"}, 413, "9999 bytes exceeds the limit of 512"),
     ("POST", "/v2/models/m/infer", {"Content-Length": "x1"}, 400, "Content-Length 'x1' is not a number")],
)
def test_app_refusals_are_one_json_line(doubles: _Doubles, method: str, path: str, headers: dict[str, str],
                                        status: int, message: str) -> None:
    got, _, answer = _call(doubles.app, method, path, _BODY if method == "POST" else b"", headers)
    assert got == status and message in json.loads(answer)["error"]


def test_app_refuses_a_streamed_body_over_the_limit(doubles: _Doubles) -> None:
    got, _, answer = _call(doubles.app, "POST", "/v2/models/m/infer", b" " * 600)
    assert got == 413 and "exceeds the limit of 512 bytes" in json.loads(answer)["error"]


def test_make_app_refuses_a_bad_body_limit() -> None:
    async def infer(arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        return list(arrays)

    with pytest.raises(ValueError, match="max_body_bytes must be an integer >= 1; got 0"):
        make_app(_MODEL, infer, metrics=ServeMetrics("m"), ready=lambda: True, max_body_bytes=0)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_app_infer_routes_answer_under_a_root_path_with_their_length(doubles: _Doubles) -> None:
    x = np.array([[1, 2]], np.float32)
    headers = {"Content-Type": "application/x-npy"}
    for root, path in (("", "/"), ("", "/infer"), ("/bench", "/bench/"), ("/bench", "/bench/infer")):
        status, got, body = _call(doubles.app, "POST", path, _npy(x), headers, root)
        assert status == 200, (root, path, body)
        assert got["content-length"] == str(len(body)) and got["content-type"] == "application/x-npy"
        assert np.array_equal(np.load(io.BytesIO(body)), x * 2 + 1)
    status, answer_headers, _ = _call(doubles.app, "POST", "/v2/models/m/infer", _BODY, headers)
    assert status == 200 and answer_headers["content-type"] == "application/json"


def test_app_infer_answers_binary_outputs_with_the_json_length(doubles: _Doubles) -> None:
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                                     "parameters": {"binary_data_size": 8}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + np.array([[1, 2]], np.float32).tobytes()
    status, headers, answer = _call(doubles.app, "POST", "/v2/models/m/versions/1/infer", body,
                                    {"Inference-Header-Content-Length": str(len(header))})
    split = int(headers["inference-header-content-length"])
    assert status == 200 and headers["content-length"] == str(len(answer))
    assert json.loads(answer[:split])["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(answer[split:], np.float32).tolist() == [3.0, 5.0]


def test_app_reads_a_body_sent_in_several_messages(doubles: _Doubles) -> None:
    chunks = [_BODY[:5], _BODY[5:20], _BODY[20:]]
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "root_path": "",
             "query_string": b"", "headers": [], "http_version": "1.1"}

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(doubles.app(scope, receive, send))
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"])["outputs"][0]["data"] == [3.0, 5.0]


def test_app_counts_an_answer_before_it_leaves(doubles: _Doubles) -> None:
    counted: list[float] = []
    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "root_path": "",
             "query_string": b"", "headers": [], "http_version": "1.1"}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": _BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        counted.append(doubles.series('trt_runtime_requests_total{code="200",model="m"}'))

    asyncio.run(doubles.app(scope, receive, send))
    assert counted == [1, 1]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("POST", "/infer/", 307), ("POST", "/v2/models/m/infer/", 307), ("POST", "/v2/models//infer", 404),
     ("GET", "/infer", 405), ("PUT", "/v2/models/m/versions/1/infer", 405)],
)
def test_app_leaves_other_infer_like_requests_to_the_router(doubles: _Doubles, method: str, path: str,
                                                             status: int) -> None:
    assert _call(doubles.app, method, path, _BODY)[0] == status
