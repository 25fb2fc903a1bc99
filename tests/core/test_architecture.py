"""Rules of the architecture checked on the source: no import cycle among trt_runtime's
modules, the core never imports a backend, each package lives in a folder named as it is
imported, modules stay under 600 lines, and docs/backends.md's capability table matches
:class:`BackendCapabilities`."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import trt_runtime_backends

import trt_runtime
from trt_runtime.protocols import BackendCapabilities

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(trt_runtime.__file__).resolve().parent


BACKENDS = ROOT / "backends" / "trt_runtime_backends"


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: Path = PACKAGE, lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports at module level (``TYPE_CHECKING``
    blocks included: type checkers follow them; imports inside functions are lazy and
    left out unless ``lazy``)."""
    files = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        nodes = list(tree.body)
        while nodes:
            node = nodes.pop()
            if isinstance(node, ast.If | ast.Try) or (
                    lazy and not isinstance(node, ast.Import | ast.ImportFrom)):
                nodes.extend(ast.iter_child_nodes(node))
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base]).rstrip(".")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in files:
                        edges.add(sub)
                    elif base in files:
                        edges.add(base)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_architecture_no_import_cycle_among_trt_runtime_modules() -> None:
    graph = _import_graph()
    assert "trt_runtime.protocols" in graph and graph["trt_runtime.engine"], "the graph was read"
    assert _cycles(graph) == []


def test_architecture_no_import_cycle_among_backend_modules() -> None:
    """Read by folder (``backends/trt_runtime_backends``), the backends' imports resolve: the
    graph has its edges, and no cycle."""
    graph = _import_graph(BACKENDS)
    assert "trt_runtime_backends.python.backend" in graph["trt_runtime_backends.python"]
    assert "trt_runtime_backends.torchbind.engine" in graph["trt_runtime_backends.torchbind"]
    assert _cycles(graph) == []


def test_architecture_no_import_cycle_among_backend_modules_counting_deferred_imports() -> None:
    """Imports inside functions count too: a cycle hidden behind a deferred import (as the
    python backend's plans, fast paths and graph hooks had) is still a cycle to a reader."""
    graph = _import_graph(BACKENDS, lazy=True)
    assert "trt_runtime_backends.python.shapes" in graph["trt_runtime_backends.python.plans"]
    assert _cycles(graph) == []


def test_architecture_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_architecture_core_never_imports_a_backend() -> None:
    offenders = [
        str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
        if re.search(r"^\s*(from|import) trt_runtime_backends", p.read_text(encoding="utf-8"), re.M)
    ]
    assert offenders == []


def _pyproject() -> dict[str, object]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_architecture_package_folders_are_named_as_imported() -> None:
    """Each installed package's folder ends in its import name, so a reader (or a tool that
    follows imports from a checkout) finds ``trt_runtime_backends.python`` at
    ``backends/trt_runtime_backends/python``."""
    setuptools = _pyproject()["tool"]["setuptools"]  # type: ignore[index]
    package_dir: dict[str, str] = setuptools["package-dir"]
    assert package_dir, "pyproject names the package folders"
    for name, folder in package_dir.items():
        assert Path(folder).name == name, f"package {name!r} lives in {folder!r}"
        assert (ROOT / folder / "__init__.py").is_file(), folder
    for name in setuptools["packages"]:
        top, *rest = name.split(".")
        assert (ROOT / package_dir[top] / Path(*rest) / "__init__.py").is_file(), name


def test_architecture_installed_backends_resolve_to_their_folder() -> None:
    """What imports as ``trt_runtime_backends`` is the checkout's ``backends/trt_runtime_backends``
    (the strict editable install links to it), and mypy finds it there by folder."""
    installed = Path(trt_runtime_backends.__file__).resolve().parent
    if not installed.is_relative_to(ROOT):
        pytest.skip(f"trt_runtime_backends is installed from {installed}, not from this checkout")
    assert installed == ROOT / "backends" / "trt_runtime_backends"
    mypy = _pyproject()["tool"]["mypy"]  # type: ignore[index]
    assert (ROOT / mypy["mypy_path"] / "trt_runtime_backends" / "__init__.py").is_file()


@pytest.mark.parametrize("folder", ["trt_runtime", "backends"])
def test_architecture_no_module_over_600_lines(folder: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert long == {}


def _documented_flags() -> dict[str, str]:
    """The rows of the capability table in docs/backends.md: flag -> description."""
    text = (ROOT / "docs" / "backends.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\|\s*`(\w+)`\s*\|\s*(.+?)\s*\|\s*$", text, re.M))


def test_architecture_docs_capability_table_matches_backend_capabilities() -> None:
    fields = [f.name for f in dataclasses.fields(BackendCapabilities) if f.name != "notes"]
    documented = _documented_flags()
    assert list(documented) == fields, "docs/backends.md's capability table must list every flag, in order"
    assert all(documented.values())


_TEMPLATE = (
    "execute", "__call__", "_lease_call", "runtime_settings", "outer_graph", "contexts", "static_inputs",
    "close", "_new_lane", "_exclusive",
)


def _engine_classes() -> list[type]:
    from trt_runtime_backends.python.engine import PythonEngine
    from trt_runtime_backends.torchbind.engine import TorchbindEngine

    from trt_runtime.testing.memory import MemoryEngine

    return [PythonEngine, TorchbindEngine, MemoryEngine]


@pytest.mark.parametrize("cls", _engine_classes(), ids=lambda c: c.__name__)
def test_architecture_no_engine_overrides_the_call_template(cls: type) -> None:
    from trt_runtime.engine import EngineBase

    overridden = [
        name for name in _TEMPLATE
        for klass in cls.__mro__[: cls.__mro__.index(EngineBase)]
        if name in vars(klass)
    ]
    assert overridden == []


