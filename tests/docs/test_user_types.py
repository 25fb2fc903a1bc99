"""After the README's install, ``mypy --strict`` and pyright resolve ``trt_runtime`` and
``trt_runtime_backends`` and accept a user's script written from the docs, and reject misuse.

The checkers run in a temporary directory on copies of ``tests/typecheck/*.py``, so what they
find is the *installed* package (the strict editable install's link tree, or a wheel),
never the checkout's folders through the current directory. pyright is ``basedpyright``
from PyPI (the ``test`` extra): the pyright engine with node bundled in a wheel, so nothing
is downloaded at run time. PyPI's ``pyright`` fetches its npm package on first use; when it
is installed the same checks run with it too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "typecheck"
SCRIPTS = ("user_script.py", "bad_script.py", "torch_script.py")


def _copy_scripts(tmp_path: Path) -> Path:
    for name in SCRIPTS:
        shutil.copy(HERE / name, tmp_path / name)
    return tmp_path


def _expected_error_lines(script: str = "bad_script.py") -> set[int]:
    lines = (HERE / script).read_text().splitlines()
    return {i for i, line in enumerate(lines, start=1) if line.rstrip().endswith("# error")}


def _mypy(tmp_path: Path, script: str) -> tuple[int, str]:
    pytest.importorskip("mypy", reason="mypy is not installed: pip install -c constraints.txt -e '.[test]'")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable",
         sys.executable, script],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=600,
    )
    return done.returncode, done.stdout + done.stderr


PYRIGHTS = {
    "basedpyright": "basedpyright is not installed: pip install -c constraints.txt -e '.[test]'",
    # PyPI's pyright runs node and fetches pyright's npm package on first use: optional here.
    "pyright": "PyPI's pyright is not installed (optional: pip install pyright; needs node or npm access)",
}


@pytest.fixture(params=sorted(PYRIGHTS))
def pyright(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        pytest.skip(PYRIGHTS[name])
    return exe


def _pyright(exe: str, tmp_path: Path, script: str) -> dict[str, object]:
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}))
    done = subprocess.run(
        [exe, "--outputjson", "--pythonpath", sys.executable, script],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=600,
    )
    report: dict[str, object] = json.loads(done.stdout)
    return report


def _pyright_errors(report: dict[str, object]) -> list[dict[str, object]]:
    diagnostics = report["generalDiagnostics"]
    assert isinstance(diagnostics, list)
    return [d for d in diagnostics if d["severity"] == "error"]


def test_user_types_mypy_strict_accepts_the_documented_api(tmp_path: Path) -> None:
    code, text = _mypy(_copy_scripts(tmp_path), "user_script.py")
    assert code == 0, text
    assert "Success: no issues found" in text


def test_user_types_mypy_strict_rejects_misuse(tmp_path: Path) -> None:
    code, text = _mypy(_copy_scripts(tmp_path), "bad_script.py")
    assert code == 1, text
    found = {int(m.group(1)) for m in re.finditer(r"^bad_script\.py:(\d+): error:", text, re.M)}
    assert found == _expected_error_lines(), text
    assert "cuda_graph" in text and "Literal['fast']" in text


def test_user_types_pyright_accepts_the_documented_api(pyright: str, tmp_path: Path) -> None:
    report = _pyright(pyright, _copy_scripts(tmp_path), "user_script.py")
    errors = _pyright_errors(report)
    assert errors == [], json.dumps(errors, indent=1)
    summary = report["summary"]
    assert isinstance(summary, dict) and summary["filesAnalyzed"] >= 1


def test_user_types_pyright_rejects_misuse(pyright: str, tmp_path: Path) -> None:
    errors = _pyright_errors(_pyright(pyright, _copy_scripts(tmp_path), "bad_script.py"))
    found = {int(e["range"]["start"]["line"]) + 1 for e in errors}  # type: ignore[index]
    assert found == _expected_error_lines(), json.dumps(errors, indent=1)


def test_user_types_packages_resolve_from_outside_the_checkout(tmp_path: Path) -> None:
    """What the checkers saw is the installed package: both import names resolve outside the repo."""
    probe = "import trt_runtime as a, trt_runtime_backends as b; print(a.__file__); print(b.__file__)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          check=True)
    core, backends = done.stdout.splitlines()
    assert Path(core).name == "__init__.py" and Path(backends).name == "__init__.py"
    assert (Path(core).parent / "py.typed").exists() and (Path(backends).parent / "py.typed").exists()


def test_user_types_a_torch_call_returns_a_tensor(pyright: str, tmp_path: Path) -> None:
    """torch in, ``torch.Tensor`` out, for mypy --strict and pyright (torch only at check time)."""
    pytest.importorskip("torch", reason="torch is not installed: "
                                 "pip install -c constraints.txt -e '.[torch]'")
    _copy_scripts(tmp_path)
    expected = _expected_error_lines("torch_script.py")
    code, text = _mypy(tmp_path, "torch_script.py")
    found = {int(m.group(1)) for m in re.finditer(r"^torch_script\.py:(\d+): error:", text, re.M)}
    assert code == 1 and found == expected, text
    errors = _pyright_errors(_pyright(pyright, tmp_path, "torch_script.py"))
    assert {int(e["range"]["start"]["line"]) + 1 for e in errors} == expected, (  # type: ignore[index]
        json.dumps(errors, indent=1))
