"""Overlapped engine calls: the batcher on the loop starts each batch's call through a stager and
collects it on later passes (trt_runtime.serve.local.staging has the CUDA stager; the GPU tests run
it). Here a host stager stands in for the GPU: its "GPU" reads a call's input buffers only when the
call ends, so a buffer reused too early gives wrong answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _serve_support import rows4_checker

from trt_runtime import TensorSpec
from trt_runtime.errors import EngineError, RequestError, SettingsError
from trt_runtime.graphs import OuterGraph
from trt_runtime.serve.batcher import DynamicBatcher
from trt_runtime.serve.batching import BatchRunner
from trt_runtime.serve.local.staging import stager_refusal

uvloop = pytest.importorskip("uvloop")

_checker = rows4_checker


class _HostCall:
    """One call's buffers; its outputs (``y = x + 1``) are worked out from its input buffer only as
    it ends (as a GPU reads it), after ``ticks`` looks or once the stager's gate opens."""

    def __init__(self, stager: _HostStager) -> None:
        self._stager = stager
        self._in = np.zeros((stager.max_rows, 4), np.float32)
        self._out = np.zeros((stager.max_rows, 4), np.float32)
        self.inputs: list[Any] = []
        self._rows = 0
        self._looks = 0
        self._ended = False

    def take(self, rows: int) -> _HostCall:
        self._rows, self._looks, self._ended = rows, 0, False
        self.inputs = [self._in[:rows]]
        return self

    def launch(self) -> None:
        stager = self._stager
        stager.rows.append(self._rows)
        stager.running += 1
        stager.most_running = max(stager.most_running, stager.running)

    def done(self) -> bool:
        stager = self._stager
        assert not stager.closed, "a call was looked at after the stager closed"
        if self._ended:
            return True
        self._looks += 1
        stager.looks += 1
        if not stager.gate.is_set() or self._looks < stager.ticks:
            return False
        self._ended = True
        stager.running -= 1
        x = self._in[:self._rows]
        if (x == stager.poison).any():
            raise EngineError("the engine call failed on the GPU: an illegal address (test)")
        self._out[:self._rows] = x + 1
        return True

    def outputs(self) -> list[Any]:
        return [self._out[:self._rows]]

    def release(self) -> None:
        self.inputs = []
        self._stager.free.append(self)


class _HostStager:
    def __init__(self, max_rows: int = 16, ticks: int = 3, gate_open: bool = True) -> None:
        self.max_rows = max_rows
        self.ticks = ticks
        self.gate = asyncio.Event() if not gate_open else _Open()
        self.free: list[_HostCall] = []
        self.rows: list[int] = []
        self.running = 0
        self.most_running = 0
        self.looks = 0
        self.poison = -7.0
        self.closed = False

    def call(self, rows: int) -> _HostCall:
        assert 1 <= rows <= self.max_rows
        return (self.free.pop() if self.free else _HostCall(self)).take(rows)


class _Open:
    def is_set(self) -> bool:
        return True


def _eager(x: np.ndarray) -> list[np.ndarray]:
    raise AssertionError("the stager takes every call here: nothing runs eagerly")


def _batcher(stager: Any, *, max_batch: int = 8, delay_us: int = 0, in_flight: int = 2) -> DynamicBatcher:
    return DynamicBatcher([_eager], _checker(), max_batch=max_batch, max_queue_delay_us=delay_us,
                          on_loop=True, pad_rows=True, stager=stager, in_flight=in_flight)


def _rows(i: int, n: int = 1) -> np.ndarray:
    return np.full((n, 4), float(i), np.float32)


def test_overlapped_calls_answer_every_request_with_its_own_rows() -> None:
    stager = _HostStager(ticks=3)

    async def main() -> list[Any]:
        batcher = _batcher(stager)
        answers = await asyncio.gather(*(batcher.submit((_rows(i, 1 + i % 2),)) for i in range(40)))
        await batcher.aclose(1)
        return answers

    answers = uvloop.run(main())
    for i, (y,) in enumerate(answers):
        np.testing.assert_array_equal(y, _rows(i + 1, 1 + i % 2))
    assert len(stager.rows) >= 40 // 8 and all(r & (r - 1) == 0 for r in stager.rows)  # padded: powers of 2
    # (a batch of 8 requests of 1-2 rows is one call: at most in_flight calls ran at once)
    assert stager.most_running <= 2 and stager.looks > len(stager.rows)  # (looked at again until each ended)


