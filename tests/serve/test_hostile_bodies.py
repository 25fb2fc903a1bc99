"""Hostile HTTP request bodies: every one is a 4xx ``RequestError`` of one line, in bounded
time and memory, and the replica's ``/stats`` counts every status it answers.

Targets: no ``500`` from any body; deep nesting, huge numbers, booleans, nulls, strings
and nested objects refused with 400 before any array is built, in at most 2 s of CPU on
bodies up to 1 MB; a streamed body over ``max_body_bytes`` is 413 with the process grown
by no more than the limit (peak RSS of a fresh process).
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from _serve_support import pair_engine, single_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trt_runtime
from trt_runtime import RequestError
from trt_runtime.serve.codec import decode_body, read_body_limited
from trt_runtime.serve.json_body import MAX_JSON_DEPTH, MAX_JSON_ELEMENTS

MB = 2**20
LIMIT = 100 * MB
SINGLE = trt_runtime.load(single_engine(), "memory").inputs
PAIR = trt_runtime.load(pair_engine(), "memory").inputs

HOSTILE_JSON = {
    "arrays 2,000 deep": (b"[" * 2000 + b"]" * 2000, f"deeper than {MAX_JSON_DEPTH} levels"),
    "arrays 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, "deeper than"),
    "objects 100,000 deep": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
                             "objects are allowed only at the top"),
    "5,000-digit integer": (b"[[" + b"9" * 5000 + b"]]", "has 5000 characters"),
    "5,000-digit float": (b"[[0." + b"1" * 5000 + b"]]", "has 5002 characters"),
    "object inside an array": (b'[[{"a":1},1,2,3]]', "objects are allowed only at the top"),
    "booleans": (b"[[true,false,true,false]]", "JSON true is not a number"),
    "null": (b"[[1,null]]", "JSON null is not a number"),
    "string": (b'[["1",2]]', "JSON strings are allowed only as the keys"),
    "string value of a key": (b'{"x": "[[1]]"}', "JSON strings are allowed only as the keys"),
    "NaN": (b"[[NaN]]", "JSON constant NaN is not allowed"),
    "-Infinity": (b"[[-Infinity]]", "JSON constant -Infinity is not allowed"),
    "too many numbers": (b"[" + b"0," * MAX_JSON_ELEMENTS + b"0]", "more than"),
    "too many arrays": (b"[" + b"[]," * (MAX_JSON_ELEMENTS // 2 + 2) + b"[]]", "more than"),
    "huge integer under the digit limit": (b"[[" + b"9" * 39 + b"]]", "JSON numbers must fit in 64 bits"),
    "ragged": (b"[[1,2],[3]]", "not a rectangular array"),
    "mixed depth": (b"[1,[2]]", "not a rectangular array"),
    "not UTF-8": (b"[[\xff\xfe]]", "not valid JSON"),
    "unterminated strings": (b'{"' + b'\\"' * 100_000, "not valid JSON"),
}


@pytest.mark.parametrize("case", list(HOSTILE_JSON))
def test_hostile_bodies_json_is_a_400_naming_the_problem(case: str) -> None:
    body, match = HOSTILE_JSON[case]
    start = time.process_time()
    with pytest.raises(RequestError, match=match) as info:
        decode_body("application/json", body, SINGLE, LIMIT)
    assert time.process_time() - start < 2.0
    assert info.value.status == 400 and "\n" not in str(info.value)


def test_hostile_bodies_keys_and_escapes_are_still_accepted() -> None:
    got = decode_body("application/json", b'{"x": [[1, 2, 3, 4]], "k": [[5, 6]]}', PAIR, LIMIT)
    assert got.named["x"].dtype == np.float32 and got.named["k"].tolist() == [[5, 6]]
    nested = b"[" * (MAX_JSON_DEPTH - 1) + b"1.5" + b"]" * (MAX_JSON_DEPTH - 1)
    assert decode_body("application/json", nested, PAIR, LIMIT).args[0] is not None
    with pytest.raises(RequestError, match="unknown") as info:  # a key with escapes and brackets is a key
        from trt_runtime.serve.validation import RequestChecker

        decoded = decode_body("application/json", b'{"x\\"[{true": [[1, 2, 3, 4]]}', PAIR, LIMIT)
        RequestChecker("pair", PAIR, ()).check(decoded.args, decoded.named)
    assert info.value.status in (400, 422)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(
    st.binary(max_size=200),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=4)
                 | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                 max_leaves=30).map(lambda doc: json.dumps(doc).encode()),
))
def test_hostile_bodies_any_body_is_a_request_error_or_arrays(body: bytes) -> None:
    for media in ("application/json", "application/x-npy", "application/x-npz"):
        for inputs in (SINGLE, PAIR):
            try:
                decode_body(media, body, inputs, LIMIT)
            except RequestError as exc:
                assert 400 <= exc.status < 500


def _npz(**members: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_hostile_bodies_npz_members_checked_before_inflating() -> None:
    zeros = _npy(np.zeros(16 * MB, np.uint8))
    body = _npz(**{"w.npy": zeros})
    assert len(body) < MB
    with pytest.raises(RequestError, match=r"members \['w'\], which are not inputs") as info:
        decode_body("application/x-npz", body, PAIR, LIMIT)
    assert info.value.status == 422
    with pytest.raises(RequestError, match=r"input 'x' must have dtype float32; got uint8") as info:
        decode_body("application/x-npz", _npz(**{"x.npy": zeros}), PAIR, LIMIT)
    assert info.value.status == 422
    with pytest.raises(RequestError, match=r"unpacks to \d+ bytes, over the limit of 1048576") as info:
        decode_body("application/x-npz", _npz(**{"x.npy": zeros}), PAIR, MB)
    assert info.value.status == 413
    with pytest.raises(RequestError, match=r"member 'x.txt' is not an .npy array") as info:
        decode_body("application/x-npz", _npz(**{"x.txt": b"1"}), PAIR, LIMIT)
    assert info.value.status == 400


# -- streamed bodies ------------------------------------------------------------------------


async def _chunks(total: int, size: int) -> AsyncIterator[bytes]:
    while total > 0:
        yield bytes(min(size, total))  # a fresh object each time, as a server's receive gives
        total -= size


def test_hostile_bodies_streamed_body_stops_at_the_limit() -> None:
    assert asyncio.run(read_body_limited(_chunks(3 * MB, 64 * 1024), 3 * MB)) == bytes(3 * MB)
    with pytest.raises(RequestError, match="exceeds the limit of 3145728 bytes") as info:
        asyncio.run(read_body_limited(_chunks(3 * MB + 1, 64 * 1024), 3 * MB))
    assert info.value.status == 413


def test_hostile_bodies_110mb_stream_grows_the_process_by_at_most_the_limit() -> None:
    code = textwrap.dedent(f"""
        import asyncio, json
        from trt_runtime.errors import RequestError
        from trt_runtime.serve.codec import read_body_limited

        def rss(field):
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field))

        async def chunks():
            for _ in range(110 * 16):
                yield bytes(65536)

        before = rss("VmRSS:")
        try:
            asyncio.run(read_body_limited(chunks(), {LIMIT}))
            status = 200
        except RequestError as exc:
            status = exc.status
        print(json.dumps({{"status": status, "grown": rss("VmHWM:") - before}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True)
    result = json.loads(proc.stdout)
    assert result["status"] == 413
    assert result["grown"] <= LIMIT + 8 * MB, result


# -- the replica's HTTP path and /stats ------------------------------------------------------


def _request(method: str, path: str, body: bytes = b"", content_type: str = "application/json") -> Any:
    from starlette.requests import Request

    sent = [False]

    async def receive() -> dict[str, Any]:
        if sent[0]:
            return {"type": "http.disconnect"}
        sent[0] = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"",
             "headers": [(b"content-type", content_type.encode())]}
    return Request(scope, receive)


def test_hostile_bodies_replica_answers_4xx_and_counts_every_status() -> None:
    pytest.importorskip("ray", reason="the Ray deployment needs ray[serve]")
    from trt_runtime.serve import EngineServer, ServeOptions

    server = EngineServer(single_engine(), ServeOptions(backend="memory", runtime_cache=None, max_batch=1))
    try:
        async def answer(method: str, path: str, body: bytes = b"") -> int:
            response = await server._http(_request(method, path, body))
            return int(response.status_code)

        async def all_answers() -> list[int]:
            statuses = [await answer("POST", "/infer", body) for body, _ in HOSTILE_JSON.values()]
            statuses.append(await answer("POST", "/infer", b"[[1, 2, 3, 4]]"))
            statuses.append(await answer("GET", "/nowhere"))
            statuses.append(await answer("GET", "/infer"))
            return statuses

        statuses = asyncio.run(all_answers())
        assert 500 not in statuses and statuses.count(400) == len(HOSTILE_JSON)
        assert statuses[-3:] == [200, 404, 405]
        counted = server.stats()["requests"]
        assert counted == {"200": 1, "400": len(HOSTILE_JSON), "404": 1, "405": 1}
    finally:
        server.close()
