"""What one *lane* of a ``PythonEngine`` holds: one execution context and its state.

``PythonEngine`` holds parts (:class:`.contract.Contract`, :class:`.bridge.TorchBridge`,
:class:`.output_binding.OutputBinding`, :class:`.graphs.OuterGraphs`) and one mixin,
:mod:`.fast_path`; each works on the state declared here, once,
instead of each re-declaring what it reads. ``contexts=N`` makes N lanes (see
:meth:`PythonEngine._clone_lane`); the core leases one to each call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["LaneState"]


class LaneState:
    """The attributes of one lane (set by ``PythonEngine._init``) and the methods the
    concerns call on each other."""

    _binding: Any
    _context: Any
    _contract: Any
    _device: int
    _graphs: Any
    _fast: dict[tuple[int, ...], Any]
    _graph_captures: int
    _in: list[Any]
    _in_names: tuple[str, ...]
    _io_names: tuple[str, ...]
    _logger: Any
    _multi_device: bool
    _n_in: int
    _n_out: int
    _natural: dict[tuple[Any, ...], Any]
    _order: Any
    _out: list[Any]
    _outer_graph: Any
    _profile: int | None
    _res: Any
    _rt: Any
    _state: Any
    _stream: Any
    _stream_handle: int
    _threads: Any
    _torch: Any
    name: str

    if TYPE_CHECKING:  # defined by PythonEngine, EngineBase or another concern
        def _activate_thread(self) -> None: ...
        def _apply_shapes(self, ctx: Any, shapes: tuple[Any, ...], profile: int) -> None: ...
        def _caller_stream(self, stream: Any, torch_inputs: bool) -> int | None: ...
        def _check_open(self) -> None: ...
        def _execute_failed(self) -> None: ...
        def _fit_device_memory(self, ctx: Any) -> None: ...
        def _select_profile(self, ctx: Any, profile: int) -> None: ...
        def _set_device(self) -> None: ...
        def _sync(self) -> None: ...
        def ensure_context(self) -> Any: ...
        def _torch_lookup(
            self, inputs: tuple[Any, ...], stream: Any, table: dict[Any, Any]
        ) -> tuple[Any, int | None] | None: ...
