"""Engine files the command-line tests run the commands on: a real dynamic engine (plan, TR01,
.pte; built once per session, as several modules use it), a memory-backend engine, a file of
random bytes and a private cache directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trt_runtime import TensorSpec
from trt_runtime.cli.demo import write_pte
from trt_runtime.testing.memory import AffineOutput, MemoryBackend


@pytest.fixture(scope="session")
def built_dynamic() -> Any:
    """A real TensorRT-RTX engine with a dynamic batch, built on the CPU."""
    pytest.importorskip("tensorrt_rtx", reason="building engines needs tensorrt-rtx")
    from trt_runtime import builders

    return builders.build_dynamic(width=8)


@pytest.fixture(scope="session")
def engine_files(tmp_path_factory: pytest.TempPathFactory, built_dynamic: Any) -> dict[str, Path]:
    """The dynamic engine as a raw plan and a TR01 blob."""
    from trt_runtime.formats import write_plan, write_tr01

    built = built_dynamic
    root = tmp_path_factory.mktemp("engines")
    plan, tr01 = root / "dyn.plan", root / "dyn.tr01"
    write_plan(plan, built.plan)
    write_tr01(tr01, built.plan, (*built.inputs, *built.outputs), device_id=0)
    return {"plan": plan, "tr01": tr01}


@pytest.fixture(scope="session")
def pte_file(tmp_path_factory: pytest.TempPathFactory, built_dynamic: Any) -> Path:
    """The dynamic engine as a single-delegate .pte program."""
    target = tmp_path_factory.mktemp("pte") / "dyn.pte"
    reason = write_pte(built_dynamic, target)
    if reason:
        pytest.skip(f"cannot write a .pte here: {reason}")
    return target


@pytest.fixture
def memory_engine(tmp_path: Path) -> Path:
    """An engine of the numpy ``memory`` backend: ``y = 2 x + 1``, batch 1..8 (opt 2)."""
    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="affine")
    path = tmp_path / "affine.eng"
    path.write_bytes(data)
    return path


# -- files that are not engines ----------------------------------------------------------


@pytest.fixture
def random_file(tmp_path: Path) -> Path:
    """1 MiB of random bytes: no TensorRT, TR01/TR02 or .pte magic."""
    from trt_runtime.formats import PLAN_MAGICS, detect_format

    data = np.random.default_rng(14).bytes(1 << 20)
    assert data[:4] not in PLAN_MAGICS and detect_format(memoryview(data)) == "plan"
    path = tmp_path / "random.bin"
    path.write_bytes(data)
    return path


# -- cache ----------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default cache directory, moved under ``tmp_path`` through XDG_CACHE_HOME."""
    if sys.platform != "linux":
        pytest.skip("XDG_CACHE_HOME moves the platformdirs cache directory on Linux only")
    monkeypatch.setenv("XDG_CACHE_HOME", os.fspath(tmp_path / "xdg"))
    from trt_runtime.cache import default_cache_dir

    directory = default_cache_dir()
    assert directory.is_relative_to(tmp_path)
    return directory
