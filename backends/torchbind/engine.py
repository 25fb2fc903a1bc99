"""TorchbindEngine: one ``torch.classes.tensorrt.Engine`` behind the core engine lifecycle.

What "execution context" means here
-----------------------------------
torch-tensorrt's C++ engine owns its ``IExecutionContext``. The context this class
creates (what :class:`~trt_runtime.EngineBase` counts) is the *configured* torchbind
engine: ``Engine.update_runtime_settings(ds, cg, cache_handle)`` applied with the
current settings. A settings change drops it; the next :meth:`execute` applies the
new settings, and torch-tensorrt (2.13+) then builds one new ``IExecutionContext`` in
that same ``execute_engine`` call, lazily, as the Python backend does. Dropping a
context also asks torch-tensorrt to drop its own (``disable_profiling`` is the
torchbind method that invalidates it), so both sides count the same creations.

Inputs and outputs
------------------
Inputs are torch tensors on the engine's CUDA device (zero-copy). numpy arrays and CPU
tensors are host inputs: they are copied to the device on the caller's stream, and the
first time an engine does so it logs at INFO. Any other object exposing ``__dlpack__``
or ``__cuda_array_interface__`` is viewed through torch without a copy. Outputs are
CUDA torch tensors allocated by torch-tensorrt, ordered on the caller's stream.
Count, dtype, shape (against each :class:`~trt_runtime.TensorSpec` and its profiles),
contiguity and device are checked before the C++ op runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.engine import EngineBase
from trt_runtime.errors import CacheError, CapabilityError, EngineError, InputError, TrtRuntimeError
from trt_runtime.protocols import Backend, TensorSpec
from trt_runtime.settings import RuntimeSettings, SettingsLike

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

    from .runtime import TorchbindRuntime

__all__ = ["NativeState", "TorchbindEngine", "translate_errors"]

logger = logging.getLogger("trt_runtime.torchbind")


@contextlib.contextmanager
def translate_errors(engine: str, what: str) -> Iterator[None]:
    """Turn an exception from torch / torch-tensorrt into :class:`EngineError`."""
    try:
        yield
    except TrtRuntimeError:
        raise
    except Exception as exc:
        raise EngineError(f"engine {engine!r}: {what} failed in torch-tensorrt's runtime: {exc}") from exc


#: ``_last_stream`` value meaning "torch's current stream on the engine's device".
_CURRENT = object()


@dataclasses.dataclass
class NativeState:
    """The "execution context" of a torchbind engine: the settings it was configured with."""

    serial: int
    settings: RuntimeSettings
    cache_handle: Any = None
    applied: bool = False  # whether update_runtime_settings was called for it


class TorchbindEngine(EngineBase):
    """An engine run by torch-tensorrt's C++ runtime. Outputs are CUDA torch tensors."""

    def __init__(
        self,
        backend: Backend,
        *,
        runtime: TorchbindRuntime,
        native: Any,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        device: int,
        settings: SettingsLike = None,
    ) -> None:
        self._runtime = runtime
        self._native = native
        self.device = device
        bridge = runtime.bridge
        self._can_update = runtime.has_runtime_settings and bridge.has_method(
            native, "update_runtime_settings"
        )
        self._lazy_native_context = bridge.has_method(native, "num_execution_contexts_created")
        self._switches_profiles = False
        inputs = self._select_profiles(name, inputs)
        # Per input, what the hot-path check needs (see _fast_spec); None: full check only.
        self._fast = [_fast_spec(spec, bridge.torch_dtype(spec.dtype)) for spec in inputs]
        self._single_device = bridge.device_count() == 1
        self._checked: tuple[Sequence[Any], list[Any], bool] | None = None
        self._last_stream: Any = None
        self._staged = False
        self._serial = 0
        #: How many times ``update_runtime_settings`` was called (diagnostics, tests).
        self.native_updates = 0
        super().__init__(backend, name=name, inputs=inputs, outputs=outputs, settings=settings)

    def _select_profiles(self, name: str, inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
        """Let torch-tensorrt pick the optimization profile per call (2.14+); before it
        could, only profile 0 is ever active, so only its ranges are advertised."""
        if not any(len(s.profiles) > 1 for s in inputs):
            return list(inputs)
        bridge = self._runtime.bridge
        if bridge.has_method(self._native, "set_active_profile"):
            with translate_errors(name, "enabling optimization-profile selection"):
                self._native._auto_select_profiles = True
            self._switches_profiles = True
            return list(inputs)
        logger.info(
            "engine %r: %s %s cannot switch optimization profiles; only profile 0 is used",
            name,
            self._runtime.library.distribution,
            self._runtime.library.version,
        )
        return [dataclasses.replace(s, profiles=s.profiles[:1]) for s in inputs]

    # -- what torch-tensorrt sees ---------------------------------------------------------
    @property
    def native(self) -> Any:
        """The ``torch.classes.tensorrt.Engine`` (None once closed)."""
        return self._native

    @property
    def native_context_creations(self) -> int | None:
        """torch-tensorrt's own count of ``IExecutionContext`` creations (2.13+), else None."""
        if self._native is None or not self._lazy_native_context:
            return None
        return int(self._native.num_execution_contexts_created())

    # -- EngineBase hooks ---------------------------------------------------------------
    def _create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> NativeState:
        handle = None
        if cache is not None:
            handle = cache.ensure_materialized(self, backend=self.backend)
            bridge = self._runtime.bridge
            native_handle = bridge.qualified_name(handle).endswith("RuntimeCacheHandle") or (
                bridge.has_method(handle, "has_cache") and bridge.has_method(handle, "deserialize")
            )
            if not native_handle:
                raise CacheError(
                    f"engine {self.name!r}: the runtime cache gave {type(handle).__name__}, "
                    "not torch-tensorrt's RuntimeCacheHandle (was it materialized by another backend?)"
                )
        state = NativeState(serial=self._serial, settings=settings, cache_handle=handle)
        self._serial += 1
        if self._can_update:
            ds, cg = settings.to_codes()
            with translate_errors(self.name, "update_runtime_settings"):
                self._native.update_runtime_settings(ds, cg, handle)
            self.native_updates += 1
            state.applied = True
        elif settings != RuntimeSettings():
            # The backend claimed the capability but this engine object lacks the method.
            raise CapabilityError(
                f"engine {self.name!r}: torch.classes.tensorrt.Engine has no update_runtime_settings "
                f"in {self._runtime.library.distribution} {self._runtime.library.version}; "
                "torch-tensorrt-rtx >= 2.13 adds it"
            )
        if self._switches_profiles:
            self._resync_profile()
        return state

    def _resync_profile(self) -> None:
        """torch-tensorrt keeps its active-profile index when it rebuilds its execution
        context, but a new context starts on profile 0; its per-call selection then trusts
        the stale index and TensorRT refuses the shapes. Re-pin profile 0 so index and
        context agree (this builds the context now instead of in the next execute: one
        creation either way); the next call selects the profile its shapes need."""
        with translate_errors(self.name, "re-selecting the optimization profile"):
            if int(self._native._active_profile_index) != 0:
                self._native.set_active_profile(0)

    def _destroy_context(self, context: Any) -> None:
        if self._native is not None and self._lazy_native_context:
            # Invalidates torch-tensorrt's IExecutionContext (rebuilt lazily at the next
            # execute); this engine never enables profiling, so nothing else changes.
            with translate_errors(self.name, "dropping the execution context"):
                self._native.disable_profiling()

    def _validate_inputs(self, inputs: Sequence[Any]) -> None:
        """Check every input before a context exists (EngineBase calls this first)."""
        tensors, host = self._check(inputs)
        self._checked = (inputs, tensors, host)

    def _run(self, context: Any, inputs: Sequence[Any], stream: Any, outputs: Any = None) -> list[Any]:
        bridge = self._runtime.bridge
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is inputs:
            _, tensors, host = checked
        else:
            tensors, host = self._check(inputs)
        if stream is None and (self._single_device or bridge.current_device() == self.device):
            # The common case, kept lean: torch's current stream on the engine's device
            # needs no device or stream switch.
            if host:
                tensors = self._stage(tensors)
            try:
                outputs = bridge.execute(tensors, self._native)
            except Exception as exc:
                raise EngineError(
                    f"engine {self.name!r}: execute_engine failed in torch-tensorrt's runtime: {exc}"
                ) from exc
            self._last_stream = _CURRENT
        else:
            with translate_errors(self.name, "resolving the stream"):
                torch_stream = bridge.resolve_stream(stream, self.device)
            with bridge.stream_scope(torch_stream, self.device):
                if host:
                    tensors = self._stage(tensors)
                with translate_errors(self.name, "execute_engine"):
                    outputs = bridge.execute(tensors, self._native)
            self._last_stream = torch_stream
        if len(outputs) != len(self._outputs):
            raise EngineError(
                f"engine {self.name!r}: torch-tensorrt returned {len(outputs)} output(s); "
                f"expected {len(self._outputs)} {[o.name for o in self._outputs]}"
            )
        return outputs

    def synchronize(self) -> None:
        """Wait for the work this engine queued on the last stream it ran on."""
        stream = self._last_stream
        if stream is None:
            return
        bridge = self._runtime.bridge
        if stream is _CURRENT:
            stream = bridge.current_stream(self.device)
        bridge.synchronize(stream)

    def _release(self) -> None:
        self._native = None  # the C++ engine is freed with its last reference

    # -- input validation -------------------------------------------------------------
    def _check(self, inputs: Sequence[Any]) -> tuple[list[Any], bool]:
        """Validate ``inputs``; return the tensors to pass and whether any is host memory
        (host inputs are returned as host tensors and staged by :meth:`_stage`)."""
        if len(inputs) != len(self._inputs):
            raise InputError(
                f"engine {self.name!r} takes {len(self._inputs)} input(s) "
                f"{[s.name for s in self._inputs]}; got {len(inputs)}"
            )
        fast_shape = self._runtime.bridge.fast_shape
        tensors = list(inputs)
        host = False
        for i, value in enumerate(tensors):
            fast = self._fast[i]
            if fast is not None:
                # A contiguous CUDA tensor of the right dtype on our device: only its shape
                # is left to check, against precomputed ranges.
                shape = fast_shape(value, fast[0], self.device)
                if shape is not None and _shape_fits(shape, fast[1], fast[2]):
                    continue
            tensors[i], on_host = self._check_one(self._inputs[i], value)
            host = host or on_host
        return tensors, host

    def _check_one(self, spec: TensorSpec, value: Any) -> tuple[Any, bool]:
        bridge = self._runtime.bridge
        tensor = value
        info = bridge.describe(value)
        if info is None:
            try:
                tensor = bridge.as_tensor(value)
            except Exception as exc:
                raise InputError(f"{self._where(spec)} could not be viewed as a tensor: {exc}") from exc
            info = None if tensor is None else bridge.describe(tensor)
        if info is None:
            raise InputError(
                f"{self._where(spec)} must be a torch tensor, a numpy array or a DLPack array; "
                f"got {type(value).__name__}"
            )
        if info.dtype != spec.dtype:
            raise InputError(f"{self._where(spec)} must have dtype {spec.dtype}; got {info.dtype}")
        check_shape(self.name, spec, info.shape)
        if not info.contiguous:
            raise InputError(
                f"{self._where(spec)} must be contiguous (C order); "
                f"got strided data of shape {list(info.shape)}"
            )
        if info.device_type == "cuda":
            if info.device_index != self.device:
                raise InputError(
                    f"{self._where(spec)} is on cuda:{info.device_index}; "
                    f"the engine runs on cuda:{self.device}"
                )
            return tensor, False
        if info.device_type == "cpu":
            return tensor, True
        raise InputError(
            f"{self._where(spec)} is on device {info.device_type!r}; "
            f"expected cuda:{self.device} or host memory"
        )

    def _where(self, spec: TensorSpec) -> str:
        return f"input {spec.name!r} of engine {self.name!r}"

    def _stage(self, tensors: list[Any]) -> list[Any]:
        """Copy host tensors to the engine's device (on the current stream); log once."""
        bridge = self._runtime.bridge
        staged = []
        for tensor in tensors:
            info = bridge.describe(tensor)
            if info is not None and info.device_type == "cpu":
                if not self._staged:
                    self._staged = True
                    logger.info(
                        "engine %r: host input copied to cuda:%d (pass CUDA tensors to stay zero-copy)",
                        self.name,
                        self.device,
                    )
                tensor = bridge.to_device(tensor, self.device)
            staged.append(tensor)
        return staged


def _fast_spec(
    spec: TensorSpec, dtype: Any
) -> tuple[Any, tuple[int, ...], tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]] | None:
    """``(torch dtype, shape, ((min, max), ...))`` of an input for the hot-path check."""
    if dtype is None:
        return None
    if not spec.is_dynamic:
        return dtype, spec.shape, ()
    if not spec.profiles:
        return None  # only rank and static dims are known: the full check says it
    return dtype, spec.shape, tuple((lo, hi) for lo, _opt, hi in spec.profiles)


