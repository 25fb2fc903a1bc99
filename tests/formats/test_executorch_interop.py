"""Interop with ExecuTorch itself: our ``.pte`` read by ExecuTorch, ExecuTorch's read by us.

ExecuTorch's own deserializer (``deserialize_pte_binary``, its flatc-generated schema
classes) reads what ``to_pte`` writes, without torch (tests/_executorch_schema.py);
the fixtures under tests/fixtures/executorch/ were written by ExecuTorch 1.5.1
(tools/make_executorch_fixtures.py). CI installs ``executorch==1.5.1`` without its
dependencies and sets ``TRT_RUNTIME_REQUIRE_EXECUTORCH=1``, so these never skip there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import _executorch_schema
import pytest

from trt_runtime import FormatError, TensorSpec
from trt_runtime.executorch import read_program, to_pte
from trt_runtime.formats import describe, parse_tr01, read_engine_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "executorch"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
ENGINE = bytes(range(256)) * 3
PROFILE = (((1, 4), (4, 4), (8, 4)),)
DYNAMIC = (
    TensorSpec("x", "float32", (-1, 4), True, profiles=PROFILE),
    TensorSpec("y", "float32", (-1, 4), False),
)
STATIC = (TensorSpec("x", "float32", (2, 4), True), TensorSpec("y", "float32", (2, 4), False))
MIXED = (
    TensorSpec("tokens", "int32", (-1, 16), True, profiles=(((1, 16), (2, 16), (4, 16)),)),
    TensorSpec("mask", "bool", (-1, 16), True, profiles=(((1, 16), (2, 16), (4, 16)),)),
    TensorSpec("logits", "float16", (-1, 16, 32), False),
    TensorSpec("pooled", "bfloat16", (-1, 32), False),
)
LEAF: dict[str, Any] = {"type": None, "context": None, "children_spec": []}


@pytest.fixture(scope="module")
def et() -> Any:
    return _executorch_schema.load_or_skip()


def _write(bindings: tuple[TensorSpec, ...], **options: Any) -> bytes:
    out = io.BytesIO()
    to_pte(ENGINE, bindings, out, **options)
    return out.getvalue()


def _flatbuffer(et: Any, data: bytes) -> Any:
    """The Program exactly as stored (segments not moved back), by ExecuTorch's code."""
    header = et.get_extended_header(data)
    size = header.program_size if header is not None and header.is_valid() else len(data)
    return et.flatbuffer_to_program(data[:size])


def test_executorch_interop_installed_version_is_the_checked_one(et: Any) -> None:
    assert et.version == _executorch_schema.EXECUTORCH_VERSION == MANIFEST["executorch"]


@pytest.mark.parametrize("location", ["segment", "inline"])
@pytest.mark.parametrize(
    ("bindings", "device_id", "sizes", "dynamism"),
    [
        (DYNAMIC, 1, [[8, 4], [8, 4]], "DYNAMIC_BOUND"),
        (STATIC, 0, [[2, 4], [2, 4]], "STATIC"),
        (MIXED, 5, [[4, 16], [4, 16], [4, 16, 32], [4, 32]], "DYNAMIC_BOUND"),
    ],
)
def test_executorch_interop_deserializer_reads_every_field(
    et: Any,
    bindings: tuple[TensorSpec, ...],
    device_id: int,
    sizes: list[list[int]],
    dynamism: str,
    location: str,
) -> None:
    schema = et.schema
    data = _write(bindings, device_id=device_id, location=location)
    assert et.program_fb.Program.ProgramBufferHasIdentifier(data, 0)
    header = et.get_extended_header(data)
    assert (header is not None and header.is_valid()) == (location == "segment")
    program = et.deserialize_pte_binary(data).program
    assert program.version == 0
    assert program.constant_buffer in ([], [schema.Buffer(storage=b"")])
    assert program.mutable_data_segments is None
    (plan,) = program.execution_plan
    assert plan.name == "forward"
    n_in = sum(1 for b in bindings if b.is_input)
    assert plan.inputs == list(range(n_in))
    assert plan.outputs == list(range(n_in, len(bindings)))
    assert plan.operators == []
    assert plan.non_const_buffer_sizes == [0, 0]
    assert plan.non_const_buffer_device is None
    encoded_in = json.loads(plan.container_meta_type.encoded_inp_str)
    assert encoded_in[1]["children_spec"][0]["children_spec"] == [LEAF] * n_in
    # torch's pytree JSON, as ExecuTorch writes it for (args, kwargs) and the result.
    encoded_out = json.loads(plan.container_meta_type.encoded_out_str)[1]
    n_out = len(bindings) - n_in
    assert encoded_out == (
        LEAF if n_out == 1 else {"type": "builtins.tuple", "context": "null", "children_spec": [LEAF] * n_out}
    )
    (chain,) = plan.chains
    assert (chain.inputs, chain.outputs, chain.stacktrace) == ([], [], None)
    (instruction,) = chain.instructions
    assert instruction.instr_args == schema.DelegateCall(delegate_index=0, args=list(range(len(bindings))))
    (delegate,) = plan.delegates
    assert delegate.id == "TensorRTBackend"
    assert delegate.compile_specs == [schema.CompileSpec("target_device", f"cuda:{device_id}".encode())]
    blob = parse_tr01(bytes(program.backend_delegate_data[delegate.processed.index].data))
    assert blob.device_id == device_id and bytes(blob.engine) == ENGINE
    assert [s.name for s in blob.bindings] == [b.name for b in bindings]
    codes = {"float32": 6, "float16": 5, "int32": 3, "bool": 11, "bfloat16": 15}
    for value, spec, expected in zip(plan.values, bindings, sizes, strict=True):
        tensor = value.val
        assert isinstance(tensor, schema.Tensor)
        assert tensor.scalar_type == codes[spec.dtype]
        assert tensor.sizes == expected
        assert tensor.dim_order == list(range(len(expected)))
        assert tensor.shape_dynamism == schema.TensorShapeDynamism[dynamism]
        assert tensor.allocation_info is None and tensor.data_buffer_idx == 0
        assert (tensor.storage_offset, tensor.requires_grad, tensor.layout) == (0, False, 0)
        assert tensor.extra_tensor_info == schema.ExtraTensorInfo(
            device_type=schema.DeviceType.CUDA, device_index=device_id
        )


