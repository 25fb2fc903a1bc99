"""The torchbind backend's device contract on the CPU (against tests/_torchbind_doubles.py):
output kind per input kind, host staging, streams, ``outputs=``, the hot path, and the
errors for each kind of bad input, in the python backend's words."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from _torchbind_doubles import OUT, X, Y, cuda, inputs, make_backend, source
from _torchbind_fakes import FakeCudaArray, FakeStream, FakeTensor

from trt_runtime.errors import EngineError, InputError
from trt_runtime.lane import Lane
from trt_runtime.protocols import TensorSpec
from trt_runtime.settings import RuntimeSettings

SIX = np.full((2, 4), 6.0, np.float16)  # out = 2 * (x + y) for x = 1, y = 2
DYN_X = TensorSpec("x", "float16", (-1, 4), True, (((1, 4), (4, 4), (8, 4)),))
DYN_O = TensorSpec("o", "float16", (-1, 4), False)


def host(value: float = 1.0, dtype: Any = np.float16) -> np.ndarray:
    return np.full((2, 4), value, dtype)


# -- output kind follows input kind ------------------------------------------------------------
def test_torchbind_contract_cuda_torch_in_cuda_torch_out_through_the_hot_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, bridge = make_backend("2.14.0")
    spec2 = TensorSpec("out2", "float16", (2, 4), False)
    engine = backend.load_engine(source(bindings=(X, Y, OUT, spec2)))
    engine(*inputs())  # the first call creates the context and validates the shapes
    slow: list[Any] = []
    original = Lane.call  # the core pipeline's general path
    monkeypatch.setattr(Lane, "call", lambda lane, *a: slow.append(a) or original(lane, *a))
    first, second = engine(*inputs())
    (again, _) = engine.execute(*inputs())
    assert slow == [], "static CUDA inputs of validated shapes must take the hot path"
    assert isinstance(first, FakeTensor) and first.device == "cuda:0"
    np.testing.assert_array_equal(first.array, SIX)
    np.testing.assert_array_equal(second.array, np.full((2, 4), 9.0, np.float16))
    np.testing.assert_array_equal(again.array, SIX)
    assert bridge.ops.streams == ["current:0"] * 3
    assert [e for e in bridge.events if e[0] != "sync"] == []  # nothing staged, copied or waited
    engine.synchronize()
    # torch's current stream on the engine's device, and the lane's own (a caller on the
    # legacy default stream has no event that waits for it)
    assert [s.name for s in bridge.synced[-2:]] == ["current:0", "lane:0:1"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: [cuda(np.ones((2, 4))), FakeTensor(np.ones((2, 4), np.float32))],  # wrong dtype
        lambda: [cuda(np.ones((4, 2))).array.T, cuda(np.ones((2, 4)))],  # numpy
        lambda: [FakeTensor(np.ones((4, 2), np.float16).T), cuda(np.ones((2, 4)))],  # strided
        lambda: [cuda(np.ones((3, 4))), cuda(np.ones((2, 4)))],  # not a validated shape
        lambda: [cuda(np.ones((2, 4)))],  # count
    ],
)
def test_torchbind_contract_hot_path_leaves_anything_else_to_the_full_check(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine(*inputs())
    slow: list[Any] = []
    monkeypatch.setattr(Lane, "call", lambda lane, *a: slow.append(a) or [])
    engine.execute(*make())
    assert len(slow) == 1


def test_torchbind_contract_numpy_in_numpy_out_staged_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    with caplog.at_level(logging.INFO, logger="trt_runtime.torchbind"):
        for _ in range(3):
            (out,) = engine.execute(host(1.0), host(2.0))
    staged = [r.getMessage() for r in caplog.records if "copied to cuda:0" in r.getMessage()]
    assert staged == [
        "engine 'mlp': host input(s) 'x', 'y' copied to cuda:0 on the caller's stream "
        "(pass CUDA tensors to stay zero-copy)"
    ]
    assert type(out) is np.ndarray and out.dtype == np.float16
    np.testing.assert_array_equal(out, SIX)
    assert all(t.device == "cuda:0" for t in bridge.ops.calls[-1][0])
    # staged, run and copied back on the caller's stream, the copy back waiting for the op
    assert bridge.events[-3:] == [("h2d", "current:0"), ("h2d", "current:0"), ("d2h", "current:0")]
    assert engine(host(1.0), host(2.0)).dtype == np.float16  # engine(...) unwraps one output


def test_torchbind_contract_cpu_torch_in_cpu_torch_out() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    (out,) = engine.execute(FakeTensor(host(1.0), "cpu"), FakeTensor(host(2.0), "cpu"))
    assert isinstance(out, FakeTensor) and out.device == "cpu"
    np.testing.assert_array_equal(out.array, SIX)
    # a CPU tensor among numpy arrays makes host outputs CPU tensors (as in the python backend)
    (mixed,) = engine.execute(host(1.0), FakeTensor(host(2.0), "cpu"))
    assert isinstance(mixed, FakeTensor) and mixed.device == "cpu"


def test_torchbind_contract_any_cuda_torch_input_makes_a_torch_call() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    (out,) = engine.execute(host(1.0), cuda(np.full((2, 4), 2.0)))
    assert isinstance(out, FakeTensor) and out.device == "cuda:0"
    np.testing.assert_array_equal(out.array, SIX)
    assert ("d2h", "current:0") not in bridge.events
    (out,) = engine.execute(FakeCudaArray(host(1.0)), cuda(np.full((2, 4), 2.0)))
    assert out.device == "cuda:0"


def test_torchbind_contract_cuda_array_in_device_array_out() -> None:
    """A CUDA array that is not a torch tensor is viewed zero-copy; outputs are device arrays
    (torch CUDA tensors, which expose __cuda_array_interface__ and __dlpack__)."""
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    x, y = FakeCudaArray(host(1.0)), FakeCudaArray(host(2.0))
    (out,) = engine.execute(x, y)
    assert isinstance(out, FakeTensor) and out.device == "cuda:0"
    np.testing.assert_array_equal(out.array, SIX)
    sent = bridge.ops.calls[-1][0]
    assert sent[0].array is x.array, "a CUDA array is viewed, never copied"
    (mixed,) = engine.execute(x, host(2.0))  # with a host array: still a device call
    assert isinstance(mixed, FakeTensor) and mixed.device == "cuda:0"
    assert ("h2d", "current:0") in bridge.events


def test_torchbind_contract_lists_are_host_arrays_of_the_input_dtype() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    (out,) = engine.execute([[1.0] * 4] * 2, host(2.0))
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, SIX)


# -- streams -------------------------------------------------------------------------------------
def test_torchbind_contract_work_is_queued_on_the_callers_stream() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    mine = FakeStream("mine")
    engine.execute(*inputs(), stream=mine)
    engine.execute(host(1.0), host(2.0), stream=mine)
    assert bridge.ops.streams == ["mine", "mine"]
    assert bridge.events == [("h2d", "mine"), ("h2d", "mine"), ("d2h", "mine")]
    engine.synchronize()
    assert mine.syncs == 1


def test_torchbind_contract_other_current_device_runs_on_the_engines_device() -> None:
    backend, bridge = make_backend("2.14.0", devices=2)
    engine = backend.load_engine(source(), device=1)
    bridge.current = 0  # another device is current: the engine's stream on device 1 is used
    engine.execute(cuda(np.ones((2, 4)), "cuda:1"), cuda(np.full((2, 4), 2.0), "cuda:1"))
    assert bridge.ops.streams == ["current:1"]


# -- preallocated outputs ------------------------------------------------------------------------
def test_torchbind_contract_outputs_written_and_returned_as_given() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    y = cuda(np.zeros((2, 4)))
    got = engine.execute(*inputs(), outputs=[y])
    assert got == [y] and got[0] is y
    np.testing.assert_array_equal(y.array, SIX)
    assert bridge.events == [("copy", "current:0")]
    mine = FakeStream("mine")
    assert engine(*inputs(), stream=mine, outputs=[y]) is y
    assert bridge.events[-1] == ("copy", "mine")
    # a CUDA array is written through its view and returned itself
    device_out = FakeCudaArray(np.zeros((2, 4), np.float16))
    assert engine.execute(*inputs(), outputs=[device_out])[0] is device_out
    np.testing.assert_array_equal(device_out.array, SIX)


def test_torchbind_contract_outputs_with_host_inputs_are_ready_when_returned() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    y = cuda(np.zeros((2, 4)))
    engine.execute(host(1.0), host(2.0), outputs=[y])
    assert bridge.events[-2:] == [("copy", "current:0"), ("sync", "current:0")]
    mine = FakeStream("mine")
    engine.execute(host(1.0), host(2.0), outputs=[y], stream=mine)
    assert bridge.events[-1] == ("copy", "mine")  # the caller's stream orders it: no sync


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ([], r"^engine 'mlp' has 1 output\(s\); outputs= has 0$"),
        ([np.zeros((2, 4), np.float16)], r"outputs= must hold CUDA arrays; output 'out' is ndarray$"),
        ([FakeTensor(np.zeros((2, 4), np.float16), "cpu")], r"output 'out' is a cpu tensor$"),
        ([FakeTensor(np.zeros((2, 4), np.float32))], r"output 'out' must have dtype float16; got float32$"),
        ([cuda(np.zeros((2, 4)), "cuda:1")], r"output 'out' is on cuda:1; the engine runs on cuda:0$"),
        ([cuda(np.zeros((4, 2))).array.T], r"output 'out' is ndarray$"),
        (
            [FakeTensor(np.zeros((4, 2), np.float16).T)],
            r"output 'out' is not contiguous \(strides \(1, 2\)\)",
        ),
        ([cuda(np.zeros((2, 5)))], r"^engine 'mlp': output 'out' must have shape \(2, 4\); got \(2, 5\)$"),
        ([FakeCudaArray(np.zeros((2, 4), np.float16), broken=True)], r"is not a readable device array"),
    ],
)
def test_torchbind_contract_bad_outputs_refused_before_the_op(outputs: list[Any], message: str) -> None:
    backend, bridge = make_backend("2.14.0", devices=2)
    engine = backend.load_engine(source())
    with pytest.raises(InputError, match=message):
        engine.execute(*inputs(), outputs=outputs)
    assert bridge.ops.calls == [] and engine.context_creations == 0


def test_torchbind_contract_dynamic_output_shapes_checked_before_writing() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source(bindings=(DYN_X, DYN_O)))
    with pytest.raises(InputError, match=r"output 'o' must have shape \(-1, 4\); got \(3, 4, 1\)"):
        engine.execute(cuda(np.ones((3, 4))), outputs=[cuda(np.zeros((3, 4, 1)))])
    assert bridge.ops.calls == []
    wrong = cuda(np.zeros((2, 4)))
    # the first call of a shape learns the output shapes from the op; nothing is written
    with pytest.raises(InputError, match=r"output 'o' must have shape \(3, 4\); got \(2, 4\)"):
        engine.execute(cuda(np.ones((3, 4))), outputs=[wrong])
    assert len(bridge.ops.calls) == 1 and not wrong.array.any()
    # known from then on: refused before the op
    with pytest.raises(InputError, match=r"output 'o' must have shape \(3, 4\); got \(2, 4\)"):
        engine.execute(cuda(np.ones((3, 4))), outputs=[wrong])
    assert len(bridge.ops.calls) == 1
    right = cuda(np.zeros((3, 4)))
    assert engine.execute(cuda(np.ones((3, 4))), outputs=[right]) == [right]
    np.testing.assert_array_equal(right.array, np.full((3, 4), 2.0, np.float16))


def test_torchbind_contract_data_dependent_outputs_cannot_be_preallocated() -> None:
    backend, _ = make_backend("2.14.0")
    dd = TensorSpec("out", "float16", (-1,), False, data_dependent=True)
    engine = backend.load_engine(source(bindings=(X, Y, dd)))
    with pytest.raises(InputError, match="output 'out' has a data-dependent shape; it cannot be preallocat"):
        engine.execute(*inputs(), outputs=[cuda(np.zeros(8))])


# -- bad input never reaches execute_engine ------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: [cuda(np.ones((2, 4)))], r"^engine 'mlp' takes 2 input\(s\) \(x, y\); got 1$"),
        (
            lambda: [FakeTensor(np.ones((2, 4), np.float32)), cuda(np.ones((2, 4)))],
            r"^engine 'mlp': input 'x' must have dtype float16; got float32$",
        ),
        (lambda: [host(1.0, np.float64), host()], r"input 'x' must have dtype float16; got float64$"),
        (
            lambda: [FakeCudaArray(np.ones((2, 4), np.float32)), host()],
            r"input 'x' must have dtype float16; got float32$",
        ),
        (
            lambda: [cuda(np.ones((3, 4))), cuda(np.ones((2, 4)))],
            r"^engine 'mlp': input 'x' must have shape \(2, 4\); got \(3, 4\)$",
        ),
        (
            lambda: [cuda(np.ones(8)), cuda(np.ones((2, 4)))],
            r"input 'x' must have 2 dimension\(s\) \(2, 4\); got shape \(8,\)$",
        ),
        (
            lambda: [cuda(np.ones((2, 4)), "cuda:1"), cuda(np.ones((2, 4)))],
            r"input 'x' is on cuda:1; the engine runs on cuda:0$",
        ),
        (
            lambda: [FakeTensor(np.ones((2, 4), np.float16), "meta"), host()],
            r"input 'x' is on device 'meta'; expected cuda:0 or host memory$",
        ),
        (
            lambda: [FakeTensor(np.ones((4, 2), np.float16).T), cuda(np.ones((2, 4)))],
            r"input 'x' is not contiguous \(strides \(1, 2\)\); call \.contiguous\(\) first$",
        ),
        (
            lambda: [np.ones((4, 2), np.float16).T, host()],
            r"input 'x' is not C-contiguous; use numpy\.ascontiguousarray$",
        ),
        (
            lambda: [FakeCudaArray(np.ones((4, 2), np.float16).T), host()],
            r"input 'x' is not contiguous",
        ),
        (
            lambda: [FakeCudaArray(np.ones((2, 4), np.float16), broken=True), host()],
            r"input 'x' \(FakeCudaArray\) is not a readable device array: the producer released",
        ),
        (
            lambda: ["text", cuda(np.ones((2, 4)))],
            r"input 'x' must be a torch tensor, a CUDA array \(DLPack or __cuda_array_interface__\) "
            r"or a host array \(numpy\); got str$",
        ),
    ],
)
def test_torchbind_contract_bad_input_is_refused_before_the_op(make: Any, message: str) -> None:
    backend, bridge = make_backend("2.14.0", devices=2)
    engine = backend.load_engine(source())
    with pytest.raises(InputError, match=message):
        engine.execute(*make())
    assert bridge.ops.calls == []
    assert engine.context_creations == 0 and engine.native.updates == []  # no context for bad input


def test_torchbind_contract_dynamic_shapes_outside_every_profile() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source(bindings=(DYN_X, DYN_O)))
    engine.execute(cuda(np.ones((8, 4))))
    with pytest.raises(InputError, match=r"'x' must have 2 dimension\(s\) \(-1, 4\); got shape \(8, 4, 1"):
        engine.execute(cuda(np.ones((8, 4, 1))))
    with pytest.raises(InputError, match=r"input 'x' must have shape \(-1, 4\); got \(8, 5\)$"):
        engine.execute(cuda(np.ones((8, 5))))
    with pytest.raises(
        InputError,
        match=r"^engine 'mlp': input 'x' has shape \(9, 4\), outside every optimization profile "
        r"\(or no profile fits all inputs\): profile 0: min \(1, 4\), max \(8, 4\)$",
    ):
        engine.execute(cuda(np.ones((9, 4))))
    assert len(bridge.ops.calls) == 1


def test_torchbind_contract_profiles_must_hold_all_inputs_at_once() -> None:
    a = TensorSpec("a", "float16", (-1, 4), True, (((1, 4), (1, 4), (4, 4)), ((5, 4), (5, 4), (8, 4))))
    b = TensorSpec("b", "float16", (-1, 4), True, (((1, 4), (1, 4), (4, 4)), ((5, 4), (5, 4), (8, 4))))
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source(bindings=(a, b, DYN_O)))
    engine.execute(cuda(np.ones((3, 4))), cuda(np.ones((3, 4))))  # both in profile 0
    with pytest.raises(InputError, match=r"input 'a' has shape \(2, 4\), outside every optimization profile"):
        engine.execute(cuda(np.ones((2, 4))), cuda(np.ones((6, 4))))  # each fits a different profile
    assert len(bridge.ops.calls) == 1


# -- torch-tensorrt failures ----------------------------------------------------------------------
def test_torchbind_contract_runtime_failures_are_engine_errors() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine.execute(*inputs())
    bridge.ops.fail_with = RuntimeError("enqueueV3 failed")
    pattern = r"^engine 'mlp': execute_engine failed in torch-tensorrt's runtime: enqueueV3 failed$"
    with pytest.raises(EngineError, match=pattern):
        engine(*inputs())  # the hot path
    with pytest.raises(EngineError, match=pattern):
        engine.execute(host(1.0), host(2.0))  # the full path
    with pytest.raises(EngineError, match=pattern):
        engine.execute(*inputs(), outputs=[cuda(np.zeros((2, 4)))])


def test_torchbind_contract_torch_failures_around_the_op_are_engine_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())

    def out_of_memory(tensor: Any, index: int) -> Any:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(bridge, "to_device", out_of_memory)
    with pytest.raises(EngineError, match=r"^engine 'mlp': the call failed in torch: CUDA out of memory$"):
        engine.execute(host(1.0), host(2.0))


def test_torchbind_contract_wrong_output_count_from_the_runtime_is_an_engine_error() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source(bindings=(X, Y, OUT, TensorSpec("o2", "float16", (2, 4), False))))
    engine.native.outputs = ["out"]  # the C++ side knows one output only
    with pytest.raises(EngineError, match=r"returned 1 output\(s\); expected 2 \['out', 'o2'\]"):
        engine.execute(*inputs())


def test_torchbind_contract_checks_survive_a_settings_change() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine(*inputs())
    engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    with pytest.raises(InputError, match="must have dtype float16"):
        engine(FakeTensor(np.ones((2, 4), np.float32)), cuda(np.ones((2, 4))))
    (out,) = engine.execute(*inputs())
    np.testing.assert_array_equal(out.array, SIX)
    assert engine.context_creations == 2
