"""The outer CUDA-graph part of the conformance suite (:mod:`trt_runtime.graphs`).

:class:`OuterGraphTests` checks ``enable_cudagraphs(engine, outer=...)`` and
``engine.outer_graph``: outputs equal eager outputs across shape changes and settings
changes made inside (nested ``runtime_config``), in ``"copy"`` and ``"view"`` mode, one
capture per input-shape key per execution context, no context created by the wrap
itself, everything restored on exit, and the refusals (``CapabilityError``) for a
backend without ``supports_outer_cuda_graph`` and for data-dependent outputs.
``BackendConformance`` inherits them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from trt_runtime.contexts import enable_cudagraphs, runtime_config
from trt_runtime.errors import CapabilityError
from trt_runtime.graphs import OuterGraph
from trt_runtime.protocols import Backend
from trt_runtime.testing import array_kinds
from trt_runtime.testing.array_kinds import ALL_KINDS
from trt_runtime.testing.conformance_base import ConformanceBase
from trt_runtime.testing.stateful import BackendHarness

__all__ = ["OuterGraphTests"]

Kinds = Mapping[str, Callable[[Any], Any]]


class OuterGraphTests(ConformanceBase):
    """Tests of the outer CUDA-graph wrap (mixed into ``BackendConformance``).

    Engines are typed ``Any``: the tests use ``EngineBase``'s ``reset_graphs()``,
    ``data_dependent_outputs`` and the ``outer_graph`` setter's spellings (a bool or a
    mode name), which the ``Engine`` protocol does not declare.
    """

    def _needs_outer(self, backend: Backend, engine: Any) -> None:
        self._skip_unless(backend, "supports_outer_cuda_graph")
        if engine.has_data_dependent_outputs:
            pytest.skip(f"outputs {engine.data_dependent_outputs} are data-dependent: no outer graph")

    def _call(self, engine: Any, harness: BackendHarness, seed: int,
              convert: Callable[[Any], Any] | None = None) -> tuple[list[Any], list[Any]]:
        """``(outputs, expected)`` of one call with the inputs of ``seed``, as ``make_inputs``
        gives them or turned into one kind by ``convert``."""
        import numpy as np

        if convert is None:
            inputs = list(harness.make_inputs(np.random.default_rng(seed)))
            expected = list(harness.reference(inputs))
        else:
            inputs, expected = self._kind_inputs(harness, convert, seed)
        return engine.execute(*inputs), expected

    def test_outer_graph_missing_refused(self, backend: Backend, engine: Any) -> None:
        if backend.capabilities.supports_outer_cuda_graph:
            pytest.skip(f"backend {backend.name!r} has supports_outer_cuda_graph")
        before = engine.runtime_settings
        with pytest.raises(CapabilityError, match="outer_cuda_graph"), enable_cudagraphs(engine, outer=True):
            pass
        with pytest.raises(CapabilityError, match="outer_cuda_graph"):
            engine.outer_graph = True
        assert engine.outer_graph is None and engine.runtime_settings == before

    def test_outer_graph_refused_for_data_dependent_outputs(self, backend: Backend, engine: Any) -> None:
        self._skip_unless(backend, "supports_outer_cuda_graph")
        if not engine.has_data_dependent_outputs:
            pytest.skip("the engine has no data-dependent outputs")
        name = engine.data_dependent_outputs[0]
        before = engine.runtime_settings
        with pytest.raises(CapabilityError, match=re.escape(name)), enable_cudagraphs(engine, outer=True):
            pass
        with pytest.raises(CapabilityError, match=re.escape(name)):
            engine.outer_graph = "view"
        assert engine.outer_graph is None and engine.runtime_settings == before

    def test_outer_graph_equals_eager_across_shapes_and_settings(
        self, backend: Backend, engine: Any, harness: BackendHarness
    ) -> None:
        """Outputs under the wrap equal eager ones; one capture per input-shape key per
        context; a settings change inside (nested ``runtime_config``) captures again; the
        wrap creates no context; exit restores ``outer_graph`` and the settings."""
        self._needs_outer(backend, engine)
        a, a2, b = self._shape_seeds(harness)
        seeds = [a, a2] + ([] if b is None else [b])
        eager = {seed: self._call(engine, harness, seed)[0] for seed in seeds}
        eager = {seed: [self.output_to_numpy(o) for o in outs] for seed, outs in eager.items()}
        before = engine.runtime_settings
        creations = engine.context_creations
        assert creations == 1 and engine.graph_captures == 0

        def run(seed: int) -> None:
            outputs, expected = self._call(engine, harness, seed)
            self.check_close(harness, outputs, expected)
            self.check_close(harness, outputs, eager[seed])

        with enable_cudagraphs(engine, outer=True) as target:
            assert target is engine and engine.outer_graph == OuterGraph()
            assert engine.has_context(), "enabling the outer wrap with unchanged settings keeps the context"
            run(a)
            assert engine.graph_captures == 1
            run(a2)  # same shapes: a replay with new values
            run(a)
            assert engine.graph_captures == 1, "a replay is not a capture"
            expected = 1
            if b is not None:
                run(b)
                run(b)
                run(a)
                expected = 2
                assert engine.graph_captures == expected, "one capture per input-shape key"
            assert engine.context_creations == creations, "the outer wrap must not create a context"
            overrides = self._settings_variant(backend, graph_strategy=False)
            with runtime_config(engine, **overrides):
                assert engine.outer_graph == OuterGraph()
                run(a)
                run(a2)
                expected += 1
                assert engine.graph_captures == expected, "a new context captures its graphs again"
                assert engine.context_creations == creations + 1
            run(a)  # settings restored: another context, another capture
            expected += 1
            assert engine.graph_captures == expected and engine.context_creations == creations + 2
            engine.reset_graphs()
            run(a2)
            expected += 1
            assert engine.graph_captures == expected, "reset_graphs() drops the graphs"
            assert engine.context_creations == creations + 2, "reset_graphs() keeps the context"
        assert engine.outer_graph is None and engine.runtime_settings == before
        run(a)
        assert engine.graph_captures == expected, "eager calls capture nothing"
        assert engine.context_creations == creations + 2, "leaving the outer wrap must not create a context"

    def test_outer_graph_toggle_keeps_context(
        self, backend: Backend, engine: Any, harness: BackendHarness
    ) -> None:
        """Setting ``outer_graph`` never creates or drops a context; a different value
        drops the graphs (the next call captures again), an equal value keeps them."""
        self._needs_outer(backend, engine)
        seed = self._shape_seeds(harness)[0]
        self._call(engine, harness, seed)
        engine.outer_graph = True
        run = lambda: self.check_close(harness, *self._call(engine, harness, seed))  # noqa: E731
        run()
        engine.outer_graph = "copy"  # equal to True: nothing changes
        run()
        assert engine.graph_captures == 1
        engine.outer_graph = "view"
        run()
        assert engine.graph_captures == 2
        engine.outer_graph = None
        run()
        assert engine.has_context() and engine.context_creations == 1
        assert engine.graph_captures == 2

    @pytest.mark.parametrize("mode", ["copy", "view"])
    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_outer_graph_output_modes(
        self, backend: Backend, engine: Any, harness: BackendHarness, input_kinds: Kinds, device: int,
        kind: str, mode: str,
    ) -> None:
        """Outputs keep following the input kind under the wrap. ``"copy"``: every call
        returns new arrays, earlier results keep their values. ``"view"``: for the kinds
        in :attr:`static_output_kinds` a call returns the static output buffers (the same
        memory every call of a shape), which the next call of that shape overwrites;
        other kinds (host copies of device buffers) are new arrays as in ``"copy"``."""
        self._needs_outer(backend, engine)
        convert = self._converter(kind, backend, input_kinds)
        first, second, _ = self._shape_seeds(harness)
        with enable_cudagraphs(engine, outer=mode):
            one, expected_one = self._call(engine, harness, first, convert)
            self._check_kinds(engine, kind, one, expected_one, device)
            self.check_close(harness, one, expected_one)
            two, expected_two = self._call(engine, harness, second, convert)
            self._check_kinds(engine, kind, two, expected_two, device)
            self.check_close(harness, two, expected_two)
            three, _ = self._call(engine, harness, second, convert)  # a pure replay
            self.check_close(harness, three, expected_two)
            same = [array_kinds.address(x) == array_kinds.address(y) for x, y in zip(one, two, strict=True)]
            if mode == "view" and kind in self.static_output_kinds:
                assert all(same), f"view mode must return the static output buffers each call ({kind})"
                self.check_close(harness, one, expected_two)  # overwritten by the next call
            else:
                assert not any(same), f"{mode} mode must return new arrays each call ({kind})"
                self.check_close(harness, one, expected_one)

    def test_outer_graph_preallocated_outputs(
        self, backend: Backend, engine: Any, harness: BackendHarness, device: int
    ) -> None:
        """``outputs=`` under the wrap: written and returned as given, in both modes."""
        self._needs_outer(backend, engine)
        self._skip_unless(backend, "supports_preallocated_outputs")
        import numpy as np

        kind = self._output_kind(backend)
        if kind is None:
            pytest.skip(f"no kind of {type(self).__name__}.preallocated_output_kinds can be made here")
        first, second, _ = self._shape_seeds(harness)
        for mode in ("copy", "view"):
            with enable_cudagraphs(engine, outer=mode):
                for seed in (first, second, first):
                    inputs = list(harness.make_inputs(np.random.default_rng(seed)))
                    expected = [array_kinds.to_numpy(e) for e in harness.reference(inputs)]
                    given = [self.allocate_output(kind, e.shape, s.dtype, device)
                             for s, e in zip(engine.outputs, expected, strict=True)]
                    results = engine.execute(*inputs, outputs=given)
                    assert all(r is g for r, g in zip(results, given, strict=True)), (
                        f"outputs= arrays must be returned as given under outer_graph={mode!r}"
                    )
                    if kind == array_kinds.CUDA_ARRAY:
                        engine.synchronize()
                    self.check_close(harness, given, expected)
