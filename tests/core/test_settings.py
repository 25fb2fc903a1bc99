"""RuntimeSettings: values, codes, validation and round trips."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trt_runtime import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeCache,
    RuntimeSettings,
)
from trt_runtime.testing import strategies as tst

FIELDS = ("cuda_graph_strategy", "dynamic_shapes_kernel_specialization_strategy", "runtime_cache")
ENUMS = {
    "cuda_graph_strategy": CudaGraphStrategy,
    "dynamic_shapes_kernel_specialization_strategy": DynamicShapesKernelSpecializationStrategy,
}


def _tensorrt_rtx():
    try:
        import tensorrt_rtx
    except Exception as exc:  # ImportError, or a broken CUDA install underneath
        pytest.skip(f"tensorrt_rtx is not importable here: {exc}")
    return tensorrt_rtx


@pytest.mark.parametrize("ours", [CudaGraphStrategy, DynamicShapesKernelSpecializationStrategy])
def test_settings_codes_equal_tensorrt_rtx(ours):
    trt = _tensorrt_rtx()
    theirs = getattr(trt, ours.__name__)
    their_members = {name: int(value) for name, value in theirs.__members__.items()}
    assert {m.name: m.code for m in ours} == their_members


@pytest.mark.parametrize("ours", [CudaGraphStrategy, DynamicShapesKernelSpecializationStrategy])
def test_settings_accepts_tensorrt_rtx_members(ours):
    trt = _tensorrt_rtx()
    for name, member in getattr(trt, ours.__name__).__members__.items():
        assert ours.parse(member, "field") is ours[name]


def test_settings_defaults():
    s = RuntimeSettings()
    assert s.cuda_graph_strategy is CudaGraphStrategy.DISABLED
    assert s.dynamic_shapes_kernel_specialization_strategy is DynamicShapesKernelSpecializationStrategy.LAZY
    assert s.runtime_cache is None
    assert s.to_codes() == (0, 0)


ALL_MEMBERS = [*CudaGraphStrategy, *DynamicShapesKernelSpecializationStrategy]


@given(member=st.sampled_from(ALL_MEMBERS), data=st.data())
def test_settings_every_spelling_parses(member, data):
    spelling = data.draw(tst.setting_spellings(member))
    assert type(member).parse(spelling, "field") is member


def test_settings_merge_rejects_unknown_fields_naming_valid_ones():
    message = r"unknown runtime setting\(s\) 'cuda_graph'.*'cuda_graph_strategy'"
    with pytest.raises(TypeError, match=message) as info:
        RuntimeSettings().merge(cuda_graph="whole_graph_capture")
    for field in FIELDS:
        assert repr(field) in str(info.value)


def test_settings_merge_overrides_only_given_fields():
    base = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")
    merged = base.merge(cuda_graph_strategy="whole_graph_capture")
    eager = DynamicShapesKernelSpecializationStrategy.EAGER
    assert merged.dynamic_shapes_kernel_specialization_strategy is eager
    assert merged.cuda_graph_strategy is CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    assert base.cuda_graph_strategy is CudaGraphStrategy.DISABLED  # frozen value, not mutated


def test_settings_invalid_enum_value_names_value_and_allowed_set():
    with pytest.raises(
        ValueError,
        match=(
            r"cuda_graph_strategy must be one of 'disabled', 'whole_graph_capture' "
            r"\(or codes 0, 1\); got 'fast'"
        ),
    ):
        RuntimeSettings(cuda_graph_strategy="fast")
    with pytest.raises(ValueError, match=r"'lazy', 'eager', 'none'.*got 7"):
        RuntimeSettings(dynamic_shapes_kernel_specialization_strategy=7)
    with pytest.raises(ValueError, match="got True"):
        RuntimeSettings(cuda_graph_strategy=True)


def test_settings_invalid_cache_names_value():
    with pytest.raises(ValueError, match="runtime_cache must be None, a path or a RuntimeCache; got int 3"):
        RuntimeSettings(runtime_cache=3)
    with pytest.raises(ValueError, match="runtime_cache path must not be empty"):
        RuntimeSettings(runtime_cache="")


def test_settings_coerce_rejects_other_types():
    with pytest.raises(TypeError, match="got list"):
        RuntimeSettings.coerce([("cuda_graph_strategy", "disabled")])


def test_settings_cache_paths_normalized():
    s = RuntimeSettings(runtime_cache="some/dir/cache.bin")
    assert s.runtime_cache == Path("some/dir/cache.bin")
    assert s == RuntimeSettings(runtime_cache=Path("some/dir/cache.bin"))


@settings(max_examples=150)
@given(case=tst.invalid_settings_inputs())
def test_settings_every_invalid_input_rejected(case):
    field, value = case
    with pytest.raises(ValueError, match=re.escape(field)):
        RuntimeSettings(**{field: value})
    with pytest.raises(ValueError, match=re.escape(field)):
        RuntimeSettings().merge(**{field: value})


@given(s=tst.runtime_settings())
def test_settings_dict_round_trip(s):
    assert RuntimeSettings.from_dict(s.to_dict()) == s


@given(s=tst.runtime_settings(caches=tst.cache_values(handles=False)))
def test_settings_json_round_trip(s):
    text = s.to_json()
    assert RuntimeSettings.from_json(text) == s
    assert RuntimeSettings.from_json(text.encode()) == s


@given(s=tst.runtime_settings())
def test_settings_codes_round_trip(s):
    codes = s.to_codes()
    assert all(type(c) is int for c in codes)
    assert RuntimeSettings.from_codes(*codes, s.runtime_cache) == s


@given(s=tst.runtime_settings(caches=st.none()))
def test_settings_codes_order_is_dynamic_shapes_then_cuda_graph(s):
    assert s.to_codes() == (s.dynamic_shapes_kernel_specialization_strategy.code, s.cuda_graph_strategy.code)


def test_settings_from_codes_rejects_non_ints():
    with pytest.raises(ValueError, match="cuda_graph_strategy code must be an int; got 'x'"):
        RuntimeSettings.from_codes(0, "x")
    with pytest.raises(ValueError, match="dynamic_shapes_kernel_specialization_strategy code must be an int"):
        RuntimeSettings.from_codes(True, 0)


def test_settings_json_refuses_handles():
    with pytest.raises(ValueError, match="RuntimeCache handle cannot be written as JSON"):
        RuntimeSettings(runtime_cache=RuntimeCache()).to_json()


@pytest.mark.parametrize("text", ["{", "[1]", '"x"'])
def test_settings_from_json_rejects_malformed(text):
    with pytest.raises(ValueError, match="runtime settings JSON"):
        RuntimeSettings.from_json(text)


def test_settings_handles_compare_by_identity():
    a, b = RuntimeCache(), RuntimeCache()
    assert RuntimeSettings(runtime_cache=a) == RuntimeSettings(runtime_cache=a)
    assert RuntimeSettings(runtime_cache=a) != RuntimeSettings(runtime_cache=b)
    assert RuntimeSettings(runtime_cache=a).runtime_cache is a
    # paths compare by value
    assert RuntimeSettings(runtime_cache="c.bin") == RuntimeSettings(runtime_cache=Path("c.bin"))


def test_settings_are_frozen():
    s = RuntimeSettings()
    with pytest.raises(AttributeError):
        s.cuda_graph_strategy = CudaGraphStrategy.WHOLE_GRAPH_CAPTURE  # type: ignore[misc]


def test_settings_str_is_value():
    assert str(CudaGraphStrategy.WHOLE_GRAPH_CAPTURE) == "whole_graph_capture"
    assert CudaGraphStrategy.WHOLE_GRAPH_CAPTURE == "whole_graph_capture"
