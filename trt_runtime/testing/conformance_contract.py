"""The device contract part of the conformance suite (docs/device-contract.md).

:class:`DeviceContractTests` holds the tests of what goes into an engine and what comes
out: the kind, device, dtype and shape of outputs for every kind of input, mixed inputs,
preallocated ``outputs=``, ordering with the caller's stream, the error raised for each
class of bad input, and calls from many threads. ``BackendConformance`` inherits them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from trt_runtime.contexts import enable_cudagraphs
from trt_runtime.errors import CapabilityError, EngineError, InputError
from trt_runtime.protocols import Backend, Engine
from trt_runtime.testing import array_kinds
from trt_runtime.testing.array_kinds import ALL_KINDS, HOST_KINDS, TORCH_CUDA
from trt_runtime.testing.conformance_base import ConformanceBase
from trt_runtime.testing.stateful import BackendHarness

__all__ = ["DeviceContractTests"]

Kinds = Mapping[str, Callable[[Any], Any]]


class DeviceContractTests(ConformanceBase):
    """Tests of the device contract (mixed into ``BackendConformance``)."""

    # -- output kind per input kind ----------------------------------------------------------
    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_output_kind_follows_input(
        self, backend: Backend, engine: Engine, harness: BackendHarness, input_kinds: Kinds, device: int,
        kind: str,
    ) -> None:
        """numpy in -> numpy out; CPU torch -> CPU torch; CUDA torch -> CUDA torch on the
        engine's device; another CUDA array -> a device array; dtypes of the specs."""
        convert = self._converter(kind, backend, input_kinds)
        for seed in range(3):
            inputs, expected = self._kind_inputs(harness, convert, seed)
            outputs = engine.execute(*inputs)
            self._check_kinds(engine, kind, outputs, expected, device)
            self.check_close(harness, outputs, expected)

    def test_mixed_input_kinds_follow_the_rule(
        self, engine: Engine, harness: BackendHarness, input_kinds: Kinds, device: int
    ) -> None:
        """With inputs of several kinds: any CUDA torch tensor -> CUDA torch outputs; else
        any other CUDA array -> device arrays; else any CPU torch tensor -> CPU torch."""
        if len(engine.inputs) < 2:
            pytest.skip("the engine has one input: its inputs cannot mix kinds")
        kinds = sorted(input_kinds)
        if len(kinds) < 2:
            pytest.skip(f"the backend takes one input kind here ({kinds}): nothing to mix")
        for seed, (first, rest) in enumerate(itertools.permutations(kinds, 2)):
            inputs, expected = self._kind_inputs(harness, input_kinds[rest], seed)
            original, _ = self._kind_inputs(harness, lambda a: a, seed)
            inputs[0] = input_kinds[first](original[0])
            outputs = engine.execute(*inputs)
            self._check_kinds(engine, array_kinds.output_kind([first, rest]), outputs, expected, device)
            self.check_close(harness, outputs, expected)

    @pytest.mark.parametrize("kind", sorted(HOST_KINDS))
    def test_host_inputs_staged_and_logged_once(
        self, backend: Backend, engine: Engine, harness: BackendHarness, input_kinds: Kinds, kind: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Host inputs are staged through device memory; the first time an engine does it,
        it logs once at INFO (on a ``trt_runtime`` logger, naming the engine and 'host')."""
        if not self.host_staging_logged:
            pytest.skip(f"{type(self).__name__}.host_staging_logged is false: nothing is staged")
        convert = self._converter(kind, backend, input_kinds)
        caplog.set_level(logging.INFO, logger="trt_runtime")
        for seed in range(3):
            inputs, expected = self._kind_inputs(harness, convert, seed)
            self.check_close(harness, engine.execute(*inputs), expected)
        logged = [
            r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and r.name.startswith("trt_runtime")
            and engine.name in r.getMessage() and "host" in r.getMessage()
        ]
        assert len(logged) == 1, f"expected one INFO record about staging host inputs; got {logged}"

    # -- preallocated outputs -------------------------------------------------------------------
    def _given_outputs(self, backend: Backend, engine: Engine, expected: list[Any], device: int) -> list[Any]:
        kind = self._output_kind(backend)
        if kind is None:
            reasons = {k: array_kinds.unavailable(k) for k in self.preallocated_output_kinds}
            pytest.skip(
                f"no kind of {type(self).__name__}.preallocated_output_kinds can be made here: {reasons}"
            )
        return [
            self.allocate_output(kind, array_kinds.to_numpy(want).shape, spec.dtype, device)
            for spec, want in zip(engine.outputs, expected, strict=True)
        ]

    def _read_given(self, engine: Engine, kind: str, given: list[Any]) -> None:
        # Arrays the engine did not allocate cannot carry its stream: with no caller stream
        # (inputs that are CUDA arrays but not torch tensors) they are ready after
        # synchronize(); so are CudaArrays, which carry no stream of their own.
        if kind == array_kinds.CUDA_ARRAY or any(
            array_kinds.kind_of(g) == array_kinds.CUDA_ARRAY for g in given
        ):
            engine.synchronize()

    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_preallocated_outputs_written_and_returned(
        self, backend: Backend, engine: Engine, harness: BackendHarness, input_kinds: Kinds, device: int,
        kind: str,
    ) -> None:
        """``outputs=`` arrays are written and returned as given (the same objects), with the
        same arrays and new inputs, then with the same input arrays holding new values (a
        backend that remembers a call's bindings must still read them)."""
        self._skip_unless(backend, "supports_preallocated_outputs")
        convert = self._converter(kind, backend, input_kinds)
        first, second, _ = self._shape_seeds(harness)
        inputs, expected = self._kind_inputs(harness, convert, first)
        given = self._given_outputs(backend, engine, expected, device)
        if engine.has_data_dependent_outputs:
            name = next(o.name for o in engine.outputs if o.data_dependent)
            with pytest.raises(InputError, match=re.escape(name)):
                engine.execute(*inputs, outputs=given)
            return
        calls = [self._kind_inputs(harness, convert, seed) for seed in (first, second, first)]
        new_values, _ = self._kind_inputs(harness, lambda a: a, second)
        calls.append((calls[2][0], calls[1][1]))  # the third call's arrays, the second's values
        for index, (inputs, expected) in enumerate(calls):
            if index == 3 and not all(
                array_kinds.overwrite(x, v) for x, v in zip(inputs, new_values, strict=True)
            ):
                break  # no in-place write for this kind
            results = engine.execute(*inputs, outputs=given)
            assert len(results) == len(given), f"got {len(results)} outputs for {len(given)} given"
            for spec, got, want in zip(engine.outputs, results, given, strict=True):
                assert got is want, f"output {spec.name!r} was not returned as the array given in outputs="
            self._read_given(engine, kind, given)
            self.check_close(harness, given, expected)

    def test_preallocated_outputs_checked(
        self, backend: Backend, engine: Engine, harness: BackendHarness, device: int
    ) -> None:
        """Wrong count, shape or dtype in ``outputs=``: InputError naming the output; an
        ``outputs=`` that is not a list or tuple (an iterator, a bare array, before and after
        a call with the same arrays): InputError naming its type."""
        import numpy as np

        self._skip_unless(backend, "supports_preallocated_outputs")
        inputs = list(harness.make_inputs(np.random.default_rng(5)))
        expected = list(harness.reference(inputs))
        given = self._given_outputs(backend, engine, expected, device)
        kind = array_kinds.kind_of(given[0]) or ""
        with pytest.raises(InputError, match="outputs="):
            engine.execute(*inputs, outputs=given[:-1])
        with pytest.raises(InputError, match="outputs="):
            engine.execute(*inputs, outputs=[*given, given[0]])
        with pytest.raises(InputError, match="outputs= must be a list or tuple"):
            engine.execute(*inputs, outputs=iter(given))  # type: ignore[arg-type]
        if not engine.has_data_dependent_outputs:
            engine.execute(*inputs, outputs=tuple(given))  # (a fast path may remember these arrays now)
        with pytest.raises(InputError, match="outputs= must be a list or tuple"):
            engine.execute(*inputs, outputs=given[0])
        spec = engine.outputs[0]
        if spec.data_dependent:
            pytest.skip(f"output {spec.name!r} is data-dependent: it is never preallocated")
        shape = array_kinds.to_numpy(expected[0]).shape
        wrong_shapes = [(*shape, 1)]
        if shape:
            wrong_shapes.append((shape[0] + 1, *shape[1:]))
        for bad_shape in wrong_shapes:
            bad = [self.allocate_output(kind, bad_shape, spec.dtype, device), *given[1:]]
            with pytest.raises(InputError, match=re.escape(spec.name)):
                engine.execute(*inputs, outputs=bad)
        wrong = next(d for d in ("float32", "int32", "float16") if d != spec.dtype)
        bad = [self.allocate_output(kind, shape, wrong, device), *given[1:]]
        with pytest.raises(InputError, match=re.escape(spec.name)):
            engine.execute(*inputs, outputs=bad)
        self.run_and_check(engine, harness)

    def test_preallocated_outputs_refused_without_capability(
        self, backend: Backend, engine: Engine, harness: BackendHarness
    ) -> None:
        import numpy as np

        if backend.capabilities.supports_preallocated_outputs:
            pytest.skip(f"backend {backend.name!r} has supports_preallocated_outputs")
        inputs = list(harness.make_inputs(np.random.default_rng(0)))
        outputs = [array_kinds.to_numpy(o) for o in harness.reference(inputs)]
        with pytest.raises(CapabilityError, match="preallocated_outputs"):
            engine.execute(*inputs, outputs=outputs)

    # -- the caller's stream -----------------------------------------------------------------------
    @pytest.mark.parametrize("mode", ["current_stream", "stream_argument", "outer_graph"])
    def test_caller_stream_ordering(
        self, backend: Backend, engine: Engine, harness: BackendHarness, input_kinds: Kinds, device: int,
        mode: str,
    ) -> None:
        """Inputs written on the caller's stream behind a long kernel are read after it, and
        outputs read on that stream right after the call are complete: the work is
        ordered after and before torch's current stream, or the ``stream=`` given."""
        convert = self._converter(TORCH_CUDA, backend, input_kinds)
        if mode == "outer_graph":
            self._skip_unless(backend, "supports_outer_cuda_graph")
            if engine.has_data_dependent_outputs:
                pytest.skip("the engine has data-dependent outputs: no outer graph")
        import torch

        targets, expected = self._kind_inputs(harness, convert, 11)
        with torch.cuda.device(device):
            inputs = [torch.zeros_like(t) for t in targets]
            caller = torch.cuda.Stream(device)
            outer = mode == "outer_graph"
            with enable_cudagraphs(engine, outer=True) if outer else contextlib.nullcontext():
                if mode == "outer_graph":
                    engine.execute(*inputs)  # captures: the call below replays
                torch.cuda.synchronize(device)
                with torch.cuda.stream(caller):
                    torch.cuda._sleep(self.stream_sleep_cycles)
                    for x, t in zip(inputs, targets, strict=True):
                        x.copy_(t)
                    if mode != "stream_argument":
                        outputs = engine.execute(*inputs)
                if mode == "stream_argument":
                    outputs = engine.execute(*inputs, stream=caller)
                with torch.cuda.stream(caller):
                    read = [o.cpu() for o in outputs]
        self.check_close(harness, read, expected)

    # -- bad inputs --------------------------------------------------------------------------------
    def _valid_inputs(self, harness: BackendHarness) -> list[Any]:
        import numpy as np

        return list(harness.make_inputs(np.random.default_rng(7)))

    def _no_context(self, engine: Engine) -> None:
        assert engine.context_creations == 0, "bad input must be refused before an execution context exists"

    def test_bad_input_count_rejected(self, engine: Engine, harness: BackendHarness) -> None:
        inputs = self._valid_inputs(harness)
        names = [s.name for s in engine.inputs]
        with pytest.raises(InputError, match=re.escape(names[0])):
            engine.execute(*inputs, inputs[0])
        with pytest.raises(InputError, match=re.escape(names[0])):
            engine.execute(*inputs[:-1])
        self._no_context(engine)
        self.run_and_check(engine, harness)

    def _make_bad(self, harness: BackendHarness, convert: Callable[[Any, Any], Any]) -> Any:
        """``bad(array)``: the valid inputs with the first replaced by ``array`` (numpy),
        converted by ``convert(array, like)``."""
        inputs = self._valid_inputs(harness)
        return lambda array: [convert(array, inputs[0]), *inputs[1:]]

    def _check_dtype_refused(
        self, engine: Engine, harness: BackendHarness, make: Callable[[Any], Any]
    ) -> None:
        spec = engine.inputs[0]
        good = self.input_to_numpy(self._valid_inputs(harness)[0])
        wrong = next(d for d in ("float32", "int32", "float16") if d != spec.dtype)
        with pytest.raises(InputError, match=re.escape(spec.name)) as info:
            engine.execute(*make(good.astype(wrong)))
        message = str(info.value)
        assert spec.dtype in message and wrong in message, (
            f"the message must name the expected dtype {spec.dtype} and the one given {wrong}: {message}"
        )

    def _check_shape_refused(
        self, engine: Engine, harness: BackendHarness, make: Callable[[Any], Any]
    ) -> None:
        import numpy as np

        spec = engine.inputs[0]
        good = self.input_to_numpy(self._valid_inputs(harness)[0])
        shapes: list[tuple[int, ...]] = [(1, *good.shape)]  # wrong rank
        static = [i for i, d in enumerate(spec.shape) if d >= 0]
        if static:
            wrong = list(good.shape)
            wrong[static[0]] += 1
            shapes.append(tuple(wrong))
        if spec.profiles:  # one past the largest max of every profile
            shapes.append(tuple(max(p[2][i] for p in spec.profiles) + 1 for i in range(len(spec.shape))))
        for bad_shape in shapes:
            with pytest.raises(InputError, match=re.escape(spec.name)):
                engine.execute(*make(np.zeros(bad_shape, dtype=good.dtype)))

    def test_bad_input_dtype_rejected(self, engine: Engine, harness: BackendHarness) -> None:
        """The inputs as ``make_inputs`` gives them, one of a wrong dtype (never converted)."""
        self._check_dtype_refused(engine, harness, self._make_bad(harness, self.as_backend_input))
        self._no_context(engine)
        self.run_and_check(engine, harness)

    def test_bad_input_shape_rejected(self, engine: Engine, harness: BackendHarness) -> None:
        self._check_shape_refused(engine, harness, self._make_bad(harness, self.as_backend_input))
        self._no_context(engine)
        self.run_and_check(engine, harness)

    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_bad_input_of_each_kind_rejected(
        self, backend: Backend, engine: Engine, harness: BackendHarness, input_kinds: Kinds, kind: str
    ) -> None:
        """Wrong dtype, rank, static dimension, a shape outside every profile, and a
        non-contiguous array, for each input kind: InputError naming the input."""
        convert = self._converter(kind, backend, input_kinds)
        make = self._make_bad(harness, lambda array, _like: convert(array))
        self._check_dtype_refused(engine, harness, make)
        self._check_shape_refused(engine, harness, make)
        spec = engine.inputs[0]
        good = self.input_to_numpy(self._valid_inputs(harness)[0])
        strided = array_kinds.non_contiguous(kind, good, convert)
        if strided is not None:
            with pytest.raises(InputError, match=re.escape(spec.name)):
                engine.execute(strided, *self._valid_inputs(harness)[1:])
        self._no_context(engine)
        self.run_and_check(engine, harness)

    def test_input_of_unknown_type_rejected(self, engine: Engine, harness: BackendHarness) -> None:
        spec = engine.inputs[0]
        with pytest.raises(InputError, match=re.escape(spec.name)):
            engine.execute(object(), *self._valid_inputs(harness)[1:])
        self._no_context(engine)

    def test_input_on_another_device_rejected(
        self, engine: Engine, harness: BackendHarness, input_kinds: Kinds, device: int
    ) -> None:
        """A CUDA input on another GPU than the engine's: InputError naming both devices."""
        if TORCH_CUDA not in input_kinds:
            pytest.skip("needs torch CUDA inputs")
        import torch

        if torch.cuda.device_count() < 2:
            pytest.skip("needs two CUDA devices")
        other = 1 if device == 0 else 0
        spec = engine.inputs[0]
        good = self.input_to_numpy(self._valid_inputs(harness)[0])
        wrong = array_kinds.converter(TORCH_CUDA, other)(good)
        with pytest.raises(InputError, match=re.escape(spec.name)) as info:
            engine.execute(wrong, *self._valid_inputs(harness)[1:])
        assert f"cuda:{other}" in str(info.value) and f"cuda:{device}" in str(info.value), str(info.value)

    def test_host_inputs_refused_without_host_io(
        self, backend: Backend, engine: Engine, harness: BackendHarness
    ) -> None:
        if backend.capabilities.supports_host_io:
            pytest.skip(f"backend {backend.name!r} has supports_host_io")
        spec = engine.inputs[0]
        host = self.input_to_numpy(self._valid_inputs(harness)[0])
        with pytest.raises(InputError, match=re.escape(spec.name)):
            engine.execute(host, *self._valid_inputs(harness)[1:])

    def test_closed_engine_refused(self, engine: Engine, harness: BackendHarness) -> None:
        self.run_and_check(engine, harness)
        engine.close()
        engine.close()  # idempotent
        with pytest.raises(EngineError, match=re.escape(engine.name)):
            engine.execute(*self._valid_inputs(harness))

    # -- threads -----------------------------------------------------------------------------------
    def _threaded(self, engine: Engine, harness: BackendHarness) -> None:
        import numpy as np

        count, calls = self.thread_count, self.thread_calls
        barrier = threading.Barrier(count)
        failures: list[tuple[int, BaseException]] = []

        def work(index: int) -> None:
            try:
                barrier.wait(timeout=120)
                for call in range(calls):
                    inputs = list(harness.make_inputs(np.random.default_rng(10_000 + index * calls + call)))
                    outputs = engine.execute(*inputs)
                    self.check_close(harness, outputs, harness.reference(inputs))
            except BaseException as exc:  # reported below, with the thread's index
                failures.append((index, exc))

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        assert not any(t.is_alive() for t in threads), "threads calling the engine did not finish in 600 s"
        if failures:
            index, exc = failures[0]
            raise AssertionError(
                f"{len(failures)} of {count} threads got wrong results or errors; thread {index}: {exc!r}"
            ) from exc

    def test_threads_share_one_engine(self, engine: Engine, harness: BackendHarness) -> None:
        """``thread_count`` threads call one engine at once, each with its own inputs."""
        self._threaded(engine, harness)
        assert engine.context_creations >= 1

    def test_threads_share_one_engine_under_outer_graph(
        self, backend: Backend, engine: Engine, harness: BackendHarness
    ) -> None:
        self._skip_unless(backend, "supports_outer_cuda_graph")
        if engine.has_data_dependent_outputs:
            pytest.skip("the engine has data-dependent outputs: no outer graph")
        with enable_cudagraphs(engine, outer="copy"):
            self._threaded(engine, harness)
