"""Calls into the torchbind backend on the CPU doubles: the core conformance suite on torch-tensorrt
2.14 and 2.11, profile selection, bindings read from the engine, one CUDA context bound per
calling thread and one stream per lane."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from _torchbind_doubles import DYNAMIC_X, DYNAMIC_Y, TWO_PROFILES, X, Y, cuda, inputs, make_backend, source
from _torchbind_fakes import FakeTensor
from trt_runtime_backends.torchbind import TorchbindBackend
from trt_runtime_backends.torchbind.bindings import io_from_source

from trt_runtime.errors import InputError
from trt_runtime.protocols import EngineSource, TensorSpec
from trt_runtime.settings import RuntimeSettings
from trt_runtime.testing.conformance import BackendConformance

# -- the core conformance suite, against the doubles ---------------------------------------------


class _FakeTorchbindConformance(BackendConformance):
    version = "2.14.0"

    @pytest.fixture
    def backend(self) -> TorchbindBackend:
        return make_backend(self.version)[0]

    @pytest.fixture
    def engine_source(self) -> EngineSource:
        return EngineSource(b"PLAN-affine", name="affine", bindings=(DYNAMIC_X, DYNAMIC_Y))

    @pytest.fixture
    def make_inputs(self) -> Any:
        def make(rng: np.random.Generator) -> list[FakeTensor]:
            rows = int(rng.integers(1, 9))
            return [FakeTensor(rng.standard_normal((rows, 4)).astype(np.float32))]

        return make

    @pytest.fixture
    def reference(self) -> Any:
        # the double computes 2 * sum; inputs may be FakeTensors or host arrays
        return lambda inputs: [2.0 * np.asarray(_array(inputs[0]), dtype=np.float64)]

    @pytest.fixture
    def input_kinds(self) -> Any:
        # The doubles emulate torch with FakeTensor: real torch tensors (where torch is
        # installed) would reach the fake runtime, so only host numpy input is offered.
        from trt_runtime.testing import array_kinds

        return {"numpy": array_kinds.converter("numpy")}

    def as_backend_input(self, array: Any, like: Any) -> Any:
        return FakeTensor(np.ascontiguousarray(array), like.device)

    def output_to_numpy(self, value: Any) -> Any:
        return np.asarray(_array(value))

    def input_to_numpy(self, value: Any) -> Any:
        return np.asarray(_array(value))


def _array(value: Any) -> Any:
    """The numpy array of a FakeTensor (a CPU or CUDA torch tensor of the doubles), else the value."""
    return value.array if isinstance(value, FakeTensor) else value


class TestFakeTorchbind214Conformance(_FakeTorchbindConformance):
    version = "2.14.0"


class TestFakeTorchbind211Conformance(_FakeTorchbindConformance):
    version = "2.11.0"


def test_torchbind_profiles_selected_automatically_on_2_14() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source(bindings=(TWO_PROFILES, DYNAMIC_Y)))
    assert engine.native._auto_select_profiles is True
    assert engine.inputs[0].profiles == TWO_PROFILES.profiles
    engine.execute(FakeTensor(np.ones((20, 4), np.float32)))
    assert len(bridge.ops.calls) == 1


def test_torchbind_only_first_profile_before_profile_selection(caplog: pytest.LogCaptureFixture) -> None:
    backend, bridge = make_backend("2.11.0")
    with caplog.at_level(logging.INFO, logger="trt_runtime.torchbind"):
        engine = backend.load_engine(source(bindings=(TWO_PROFILES, DYNAMIC_Y)))
    assert "cannot switch optimization profiles; only profile 0 is used" in caplog.text
    assert engine.inputs[0].profiles == TWO_PROFILES.profiles[:1]
    assert not hasattr(engine.native, "_auto_select_profiles")
    with pytest.raises(
        InputError,
        match=r"input 'x' has shape \(20, 4\), outside every optimization profile .*: "
        r"profile 0: min \(1, 4\), max \(8, 4\)$",
    ):
        engine.execute(FakeTensor(np.ones((20, 4), np.float32)))
    assert bridge.ops.calls == []


def test_torchbind_incomplete_container_bindings_read_from_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch-tensorrt's TR01 writer records no dtypes: IO then comes from the engine itself."""
    from trt_runtime_backends.torchbind import backend as backend_module

    no_dtype = (
        TensorSpec("x", "", (2, 4), True),
        TensorSpec("y", "", (2, 4), True),
        TensorSpec("out", "", (-1,), False, data_dependent=True),
    )
    src = source(bindings=no_dtype, metadata={"dtypes_recorded": False})
    assert io_from_source(src) is None
    assert (
        io_from_source(source(bindings=(DYNAMIC_X.__class__("x", "float32", (-1, 4), True), DYNAMIC_Y)))
        is None
    )
    read: list[bytes] = []

    def from_engine(data: bytes, **kw: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
        read.append(data)
        return [X, Y], [TensorSpec("out", "float16", (-1,), False)]

    monkeypatch.setattr(backend_module, "io_from_tensorrt", from_engine)
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(src)
    assert read == [src.data]
    assert [s.dtype for s in engine.inputs] == ["float16", "float16"]
    assert engine.outputs[0].data_dependent and engine.has_data_dependent_outputs
    layout = backend.runtime.layout
    assert engine.native.info[layout.indices["REQUIRES_OUTPUT_ALLOCATOR"]] == "1"


@pytest.mark.parametrize("drop", ["invalidate", "settings"])
def test_torchbind_profile_resynced_after_context_is_recreated(drop: str) -> None:
    """torch-tensorrt keeps its active profile index when its context is rebuilt (the new
    context starts on profile 0); the backend resets it so selection stays right."""
    backend, bridge = make_backend("2.14.0")
    bridge.ops.profile_ranges = [(1, 8), (9, 32)]
    engine = backend.load_engine(source(bindings=(TWO_PROFILES, DYNAMIC_Y)))
    big = FakeTensor(np.ones((20, 4), np.float32))
    engine.execute(big)
    assert engine.native._active_profile_index == 1
    if drop == "invalidate":
        engine.invalidate_context()
    else:
        engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    engine.execute(big)  # same shape: torch-tensorrt would not re-select by itself
    engine.execute(FakeTensor(np.ones((3, 4), np.float32)))
    engine.execute(big)
    assert engine.context_creations == 2 == engine.native_context_creations


def test_torchbind_engine_binds_a_cuda_context_once_in_each_calling_thread() -> None:
    # A new thread has no current CUDA context, and TensorRT-RTX's profile switch inside
    # execute_engine fails without one (seen on an H100): the first call of each thread
    # makes the engine's device context current, later calls of that thread do not.
    import threading

    backend, bridge = make_backend("2.14.0", devices=2)
    engine = backend.load_engine(source(device_id=1))
    try:
        on_1 = [cuda(np.ones((2, 4)), "cuda:1"), cuda(np.full((2, 4), 2.0), "cuda:1")]

        def calls() -> None:
            for _ in range(3):
                engine(*on_1)

        workers = [threading.Thread(target=calls) for _ in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        bound = bridge.bound_threads
        assert sorted(t for t, _ in bound) == sorted(w.ident for w in workers)
        assert {device for _, device in bound} == {1}
    finally:
        engine.close()


def test_torchbind_engine_runs_every_call_of_a_lane_on_its_own_stream() -> None:
    # torch-tensorrt's op gave wrong outputs when called from threads on different streams
    # under GPU load (H100); every call of one lane goes through one private stream, from
    # any thread, ordered with the caller's stream.
    import threading

    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    try:
        engine(*inputs())
        worker = threading.Thread(target=lambda: engine(*inputs()))
        worker.start()
        worker.join()
        assert bridge.lanes == 1
        assert [lane for lane, _, _ in bridge.lane_calls] == ["lane:0:1"] * len(bridge.lane_calls)
        assert len({thread for _, _, thread in bridge.lane_calls}) == 2
        assert len(bridge.lane_calls) >= 2
    finally:
        engine.close()
