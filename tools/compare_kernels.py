"""Are two builds' kernels the same machine code, whatever their names?

    python tools/compare_kernels.py OLD NEW

OLD and NEW are PTX (`nvcc -ptx`, no GPU needed) or SASS (`cuobjdump -sass`) listings of
the same instantiations at two commits. A refactor that renames kernels (a template
argument that became a named configuration) changes every mangled name, so kernels are
matched by their code: identifiers are numbered in order of first use within each kernel,
and PTX module-scope declarations a kernel uses (its shared arrays) are part of it. Prints
how many kernels are identical and, demangled, those whose code is in one listing only.
Exits 1 if any differ.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

_IDENT = re.compile(r"\b_Z\w+")
_PTX_ENTRY = re.compile(r"^(?:\.visible\s+)?\.entry\s+(\w+)\(", re.M)
_PTX_DECL = re.compile(r"^(?:\.extern\s+)?\.(?:shared|global|const)\b[^\n]*?\b(_Z\w+)[^\n]*$", re.M)
_SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.M)
_SASS_NOISE = re.compile(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]+ \*/")
# PTX virtual registers and labels: numbered by the compiler front end, which a change that
# leaves the instructions alone can still shift; ptxas allocates registers itself.
_PTX_NAMES = re.compile(r"%(?:rd|rs|r|fd|f|p|h|hh)\d+|\$L__\w+")
_PTX_REG_DECL = re.compile(r"^\s*\.reg\s.*$", re.M)


def _renamed(text: str, pattern: re.Pattern = _IDENT) -> str:
    """Names matching `pattern` numbered in order of first appearance (by kind for registers)."""
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        kind = re.sub(r"\d+$", "", m.group(0)) if m.group(0).startswith("%") else "N"
        return names.setdefault(m.group(0), f"{kind}#{len(names)}")
    return pattern.sub(rename, text)


def ptx_kernels(text: str) -> dict[str, str]:
    """Kernel name -> its normalized code (body and the declarations it uses)."""
    decls = {m.group(1): m.group(0) for m in _PTX_DECL.finditer(text)}
    out = {}
    for m in _PTX_ENTRY.finditer(text):
        end = text.index("\n}\n", m.start()) + 3
        body = text[m.start():end]
        used = [decls[n] for n in dict.fromkeys(_IDENT.findall(body)) if n in decls]
        body = _PTX_REG_DECL.sub("", body)
        out[m.group(1)] = _renamed(_renamed("\n".join(used + [body])), _PTX_NAMES)
    return out


def sass_kernels(text: str) -> dict[str, str]:
    starts = list(_SASS_FUNCTION.finditer(text))
    out = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        lines = [_SASS_NOISE.sub("", line).strip() for line in text[m.end():end].splitlines()]
        out[m.group(1)] = _renamed("\n".join(line for line in lines if line))
    return out


def kernels(path: Path) -> dict[str, str]:
    text = path.read_text()
    return sass_kernels(text) if _SASS_FUNCTION.search(text) else ptx_kernels(text)


def demangle(names: list[str]) -> list[str]:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return names
    return subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()


def compare(old: dict[str, str], new: dict[str, str]) -> tuple[int, list[str], list[str]]:
    """(kernels identical, old kernels without a twin in new, new kernels without one in old)."""
    left, right = Counter(old.values()), Counter(new.values())
    common = left & right
    only_old, only_new = left - common, right - common
    return (sum(common.values()), [n for n, c in old.items() if c in only_old],
            [n for n, c in new.items() if c in only_new])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    old, new = kernels(Path(argv[0])), kernels(Path(argv[1]))
    same, only_old, only_new = compare(old, new)
    print(f"{len(old)} kernels in {argv[0]}, {len(new)} in {argv[1]}: {same} identical")
    for label, names in (("only in the first", only_old), ("only in the second", only_new)):
        for name in demangle(names):
            print(f"  {label}: {name}")
    return 0 if not only_old and not only_new and len(old) == len(new) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
