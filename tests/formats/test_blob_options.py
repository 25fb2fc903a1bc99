"""One options value for what a TR01/TR02 blob records (:class:`BlobOptions`): checked when made,
built from ``None``, a mapping or an instance, and taken by every blob writer beside the
keyword arguments they always took."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest

from trt_runtime import SettingsError, TensorSpec
from trt_runtime.executorch import read_program, to_pte
from trt_runtime.formats import BlobOptions, encode_metadata, pack_tr01, parse_tr01, write_tr01

ENGINE = bytes(range(256)) * 2
BINDINGS = (
    TensorSpec("x", "float32", (2, 4), True),
    TensorSpec("y", "float32", (2, 4), False),
)
CHOSEN: dict[str, Any] = {
    "aliased_io": {"y": "x"},
    "device_id": 3,
    "hardware_compatible": True,
    "serialized_metadata": "abc",
    "target_platform": "linux_aarch64",
    "record_profiles": False,
}


def test_blob_options_defaults_are_the_writers_defaults() -> None:
    assert BlobOptions() == BlobOptions.coerce(None) == BlobOptions.coerce({})
    assert encode_metadata(BINDINGS, BlobOptions(target_platform="p")) == encode_metadata(
        BINDINGS, target_platform="p")


def test_blob_options_coerce_takes_an_instance_a_mapping_and_keywords() -> None:
    made = BlobOptions(**CHOSEN)
    assert BlobOptions.coerce(made) is made
    assert BlobOptions.coerce(CHOSEN) == made
    assert BlobOptions.coerce(**CHOSEN) == made
    assert BlobOptions.coerce(made, device_id=5) == dataclasses.replace(made, device_id=5)
    assert BlobOptions.coerce({"device_id": 1}, device_id=2).device_id == 2  # keywords win


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"device_id": -1}, SettingsError, r"device_id must be an integer in \[0, 2\*\*31\); got -1"),
        ({"device_id": True}, SettingsError, r"device_id must be an integer .*; got True"),
        ({"device_id": 2**31}, SettingsError, r"got 2147483648"),
        ({"hardware_compatible": "yes"}, SettingsError, r"hardware_compatible must be a boolean .*got 'yes'"),
        ({"record_profiles": 1}, SettingsError, r"record_profiles must be a boolean .*; got 1"),
        ({"serialized_metadata": 7}, TypeError, r"serialized_metadata must be a string; got int"),
        ({"target_platform": b"x"}, TypeError, r"target_platform must be a string; got bytes"),
        ({"aliased_io": "y"}, SettingsError, r"aliased_io must be a mapping .*; got 'y'"),
    ],
)
def test_blob_options_rejects_bad_values(given: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        BlobOptions(**given)
    with pytest.raises(error, match=message):  # and so does every writer, before writing
        pack_tr01(ENGINE, BINDINGS, **given)


def test_blob_options_rejects_unknown_names_and_types() -> None:
    with pytest.raises(TypeError, match=r"unknown blob option\(s\) \['device'\]; expected some of "):
        BlobOptions.coerce({"device": 1})
    with pytest.raises(TypeError, match=r"unknown blob option\(s\) \['platform'\]"):
        write_tr01(io.BytesIO(), ENGINE, BINDINGS, platform="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="blob options must be a BlobOptions, a mapping or None; got int"):
        BlobOptions.coerce(3)  # type: ignore[arg-type]


def test_blob_options_is_a_frozen_value() -> None:
    made = BlobOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.device_id = 1  # type: ignore[misc]
    assert not hasattr(made, "__dict__")


def test_blob_options_writers_record_the_same_blob_either_way() -> None:
    by_keywords = pack_tr01(ENGINE, BINDINGS, **CHOSEN)
    by_options = pack_tr01(ENGINE, BINDINGS, BlobOptions(**CHOSEN))
    streamed = io.BytesIO()
    write_tr01(streamed, ENGINE, BINDINGS, options=CHOSEN)
    assert by_keywords == by_options == streamed.getvalue()
    blob = parse_tr01(by_options)
    assert (blob.magic, blob.device_id, blob.hardware_compatible) == ("TR02", 3, True)
    assert (blob.serialized_metadata, blob.target_platform) == ("abc", "linux_aarch64")
    assert blob.aliased_io == (("y", "x", "kv_cache_update"),)


def test_blob_options_to_pte_takes_them_as_the_blob_writers_do() -> None:
    by_keywords, by_options = io.BytesIO(), io.BytesIO()
    to_pte(ENGINE, BINDINGS, by_keywords, device_id=2, target_platform="p", hardware_compatible=True)
    to_pte(ENGINE, BINDINGS, by_options, options=BlobOptions(device_id=2, target_platform="p",
                                                             hardware_compatible=True))
    assert by_keywords.getvalue() == by_options.getvalue()
    (delegate,) = read_program(by_options.getvalue()).delegates
    assert (delegate.blob.device_id, delegate.blob.hardware_compatible) == (2, True)
    assert delegate.metadata()["compile_specs"]["target_device"] == "cuda:2"
