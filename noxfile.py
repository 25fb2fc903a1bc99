"""Development sessions: tests, gpu, lint, typecheck, docs, bench."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

CONSTRAINTS = ("-c", "constraints.txt")


def _install(session: nox.Session, extras: str, *extra: str) -> None:
    # -e is a strict editable install (pyproject's [tool.distutils.editable_wheel]), which
    # mypy and pyright follow.
    session.install(*CONSTRAINTS, "-e", f".[{extras}]", *extra)


@nox.session
def tests(session: nox.Session) -> None:
    """CPU test suite (GPU tests skip with their reason)."""
    _install(session, "rtx,cuda,cli,test,serve")
    session.install(*CONSTRAINTS, "--no-deps", "executorch")
    # One worker per core; the tests that start a Ray stay on one worker (tests/conftest.py).
    session.run("python", "-m", "pytest", "-n", "auto", "--dist", "loadgroup", *session.posargs,
                env={"TRT_RUNTIME_REQUIRE_EXECUTORCH": "1", "TRT_RUNTIME_REQUIRE_SERVE": "1"})


@nox.session
def gpu(session: nox.Session) -> None:
    """GPU suite: needs an NVIDIA GPU, TensorRT-RTX and cuda-python."""
    _install(session, "rtx,cuda,cli,test")
    # The soak tests (10,000 load/call/close cycles per backend) run apart: -m soak.
    session.run("python", "-m", "pytest", "-m", "gpu and not soak", "tests/gpu", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, backends and tests."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "trt_runtime", "backends", "tests", *session.posargs)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the core and the backends; mypy --strict and pyright over a user's script."""
    _install(session, "test")
    session.run("mypy", *session.posargs)
    session.run("python", "-m", "pytest", "-q", "tests/docs/test_user_types.py")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site with warnings as errors (broken links and anchors too), and
    run every code block of the README and docs/ (tests/docs/test_docs.py)."""
    _install(session, "docs,test")  # docs: mkdocs, mkdocstrings and ruff (it formats signatures)
    session.run("mkdocs", "build", "--strict", *session.posargs)
    session.run("python", "-m", "pytest", "-q", "tests/docs/test_docs.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks on a GPU (docs/benchmarks.md): every row on every workload, the per-call
    overhead targets, cold vs warm cache; results in $OUT or ./bench-out (``-- --quick`` for a smoke run)."""
    _install(session, "rtx,cuda,cli,torch,plot")
    session.run("python", "-m", "benchmarks", *session.posargs)
