"""What each kind of call plan (backends/trt_runtime_backends/python/plans.py) checks, over the test
doubles: every kind declines what it does not take (wrong dtype, not contiguous, another device, not
a torch tensor; for pre-bound calls other pointers, shapes or arrays), switches to the plan its
lane's table holds for other shapes, and runs calls of any arity. The plans are closures of the
module: no source is generated or compiled at run time."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import _python_doubles
import numpy as np
import pytest
from _python_doubles import FakeTorch, _fake_engine, _FakeRuntimeNodes, _FakeTrtEngine, _Mode
from trt_runtime_backends.python import plans, replay_plans

ROOT = Path(__file__).resolve().parents[3]
KINDS = ["natural", "prebound", "replay", "copying"]


def _engine(kind: str, torch: FakeTorch) -> tuple[Any, Any, Any]:
    """A fake engine whose current plan is of ``kind``, for (2, 4) float32 inputs; with the
    input and the ``outputs=`` list of the call that made it (``None`` for the torch kinds)."""
    engine = _fake_engine(runtime=_FakeRuntimeNodes() if kind == "copying" else None)
    x = torch.cuda_tensor((2, 4))
    outputs = None
    if kind == "prebound":
        outputs = [torch.cuda_tensor((2, 4))]
        engine.execute(x, outputs=outputs)
    else:
        if kind in ("replay", "copying"):
            engine.outer_graph = "view"
            engine(x)  # the capture
        engine(x)
    return engine, x, outputs


def _executions(engine: Any) -> int:
    """TensorRT enqueues and graph launches so far (what a plan that takes a call makes)."""
    trt = sum(1 for context in engine.trt_engine.contexts for c in context.calls if c[0] == "execute")
    return trt + sum(1 for c in engine._rt.calls if c[0] == "launch")


def test_plans_kinds_are_what_the_tests_say(torch: FakeTorch) -> None:
    kinds = {}
    slots = {}
    for kind in KINDS:
        engine, _, _ = _engine(kind, torch)
        kinds[kind] = engine._lanes[0].fast_entry
        if kind in ("replay", "copying"):
            (slots[kind],) = engine._lanes[0].outer_graphs.cache.values()
    # a slot with copy nodes has two plans, the plain one for its static buffers; the doubles'
    # plain runtime has no copy nodes: one
    assert slots["copying"].static_plan is not slots["copying"].plan is kinds["copying"]
    assert slots["replay"].static_plan is slots["replay"].plan is kinds["replay"]
    assert len({id(p) for p in kinds.values()}) == 4


def _module(kind: str) -> Any:
    """The module whose closures the plans of ``kind`` are."""
    return replay_plans if kind in ("replay", "copying") else plans


@pytest.mark.parametrize("kind", KINDS)
def test_plans_are_closures_of_the_plans_module(kind: str, torch: FakeTorch) -> None:
    engine, _, _ = _engine(kind, torch)
    plan = engine._lanes[0].fast_entry
    assert plan.__code__.co_filename == _module(kind).__file__
    assert all(cell.cell_contents is not plan for cell in plan.__closure__)  # no cycle through itself


@pytest.mark.parametrize("kind", ["natural", "replay", "copying"])
@pytest.mark.parametrize("bad", ["dtype", "contiguity", "device", "type", "count", "outputs"])
def test_plans_torch_kinds_decline_inputs_they_do_not_take(kind: str, bad: str, torch: FakeTorch) -> None:
    engine, x, _ = _engine(kind, torch)
    plan = engine._lanes[0].fast_entry
    before = _executions(engine)
    given = {
        "dtype": ((torch.cuda_tensor((2, 4), torch.float16),), None),
        "contiguity": ((torch.cuda_tensor((2, 4), contiguous=False),), None),
        "device": ((torch.Tensor((2, 4), torch.float32, 1),), None),
        "type": ((np.ones((2, 4), np.float32),), None),
        "count": ((x, x), None),
        "outputs": ((x,), [torch.cuda_tensor((2, 4))]),
    }[bad]
    inputs, outputs = given
    assert plan(inputs, None, outputs) is None  # declined: the full path checks and runs it
    assert _executions(engine) == before
    assert engine._lanes[0].fast_entry is plan
    assert plan((x,), None, None) is not None and _executions(engine) == before + 1  # and takes x


@pytest.mark.parametrize("bad", ["pointer", "shape", "other output"])
def test_plans_prebound_declines_other_pointers_shapes_and_arrays(bad: str, torch: FakeTorch) -> None:
    engine, x, outputs = _engine("prebound", torch)
    plan = engine._lanes[0].fast_entry
    before = _executions(engine)
    if bad == "pointer":
        x._ptr += 4096
    elif bad == "shape":
        x.shape = torch.Size((1, 4))
    else:
        outputs = [torch.cuda_tensor((2, 4))]
    assert plan((x,), None, outputs) is None
    assert _executions(engine) == before and engine._lanes[0].fast_entry is plan


@pytest.mark.parametrize("kind", KINDS)
def test_plans_switch_to_the_plan_their_table_holds(kind: str, torch: FakeTorch) -> None:
    """Inputs of another shape (other arrays, for pre-bound calls) remembered before: the plan
    hands the call to the table's plan for them, which becomes the lane's current plan; a
    shape the table does not hold is declined."""
    engine, _, outputs = _engine(kind, torch)
    first = engine._lanes[0].fast_entry
    b = torch.cuda_tensor((3, 4))
    b_out = [torch.cuda_tensor((3, 4))] if outputs is not None else None
    for _ in range(2):  # (a capture first, under the outer graph)
        if b_out is None:
            engine(b)
        else:
            engine.execute(b, outputs=b_out)
    second = engine._lanes[0].fast_entry
    assert second is not first
    engine._lanes[0].fast_entry = first
    before = _executions(engine)
    result = first((b,), None, b_out)
    assert result is not None and result[0].shape == (3, 4)
    assert engine._lanes[0].fast_entry is second and _executions(engine) == before + 1
    unknown = torch.cuda_tensor((5, 4))
    assert first((unknown,), None, [torch.cuda_tensor((5, 4))] if outputs else None) is None


# -- arity: n inputs, m outputs -----------------------------------------------------------------
def _multi_engine(monkeypatch: pytest.MonkeyPatch, n: int, m: int, **kwargs: Any) -> Any:
    """A fake static engine with inputs x0..x{n-1} and outputs y0..y{m-1}, all (2, 4) float32."""

    class Multi(_FakeTrtEngine):
        def __init__(self, batch: int = -1) -> None:
            super().__init__(batch)
            self.tensors = {
                **{f"x{i}": ("FLOAT", (2, 4), _Mode.INPUT) for i in range(n)},
                **{f"y{j}": ("FLOAT", (2, 4), _Mode.OUTPUT) for j in range(m)},
            }
            self.num_io_tensors = n + m

    monkeypatch.setattr(_python_doubles, "_FakeTrtEngine", Multi)
    return _fake_engine(batch=2, **kwargs)


@pytest.mark.parametrize(("n", "m"), [(1, 1), (2, 3), (1, 2), (3, 1)])
@pytest.mark.parametrize("kind", KINDS)
def test_plans_run_calls_of_any_arity(kind: str, n: int, m: int, torch: FakeTorch,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _multi_engine(monkeypatch, n, m, runtime=_FakeRuntimeNodes() if kind == "copying" else None)
    xs = [torch.cuda_tensor((2, 4)) for _ in range(n)]
    outputs = [torch.cuda_tensor((2, 4)) for _ in range(m)] if kind == "prebound" else None
    if kind in ("replay", "copying"):
        engine.outer_graph = "view" if kind == "replay" else "copy"

    def call() -> Any:
        return engine.execute(*xs, outputs=outputs) if outputs is not None else engine.execute(*xs)

    call()
    call()
    plan = engine._lanes[0].fast_entry
    assert plan.__code__.co_filename == _module(kind).__file__
    if kind in ("replay", "copying"):  # (several inputs: the plain plan of its own kind)
        (slot,) = engine._lanes[0].outer_graphs.cache.values()
        assert (slot.static_plan is plan) == (kind == "replay")
    before = _executions(engine)
    for _ in range(3):
        got = call()
        assert len(got) == m and all(y.shape == (2, 4) for y in got)
        assert engine._lanes[0].fast_entry is plan
    assert _executions(engine) == before + 3
    if kind == "natural":  # each call's outputs bound before its enqueue
        bound = [c[2] for c in engine.trt_engine.contexts[-1].calls if c[0] == "address" and c[1] == "y0"]
        assert bound[-1] == got[0].data_ptr()
    if kind != "prebound":  # the checks of the last of n inputs
        assert plan((*xs[:-1], torch.cuda_tensor((2, 4), torch.float16)), None, None) is None
        assert plan((*xs[:-1], torch.cuda_tensor((3, 4))), None, None) is None
        assert _executions(engine) == before + 3


# -- no source code at run time -----------------------------------------------------------------
def _source_runners(path: Path) -> list[str]:
    """Calls of ``exec``, ``eval`` and the built-in ``compile`` in a module, as ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("exec", "eval", "compile")):
            found.append(f"{path.name}:{node.lineno} {node.func.id}")
    return found


def test_plans_no_source_is_executed_at_run_time() -> None:
    """Neither the core nor the backends build and run source: no ``exec(``, ``eval(`` or
    built-in ``compile(`` (``re.compile`` and the like are attributes, not the built-in)."""
    files = [p for folder in ("trt_runtime", "backends") for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 50
    assert [hit for path in files for hit in _source_runners(path)] == []


def test_plans_source_runner_finder_finds_them(tmp_path: Path) -> None:
    module = tmp_path / "runner.py"
    module.write_text("import re\nre.compile('x')\nexec(compile('1', 'x', 'eval'))\neval('1')\n",
                      encoding="utf-8")
    assert sorted(hit.split()[-1] for hit in _source_runners(module)) == ["compile", "eval", "exec"]
