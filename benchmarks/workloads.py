"""The engines a benchmark run measures, built on the GPU host with :mod:`trt_runtime.builders`.

A workload is one engine plus the input shapes each call cycles through (one shape: a
static engine). Building needs TensorRT-RTX but no GPU; tensors need torch with CUDA.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["WORKLOADS", "WORKLOADS_BY_KEY", "Tensors", "Workload", "build", "make_tensors", "parse_workloads"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """An engine recipe and the shapes its calls cycle through."""

    key: str
    title: str
    #: Input shapes, one per call in turn (``len > 1``: the engine is dynamic).
    shapes: tuple[tuple[int, ...], ...]
    #: Calls per enqueue chunk: small enough that a chunk's kernel launches fit CUDA's
    #: launch queue, a multiple of ``len(shapes)`` so every shape is timed alike.
    chunk: int
    #: ``builders`` function name and its keyword arguments.
    builder: str
    arguments: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments)
        return f"{self.builder}({args})"


WORKLOADS = (
    Workload(
        "tiny",
        "tiny fp16 8x16 (y = 2x + 1): per-call overhead dominates",
        ((8, 16),),
        32,
        "build_tiny",
        (("width", 16), ("batch", 8), ("dtype", "float16")),
    ),
    Workload(
        "mlp",
        "MLP 8 x (256x256 matmul + ReLU) fp16, batch 8",
        ((8, 256),),
        16,
        "build_mlp",
        (("width", 256), ("layers", 8), ("batch", 8), ("dtype", "float16")),
    ),
    Workload(
        "convnet",
        "ResNet-18-like conv net fp16 224x224, batch 1",
        ((1, 3, 224, 224),),
        4,
        "build_convnet",
        (("batch", 1), ("dtype", "float16"), ("image_size", 224), ("base_channels", 64),
         ("num_classes", 1000)),
    ),
    Workload(
        "dynamic",
        "dynamic batch fp16 256-wide (relu(x @ W) + 1), batches 1/8/64 in turn",
        ((1, 256), (8, 256), (64, 256)),
        15,
        "build_dynamic",
        (("width", 256), ("dtype", "float16"), ("profiles", ((1, 8, 64),))),
    ),
)
WORKLOADS_BY_KEY = {w.key: w for w in WORKLOADS}


def parse_workloads(text: str) -> list[str]:
    """Workload keys from a comma-separated list (ValueError naming the allowed set)."""
    keys = [part.strip() for part in text.split(",") if part.strip()]
    for key in keys:
        if key not in WORKLOADS_BY_KEY:
            raise ValueError(f"workload must be one of {', '.join(WORKLOADS_BY_KEY)}; got {key!r}")
    if not keys:
        raise ValueError(f"no workload given: choose from {', '.join(WORKLOADS_BY_KEY)}")
    return keys


class _Progress:
    """Prints the builder's phases (start and end of each top-level phase) to stderr."""

    def __init__(self, key: str, echo: Callable[[str], None]) -> None:
        self.key = key
        self.echo = echo
        self.seen: set[str] = set()

    def __call__(self, phase: str, step: int, total: int) -> None:
        if phase not in self.seen:
            self.seen.add(phase)
            self.echo(f"  build {self.key}: {phase} ({total} steps)")


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build(workload: Workload, logger: Any = None, echo: Callable[[str], None] = _stderr) -> tuple[Any, float]:
    """Build ``workload``'s engine; ``(BuiltEngine, seconds)``. Prints progress through ``echo``."""
    from trt_runtime import builders

    make = getattr(builders, workload.builder)
    echo(f"building {workload.key}: {workload.describe()}")
    t0 = time.perf_counter()
    built = make(**dict(workload.arguments), progress=_Progress(workload.key, echo), logger=logger)
    seconds = time.perf_counter() - t0
    echo(f"built {workload.key} in {seconds:.1f} s ({len(built.plan) / 1e6:.2f} MB plan)")
    return built, seconds


@dataclasses.dataclass
class Tensors:
    """Device inputs, preallocated outputs and host copies of a workload, one per shape.

    Every input is a view of one buffer of the largest shape (likewise outputs), so all
    shapes share one address and pre-bound raw loops stay valid as shapes cycle.
    """

    inputs: list[Any]
    outputs: list[Any]
    out_shapes: list[tuple[int, ...]]
    #: float64 host input of the first shape, for output checks.
    host_input: Any


def make_tensors(torch: Any, built: Any, workload: Workload, seed: int = 0) -> Tensors:
    """Random device inputs of every shape of ``workload`` and matching empty outputs."""
    import numpy as np

    from trt_runtime.dtypes import normalize_dtype

    spec_in, spec_out = built.inputs[0], built.outputs[0]
    largest = max(s[0] for s in workload.shapes)
    rest_in = workload.shapes[0][1:]
    rest_out = tuple(d for d in spec_out.shape[1:])
    dtype_in = getattr(torch, normalize_dtype(spec_in.dtype))
    dtype_out = getattr(torch, normalize_dtype(spec_out.dtype))
    host = np.random.default_rng(seed).standard_normal((largest, *rest_in)).astype(np.float32)
    x = torch.from_numpy(host).to(device="cuda", dtype=dtype_in)
    y = torch.empty((largest, *rest_out), device="cuda", dtype=dtype_out)
    torch.cuda.synchronize()
    first = workload.shapes[0][0]
    return Tensors(
        inputs=[x[: s[0]] for s in workload.shapes],
        outputs=[y[: s[0]] for s in workload.shapes],
        out_shapes=[(s[0], *rest_out) for s in workload.shapes],
        host_input=x[:first].float().cpu().numpy().astype(np.float64),
    )
