"""The Open Inference Protocol over HTTP, driven by Triton's own client against the in-process server."""

from __future__ import annotations

import io
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
from _serve_support import get_json, load_npy, npy, pair_engine, post, reference, single_engine
from tritonclient.utils import InferenceServerException

import trt_runtime
from trt_runtime import RequestError
from trt_runtime.serve.inprocess import InProcessServer
from trt_runtime.serve.model import ModelInfo


@pytest.fixture(scope="module")
def affine() -> Iterator[InProcessServer]:
    with trt_runtime.load(single_engine(), "memory") as engine:
        model = ModelInfo.from_engine(engine, "affine", max_batch=8)
        with InProcessServer(engine, model, max_queue_delay_us=20_000, max_body_bytes=1 << 16) as server:
            yield server


@pytest.fixture(scope="module")
def pair() -> Iterator[InProcessServer]:
    with trt_runtime.load(pair_engine(), "memory") as engine:
        model = ModelInfo.from_engine(engine, "pair", max_batch=4)
        with InProcessServer(engine, model) as server:
            yield server


def _client(server: InProcessServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.url.removeprefix("http://"))


def _input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def test_kserve_health_and_metadata(affine: InProcessServer) -> None:
    client = _client(affine)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("affine")
    assert client.get_model_metadata("affine") == {
        "name": "affine", "versions": ["1"], "platform": "tensorrt_plan",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, -1]}],
    }
    config = client.get_model_config("affine")
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}]
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert not client.is_model_ready("other")


@pytest.mark.parametrize(
    ("binary_in", "binary_out"), [(True, True), (False, False), (True, False), (False, True)]
)
def test_kserve_infer_json_and_binary_tensors(
    affine: InProcessServer, binary_in: bool, binary_out: bool
) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    result = _client(affine).infer(
        "affine", [_input("x", x, "FP32", binary_in)],
        outputs=[triton.InferRequestedOutput("y", binary_data=binary_out)], request_id="r-1",
    )
    np.testing.assert_array_equal(result.as_numpy("y"), reference(x))
    response = result.get_response()
    assert response["id"] == "r-1" and response["model_version"] == "1"
    assert ("binary_data_size" in response["outputs"][0].get("parameters", {})) is binary_out


