"""Docs a reader can follow: every command listed, no issue numbers, a LICENSE, the docs extra."""

from __future__ import annotations

import re
from pathlib import Path

from trt_runtime.cli.parser import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_docs_index_lists_every_command() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert [c for c in COMMANDS if f"`{c}`" not in index] == []


def test_docs_cite_no_issue_numbers() -> None:
    # "issue 10" points at a tracker no reader has (the dated GPU log included); torch-tensorrt's
    # "issues #4328" is a link.
    cited = re.compile(r"\bissues? \d+", re.IGNORECASE)
    docs = sorted((ROOT / "docs").glob("*.md"))
    pages = [ROOT / "README.md", *docs]
    found = [f"{p.name}: {m.group(0)}" for p in pages for m in cited.finditer(p.read_text(encoding="utf-8"))]
    assert found == []


def test_docs_troubleshooting_is_in_the_nav_and_covers_what_users_meet() -> None:
    assert "troubleshooting.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    for topic in ("no trt-runtime backend can run here", "could not be deserialized", "runtime cache",
                  "ContextOverlapWarning", "busy port", "Ray that will not start"):
        assert topic in page, topic


def test_license_is_the_apache_2_text_pyproject_names() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_noxfile_docs_session_installs_the_docs_extra() -> None:
    source = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    docs = source[source.index("def docs("):source.index("def bench(")]
    assert re.search(r"_install\(session, \"[^\"]*\bdocs\b", docs), docs


def test_readme_main_job_installs_what_the_demo_needs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (line,) = [ln for ln in readme.splitlines() if ln.endswith("trt-runtime demo")]
    extras = set(re.search(r"-e '\.\[([^\]]+)\]'", line).group(1).split(","))  # type: ignore[union-attr]
    assert {"rtx", "cli", "onnx"} <= extras