def test_the_loop_reads_requests_while_a_call_runs_and_starts_them_as_it_ends() -> None:
    """in_flight=1: while the first call runs, the loop keeps taking requests (none starts); when
    it ends, those that came meanwhile start at once, in one call, without a queue delay."""
    stager = _HostStager(gate_open=False, ticks=1)

    async def main() -> tuple[list[Any], list[int], int]:
        batcher = _batcher(stager, max_batch=4, in_flight=1, delay_us=1_000_000)
        first = [asyncio.ensure_future(batcher.submit((_rows(i, 2),))) for i in range(4)]  # full: starts
        for _ in range(5):
            await asyncio.sleep(0)
        later = [asyncio.ensure_future(batcher.submit((_rows(10 + i),))) for i in range(3)]
        passes = 0
        while passes < 50:  # the loop is free: this coroutine runs pass after pass
            await asyncio.sleep(0)
            passes += 1
        started_meanwhile = list(stager.rows)
        stager.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*first, *later), 0.5)  # (not after the 1 s delay)
        await batcher.aclose(1)
        return answers, started_meanwhile, passes

    answers, started_meanwhile, passes = uvloop.run(main())
    assert started_meanwhile == [8] and passes == 50
    assert stager.rows == [8, 4]  # the three that came meanwhile: one call, padded to 4
    for i, (y,) in enumerate(answers[:4]):
        np.testing.assert_array_equal(y, _rows(i + 1, 2))
    for i, (y,) in enumerate(answers[4:]):
        np.testing.assert_array_equal(y, _rows(11 + i))


def test_a_second_full_batch_starts_while_one_runs_but_no_third() -> None:
    stager = _HostStager(gate_open=False, ticks=1)

    async def main() -> tuple[list[int], list[Any]]:
        batcher = _batcher(stager, max_batch=4, delay_us=1_000_000, in_flight=2)
        futures = [asyncio.ensure_future(batcher.submit((_rows(i),))) for i in range(12)]
        for _ in range(20):
            await asyncio.sleep(0)
        started = list(stager.rows)
        stager.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*futures), 0.5)
        await batcher.aclose(1)
        return started, answers

    started, answers = uvloop.run(main())
    assert started == [4, 4] and stager.rows == [4, 4, 4]
    for i, (y,) in enumerate(answers):
        np.testing.assert_array_equal(y, _rows(i + 1))


def test_an_answer_given_to_a_future_is_a_copy_that_the_next_call_does_not_overwrite() -> None:
    stager = _HostStager(ticks=1)

    async def main() -> tuple[Any, Any]:
        batcher = _batcher(stager)
        (first,) = await batcher.submit((_rows(1, 2),))
        (second,) = await batcher.submit((_rows(5, 2),))  # (the same buffers, handed back and reused)
        await batcher.aclose(1)
        return first, second

    first, second = uvloop.run(main())
    assert len(stager.free) == 1  # one call's buffers served both
    np.testing.assert_array_equal(first, _rows(2, 2))
    np.testing.assert_array_equal(second, _rows(6, 2))


def test_an_answer_handed_to_a_callback_is_read_before_the_buffers_go_back() -> None:
    """enqueue_call's callback gets views of the call's buffers (no copy) and reads them at once."""
    stager = _HostStager(ticks=1)
    seen: list[Any] = []

    async def main() -> None:
        batcher = _batcher(stager)
        ended = asyncio.get_running_loop().create_future()

        def done(answer: Any) -> None:
            seen.append((answer[0].base is not None, answer[0].copy()))
            if len(seen) == 2:
                ended.set_result(None)

        batcher.enqueue_call((_rows(3, 2),), done)
        batcher.enqueue_call((_rows(4, 1),), done)
        await asyncio.wait_for(ended, 0.5)
        await batcher.aclose(1)

    uvloop.run(main())
    assert [view for view, _ in seen] == [True, True]
    np.testing.assert_array_equal(seen[0][1], _rows(4, 2))
    np.testing.assert_array_equal(seen[1][1], _rows(5, 1))


def test_a_call_that_fails_on_the_gpu_fails_its_requests_only() -> None:
    stager = _HostStager(ticks=1)

    async def main() -> tuple[BaseException | None, Any]:
        batcher = _batcher(stager)
        error = None
        try:
            await batcher.submit((np.full((1, 4), stager.poison, np.float32),))
        except EngineError as exc:
            error = exc
        (after,) = await batcher.submit((_rows(2),))
        await batcher.aclose(1)
        return error, after

    error, after = uvloop.run(main())
    assert error is not None and "failed on the GPU" in str(error)
    np.testing.assert_array_equal(after, _rows(3))
    assert len(stager.free) == 1  # (the failed call's buffers went back too)


