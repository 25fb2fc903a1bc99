"""Write the ``.pte`` fixtures of tests/fixtures/executorch/ with ExecuTorch itself.

The CPU tests read these files to prove that trt-runtime reads programs ExecuTorch
writes, and that what ``trt_runtime.executorch.to_pte`` writes carries the metadata
ExecuTorch itself emits for a CUDA delegate. Nothing here runs in CI: it needs torch
and executorch (1.5.1, the version the fixtures were made with), which the project
does not depend on. Run it in a throwaway environment::

    python3 -m venv /tmp/etvenv
    /tmp/etvenv/bin/pip install torch==2.13.0 executorch==1.5.1
    .venv/bin/python tools/make_executorch_fixtures.py --build-engine /tmp/dyn4.plan
    /tmp/etvenv/bin/python tools/make_executorch_fixtures.py --engine /tmp/dyn4.plan

The first command needs TensorRT-RTX (the project's venv) and only builds the small
engine the TensorRT reference programs carry; the second needs torch + executorch.
Fixtures:

* ``xnnpack_linear_segment.pte``: ``Linear(4, 3)`` delegated to XNNPACK, its data in a
  segment (ExecuTorch's default);
* ``xnnpack_linear_inline.pte``: the same with the delegate data inline;
* ``two_methods.pte``: methods ``forward`` (XNNPACK) and ``scale`` (portable kernels);
* ``portable_add.pte``: no delegate at all;
* ``tensorrt_dynamic_cuda1.pte``: a delegate with backend id ``TensorRTBackend`` (a
  stand-in ``BackendDetails`` whose processed bytes are the TR01 blob of the engine),
  dynamic batch 1..8, ``CompileSpec("target_device", b"cuda:1")``, exported with the
  configuration ExecuTorch documents for device delegates that take the caller's
  memory (``PropagateDeviceConfig(skip_h2d_for_method_inputs=True,
  skip_d2h_for_method_outputs=True)``, ``MemoryPlanningPass(alloc_graph_input=False,
  alloc_graph_output=False)``);
* ``tensorrt_static_inline_cuda0.pte``: static batch 2, ``cuda:0``, delegate inline.

``MANIFEST.json`` records the versions, the options and each file's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "executorch"
WIDTH = 4
MAX_BATCH = 8


def build_engine(path: Path) -> None:
    """Build ``y = relu(x @ W) + 1``, x (batch 1..8, 4), with TensorRT-RTX (project venv)."""
    sys.path.insert(0, str(ROOT))
    from trt_runtime import builders

    built = builders.build_dynamic(width=WIDTH, profiles=((1, 4, MAX_BATCH),))
    path.write_bytes(built.plan)
    print(f"wrote {path} ({len(built.plan)} bytes)")


def _bindings(batch: int | None) -> tuple[Any, ...]:
    from trt_runtime import TensorSpec

    if batch is None:
        profile = (((1, WIDTH), (4, WIDTH), (MAX_BATCH, WIDTH)),)
        return (
            TensorSpec("x", "float32", (-1, WIDTH), True, profiles=profile),
            TensorSpec("y", "float32", (-1, WIDTH), False),
        )
    return (
        TensorSpec("x", "float32", (batch, WIDTH), True),
        TensorSpec("y", "float32", (batch, WIDTH), False),
    )


def make(engine_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    import executorch
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
    from executorch.exir.backend.utils import tag_constant_data
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig

    from trt_runtime.formats import pack_tr01

    engine = engine_path.read_bytes()
    # The blob the stand-in backend returns for the next lowering.
    blob: list[bytes] = []

    # The class name is the backend id ExecuTorch writes, as with torch-tensorrt's backend.
    class TensorRTBackend(BackendDetails):  # type: ignore[misc]
        @staticmethod
        def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
            return PreprocessResult(processed_bytes=blob[-1])

    class WholeGraphPartitioner(Partitioner):  # type: ignore[misc]
        def __init__(self, specs: list[Any]) -> None:
            super().__init__()
            self.delegation_spec = DelegationSpec("TensorRTBackend", specs)

        def partition(self, program: Any) -> Any:
            tags = {}
            for node in program.graph_module.graph.nodes:
                if node.op == "call_function":
                    node.meta["delegation_tag"] = "tensorrt_0"
            tags["tensorrt_0"] = self.delegation_spec
            tag_constant_data(program)
            return PartitionResult(tagged_exported_program=program, partition_tags=tags)

    class Dyn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(WIDTH, WIDTH))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ self.w) + 1

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    class Add(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    torch.manual_seed(0)
    linear = torch.nn.Linear(WIDTH, 3).eval()
    example = (torch.randn(2, WIDTH),)
    device_config = ExecutorchBackendConfig(
        propagate_device_config=PropagateDeviceConfig(
            skip_h2d_for_method_inputs=True, skip_d2h_for_method_outputs=True
        ),
        enable_non_cpu_memory_planning=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False),
    )
    written: dict[str, dict[str, Any]] = {}

    def save(name: str, manager: Any, options: dict[str, Any]) -> None:
        target = OUT / name
        target.write_bytes(manager.buffer)
        written[name] = {
            "bytes": len(manager.buffer),
            "sha256": hashlib.sha256(manager.buffer).hexdigest(),
            **options,
        }
        print(f"wrote {target} ({len(manager.buffer)} bytes)")

    def xnnpack(programs: Any, **config: Any) -> Any:
        edge = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()])
        return edge.to_executorch(ExecutorchBackendConfig(**config))

    ep = torch.export.export(linear, example)
    save("xnnpack_linear_segment.pte", xnnpack(ep), {"model": "Linear(4, 3)", "delegate": "XNNPACK"})
    save(
        "xnnpack_linear_inline.pte",
        xnnpack(ep, extract_delegate_segments=False),
        {"model": "Linear(4, 3)", "delegate": "XNNPACK", "extract_delegate_segments": False},
    )
    two = {"forward": ep, "scale": torch.export.export(Scale(), example)}
    edge = to_edge_transform_and_lower(two, partitioner={"forward": [XnnpackPartitioner()], "scale": []})
    save(
        "two_methods.pte",
        edge.to_executorch(),
        {"methods": ["forward (XNNPACK)", "scale (portable)"]},
    )
    add = torch.export.export(Add(), (torch.randn(2, WIDTH), torch.randn(2, WIDTH)))
    save("portable_add.pte", to_edge_transform_and_lower(add).to_executorch(), {"delegate": None})

    # No profiles key: the interop test compares with to_pte(..., record_profiles=False).
    blob.append(pack_tr01(engine, _bindings(None), device_id=1, record_profiles=False))
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    dyn = torch.export.export(Dyn(), (torch.randn(4, WIDTH),), dynamic_shapes=({0: batch},))
    specs = [CompileSpec("target_device", b"cuda:1")]
    edge = to_edge_transform_and_lower(dyn, partitioner=[WholeGraphPartitioner(specs)])
    save(
        "tensorrt_dynamic_cuda1.pte",
        edge.to_executorch(device_config),
        {"target_device": "cuda:1", "blob_device_id": 1, "batch": [1, MAX_BATCH], "config": "device"},
    )

    blob.append(pack_tr01(engine, _bindings(2), device_id=0))
    static = torch.export.export(Dyn(), (torch.randn(2, WIDTH),))
    specs = [CompileSpec("target_device", b"cuda:0")]
    edge = to_edge_transform_and_lower(static, partitioner=[WholeGraphPartitioner(specs)])
    inline_config = ExecutorchBackendConfig(
        propagate_device_config=device_config.propagate_device_config,
        enable_non_cpu_memory_planning=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False),
        extract_delegate_segments=False,
    )
    save(
        "tensorrt_static_inline_cuda0.pte",
        edge.to_executorch(inline_config),
        {"target_device": "cuda:0", "blob_device_id": 0, "batch": 2, "config": "device, inline"},
    )

    manifest = {
        "generator": "tools/make_executorch_fixtures.py",
        "torch": torch.__version__,
        "executorch": getattr(executorch, "__version__", None) or _dist_version("executorch"),
        "python": sys.version.split()[0],
        "engine_bytes": len(engine),
        "files": written,
    }
    (OUT / "MANIFEST.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-engine", type=Path, help="build the fixture engine (needs TensorRT-RTX)")
    parser.add_argument("--engine", type=Path, help="the engine the TensorRT reference programs carry")
    args = parser.parse_args()
    if args.build_engine:
        build_engine(args.build_engine)
        return 0
    if not args.engine:
        parser.error("pass --engine PLAN (build it first with --build-engine PLAN in the project venv)")
    os.makedirs(OUT, exist_ok=True)
    make(args.engine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
