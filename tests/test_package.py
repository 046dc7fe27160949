"""The package's shape: the library apart from its harness, plain Python a reader can step
into, regions as objects."""

import re
import subprocess
import sys
from pathlib import Path

LIBRARY = Path(__file__).resolve().parent.parent / "src" / "normscan"


def test_import_normscan_loads_the_library_alone():
    """`import normscan` imports no module of the harness (normscan.bench: verify's cases,
    the timer, the catalogue, KernelBench's problems, the commands)."""
    out = subprocess.run([sys.executable, "-c", "import sys, normscan; print(*sorted(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout.split()
    loaded = [m for m in out if m.startswith("normscan")]
    assert "normscan.ops" in loaded and not [m for m in loaded if m.startswith("normscan.bench")], loaded


def _library_sources():
    return [p for p in LIBRARY.glob("*.py")]


def test_the_library_builds_no_code_from_strings():
    for path in _library_sources():
        assert not re.search(r"\b(exec|eval)\(", path.read_text()), path.name


def test_no_region_is_named_by_a_string_outside_the_region_classes():
    """What an op reduces is an object (regions.py), not a string compared in branches."""
    pattern = re.compile(r"""region\s*[!=]=\s*["']""")
    for path in [*_library_sources(), *LIBRARY.glob("bench/**/*.py")]:
        assert not pattern.search(path.read_text()), path.name


def test_the_source_distribution_carries_the_tests_and_the_package_its_types(tmp_path):
    """An sdist's tests run (their helpers conftest.py and calls.py come with them), and the
    package says it is typed (py.typed) and ships its CUDA sources."""
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                          "print(b.build_sdist(sys.argv[1]))", str(tmp_path)], cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    sdist = tmp_path / run.stdout.strip().splitlines()[-1]
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    assert {"tests/conftest.py", "tests/calls.py", "tests/test_ops.py", "src/normscan/py.typed",
            "src/normscan/csrc/binding.cuh", "docs/architecture.md", "LICENSE"} <= names
