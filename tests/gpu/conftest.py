"""GPU test setup: skip with a visible reason without a CUDA GPU or TensorRT-RTX, and build
the engines these tests use once per session, on the GPU host, with trt_runtime.builders; the
torchbind backend, torch and the tiny engines its GPU tests (test_gpu_torchbind*.py) share."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _gpu_outer import engine_opener

from trt_runtime.testing.cuda_arrays import gpu_unavailable


def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or ``None`` when they can."""
    return gpu_unavailable()


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


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """Each GPU test's cyclic garbage (engines dropped unclosed, their buffers, graphs and
    streams) is finalized in that test's teardown, never by a collection a later test of the
    same xdist worker happens to trigger: its finalizers would then run inside that test's
    window (its threads, captures and counts), and an exception they raise would be reported
    as that test's failure (PytestUnraisableExceptionWarning is an error here, pyproject.toml)."""
    yield
    gc.collect()


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
    with engine_opener(python_backend, engines) as open_:
        yield lambda name, **kwargs: open_(name, **kwargs)[0]


# -- the torchbind backend's GPU tests (test_gpu_torchbind*.py) --------------------------------
@pytest.fixture(scope="session")
def torchbind_backend() -> Any:
    """The ``torchbind`` backend through its entry point; skips with the reason it cannot run."""
    from trt_runtime import backend_status, get_backend

    status = backend_status().get("torchbind")
    if status is None:
        pytest.skip("the torchbind backend is not installed (entry point missing)")
    if not status:
        pytest.skip(f"the torchbind backend cannot run here: {status.reason}")
    return get_backend("torchbind")


@pytest.fixture(scope="session")
def torch() -> Any:
    return pytest.importorskip("torch", reason="torch is not installed on this GPU host")


@pytest.fixture(scope="session")
def tiny_plans(python_backend: Any) -> dict[bool, Any]:
    """The tiny engine (``y = 2x + 1``, 8x16 fp16) built with and without
    BuilderFlag.REQUIRE_USER_ALLOCATION (what makes a TensorRT-RTX context capturable)."""

    from trt_runtime import builders

    original = builders._build
    plans = {}
    try:
        for flag in (True, False):
            builders._build = functools.partial(original, require_user_allocation=flag)  # type: ignore[assignment]
            plans[flag] = builders.build_tiny(16, 8, "float16", logger=python_backend.logger)
    finally:
        builders._build = original  # type: ignore[assignment]
    return plans


@pytest.fixture
def open_torchbind(torchbind_backend: Any, engines: Any, tiny_plans: dict[bool, Any]) -> Any:
    """``open_torchbind(name, **kwargs) -> (engine, built)`` for conftest's engines plus
    ``tiny`` and ``tiny_uncapturable``; closed after the test."""

    # torch-tensorrt creates default (STATIC) contexts, which TensorRT-RTX refuses for
    # engines built with REQUIRE_USER_ALLOCATION: both names use the default build.
    own = {"tiny": tiny_plans[False], "tiny_uncapturable": tiny_plans[False]}
    with engine_opener(torchbind_backend, lambda name: own.get(name) or engines(name)) as open_:
        yield open_