def test_architecture_memory_backend_implements_the_documented_lane_ops() -> None:
    """docs/writing-a-backend.md's skeleton backend implements every LaneOps and GraphOps
    method, and the page's table names each of them."""
    from trt_runtime.lane import LaneOps
    from trt_runtime.outer import GraphOps

    text = (ROOT / "docs" / "writing-a-backend.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\|\s*`(\w+)`", text, re.M))
    for protocol in (LaneOps, GraphOps):
        methods = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
        assert methods and methods <= table, sorted(methods - table)


def _lane_classes() -> list[tuple[type, type]]:
    """(LaneOps class, GraphOps class) of each backend."""
    from trt_runtime_backends.python.graphs import PythonGraphs
    from trt_runtime_backends.python.lane import PythonLane
    from trt_runtime_backends.torchbind.graphs import TorchbindGraphs
    from trt_runtime_backends.torchbind.lane import TorchbindLane

    from trt_runtime.testing.memory import MemoryLane

    return [(PythonLane, PythonGraphs), (TorchbindLane, TorchbindGraphs), (MemoryLane, MemoryLane)]


@pytest.mark.parametrize("ops, graphs", _lane_classes(), ids=lambda c: c.__name__)
def test_architecture_backends_write_every_lane_method_in_their_classes(ops: type, graphs: type) -> None:
    """Every GraphOps method, and the LaneOps methods without a default, are written in the
    backend's own classes (none falls back to a protocol's empty body)."""
    from trt_runtime.lane import LaneOps
    from trt_runtime.outer import GraphOps

    def written(cls: type, name: str) -> bool:
        return any(name in vars(k) for k in cls.__mro__ if k not in (LaneOps, GraphOps, object))

    required = ("create_context", "destroy_context", "run")
    graph_methods = [n for n, v in vars(GraphOps).items() if callable(v) and not n.startswith("_")]
    assert [n for n in required if not written(ops, n)] == []
    assert [n for n in graph_methods if not written(graphs, n)] == []


def _loaded_engines() -> list[Any]:
    """An engine of each backend, loaded with the CPU doubles, after calls on two contexts
    (and under the outer graph) so that whatever is made lazily exists."""
    import numpy as np
    from _python_doubles import _fake_engine
    from _torchbind_doubles import inputs, make_backend, source

    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    spec = trt_runtime.TensorSpec("x", "float32", (2, 4), is_input=True)
    memory = MemoryBackend().load_engine(trt_runtime.EngineSource(
        MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)])))
    python = _fake_engine(batch=8)
    torchbind = make_backend("2.14.0")[0].load_engine(source())
    engines = [(python, (np.ones((8, 4), np.float32),)), (torchbind, inputs()),
               (memory, (np.ones((2, 4), np.float32),))]
    for engine, args in engines:
        engine.contexts = 2
        engine(*args)
        engine.outer_graph = "copy"
        engine(*args)
        engine(*args)
    return [engine for engine, _ in engines]


@pytest.mark.filterwarnings("ignore::trt_runtime.ContextOverlapWarning")
def test_architecture_engines_are_small_objects_of_few_bases() -> None:
    """An engine is one thing, not also a lane: at most 2 base classes (EngineBase and its
    ABC) and at most 20 instance attributes, counted on a loaded engine of each backend."""
    from trt_runtime.engine import EngineBase

    for engine in _loaded_engines():
        cls = type(engine)
        assert len(cls.__mro__[1:-1]) <= 2 and cls.__bases__ == (EngineBase,), cls.__mro__
        attributes = sorted(vars(engine))
        assert len(attributes) <= 20, f"{cls.__name__}: {len(attributes)} attributes {attributes}"
        engine.close()


def _sources() -> list[Path]:
    return [*PACKAGE.rglob("*.py"), *BACKENDS.rglob("*.py")]


def test_architecture_no_method_is_grafted_onto_a_class() -> None:
    """Methods live in the class that shows them: no class decorator but ``dataclass`` (and
    ``runtime_checkable``), no ``setattr(cls, ...)``, no ``Class.name = function`` after a
    class statement."""
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for deco in node.decorator_list:
                    target = deco.func if isinstance(deco, ast.Call) else deco
                    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                    if name not in ("dataclass", "runtime_checkable"):
                        offenders.append(f"{path.name}: @{name} on {node.name}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Name) and first.id in ("cls", "klass", *classes):
                    offenders.append(f"{path.name}:{node.lineno}: setattr({first.id}, ...)")
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if (isinstance(target, ast.Attribute) and getattr(target.value, "id", "") in classes
                            and isinstance(node.value, ast.Name | ast.Call | ast.Lambda | ast.Attribute)):
                        offenders.append(f"{path.name}:{node.lineno}: {target.value.id}.{target.attr} = ...")  # type: ignore[attr-defined]
    assert offenders == []


def test_architecture_the_call_entry_points_are_written_in_the_engine_class() -> None:
    """``execute`` and ``__call__`` are EngineBase's own methods, from its class body."""
    from trt_runtime.engine import EngineBase

    for name in ("execute", "__call__"):
        code = vars(EngineBase)[name].__code__
        assert code.co_name == name and Path(code.co_filename).name == "engine.py"


def test_architecture_outer_graphs_and_lanes_are_typed() -> None:
    """The objects that cross the core/backend boundary have types: no ``Any`` lane or ops."""
    from trt_runtime import lane, outer

    assert outer.OuterGraphs.__init__.__annotations__["ops"] == "GraphOps"
    made = lane.Lane.__init__.__annotations__
    assert made["engine"] == "LaneOwner" and made["make_ops"] == "Callable[[Lane], LaneOps]"
    assert lane.Lane.call.__annotations__["return"] == "list[Any]"
