"""What one *lane* of a ``PythonEngine`` holds: one execution context and its state.

``PythonEngine`` is made of one module per concern (:mod:`.contract`, :mod:`.fast_path`,
:mod:`.output_binding`, :mod:`.graphs`); each works on the state declared here, once,
instead of each re-declaring what it reads. ``contexts=N`` makes N lanes (see
:meth:`PythonEngine._clone_lane`); the core leases one to each call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

__all__ = ["LaneState"]


class LaneState:
    """The attributes of one lane (set by ``PythonEngine._init``) and the methods the
    concerns call on each other."""

    _capture_stream: Any
    _context: Any
    _current_raw_stream: Any
    _device: int
    _fast: dict[tuple[int, ...], Any]
    _graph_captures: int
    _graph_shortcuts: dict[tuple[Any, ...], Any]
    _in: list[Any]
    _in_names: tuple[str, ...]
    _in_torch_dtypes: tuple[Any, ...]
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
    _shapes: Any
    _slots: Any
    _stage_in: list[Any]
    _stage_out: list[Any]
    _staged_logged: bool
    _state: Any
    _stream: Any
    _stream_handle: int
    _threads: Any
    _torch_device: Any
    _torch_empty: Any
    _torch_tensor: Any
    name: str

    if TYPE_CHECKING:  # defined by PythonEngine, EngineBase or another concern
        def _activate_thread(self) -> None: ...
        def _apply_shapes(self, ctx: Any, shapes: tuple[Any, ...], profile: int) -> None: ...
        def _caller_stream(self, stream: Any, torch_inputs: bool) -> int | None: ...
        def _check_device_array(self, io: Any, x: Any) -> tuple[int, tuple[int, ...]]: ...
        def _check_open(self) -> None: ...
        def _check_outputs(self, ctx: Any, outputs: Sequence[Any]) -> tuple[list[Any], list[int]]: ...
        def _check_torch(self, io: Any, x: Any) -> None: ...
        def _is_torch(self, x: Any) -> bool: ...
        def _log_staging(self, host: list[tuple[int, Any]]) -> None: ...
        def _restore_shapes(
            self, ctx: Any, shape_key: tuple[Any, int],
            dynamic_dims: tuple[tuple[str, tuple[int, ...]], ...], out_shapes: Any,
        ) -> bool: ...
        def _to_host(self, results: list[Any], ours: int, torch_host: bool = False) -> list[Any]: ...
        def _execute_failed(self) -> None: ...
        def _fit_device_memory(self, ctx: Any) -> None: ...
        def _select_profile(self, ctx: Any, profile: int) -> None: ...
        def _set_device(self) -> None: ...
        def _sync(self) -> None: ...
        def ensure_context(self) -> Any: ...
        def _torch_lookup(
            self, inputs: tuple[Any, ...], stream: Any, table: dict[Any, Any]
        ) -> tuple[Any, int | None] | None: ...