def test_executorch_interop_flatc_classes_read_compile_specs_and_devices(et: Any) -> None:
    data = _write(DYNAMIC, device_id=0, target_device="cuda:3", location="inline")
    root = et.program_fb.Program.GetRootAs(data, 0)
    plan = root.ExecutionPlan(0)
    delegate = plan.Delegates(0)
    assert delegate.Id() == b"TensorRTBackend"
    spec = delegate.CompileSpecs(0)
    assert spec.Key() == b"target_device" and bytes(spec.ValueAsNumpy()) == b"cuda:3"
    assert root.BackendDelegateDataLength() == 1
    assert parse_tr01(bytes(root.BackendDelegateData(0).DataAsNumpy())).device_id == 0
    table = plan.Values(0).Val()
    tensor = et.generated.Tensor.Tensor()
    tensor.Init(table.Bytes, table.Pos)
    extra = tensor.ExtraTensorInfo()
    assert (extra.DeviceType(), extra.DeviceIndex()) == (et.generated.DeviceType.DeviceType.CUDA, 3)
    assert tensor.AllocationInfo() is None


def test_executorch_interop_named_data_program(et: Any) -> None:
    data = _write(STATIC, device_id=2, location="named_data")
    program = _flatbuffer(et, data)  # named data needs torch to move back; read it as stored
    (named,) = program.named_data
    (delegate,) = program.execution_plan[0].delegates
    assert delegate.processed.location == et.schema.DataLocation.INLINE
    assert bytes(program.backend_delegate_data[delegate.processed.index].data).decode() == named.key
    header = et.get_extended_header(data)
    segment = program.segments[named.segment_index]
    start = header.segment_base_offset + segment.offset
    assert parse_tr01(data[start : start + segment.size]).device_id == 2
    assert program.segments[0].size == 0  # ExecuTorch's empty constant segment


@pytest.mark.parametrize(
    ("fixture", "bindings", "location"),
    [
        ("tensorrt_dynamic_cuda1.pte", DYNAMIC, "segment"),
        ("tensorrt_static_inline_cuda0.pte", STATIC, "inline"),
    ],
)
def test_executorch_interop_our_program_equals_executorch_written_program(
    et: Any, fixture: str, bindings: tuple[TensorSpec, ...], location: str
) -> None:
    reference = (FIXTURES / fixture).read_bytes()
    (delegate,) = read_program(reference).delegates
    out = io.BytesIO()
    to_pte(
        bytes(delegate.blob.engine),
        bindings,
        out,
        device_id=delegate.device_id,
        location=location,
        target_platform=delegate.blob.target_platform,
        record_profiles=False,  # the fixtures' blobs, like torch-tensorrt's, record none
    )
    ours = out.getvalue()
    # Field for field, as ExecuTorch reads them: as stored, and with segments moved back.
    assert _flatbuffer(et, ours) == _flatbuffer(et, reference)
    mine = et.deserialize_pte_binary(ours).program
    theirs = et.deserialize_pte_binary(reference).program
    differences = {
        key: (value, getattr(theirs, key))
        for key, value in dataclasses.asdict(mine).items()
        if value != dataclasses.asdict(theirs)[key]
    }
    assert mine == theirs, differences


# -- ExecuTorch-written programs read by trt-runtime ------------------------------------------


def test_executorch_interop_fixtures_are_small_and_as_recorded() -> None:
    files = MANIFEST["files"]
    assert sorted(files) == sorted(p.name for p in FIXTURES.glob("*.pte"))
    for name, entry in files.items():
        data = (FIXTURES / name).read_bytes()
        assert len(data) == entry["bytes"] < 200 * 1024
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name


