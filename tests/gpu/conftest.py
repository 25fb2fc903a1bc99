"""GPU test setup: skip with a visible reason without a CUDA GPU or TensorRT-RTX, and build
the engines these tests use once per session, on the GPU host, with trt_runtime.builders."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or ``None`` when they can."""
    try:
        import tensorrt_rtx  # noqa: F401
    except ImportError as exc:
        return f"tensorrt_rtx is not installed ({exc}): pip install -c constraints.txt -e '.[rtx]'"
    try:
        from cuda.bindings import runtime
    except ImportError as exc:
        return f"cuda-python is not installed ({exc}): pip install -c constraints.txt -e '.[cuda]'"
    try:
        err, count = runtime.cudaGetDeviceCount()
    except Exception as exc:
        return f"no CUDA GPU: cudaGetDeviceCount raised {exc}"
    if int(err) != 0 or count == 0:
        return f"no CUDA GPU: cudaGetDeviceCount returned {err!s}, {count} device(s)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = None
    for item in items:
        if here not in Path(str(item.fspath)).parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if reason is None:
            reason = gpu_skip_reason() or ""
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


#: Measurements GPU tests want shown in the run's output (see pytest_terminal_summary).
MEASUREMENTS: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASUREMENTS:
        terminalreporter.section("GPU measurements")
        for line in MEASUREMENTS:
            terminalreporter.write_line(line)


@pytest.fixture
def report_measurement(record_property: Any) -> Callable[[str, str], None]:
    """``report_measurement(name, text)``: keep ``text`` in the junit XML and print it in the
    terminal summary, whether the test passes or fails."""

    def report(name: str, text: str) -> None:
        record_property(name, text)
        MEASUREMENTS.append(f"{name}: {text}")

    return report


class EngineFactory:
    """Builds each named engine once per session and keeps its plan on disk as well.

    Builds log through the python backend's logger: TensorRT keeps the first logger of a
    process, and the backend's one captures errors for EngineError messages.
    """

    def __init__(self, directory: Path, logger: Any) -> None:
        self.directory = directory
        self.logger = logger
        self._built: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        if name not in self._built:
            from trt_runtime import builders

            log = self.logger
            recipes: dict[str, Callable[[], Any]] = {
                "mlp_fp16": lambda: builders.build_mlp(256, 8, batch=8, dtype="float16", logger=log),
                "mlp_fp32": lambda: builders.build_mlp(256, 8, batch=8, dtype="float32", logger=log),
                "mlp_dynamic": lambda: builders.build_mlp(64, 4, batch=None, dtype="float32", logger=log),
                "dynamic": lambda: builders.build_dynamic(16, "float32", logger=log),
                "convnet_fp32": lambda: builders.build_convnet(1, "float32", image_size=64, logger=log),
                "convnet_fp16": lambda: builders.build_convnet(1, "float16", image_size=64, logger=log),
                # The engine of the cold/warm cache test: many distinct kernels.
                "resnet18_fp16": lambda: builders.build_convnet(
                    1, "float16", image_size=224, base_channels=64, num_classes=1000, logger=log
                ),
            }
            built = recipes[name]()
            (self.directory / f"{name}.plan").write_bytes(built.plan)
            self._built[name] = built
        return self._built[name]

    def path(self, name: str) -> Path:
        self(name)
        return self.directory / f"{name}.plan"


@pytest.fixture(scope="session")
def python_backend() -> Any:
    """The ``python`` backend, found through its entry point like users find it."""
    if gpu_skip_reason():
        pytest.skip(gpu_skip_reason() or "")
    from trt_runtime import get_backend

    return get_backend("python")


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory, python_backend: Any) -> EngineFactory:
    """``engines("mlp_fp16")`` -> a :class:`trt_runtime.builders.BuiltEngine`, built on first use."""
    return EngineFactory(tmp_path_factory.mktemp("engines"), python_backend.logger)


@pytest.fixture
def load(python_backend: Any, engines: EngineFactory) -> Any:
    """``load("mlp_fp16", **kwargs)`` -> a loaded engine, closed after the test."""
    from trt_runtime import EngineSource

    opened: list[Any] = []

    def _load(name: str, **kwargs: Any) -> Any:
        built = engines(name)
        engine = python_backend.load_engine(EngineSource(built.plan, name=name), **kwargs)
        opened.append(engine)
        return engine

    yield _load
    for engine in opened:
        engine.close()