def test_aclose_waits_for_a_started_call_and_answers_it() -> None:
    stager = _HostStager(gate_open=False, ticks=1)

    async def main() -> Any:
        batcher = _batcher(stager, delay_us=0)
        answer = asyncio.ensure_future(batcher.submit((_rows(1, 3),)))
        for _ in range(5):
            await asyncio.sleep(0)
        closing = asyncio.ensure_future(batcher.aclose(2))
        await asyncio.sleep(0.01)
        assert not closing.done() and not answer.done()
        stager.gate.set()
        await asyncio.wait_for(closing, 1)
        batcher.close()
        return answer.result()

    (y,) = uvloop.run(main())
    np.testing.assert_array_equal(y, _rows(2, 3))


def test_aclose_gives_up_on_a_call_that_never_ends_and_never_looks_at_it_again() -> None:
    stager = _HostStager(gate_open=False, ticks=1)

    async def main() -> BaseException | None:
        batcher = _batcher(stager)
        answer = asyncio.ensure_future(batcher.submit((_rows(1),)))
        await asyncio.sleep(0.01)
        await batcher.aclose(0.02)
        batcher.close()
        stager.closed = True  # (as the engine process closes its stager after the batcher)
        for _ in range(10):
            await asyncio.sleep(0)
        return answer.exception()

    error = uvloop.run(main())
    assert isinstance(error, RequestError) and error.status == 503


def test_runner_start_with_a_stager_starts_the_call_and_finish_splits_it() -> None:
    """Outside the batcher: start() starts the call, done() says when it ended, finish() gives the
    answers as views of the call's buffers (copied here: the buffers are reused once released);
    run() refuses a runner with a stager."""
    stager = _HostStager(ticks=4)
    runner = BatchRunner(_eager, _checker(), pad_rows=True, stager=stager)
    started = runner.start([(_rows(1, 2),), (_rows(2, 3),)])
    looks = 0
    while not started.done():
        looks += 1
    answers = [[o.copy() for o in a] for a in started.finish()]  # type: ignore[union-attr]
    started.release()
    assert looks == 3 and stager.rows == [8] and len(stager.free) == 1
    stager.free[0].take(8).inputs[0][:] = 99  # (the buffers reused: the answers are copies)
    np.testing.assert_array_equal(answers[0][0], _rows(2, 2))  # type: ignore[index]
    np.testing.assert_array_equal(answers[1][0], _rows(3, 3))  # type: ignore[index]
    with pytest.raises(SettingsError, match=r"BatchRunner\.run waits for its calls"):
        runner.run([(_rows(1),)])


def test_runner_and_batcher_refuse_a_stager_without_padded_rows() -> None:
    """A stager keeps a graph and static buffers per row count (a few, as powers of two): a runner
    or a batcher given one without pad_rows is refused, naming what it needs."""
    with pytest.raises(SettingsError, match="a BatchRunner with a stager needs pad_rows=True"):
        BatchRunner(_eager, _checker(), stager=_HostStager())
    with pytest.raises(SettingsError, match="needs pad_rows=True"):
        DynamicBatcher([_eager], _checker(), max_batch=8, max_queue_delay_us=0, on_loop=True,
                       stager=_HostStager())


def test_a_batch_beyond_the_stagers_rows_runs_eagerly() -> None:
    stager = _HostStager(max_rows=4, ticks=1)
    calls: list[int] = []

    def execute(x: np.ndarray) -> list[np.ndarray]:
        calls.append(x.shape[0])
        return [x + 1]

    runner = BatchRunner(execute, _checker(), pad_rows=True, stager=stager)
    started = runner.start([(_rows(1, 3),), (_rows(2, 3),)])  # 6 rows, padded to 8: not the stager's
    assert calls == [8] and stager.rows == [] and not started.calls and started.done()
    np.testing.assert_array_equal(started.answers[1][0], _rows(3, 3))  # type: ignore[index]


def test_batcher_refuses_a_stager_off_the_loop_and_a_bad_in_flight() -> None:
    with pytest.raises(SettingsError, match="needs on_loop=True"):
        DynamicBatcher([_eager], _checker(), max_batch=8, max_queue_delay_us=0, stager=_HostStager())
    for bad in (0, 9, True, 1.5):
        with pytest.raises(SettingsError, match=r"in_flight must be an integer in \[1, 8\]"):
            _batcher(_HostStager(), in_flight=bad)  # type: ignore[arg-type]


def _engine(graph: Any = True, statics: Any = None, shape: tuple[int, ...] = (-1, 4)) -> Any:
    specs = [TensorSpec("x", "float32", shape, True), TensorSpec("y", "float32", (-1, 4), False)]
    return SimpleNamespace(outer_graph=OuterGraph.coerce(graph), inputs=specs[:1], outputs=specs[1:],
                           static_inputs=lambda *shapes: statics if statics is not None else
                           [np.zeros(s, np.float32) for s in shapes])


class _CudaLike:
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"data": (1 << 20, False), "shape": (4, 4), "typestr": "<f4", "version": 3}


