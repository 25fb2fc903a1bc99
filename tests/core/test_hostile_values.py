"""Hostile values where they enter: settings, cache arguments, command-line options; one error story.

Each test is one cause of issue 21 (see docs/reliability.md, "Hostile files and hosts").
"""

from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from _hostile_worker import run_with_cache
from hypothesis import given, settings
from hypothesis import strategies as st

import trt_runtime
from trt_runtime import RuntimeCache, RuntimeSettings, SettingsError, TrtRuntimeError, errors
from trt_runtime.cli import main as cli_main

DOCS = Path(__file__).resolve().parents[2] / "docs"


class BytesPath(os.PathLike):  # type: ignore[type-arg]
    def __fspath__(self) -> bytes:  # type: ignore[override]
        return b"/tmp/cache.bin"


class BrokenPath(os.PathLike):  # type: ignore[type-arg]
    def __fspath__(self) -> str:
        raise RuntimeError("no path today")


def _short_id(value: Any) -> str | None:
    """Test ids pytest can make: it cannot print an int past the int-digits limit either."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"int-of-{value.bit_length()}-bits"
    if isinstance(value, str) and len(value) > 40:
        return f"str-of-{len(value)}"
    return None


# -- cause 11: edge values of settings and cache knobs --------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        (
            "cuda_graph_strategy",
            10**5000,
            "cuda_graph_strategy must be one of .*got an integer of 16610 bits",
        ),
        ("dynamic_shapes_kernel_specialization_strategy", -(10**400), "an integer of 1329 bits"),
        ("cuda_graph_strategy", "x" * 10_000, r"got 'xxxx.*\.\.\.$"),
        ("runtime_cache", "cache\x00.bin", "runtime_cache path 'cache\\\\x00.bin' contains a NUL byte"),
        ("runtime_cache", Path("a\x00b"), "contains a NUL byte"),
        ("runtime_cache", BytesPath(), r"__fspath__\(\) returned bytes"),
        ("runtime_cache", BrokenPath(), "no path today"),
        ("runtime_cache", b"/tmp/cache.bin", "must be None, a path or a RuntimeCache; got bytes"),
        ("runtime_cache", "", "runtime_cache path must not be empty"),
    ],
    ids=_short_id,
)
def test_hostile_settings_values_are_settings_errors(field: str, value: Any, match: str) -> None:
    with pytest.raises(SettingsError, match=match) as info:
        RuntimeSettings(**{field: value})
    assert isinstance(info.value, ValueError) and isinstance(info.value, TrtRuntimeError)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[" * 100_000 + "]" * 100_000, "nests containers deeper than 64 levels"),
        ('{"a":' * 65 + "1" + "}" * 65, "nests containers deeper than 64 levels"),
        ('{"cuda_graph_strategy": ' + "1" * 5000 + "}", "not valid JSON.*digits"),
        ("{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        ("[]", "must be an object; got list"),
    ],
    ids=_short_id,
)
def test_hostile_settings_json_is_a_settings_error(text: str | bytes, match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        RuntimeSettings.from_json(text)


def test_hostile_settings_from_codes_refuses_huge_codes_by_name() -> None:
    with pytest.raises(SettingsError, match="cuda_graph_strategy must be one of"):
        RuntimeSettings.from_codes(0, 10**5000)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (float("nan"), "got nan"),
        (float("inf"), "got inf"),
        (-1, "got -1"),
        (10**400, "got an integer of 1329 bits"),
        (1e10, "at most 1e\\+09"),
        (True, "got bool True"),
        ("30", "got str '30'"),
    ],
    ids=_short_id,
)
def test_hostile_lock_timeout_is_a_settings_error(value: Any, match: str) -> None:
    with pytest.raises(SettingsError, match=f"lock_timeout must be a number of seconds >= 0.*{match}"):
        RuntimeCache(lock_timeout=value)


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("c\x00.bin", "contains a NUL byte"),
        (BytesPath(), "returned bytes"),
        ("", "must not be empty"),
        (3, "must be a str or os.PathLike; got int 3"),
    ],
)
def test_hostile_cache_path_is_a_settings_error(path: Any, match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        RuntimeCache(path)
    with pytest.raises(SettingsError, match=match):
        RuntimeCache.shared(path)


@settings(max_examples=200, deadline=None)
@given(
    value=st.one_of(st.floats(), st.integers(min_value=-(10**500), max_value=10**500), st.text(max_size=5))
)
def test_hostile_lock_timeout_accepts_exactly_finite_seconds_in_range(value: Any) -> None:
    ok = isinstance(value, (int, float)) and value == value and 0 <= value <= 1e9
    try:
        cache = RuntimeCache(lock_timeout=value)
    except SettingsError:
        assert not ok
    else:
        assert ok and cache.lock_timeout == float(value)


# -- cause 12: one story about error classes -------------------------------------------------


def test_hostile_every_error_class_is_a_trt_runtime_error() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    failures = [c for c in classes if issubclass(c, BaseException) and not issubclass(c, Warning)]
    assert failures and all(issubclass(c, TrtRuntimeError) for c in failures)
    assert issubclass(SettingsError, ValueError)
    for name in errors.__all__:
        assert getattr(trt_runtime, name) is getattr(errors, name)
        assert inspect.getdoc(getattr(errors, name))


def test_hostile_no_bare_value_error_is_raised_by_the_package() -> None:
    package = Path(trt_runtime.__file__).parent
    offenders = [
        f"{path.relative_to(package)}:{n}"
        for path in package.rglob("*.py")
        if path.parent.name != "testing"  # the test kit's own fakes and strategies
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"raise (ValueError|OSError|RuntimeError)\(", line)
    ]
    assert offenders == []


def test_hostile_docs_tell_the_same_error_story() -> None:
    text = (DOCS / "settings.md").read_text()
    assert "SettingsError" in text and "raises `ValueError`" not in text
    assert "SettingsError" in (Path(errors.__file__)).read_text()


# -- causes 9 and 10: the command line -------------------------------------------------------


@pytest.mark.parametrize("seed", ["-1", "4294967296", "1e3", "x" * 100], ids=_short_id)
@pytest.mark.parametrize("command", ["run", "bench"])
def test_hostile_cli_bad_seed_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, seed: str
) -> None:
    assert cli_main([command, os.fspath(tmp_path / "m.plan"), "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trt-runtime: error: argument --seed: expected an integer in [0, 2**32)")
    assert len(err.splitlines()) == 1


def test_hostile_cli_warnings_are_one_line_each(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    assert run_with_cache(directory, b"not a cache", "--json") == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays one JSON document
    lines = captured.err.splitlines()
    assert any("ignored runtime cache file" in line for line in lines), captured.err
    assert all(line.startswith("trt-runtime: warning: ") for line in lines), captured.err
    assert ".py:" not in captured.err and "cache.load()" not in captured.err
