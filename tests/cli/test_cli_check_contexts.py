"""``trt-runtime check-contexts`` on the CPU: what it refuses before any work, and that it
says what it needs (torch with CUDA) when the machine has none. Its runs on a GPU are in
tests/gpu/test_gpu_check_contexts.py."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from trt_runtime import TensorSpec, cli
from trt_runtime.testing.memory import AffineOutput, MemoryBackend


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = cli.main([os.fspath(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def mem_file(tmp_path: Path) -> Path:
    spec = TensorSpec("x", "float32", (2, 3), is_input=True)
    path = tmp_path / "affine.mem"
    path.write_bytes(MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0)], name="affine"))
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--contexts", "1"], "--contexts must be >= 2 (the contexts whose work overlaps); got 1"),
        (["--rounds", "0"], "--rounds must be >= 1; got 0"),
        (["--tolerance", "-1"], "--tolerance must be a number >= 0; got -1.0"),
        (["--tolerance", "nan"], "--tolerance must be a number >= 0; got nan"),
        (["--backend", "nosuch"], "nosuch"),
    ],
)
def test_check_contexts_refuses_bad_options_with_exit_2(
    capsys: pytest.CaptureFixture[str], mem_file: Path, extra: list[str], message: str
) -> None:
    code, out, err = _run(capsys, "check-contexts", mem_file, *extra)
    assert code == 2 and out == ""
    assert message in err


def test_check_contexts_refuses_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "check-contexts", tmp_path / "nothing.plan")
    assert code != 0 and "nothing.plan" in err


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_check_contexts_says_it_needs_torch_with_cuda(
    capsys: pytest.CaptureFixture[str], mem_file: Path
) -> None:
    code, out, err = _run(capsys, "--json", "check-contexts", mem_file, "--contexts", "2")
    assert code == 1
    error = json.loads(out)["error"] if out.strip() else err
    assert "check-contexts needs torch with CUDA" in str(error)


def test_check_contexts_is_a_listed_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys)
    assert code == 2 and "check-contexts" in err


def test_check_overlap_refuses_too_few_callers_or_rounds_before_touching_torch() -> None:
    from trt_runtime.testing.overlap import check_overlap

    with pytest.raises(ValueError, match="at least 2 input sets \\(callers\\); got 1"):
        check_overlap(object(), [[]], 3)
    with pytest.raises(ValueError, match="rounds must be >= 1; got 0"):
        check_overlap(object(), [[], []], 0)