@pytest.mark.parametrize(("engine", "reason"), [
    (_engine(graph=None), "does not run under the outer CUDA graph"),
    (_engine(graph=OuterGraph(max_graphs=4)), "keeps 4 graphs; padded batches need up to 6"),
    (_engine(shape=(-1, -1)), "'x' has a dynamic dimension besides the batch: [-1, -1]"),
    (_engine(), "static inputs are not CUDA arrays (a ndarray)"),
])
def test_stager_refusal_names_why_an_engine_cannot_overlap(engine: Any, reason: str) -> None:
    pytest.importorskip("cuda.bindings")
    refusal = stager_refusal(engine, 16)
    assert refusal is not None and reason in refusal


def test_stager_refusal_takes_an_engine_whose_static_inputs_are_cuda_arrays() -> None:
    pytest.importorskip("cuda.bindings")
    assert stager_refusal(_engine(statics=[_CudaLike()]), 16) is None


def test_a_cuda_stager_refuses_an_engine_whose_outer_graph_hands_out_copies() -> None:
    """open_stager puts the outer graph in its "view" mode; the stager itself only checks it."""
    pytest.importorskip("cuda.bindings")
    from trt_runtime.serve.local.staging import CudaStager

    with pytest.raises(SettingsError, match='outer graph in its "view" mode'):
        CudaStager(_engine(graph="copy", statics=[_CudaLike()]), 16)


def test_engine_process_reads_in_flight_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from trt_runtime.serve.local import engine_process

    monkeypatch.delenv(engine_process.IN_FLIGHT_ENV, raising=False)
    assert engine_process._in_flight() == 2
    monkeypatch.setenv(engine_process.IN_FLIGHT_ENV, "1")
    assert engine_process._in_flight() == 1
    for bad in ("0", "9", "two", "-1"):
        monkeypatch.setenv(engine_process.IN_FLIGHT_ENV, bad)
        with pytest.raises(SettingsError, match=rf"TRT_RUNTIME_SERVE_IN_FLIGHT must be .*got '{bad}'"):
            engine_process._in_flight()


def test_an_engine_process_asked_to_overlap_a_memory_engine_runs_its_calls_waited_for() -> None:
    """--overlap where it cannot apply (this engine's second dimension is dynamic; the memory backend's
    static inputs are host arrays anyway): no stager, the calls run as without it."""
    pytest.importorskip("cuda.bindings")
    from _serve_support import single_engine

    from trt_runtime.serve import ServeOptions, open_engine
    from trt_runtime.serve.local.engine_process import EngineProcessSpec, _stager, model_info
    from trt_runtime.serve.replica import call_modes

    options = ServeOptions(backend="memory", runtime_cache=None, outer_graph="auto", pad_batches="auto")
    engine, _ = open_engine(single_engine(), options)
    try:
        spec = EngineProcessSpec(engine=Path("x.mem"), options=options, device=None, socket_path=Path("s"),
                                 name="m", max_queue_delay_us=0, drain_s=1, overlap=True)
        modes = call_modes(engine, options)
        assert modes.outer_graph and modes.pad_batches
        assert _stager(engine, spec, model_info(engine, spec), True, modes) is None
        assert "'x' has a dynamic dimension besides the batch" in (stager_refusal(engine, 16) or "")
    finally:
        engine.close()


def test_an_engine_process_whose_stager_cannot_open_refuses_to_start_with_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA failure while opening the overlapped calls: the engine process tells the supervisor why
    (one line, which ``trt-runtime serve`` prints) and exits 3, as for an engine that cannot load."""
    import multiprocessing

    from _serve_support import single_engine

    from trt_runtime.serve import ServeOptions, open_engine
    from trt_runtime.serve.local import engine_process

    def refuse(*args: Any) -> Any:
        raise EngineError("cudaHostAlloc failed: <cudaError_t.cudaErrorMemoryAllocation: 2> (test)")

    monkeypatch.setattr(engine_process, "_stager", refuse)
    options = ServeOptions(backend="memory", runtime_cache=None, outer_graph="auto", pad_batches="auto")
    engine, _ = open_engine(single_engine(), options)
    ours, theirs = multiprocessing.Pipe()
    spec = engine_process.EngineProcessSpec(engine=Path("x.mem"), options=options, device=None,
                                            socket_path=Path("s"), name="m", max_queue_delay_us=0, drain_s=1,
                                            overlap=True)
    try:
        with pytest.raises(SystemExit) as exited:
            asyncio.run(engine_process._serve(spec, engine, theirs))
        assert exited.value.code == 3
        assert ours.recv() == ("error", "cannot overlap the engine calls (--overlap): cudaHostAlloc failed: "
                                        "<cudaError_t.cudaErrorMemoryAllocation: 2> (test)")
    finally:
        engine.close()