@pytest.mark.parametrize(
    ("fixture", "device_id", "location", "shape"),
    [
        ("tensorrt_dynamic_cuda1.pte", 1, "segment", (-1, 4)),
        ("tensorrt_static_inline_cuda0.pte", 0, "inline", (2, 4)),
    ],
)
def test_executorch_interop_reads_executorch_written_tensorrt_programs(
    fixture: str, device_id: int, location: str, shape: tuple[int, ...]
) -> None:
    source = read_engine_source(FIXTURES / fixture)
    assert source.format == "pte" and source.device_id == device_id
    assert [(b.name, b.dtype, b.shape, b.is_input) for b in source.bindings] == [
        ("x", "float32", shape, True),
        ("y", "float32", shape, False),
    ]
    assert source.metadata["compile_specs"] == {"target_device": f"cuda:{device_id}"}
    assert source.metadata["warnings"] == []
    assert source.metadata["location"] == location and source.metadata["fully_delegated"] is True
    assert source.metadata["plan"]["flavour"] == "tensorrt_rtx"
    tensors = source.metadata["program_tensors"]
    assert [t["device"] for t in tensors] == [f"cuda:{device_id}"] * 2
    assert {t["dynamism"] for t in tensors} == {"dynamic_bound" if shape[0] < 0 else "static"}
    assert not any(t["planned"] for t in tensors)


@pytest.mark.parametrize(
    ("fixture", "methods", "others"),
    [
        ("xnnpack_linear_segment.pte", ["forward"], "['XnnpackBackend']"),
        ("xnnpack_linear_inline.pte", ["forward"], "['XnnpackBackend']"),
        ("two_methods.pte", ["forward", "scale"], "['XnnpackBackend']"),
        ("portable_add.pte", ["forward"], "none"),
    ],
)
def test_executorch_interop_refuses_programs_without_tensorrt_delegate(
    fixture: str, methods: list[str], others: str
) -> None:
    program = read_program(FIXTURES / fixture)
    assert list(program.methods) == methods and program.delegates == ()
    message = (
        rf"\.pte program '{fixture}' has no TensorRTBackend delegate "
        rf"\(methods {methods}; other delegates: {others}\)".replace("[", r"\[").replace("]", r"\]")
    )
    with pytest.raises(FormatError, match=message):
        read_engine_source(FIXTURES / fixture)
    info = describe(FIXTURES / fixture)
    assert info["methods"] == methods and info["delegates"] == []


def test_executorch_interop_warns_when_target_device_and_blob_disagree(et: Any) -> None:
    data = _write(DYNAMIC, device_id=0, target_device="cuda:1")
    (delegate,) = et.deserialize_pte_binary(data).program.execution_plan[0].delegates
    assert delegate.compile_specs == [et.schema.CompileSpec("target_device", b"cuda:1")]
    source = read_engine_source(data)
    assert source.device_id == 0
    assert source.metadata["compile_specs"] == {"target_device": "cuda:1"}
    assert source.metadata["warnings"][0].startswith(
        "compile spec target_device 'cuda:1' disagrees with the blob; the blob's device_id 0 decides"
    )


def test_executorch_interop_runtime_loads_our_program_up_to_delegate_init() -> None:
    """With torch and ExecuTorch's runtime bindings (not in CI): load, meta, then init fails."""
    pytest.importorskip("torch", reason="ExecuTorch's runtime bindings need torch")
    et_runtime = pytest.importorskip("executorch.extension.pybindings._C", reason="no ExecuTorch runtime")
    program = et_runtime._load_program_from_buffer(
        _write(DYNAMIC, device_id=0), program_verification=et_runtime.Verification.InternalConsistency
    )
    assert program.get_method_name(0) == "forward"
    meta = program.method_meta("forward")
    x = meta.input_tensor_meta(0)
    assert (tuple(x.sizes()), x.dtype(), x.is_memory_planned()) == ((8, 4), 6, False)
    with pytest.raises(RuntimeError, match="Failed to load method forward"):
        program.load_method("forward")  # the portable runtime registers no TensorRTBackend


@pytest.mark.gpu
def test_executorch_interop_executorch_written_program_runs_in_python_backend() -> None:
    """The TensorRT program ExecuTorch wrote (blob device 1) runs here on GPU 0 via device=0."""
    from trt_runtime.testing.cuda_arrays import gpu_unavailable

    reason = gpu_unavailable()
    if reason:
        pytest.skip(f"no CUDA GPU: {reason}")
    np = pytest.importorskip("numpy")
    import trt_runtime
    from trt_runtime import builders

    # The fixture's engine is build_dynamic(width=4, profiles=((1, 4, 8),)): same weights.
    built = builders.build_dynamic(width=4, profiles=((1, 4, 8),))
    engine = trt_runtime.load(FIXTURES / "tensorrt_dynamic_cuda1.pte", backend="python", device=0)
    try:
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        (y,) = engine.execute(x)
        np.testing.assert_allclose(np.asarray(y, np.float64), built.reference(x)[0], rtol=1e-3, atol=1e-3)
    finally:
        engine.close()
