"""The documents match the code: every environment variable read is documented, every
command's default is the one the README states, the license is the declared one, and the
documents speak of the project alone."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SOURCES = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tools").glob("*"), *(ROOT / "tests").rglob("*.py"),
           *(ROOT / ".ci").glob("*")]


def _variables_read(paths) -> set[str]:
    read = set()
    for path in paths:
        if path.name == "test_docs.py":
            continue
        text = path.read_text()
        read |= set(re.findall(r"""environ(?:\.get)?[\[(]\s*["']([A-Z_]+)["']""", text))
        read |= set(re.findall(r"\$\{?(NORMSCAN_[A-Z_]+)", text))
    return read


def test_every_environment_variable_read_is_documented():
    """The package's in the README (users'), the tests' and tools' in docs/architecture.md."""
    package = _variables_read((ROOT / "src").rglob("*.py"))
    readme = (ROOT / "README.md").read_text()
    assert {"NORMSCAN_CACHE_DIR", "XDG_CACHE_HOME", "NORMSCAN_EXTRA_CUDA_FLAGS", "NORMSCAN_COMMIT"} <= package
    assert [v for v in sorted(package) if f"`{v}`" not in readme] == []
    maintainers = readme + (ROOT / "docs" / "architecture.md").read_text()
    assert {"NORMSCAN_TEST_HUGE", "NORMSCAN_TUNE_VARIANTS"} <= _variables_read(SOURCES)
    assert [v for v in sorted(_variables_read(SOURCES)) if f"`{v}`" not in maintainers] == []


def test_command_defaults_are_the_documented_ones():
    from normscan.bench.cli import bench

    readme = (ROOT / "README.md").read_text()
    assert f"(default `./{bench.DEFAULT_OUT}`)" in readme
    assert f"(default {bench.DEFAULT_ROUNDS})" in readme and f"(default {bench.DEFAULT_REPEAT})" in readme


def test_license_is_the_declared_one():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


@pytest.mark.parametrize("path", DOCS + sorted((ROOT / "tools").glob("*")), ids=lambda p: p.name)
def test_documents_speak_of_the_project_alone(path):
    """By commit and date, not by the working sessions or tools that produced them."""
    text = path.read_text()
    for pattern in [r"\b[Ss]ession\b", r"device tool", r"lent to us", r"\$OUT\b"]:
        assert not re.search(pattern, text), (pattern, re.search(pattern, text))


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("path", [p for p in DOCS if _python_blocks(p)], ids=lambda p: p.name)
def test_every_python_block_of_the_docs_runs(path):
    """A reader's first copy-paste works: each block runs as it stands (on the CPU here, on
    the GPU where there is one)."""
    for i, block in enumerate(_python_blocks(path)):
        exec(compile(block, f"{path.name} block {i}", "exec"), {})


def test_the_docs_link_to_files_that_exist():
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)\)", path.read_text()):
            assert (path.parent / target).exists(), (path.name, target)


def _cited(text: str) -> list[tuple[str, str]]:
    """(document, section) of each citation in a source's comments: `docs/x.md, "Section"`,
    `docs/x.md "Section"` or `docs/tuning-record.md, reduce_scale-4` (section '' where none
    is named), the comment markers of a citation broken across lines dropped."""
    flat = re.sub(r"\n\s*(?://|#)?\s*", " ", text)
    return re.findall(r'(docs/[\w.-]+\.md)(?:,?\s+"([^"]+)"|,\s+((?:reduce_scale|scan)-[\w-]+))?', flat)


def test_the_code_cites_documents_and_sections_that_exist():
    """Every docs/ file a source names exists, and so does each section it names (a heading
    of that document); a citation whose section was renamed or dropped fails."""
    sources = [*SOURCES, *(ROOT / "src").rglob("*.cu*"), *(ROOT / "src").rglob("*.h")]
    seen = 0
    for path in sources:
        if path.is_dir() or path.name == "test_docs.py":
            continue
        for doc, section, label in [(d, s, l) for d, s, l in _cited(path.read_text())]:
            target = ROOT / doc
            assert target.exists(), (path.name, doc)
            headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
            name = section or label
            if name:
                seen += 1
                assert any(h == name or h.startswith(name + ":") for h in headings), (path.name, doc, name)
    assert seen > 20  # the scan found them


def test_the_citation_scanner_can_fail():
    text = '// (docs/design-notes.md, "Row\n  // kernels") and docs/tuning-record.md, scan-3.\n# docs/x.md "A b"'
    assert _cited(text) == [("docs/design-notes.md", "Row kernels", ""), ("docs/tuning-record.md", "", "scan-3"),
                            ("docs/x.md", "A b", "")]
