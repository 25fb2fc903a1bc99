"""Files the command line refuses: missing, malformed, unknown magic (and ``--force``), usage
errors, ``--debug``, ``--version`` and ``--help``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli_runner import run_cli as _run
from _cli_shared import one_error_line

from trt_runtime import cli

# -- errors ---------------------------------------------------------------------------


def test_cli_missing_file_is_one_line_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.plan"
    code, out, err = _run(capsys, "inspect", missing)
    assert code == 1 and out == ""
    assert str(missing) in one_error_line(err)


def test_cli_malformed_file_is_one_line_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"vtrt" + bytes(6))
    code, out, err = _run(capsys, "--json", "inspect", bad)
    assert code == 1
    assert "too small" in one_error_line(err)
    assert "too small" in json.loads(out)["error"]["message"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "a command is required"),
        (["run"], "the following arguments are required: file"),
        (["bench", "x.plan", "--iterations", "0"], "--iterations must be >= 1; got 0"),
        (["run", "x.plan", "--cuda-graph-strategy", "fast"], "invalid choice: 'fast'"),
        (["run", "x.plan", "--input", "nofile"], "--input must be NAME=FILE.npy; got 'nofile'"),
        (["cache", "wipe"], "invalid choice: 'wipe'"),
    ],
)
def test_cli_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    argv: list[str], needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.plan").write_bytes(b"\0" * 128)
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert needle in one_error_line(err)


def test_cli_debug_shows_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"hello")
    code, _, err = _run(capsys, "inspect", bad, "--debug")
    assert code == 1
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("trt-runtime: error: ")


def test_cli_version_and_help_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    from trt_runtime import __version__

    code, out, _ = _run(capsys, "--version")
    assert code == 0 and __version__ in out
    code, out, _ = _run(capsys, "bench", "--help")
    assert code == 0 and "--iterations" in out and "--json-out" in out


@pytest.mark.parametrize("command", ["inspect", "run", "bench"])
@pytest.mark.parametrize("json_mode", [False, True])
def test_cli_unknown_magic_is_refused(
    capsys: pytest.CaptureFixture[str], random_file: Path, command: str, json_mode: bool
) -> None:
    code, out, err = _run(capsys, *(["--json"] if json_mode else []), command, random_file)
    assert code == 1
    line = one_error_line(err)
    if json_mode:
        assert json.loads(out) == {"error": {"message": line.removeprefix("trt-runtime: error: "),
                                             "exit_code": 1, "kind": "failure"}}
    else:
        assert out == ""
    assert f"{random_file} is not an engine file (unknown magic" in line
    for magic in ("'vtrt'", "'ptrt'", "'TR01'", "'TR02'", "'ET..'"):
        assert magic in line
    assert "--force" in line


def test_cli_unknown_magic_is_refused_before_any_backend(
    capsys: pytest.CaptureFixture[str], random_file: Path
) -> None:
    # 'memory' runs here: the refusal comes from the magic, not from a missing GPU.
    code, _, err = _run(capsys, "run", random_file, "--backend", "memory")
    assert code == 1 and "is not an engine file" in one_error_line(err)
    code, _, err = _run(capsys, "bench", random_file, "--backend", "all")
    assert code == 1 and "is not an engine file" in one_error_line(err)
    with pytest.raises(cli.CliError, match="is not an engine file"):
        cli.inspect_file(random_file, load=False)


def test_cli_known_magics_come_from_the_formats_module(
    capsys: pytest.CaptureFixture[str], random_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_runtime.formats import PLAN_MAGICS

    monkeypatch.setitem(PLAN_MAGICS, random_file.read_bytes()[:4], "future_flavour")
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", random_file)
    assert code == 0, err
    assert json.loads(out)["flavour"] == "future_flavour" and err == ""


def test_cli_force_reads_unknown_magic_as_a_plan(
    capsys: pytest.CaptureFixture[str], random_file: Path
) -> None:
    code, out, err = _run(capsys, "--json", "inspect", "--no-load", "--force", random_file)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "plan" and doc["flavour"] == "unknown"
    assert doc["file_bytes"] == 1 << 20
    assert len(doc["warnings"]) == 1 and "read as a plan of unknown flavour (--force)" in doc["warnings"][0]
    assert err.startswith("trt-runtime: warning: ") and "is not an engine file" in err
    report = cli.inspect_file(random_file, load=False, force=True)
    assert report["flavour"] == "unknown"


@pytest.mark.parametrize("command", ["run", "bench"])
def test_cli_force_passes_unknown_magic_on_to_the_backend(
    capsys: pytest.CaptureFixture[str], random_file: Path, command: str
) -> None:
    code, _, err = _run(capsys, command, random_file, "--force", "--backend", "memory")
    assert code == 1
    assert "reading it as a plan of unknown flavour (--force)" in err
    line = one_error_line(err)  # now the backend's own refusal
    assert "is not an engine file" not in line and "memory" in line.lower()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "is empty (0 bytes)"),
        (b"vtrt", "too small"),
        (b"TR09" + bytes(100), "unknown magic b'TR09'"),
    ],
)
def test_cli_files_the_format_checks_explain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, needle: str
) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(content)
    for command in ("inspect", "run", "bench"):
        code, _, err = _run(capsys, command, bad, "--backend", "memory")
        assert code == 1
        line = one_error_line(err)
        assert needle in line and "is not an engine file" not in line