def _shape_fits(
    shape: Sequence[int],
    expected: tuple[int, ...],
    ranges: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...],
) -> bool:
    if not ranges:
        return shape == expected
    if len(shape) != len(expected):
        return False
    for d, s in zip(expected, shape, strict=True):
        if d >= 0 and d != s:
            return False
    for lo, hi in ranges:
        for a, s, b in zip(lo, shape, hi, strict=True):
            if not a <= s <= b:
                break
        else:
            return True
    return False


def check_shape(engine: str, spec: TensorSpec, shape: tuple[int, ...]) -> None:
    """Refuse ``shape`` unless it matches ``spec`` (rank, static dims, some profile's range)."""
    where = f"input {spec.name!r} of engine {engine!r}"
    mismatch = len(shape) != len(spec.shape) or any(
        d >= 0 and d != s for d, s in zip(spec.shape, shape, strict=False)
    )
    if mismatch:
        expected = "x".join("?" if d < 0 else str(d) for d in spec.shape) or "scalar"
        raise InputError(f"{where} must have shape {list(spec.shape)} ({expected}); got {list(shape)}")
    if spec.profiles:
        for lo, _opt, hi in spec.profiles:
            if all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True)):
                return
        ranges = "; ".join(f"{list(lo)}..{list(hi)}" for lo, _o, hi in spec.profiles)
        raise InputError(f"{where} has shape {list(shape)} outside every optimization profile ({ranges})")
