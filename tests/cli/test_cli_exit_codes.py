"""The exit-code rule of docs/cli.md, driven through every subcommand by a table.

2 for usage (a bad flag or flag value, a shape that contradicts the engine whichever flag
gave it), with ``(see 'trt-runtime CMD --help')``; 1 for a bad file or failed work, without
that hint; 130 for Ctrl-C. Each row also names what the one error line must say, so a row
cannot pass on some other failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._cli_runner import error_lines, run_cli
from trt_runtime import TensorSpec
from trt_runtime.cli.parser import COMMANDS
from trt_runtime.testing.memory import AffineOutput, MemoryBackend


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """An engine of the memory backend, and the bad files the table hands the commands."""
    spec = TensorSpec("x", "float32", (-1, 4), is_input=True, profiles=(((1, 4), (2, 4), (8, 4)),))
    paths = {name: tmp_path / name for name in
             ("affine.mem", "empty.plan", "four.plan", "notes.txt", "big.npz", "model.onnx", "out.bin")}
    paths["affine.mem"].write_bytes(MemoryBackend.build_engine([spec], [AffineOutput("y", "x")], name="a"))
    paths["empty.plan"].write_bytes(b"")
    paths["four.plan"].write_bytes(b"ftrt")
    paths["notes.txt"].write_text("hello\n")
    np.savez(paths["big.npz"], x=np.zeros((9, 4), np.float32))
    paths["model.onnx"].write_bytes(b"\x08\x07")
    paths["out.bin"].write_bytes(b"")
    paths["missing.plan"] = tmp_path / "missing.plan"
    paths["dir"] = tmp_path
    return paths


def _row(code: int, *argv: str, says: str, marks: Any = ()) -> Any:
    return pytest.param(code, argv, says, id=" ".join(argv), marks=marks)


def _bad_engine_files(command: str) -> list[Any]:
    """A missing, an empty and a 4-byte engine file: the same message whichever command opens it."""
    return [
        _row(1, command, "{missing.plan}", says="no such file"),
        _row(1, command, "{empty.plan}", says="is empty (0 bytes)"),
        _row(1, command, "{four.plan}", says="is too small to be a serialized engine: 4 bytes"),
    ]


NOT_INSTALLED = "--backend 'nope' is not an installed backend"
OUTSIDE = "shape 9x4 of input 'x' is outside every"

#: (exit code, argv with {file} placeholders, what the error line says).
TABLE = [
    _row(2, "demo", "--backend", "nope", says=NOT_INSTALLED),
    _row(2, "demo", "--bogus", says="unrecognized arguments: --bogus"),
    _row(2, "build", "{model.onnx}", "-o", "{out.plan}", "--shapes", "x:2xabc", says="dimension 'abc'"),
    _row(2, "build", "{model.onnx}", "-o", "{out.bin}", says="cannot tell the format of"),
    _row(2, "build", "{model.onnx}", says="the following arguments are required: -o/--output"),
    _row(1, "build", "{missing.plan}", "-o", "{out.plan}", says="no such ONNX model"),
    _row(2, "inspect", "{affine.mem}", "--backend", "nope", says=NOT_INSTALLED),
    *_bad_engine_files("inspect"),
    _row(1, "inspect", "{notes.txt}", says="is not an engine file (unknown magic"),
    _row(2, "run", "{affine.mem}", "--backend", "nope", says=NOT_INSTALLED),
    _row(2, "run", "{affine.mem}", "--seed", "-1", says="argument --seed: expected an integer in [0, 2**32)"),
    _row(2, "run", "{affine.mem}", "--shapes", "x:9x4", says=OUTSIDE),
    _row(2, "run", "{affine.mem}", "--load-inputs", "{big.npz}", says=OUTSIDE),
    _row(2, "run", "{affine.mem}", "--atol", "-1", says="--atol must be a number >= 0"),
    _row(1, "run", "{affine.mem}", "--load-inputs", "{notes.txt}", says="is not an .npz or .npy file"),
    *_bad_engine_files("run"),
    _row(1, "run", "{dir}", says="is a directory, not an engine file"),
    _row(2, "bench", "{affine.mem}", "--iterations", "0", says="--iterations must be >= 1"),
    _row(2, "bench", "{affine.mem}", "--warmup", "-1", says="--warmup must be >= 0"),
    _row(2, "bench", "{affine.mem}", "--shapes", "x:9x4", says=OUTSIDE),
    _row(2, "bench", "{affine.mem}", "--load-inputs", "{big.npz}", says=OUTSIDE),
    *_bad_engine_files("bench"),
    _row(2, "serve", "{affine.mem}", "--max-batch", "0", says="--max-batch"),
    _row(2, "serve", "{affine.mem}", "--port", "70000", says="--port"),
    _row(1, "serve", "{missing.plan}", says="no such file"),
    _row(1, "serve", "{empty.plan}", says="is empty (0 bytes)"),
    _row(2, "check-contexts", "{affine.mem}", "--contexts", "1", says="--contexts must be >= 2"),
    _row(2, "check-contexts", "{affine.mem}", "--rounds", "0", says="--rounds must be >= 1"),
    _row(2, "check-contexts", "{affine.mem}", "--seed", "-1", says="argument --seed: expected an integer"),
    *_bad_engine_files("check-contexts"),
    _row(2, "cache", "bogus", says="argument action: invalid choice: 'bogus'"),
    _row(2, "cache", "info", "--dir", says="argument --dir: expected one argument"),
    _row(2, "backends", "--bogus", says="unrecognized arguments: --bogus"),
]


def _argv(argv: tuple[str, ...], files: dict[str, Path]) -> list[str]:
    out = []
    for arg in argv:
        if arg.startswith("{") and arg.endswith("}"):
            name = arg[1:-1]
            out.append(str(files.get(name, files["dir"] / name)))
        else:
            out.append(arg)
    return out


@pytest.fixture
def no_ray_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve`` must refuse bad arguments and files before it starts anything."""
    try:
        import ray
    except ImportError:
        return

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("ray.init was called before the arguments were checked")

    monkeypatch.setattr(ray, "init", refuse)


@pytest.mark.parametrize(("code", "argv", "says"), TABLE)
def test_cli_exit_code_table(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], no_ray_start: None,
    code: int, argv: tuple[str, ...], says: str,
) -> None:
    got, _out, err = run_cli(capsys, *_argv(argv, files))
    lines = error_lines(err)
    assert got == code, err
    assert len(lines) == 1, err
    assert says in lines[0], lines[0]
    hint = f"(see 'trt-runtime {argv[0]} --help')"
    if code == 2:
        assert lines[0].endswith(hint), lines[0]
    else:
        assert "(see '" not in lines[0], lines[0]


def test_cli_exit_code_table_covers_every_command() -> None:
    assert {p.values[1][0] for p in TABLE} == set(COMMANDS)


def test_cli_ctrl_c_exits_130(capsys: pytest.CaptureFixture[str], files: dict[str, Path],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    from trt_runtime.cli import run as run_module

    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "input_arrays", interrupted)
    code, _out, err = run_cli(capsys, "run", files["affine.mem"])
    assert code == 130
    assert error_lines(err) == ["trt-runtime: error: interrupted"]


def test_cli_usage_error_before_a_command_points_at_the_top_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_cli(capsys, "nosuchcommand")
    assert code == 2
    (line,) = error_lines(err)
    assert line.endswith("(see 'trt-runtime --help')")
