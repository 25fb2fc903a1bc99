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
The device contract of every backend (docs/device-contract.md, enforced in
:mod:`.contract`): CUDA torch tensors in, CUDA torch tensors out; host arrays in, host
arrays out (staged through the device on the caller's stream, logged once per engine);
other CUDA arrays in, device arrays out (torch CUDA tensors). ``outputs=`` are written
with a device-to-device copy on the caller's stream. Everything is checked before the
C++ op runs. The common call (torch CUDA tensors on torch's current stream, no
``outputs=``) takes a hot path: a few attribute reads per input, a lookup of the shapes
among those already validated, and the op itself.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.engine import EngineBase
from trt_runtime.errors import CapabilityError
from trt_runtime.lane import Lane
from trt_runtime.protocols import Backend, TensorSpec
from trt_runtime.settings import SettingsLike

from .bridge import translate_errors
from .contract import Contract
from .graphs import TorchbindGraphs
from .lane import Features, NativeState, Shared, TorchbindLane

if TYPE_CHECKING:
    from .runtime import TorchbindRuntime

__all__ = ["NativeState", "TorchbindEngine", "translate_errors"]

logger = logging.getLogger("trt_runtime.torchbind")

class TorchbindEngine(EngineBase):
    """An engine run by torch-tensorrt's C++ runtime; outputs follow the kind of the inputs.
    Each lane (:class:`.lane.TorchbindLane`) holds a ``torch.classes.tensorrt.Engine`` of
    its own; what they share (the contract, the runtime, the notes logged) is a
    :class:`.lane.Shared`."""

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
        make_native: Callable[[], Any] | None = None,
    ) -> None:
        #: Builds another torch.classes.tensorrt.Engine of the same bytes (a new lane).
        self._make_native = make_native
        bridge = runtime.bridge
        switches = _select_profiles(runtime, name, native, inputs)
        if not switches and any(len(s.profiles) > 1 for s in inputs):
            inputs = [dataclasses.replace(s, profiles=s.profiles[:1]) for s in inputs]
        features = Features(
            can_update=runtime.has_runtime_settings and bridge.has_method(native, "update_runtime_settings"),
            lazy_context=bridge.has_method(native, "num_execution_contexts_created"),
            switches_profiles=switches,
        )
        self._shared = Shared(backend, runtime, device, name, tuple(inputs), tuple(outputs),
                              Contract(name, inputs, outputs, device, bridge), features)
        self._first_native = native  # (the first lane's, handed over in _new_ops)
        super().__init__(
            backend, name=name, inputs=inputs, outputs=outputs, settings=settings,
            device_guard=None if bridge.device_count() == 1 else bridge.device_guard(),
        )

    def _new_ops(self, lane: Lane) -> TorchbindLane:
        """A lane with the load's ``torch.classes.tensorrt.Engine`` (the first), else another
        of the same bytes: its own IExecutionContext and outer graphs, its own copy of the
        engine (weights included); the runtime cache is shared through the settings."""
        native, self._first_native = self._first_native, None
        if native is None:
            if self._make_native is None:
                raise CapabilityError(
                    f"engine {self.name!r} was not loaded by the backend; it cannot have more contexts"
                )
            native = self._make_native()
            if self._shared.features.switches_profiles:
                with translate_errors(self.name, "enabling optimization-profile selection"):
                    native._auto_select_profiles = True
        return TorchbindLane(self._shared, lane, native, TorchbindGraphs)

    @property
    def device(self) -> int:
        """The CUDA device the engine runs on."""
        return self._shared.device

    @property
    def runtime(self) -> TorchbindRuntime:
        """The torch-tensorrt runtime the engine runs on."""
        return self._shared.runtime

    @property
    def native_updates(self) -> int:
        """How many times ``update_runtime_settings`` was called (diagnostics, tests)."""
        return self._shared.native_updates

    # -- what torch-tensorrt sees ---------------------------------------------------------
    @property
    def native(self) -> Any:
        """The first lane's ``torch.classes.tensorrt.Engine`` (None once closed)."""
        return self._first_lane().native

    @property
    def native_context_creations(self) -> int | None:
        """torch-tensorrt's own count of ``IExecutionContext`` creations (2.13+), else None."""
        native = self.native
        if native is None or not self._shared.features.lazy_context:
            return None
        return int(native.num_execution_contexts_created())

    @property
    def _shape_checker(self) -> Any:
        return self._shared.contract.shapes

    def _first_lane(self) -> TorchbindLane:
        return self._lanes[0].ops  # type: ignore[return-value]

    def _memory_usage(self) -> tuple[int, int]:
        # torch-tensorrt reports neither; each lane holds a whole copy of the engine.
        return 0, 0


def _select_profiles(runtime: TorchbindRuntime, name: str, native: Any, inputs: Sequence[TensorSpec]) -> bool:
    """Let torch-tensorrt pick the optimization profile per call (2.14+): whether it
    can; before it could, only profile 0 is ever active, so only its ranges are
    advertised."""
    if not any(len(s.profiles) > 1 for s in inputs):
        return False
    if runtime.bridge.has_method(native, "set_active_profile"):
        with translate_errors(name, "enabling optimization-profile selection"):
            native._auto_select_profiles = True
        return True
    logger.info(
        "engine %r: %s %s cannot switch optimization profiles; only profile 0 is used",
        name, runtime.library.distribution, runtime.library.version,
    )
    return False