def test_kserve_two_inputs_two_outputs_and_an_output_subset(pair: InProcessServer) -> None:
    x = np.ones((2, 4), np.float32)
    k = np.array([[1, 2], [3, 4]], np.int32)
    client = _client(pair)
    result = client.infer("pair", [_input("x", x, "FP32"), _input("k", k, "INT32", binary=False)])
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * x + 1)
    np.testing.assert_array_equal(result.as_numpy("z"), 3 * k - 1)
    only = client.infer("pair", [_input("k", k, "INT32"), _input("x", x, "FP32")],
                        outputs=[triton.InferRequestedOutput("z")])
    assert only.as_numpy("y") is None
    np.testing.assert_array_equal(only.as_numpy("z"), 3 * k - 1)


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        ([("x", np.ones((2, 4), np.float64), "FP64")],
         r"input 'x' of model 'affine' has datatype FP32; got 'FP64'"),
        ([("x", np.ones((2, 4, 1), np.float32), "FP32")],
         r"input 'x' .* must have shape \[-1, -1\].*got \[2, 4, 1\]"),
        ([("x", np.ones((2, 9), np.float32), "FP32")], r"input 'x' .* has shape \[2, 9\], outside every"),
        ([("w", np.ones((2, 4), np.float32), "FP32")],
         r"unknown input 'w'; model 'affine' takes inputs \['x'\]"),
        ([("x", np.ones((2, 4), np.float32), "FP32")] * 2, r"input 'x' is given twice"),
    ],
)
def test_kserve_refusals_are_400_with_one_line_naming_the_value(
    affine: InProcessServer, tensors: list[tuple[str, np.ndarray, str]], match: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _client(affine).infer("affine", [_input(n, a, d) for n, a, d in tensors])
    assert caught.value.status() == "400"
    assert "\n" not in caught.value.message() and re.search(match, caught.value.message())


def test_kserve_missing_input_is_400_naming_it(pair: InProcessServer) -> None:
    with pytest.raises(InferenceServerException, match=r"missing \['k'\]") as caught:
        _client(pair).infer("pair", [_input("x", np.ones((1, 4), np.float32), "FP32")])
    assert caught.value.status() == "400"


def test_kserve_unknown_model_and_output(affine: InProcessServer) -> None:
    client = _client(affine)
    x = _input("x", np.ones((1, 4), np.float32), "FP32")
    with pytest.raises(InferenceServerException, match="unknown model 'other'") as caught:
        client.infer("other", [x])
    assert caught.value.status() == "404"
    unknown = r"unknown output 'q'; model 'affine' has outputs \['y'\]"
    with pytest.raises(InferenceServerException, match=unknown):
        client.infer("affine", [x], outputs=[triton.InferRequestedOutput("q")])


_X11 = b'{"name": "x", "datatype": "FP32", "shape": [1, 1], '


@pytest.mark.parametrize(
    ("head", "tail", "length", "match"),
    [
        (b"{not json", b"", None, "infer request is not valid JSON"),
        (b'{"inputs": 3}', b"", None, "must be a JSON object with an 'inputs' list"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2, 3]}]}', b"", None,
         r"'data' has 3 values; shape \[1, 2\] needs 2"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, -2], "data": []}]}', b"", None,
         r"shape must be a list of integers >= 0; got \[1, -2\]"),
        (b'{"inputs": [' + _X11 + b'"data": ["a"]}]}', b"", None, "'data' must hold float32 values; got 'a'"),
        (b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 1], "data": [1]}]}', b"", None,
         "datatype 'BYTES' is not supported"),
        (b'{"inputs": [' + _X11 + b'"parameters": {"binary_data_size": 8}}]}', b"\0" * 4, "len",
         r"binary_data_size 8 does not match shape \[1, 1\] of FP32 \(4 bytes\)"),
        (b'{"inputs": []}', b"", "999", "Inference-Header-Content-Length '999'"),
        (b'{"inputs": [' + _X11 + b'"data": [1]}]}', b"xx", "len", "the binary part has 2 bytes"),
    ],
)
def test_kserve_malformed_bodies_are_400(
    affine: InProcessServer, head: bytes, tail: bytes, length: str | None, match: str
) -> None:
    headers = {"Content-Type": "application/json"}
    if length is not None:
        headers["Inference-Header-Content-Length"] = str(len(head)) if length == "len" else length
    request = urllib.request.Request(
        affine.url + "/v2/models/affine/infer", data=head + tail, method="POST", headers=headers
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    message = json.loads(caught.value.read())["error"]
    assert re.search(match, message), message


def test_kserve_concurrent_clients_get_their_own_answers_in_batches(affine: InProcessServer) -> None:
    def calls_of_one_row() -> float:
        text = urllib.request.urlopen(affine.url + "/metrics", timeout=30).read().decode()
        one = re.search(r'trt_runtime_batch_size_bucket\{le="1.0",model="affine"\} (\S+)', text)
        return float(one.group(1)) if one else 0.0

    def calls() -> float:
        text = urllib.request.urlopen(affine.url + "/metrics", timeout=30).read().decode()
        count = re.search(r'trt_runtime_batch_size_count\{model="affine"\} (\S+)', text)
        return float(count.group(1)) if count else 0.0

    before_one, before = calls_of_one_row(), calls()
    wrong: list[str] = []
    barrier = threading.Barrier(16)

    def client(k: int) -> None:
        connection = _client(affine)
        barrier.wait()
        for i in range(5):
            x = np.full((1, 4), k * 100 + i, np.float32)
            y = connection.infer("affine", [_input("x", x, "FP32")]).as_numpy("y")
            if not np.array_equal(y, reference(x)):
                wrong.append(f"client {k} call {i}: {y}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not wrong
    engine_calls = calls() - before
    assert 0 < engine_calls < 80, "16 clients x 5 batch-1 requests ran in fewer engine calls than requests"
    assert engine_calls > calls_of_one_row() - before_one, "some engine call took more than one row"
    text = urllib.request.urlopen(affine.url + "/metrics", timeout=30).read().decode()
    for series in ('trt_runtime_requests_total{code="200",model="affine"}', "trt_runtime_queue_seconds_count",
                   "trt_runtime_compute_seconds_count", "trt_runtime_inflight_requests"):
        assert series in text


# -- the POST / shorthand ----------------------------------------------------------------
def test_shorthand_npy_json_and_npz(pair: InProcessServer, affine: InProcessServer) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    status, body, media = post(affine.url + "/", npy(x), "application/x-npy")
    assert status == 200 and media == "application/x-npy"
    np.testing.assert_array_equal(load_npy(body), reference(x))
    status, body, _ = post(affine.url + "/infer", json.dumps(x.tolist()).encode(), "application/json")
    assert status == 200 and json.loads(body) == reference(x).tolist()
    buffer = io.BytesIO()
    np.savez(buffer, x=np.ones((1, 4), np.float32), k=np.ones((1, 2), np.int32))
    status, body, media = post(pair.url + "/", buffer.getvalue(), "application/x-npz")
    assert status == 200 and media == "application/x-npz"
    answer = np.load(io.BytesIO(body))
    assert answer["y"].tolist() == [[3.0] * 4] and answer["z"].tolist() == [[2, 2]]


@pytest.mark.parametrize(
    ("body", "content_type", "status", "match"),
    [
        (b"[[1, 2]]", "text/plain", 415, "Content-Type 'text/plain' is not supported"),
        (b"[[1.5]]", "application/json", 200, ""),
        (npy(np.ones((2, 4), np.float64)), "application/x-npy", 422, "must have dtype float32; got float64"),
        (b"x" * (1 << 17), "application/x-npy", 413, "exceeds the limit of 65536 bytes"),
        (b"\x93NUMPY garbage", "application/x-npy", 400, "is not a valid .npy array"),
    ],
)
def test_shorthand_keeps_its_status_codes(
    affine: InProcessServer, body: bytes, content_type: str, status: int, match: str
) -> None:
    got, answer, media = post(affine.url + "/", body, content_type)
    assert got == status
    if status != 200:
        assert media == "application/json" and match in json.loads(answer)["error"]


def test_readiness_follows_the_server(affine: InProcessServer) -> None:
    assert get_json(affine.url + "/v2/health/ready") == {"ready": True}
    with trt_runtime.load(single_engine(), "memory") as engine:
        server = InProcessServer(engine, ModelInfo.from_engine(engine, "late"))
        url = server.url
        server.start()
        assert get_json(url + "/v2/models/late/ready") == {"name": "late", "ready": True}
        server.close()
        server.close()  # idempotent


# -- the codec of the protocol, every datatype ---------------------------------------------
_DTYPES = [("float16", "FP16"), ("float32", "FP32"), ("int8", "INT8"), ("int32", "INT32"), ("int64", "INT64"),
           ("uint8", "UINT8"), ("bool", "BOOL")]


def _typed_model(dtype: str) -> ModelInfo:
    from trt_runtime import TensorSpec

    x = TensorSpec("x", dtype, (-1, 3), True, profiles=(((1, 3), (2, 3), (4, 3)),))
    return ModelInfo.from_specs("typed", [x], [TensorSpec("y", dtype, (-1, 3), False)], max_batch=4)


@pytest.mark.parametrize(("dtype", "datatype"), _DTYPES)
@pytest.mark.parametrize("binary", [False, True])
def test_kserve_codec_round_trips_every_datatype(dtype: str, datatype: str, binary: bool) -> None:
    from trt_runtime.serve.kserve import decode_infer, encode_infer

    model = _typed_model(dtype)
    assert model.metadata()["inputs"][0]["datatype"] == datatype
    x = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
    entry: dict[str, object] = {"name": "x", "datatype": datatype, "shape": [2, 3]}
    if binary:
        entry["parameters"] = {"binary_data_size": x.nbytes}
    else:
        entry["data"] = x.ravel().tolist()
    head = json.dumps({"inputs": [entry], "parameters": {"binary_data_output": binary}}).encode()
    request = decode_infer(head + (x.tobytes() if binary else b""), str(len(head)) if binary else None, model)
    assert request.arrays[0].dtype == x.dtype
    np.testing.assert_array_equal(request.arrays[0], x)
    body, media, length = encode_infer(model, request, [x])
    if binary:
        assert media == "application/octet-stream" and length is not None
        doc = json.loads(body[:length])
        np.testing.assert_array_equal(np.frombuffer(body[length:], dtype).reshape(2, 3), x)
    else:
        assert media == "application/json" and length is None
        doc = json.loads(body)
        assert doc["outputs"][0]["data"] == x.ravel().tolist()
    assert doc["outputs"][0]["datatype"] == datatype and doc["outputs"][0]["shape"] == [2, 3]


def test_kserve_codec_parses_a_repeated_request_form_once_and_reads_each_body() -> None:
    from trt_runtime.serve.kserve import decode_infer, encode_infer

    model = _typed_model("float32")
    layouts: dict = {}
    heads: dict = {}
    entry = {"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}
    head = json.dumps({"id": "r-7", "inputs": [entry], "parameters": {"binary_data_output": True}}).encode()
    for scale in (1, 2, 3):  # the same JSON part with other tensor bytes each time
        x = np.arange(6, dtype=np.float32).reshape(2, 3) * scale
        request = decode_infer(head + x.tobytes(), str(len(head)), model, layouts)
        assert request.id == "r-7" and request.outputs == ((0, True),)
        np.testing.assert_array_equal(request.arrays[0], x)
        body, media, length = encode_infer(model, request, [x + 1], heads)
        assert media == "application/octet-stream" and length is not None
        assert json.loads(body[:length])["outputs"][0]["shape"] == [2, 3]
        np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32).reshape(2, 3), x + 1)
    assert len(layouts) == 1 and len(heads) == 1
    other = np.zeros((1, 3), np.float32)  # another shape: another answer head
    body, _, length = encode_infer(model, request, [other], heads)
    assert json.loads(body[:length])["outputs"][0]["shape"] == [1, 3] and len(heads) == 2
    short = head.replace(b'"shape": [2, 3]', b'"shape": [2, 2]').replace(b"24", b"16")
    for _ in range(2):  # a request the model refuses is refused every time, never remembered
        with pytest.raises(RequestError, match="shape"):
            decode_infer(short + bytes(16), str(len(short)), model, layouts)
    as_json = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                                      "data": list(range(6))}]}).encode()
    decode_infer(as_json, None, model, layouts)
    assert len(layouts) == 1  # tensors in the JSON are values, not a layout


