"""The docs run as written: every Python and shell block of the README and docs/ runs on the
CPU; the site builds with ``mkdocs build --strict`` (links and anchors checked) and its API
page has an entry for every public name, with the docstrings' cross-references resolved.

A block is marked by an HTML comment on the line before its fence (invisible on the site):

* ``<!-- gpu: REASON -->``: needs an NVIDIA GPU; skipped here with REASON;
* ``<!-- skip: REASON -->``: not run by the tests (installs packages, downloads), with REASON;
* ``<!-- ci: REASON -->``: an install-and-test line that ``.ci/run`` runs on a fresh machine;
  the test checks that every command of it is in ``.ci/run``;
* ``<!-- setup: CODE -->``: Python run before the block, Python or shell (names or files an
  excerpt assumes).

Blocks of one page run in order in one namespace and one temporary directory, which holds
``affine.mem`` (a memory-backend engine), ``model.pte`` (a TensorRT delegate program from
tests/fixtures) and ``model.plan`` (its plan). Shell blocks run with ``bash -e`` and the
venv's ``trt-runtime`` first on ``PATH``.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\w*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<kind>gpu|skip|ci|setup):\s*(?P<text>.*?)\s*-->\s*$")
RUNNABLE = ("python", "bash")


@dataclasses.dataclass
class Block:
    page: Path
    line: int
    lang: str
    code: str
    marks: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        marks: dict[str, str] = {}
        j = i - 1
        while j >= 0 and (mark := _MARK.match(lines[j])):
            marks[mark["kind"]] = mark["text"]
            j -= 1
        indent = len(fence["indent"])
        code = "\n".join(ln[indent:] for ln in lines[i + 1:end])
        found.append(Block(page, i + 1, fence["lang"], code, marks))
        i = end + 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in _blocks(page) if b.lang in RUNNABLE]
MARKED = [b for b in ALL_BLOCKS if {"gpu", "skip", "ci"} & set(b.marks)]
PAGES_THAT_RUN = sorted({b.page for b in ALL_BLOCKS if b not in MARKED})


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    from trt_runtime import TensorSpec
    from trt_runtime.formats import read_engine_source, write_plan
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="affine")
    (tmp_path / "affine.mem").write_bytes(data)
    pte = ROOT / "tests" / "fixtures" / "executorch" / "tensorrt_static_inline_cuda0.pte"
    shutil.copy(pte, tmp_path / "model.pte")
    write_plan(tmp_path / "model.plan", bytes(read_engine_source(pte).data))
    return tmp_path


def _run_bash(block: Block, cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(["bash", "-e", "-c", block.code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, (
        f"{block.id} failed ({done.returncode}):\n{block.code}\n{done.stdout}{done.stderr}"
    )


@pytest.mark.parametrize("page", PAGES_THAT_RUN, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_blocks_run_as_written(
    page: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = [b for b in _blocks(page) if b.lang in RUNNABLE and not {"gpu", "skip", "ci"} & set(b.marks)]
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("TRT_RUNTIME_CACHE_DIR", os.fspath(workdir / "user-cache"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for block in blocks:
        if "setup" in block.marks:
            exec(compile(block.marks["setup"], f"{block.id} (setup)", "exec"), namespace)
        if block.lang == "python":
            exec(compile(block.code, block.id, "exec"), namespace)
        else:
            _run_bash(block, workdir, env)
    capsys.readouterr()


@pytest.mark.parametrize("block", MARKED, ids=lambda b: b.id)
def test_docs_marked_blocks_say_why_they_do_not_run(block: Block) -> None:
    kind = next(k for k in ("gpu", "skip", "ci") if k in block.marks)
    reason = block.marks[kind]
    assert len(reason) > 10, f"{block.id}: a {kind} mark needs a reason"
    if kind == "ci":
        ci = (ROOT / ".ci" / "run").read_text()
        for command in block.code.split("&&"):
            assert command.strip() in ci, f"{block.id}: {command.strip()!r} is not what .ci/run runs"
        return
    pytest.skip(f"{block.id}: {'no GPU here: ' if kind == 'gpu' else ''}{reason}")


def test_docs_every_runnable_block_is_run_or_marked() -> None:
    unknown = [b.id for b in ALL_BLOCKS if set(b.marks) - {"gpu", "skip", "ci", "setup"}]
    assert not unknown
    assert len(ALL_BLOCKS) > 20  # the parser found the blocks
    names = {p.name for p in PAGES_THAT_RUN}
    assert {"README.md", "getting-started.md", "cli.md", "settings.md", "formats.md"} <= names


def test_docs_readme_and_getting_started_test_command_is_cis() -> None:
    def test_lines(page: Path) -> list[str]:
        return [b.code for b in _blocks(page) if "ci" in b.marks]

    assert test_lines(ROOT / "README.md") == test_lines(ROOT / "docs" / "getting-started.md")
    assert "--no-deps executorch" in test_lines(ROOT / "README.md")[0]


def test_docs_cli_lists_the_capabilities_backends_prints() -> None:
    from trt_runtime import BackendCapabilities

    flags = [f.name.removeprefix("supports_") for f in dataclasses.fields(BackendCapabilities)
             if f.name.startswith("supports_")]
    text = " ".join((ROOT / "docs" / "cli.md").read_text().split("## backends", 1)[1].split())
    listed = re.search(r"capabilities it declares: (.*?) \(the `supports_\*` fields", text)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed[1]) == flags


# -- the site ---------------------------------------------------------------------------------


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    hint = "pip install -c constraints.txt -e '.[test]'"
    pytest.importorskip("mkdocs", reason=f"mkdocs is not installed: {hint}")
    pytest.importorskip("mkdocstrings", reason=f"mkdocstrings is not installed: {hint}")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", os.fspath(config),
         "-d", os.fspath(site)],
        cwd=config.parent, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    done = _mkdocs(ROOT / "mkdocs.yml", target)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _inventory(site: Path) -> set[str]:
    raw = (site / "objects.inv").read_bytes()
    body = raw.split(b"\n", 4)[4]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


@pytest.mark.xdist_group("docs-site")  # the site fixture builds once, on one worker
def test_docs_site_builds_strict_with_cross_references_resolved(site: Path) -> None:
    api = (site / "api" / "index.html").read_text()
    raw_roles = re.findall(r":(?:class|func|meth|mod|attr|exc|data|obj):`", api)
    assert raw_roles == []
    assert api.count('class="autorefs autorefs-internal"') > 100
    for target in ("trt_runtime.cache.RuntimeCache", "trt_runtime.graphs.OuterGraph"):
        assert f'href="#{target}"' in api, target


@pytest.mark.xdist_group("docs-site")  # the site fixture builds once, on one worker
def test_docs_every_public_name_has_an_api_entry(site: Path) -> None:
    import importlib

    import trt_runtime

    entries = _inventory(site)
    missing = []
    modules = ["trt_runtime", "trt_runtime.graphs", "trt_runtime.torch_module", "trt_runtime.testing",
               "trt_runtime.settings", "trt_runtime.contexts", "trt_runtime.errors", "trt_runtime.registry"]
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # torch_module needs torch: read its __all__ from the source
            source = ROOT / (module_name.replace(".", "/") + ".py")
            tree = ast.parse(source.read_text())
            names = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                         and getattr(node.targets[0], "id", "") == "__all__")
            missing += [f"{module_name}.{n}" for n in names if f"{module_name}.{n}" not in entries]
            continue
        for name in module.__all__:
            if name.startswith("__"):
                continue
            obj = getattr(module, name)
            where = getattr(obj, "__module__", None) if callable(obj) else None
            candidates = {f"{module_name}.{name}"} | ({f"{where}.{name}"} if where else set())
            if not candidates & entries:
                missing.append(f"{module_name}.{name}")
    assert missing == []
    expected = {"trt_runtime.torch_module.TRTModule", "trt_runtime.graphs.OuterGraph", "trt_runtime.testing"}
    assert expected <= entries
    assert trt_runtime.__all__


def test_docs_broken_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    python = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [os.fspath(ROOT)]
    python["options"]["extensions"] = [f"{ROOT / 'tools' / 'griffe_roles.py'}:SphinxRoles"]
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    page = tmp_path / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\nSee [nowhere](cli.md#no-such-section).\n")
    broken = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert broken.returncode != 0
    # The one thing wrong is the anchor (the unchanged docs build clean: the site fixture), so
    # the build is not also rebuilt here without it.
    warnings = [ln for ln in (broken.stdout + broken.stderr).splitlines() if ln.startswith("WARNING")]
    assert warnings and all("no-such-section" in ln for ln in warnings), broken.stdout + broken.stderr


def test_docs_concepts_shows_load_as_it_is() -> None:
    """concepts.md's signature of ``load`` puts each parameter on the right side of ``*``."""
    import inspect

    import trt_runtime

    text = (ROOT / "docs" / "concepts.md").read_text()
    shown = re.search(r"`trt_runtime\.load\(([^)]*)\)`", text)
    assert shown is not None
    before, _, after = shown[1].partition("*")
    params = inspect.signature(trt_runtime.load).parameters
    for name in re.findall(r"(\w+)=", before):
        assert params[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
    for name in re.findall(r"(\w+)=", after):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert "device" in after
