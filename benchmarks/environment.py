"""What this machine can run: GPU, TensorRT, the backends, torch-tensorrt; versions for the record.

Each requirement a row may have (``"gpu"``, ``"tensorrt"``, ``"backend:python"``,
``"outer:python"``, ``"backend:torchbind"``, ``"torch_tensorrt"``) maps to the reason it
is not met here, or is absent when it is. Nothing here raises: a broken stack becomes a
reason. :func:`install_wheels` puts the small wheels torch-tensorrt's Python runtime
needs (carried to an offline host) on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import importlib.util
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Environment",
    "import_torch_tensorrt_first",
    "install_wheels",
    "one_line",
    "probe",
]

#: Distributions whose versions every result records.
DISTRIBUTIONS = (
    "trt-runtime",
    "tensorrt-rtx",
    "tensorrt",
    "torch",
    "torch-tensorrt-rtx",
    "torch-tensorrt",
    "cuda-core",
    "cuda-bindings",
    "numpy",
)


def one_line(exc: BaseException | str, limit: int = 300) -> str:
    """An exception (or text) on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split())
    return text[:limit] + ("..." if len(text) > limit else "")


@dataclasses.dataclass
class Environment:
    """Unmet requirements (requirement -> reason) and facts about the host."""

    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def reason(self, requirements: Sequence[str]) -> str:
        """Why something needing ``requirements`` cannot run (first unmet one), or ``""``."""
        for requirement in requirements:
            why = self.reasons.get(requirement, "")
            if why:
                return why
        return ""


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe(torch_tensorrt_error: str = "") -> Environment:
    """Look at the GPU, torch, TensorRT and the backends without running an engine.

    ``torch_tensorrt_error``: why ``import torch_tensorrt`` failed earlier (see
    :func:`import_torch_tensorrt_first`), if it did.
    """
    env = Environment()
    env.info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {dist: _version(dist) for dist in DISTRIBUTIONS},
    }
    gpu = _probe_gpu(env.info)
    if gpu:
        env.reasons["gpu"] = gpu
    try:
        from trt_runtime import builders

        trt = builders.import_tensorrt()
        env.info["tensorrt_module"] = f"{trt.__name__} {trt.__version__}"
    except ImportError as exc:
        env.reasons["tensorrt"] = one_line(exc)
    _probe_backends(env)
    if torch_tensorrt_error:
        env.reasons["torch_tensorrt"] = f"torch_tensorrt does not import: {torch_tensorrt_error}"
    elif importlib.util.find_spec("torch_tensorrt") is None:
        env.reasons["torch_tensorrt"] = "torch_tensorrt is not installed (pip install torch-tensorrt-rtx)"
    return env


def _probe_backends(env: Environment) -> None:
    import trt_runtime

    try:
        status = trt_runtime.backend_status()
    except Exception as exc:  # a broken plugin must not stop the benchmark
        status = {}
        env.info["backend_status_error"] = one_line(exc)
    for name in ("python", "torchbind"):
        if name not in status:
            env.reasons[f"backend:{name}"] = f"the {name!r} backend is not installed"
            env.reasons[f"outer:{name}"] = env.reasons[f"backend:{name}"]
            continue
        availability = status[name]
        if not availability:
            env.reasons[f"backend:{name}"] = f"the {name!r} backend cannot run here: {availability.reason}"
        try:
            caps = trt_runtime.load_backend(name).capabilities
        except Exception as exc:
            env.reasons[f"outer:{name}"] = f"the {name!r} backend does not load: {one_line(exc)}"
            continue
        if not getattr(caps, "supports_outer_cuda_graph", False):
            note = caps.notes.get("supports_outer_cuda_graph", "no supports_outer_cuda_graph capability")
            env.reasons[f"outer:{name}"] = f"the {name!r} backend has no outer CUDA-graph wrap: {note}"


def _probe_gpu(info: dict[str, Any]) -> str:
    """Empty when a CUDA GPU is usable by torch; otherwise why not. Fills device facts."""
    try:
        from cuda.bindings import runtime as cudart

        err, count = cudart.cudaGetDeviceCount()
        if err != cudart.cudaError_t.cudaSuccess:
            return f"no CUDA GPU: cudaGetDeviceCount failed with {getattr(err, 'name', err)}"
        if count == 0:
            return "no CUDA GPU: cudaGetDeviceCount found 0 devices"
        info["driver"] = cudart.cudaDriverGetVersion()[1]
    except ImportError:
        pass  # torch decides below
    except Exception as exc:
        return f"no CUDA GPU: {one_line(exc)}"
    try:
        import torch
    except Exception as exc:  # ImportError, or OSError from its CUDA libraries
        return f"torch is not importable ({one_line(exc)}): the rows' inputs are torch CUDA tensors"
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU: torch.cuda.is_available() is False"
        info["device"] = torch.cuda.get_device_name(0)
        info["compute_capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
        info["torch_cuda"] = torch.version.cuda
        info["torch_module"] = torch.__version__
    except Exception as exc:
        return f"no CUDA GPU usable by torch: {one_line(exc)}"
    return ""


def install_wheels(directory: str | Path, target: str | Path | None = None) -> dict[str, Any]:
    """Install the wheels in ``directory`` (no index, no dependencies) into ``target``
    and append it to ``sys.path``, so modules the host lacks are found there and the
    host's own versions still win. Returns what was done, for the record.

    For an offline GPU host: carry the wheels torch-tensorrt's Python runtime imports
    (see docs/benchmarks.md) and pass ``--wheels .whl/bench``.
    """
    source = Path(directory)
    wheels = sorted(source.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no *.whl files in {str(source)!r}")
    site = Path(target) if target is not None else Path(tempfile.gettempdir()) / "trt-bench-site"
    site.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--upgrade", "--target", str(site), *map(str, wheels)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install --target {site} failed: {one_line(proc.stderr or proc.stdout)}")
    if str(site) not in sys.path:
        sys.path.append(str(site))
    importlib.invalidate_caches()
    return {"directory": str(source), "target": str(site), "wheels": [w.name for w in wheels]}


def import_torch_tensorrt_first() -> str:
    """Import ``torch_tensorrt`` before anything loads torch-tensorrt's runtime library;
    the error on one line if it fails (empty on success or when it is not installed).

    ``import torch_tensorrt`` registers the torchbind classes unconditionally, and torch
    aborts the process if they are already registered (by the torchbind backend's probe).
    The torchbind backend checks for registered classes before loading the library, so
    this order is safe.
    """
    if importlib.util.find_spec("torch_tensorrt") is None:
        return ""
    try:
        import torch_tensorrt  # noqa: F401
    except BaseException as exc:  # also SystemExit from a failing import-time check
        if isinstance(exc, KeyboardInterrupt):
            raise
        return f"{type(exc).__name__}: {one_line(exc)}"
    return ""