@pytest.mark.parametrize(
    ("dtype", "datatype", "data", "match"),
    [("int8", "INT8", [1, 2, 300], "out of the range of int8"),
     ("int32", "INT32", [1, 2, 3.5], "must hold int32 values; got 3.5"),
     ("bool", "BOOL", [1, 0, 1], "must hold bool values; got 1"),
     ("float16", "FP16", [True, False, True], None)],
)
def test_kserve_json_data_refuses_lossy_values(dtype: str, datatype: str, data: list[object],
                                               match: str | None) -> None:
    from trt_runtime.serve.kserve import decode_infer

    entry = {"name": "x", "datatype": datatype, "shape": [1, 3], "data": data}
    head = json.dumps({"inputs": [entry]}).encode()
    if match is None:  # JSON booleans are numbers 0 and 1 for a float input
        assert decode_infer(head, None, _typed_model(dtype)).arrays[0].tolist() == [[1.0, 0.0, 1.0]]
        return
    with pytest.raises(RequestError, match=match) as caught:
        decode_infer(head, None, _typed_model(dtype))
    assert caught.value.status == 400


def test_inprocess_server_that_cannot_start_says_why() -> None:
    with trt_runtime.load(single_engine(), "memory") as engine:
        server = InProcessServer(engine, ModelInfo.from_engine(engine, "broken"))
        server._socket.close()  # uvicorn then fails on the closed socket
        started = time.monotonic()
        failed = "the in-process server of 'broken' did not start"
        with pytest.raises(trt_runtime.TrtRuntimeError, match=failed):
            server.start(timeout_s=20)
        assert time.monotonic() - started < 10, "start() returned as soon as uvicorn failed"
