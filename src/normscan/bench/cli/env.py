"""`normscan env`: versions, device, the source commit, the cache folder, and which kernel
families are built."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
from pathlib import Path

import torch

from ... import __version__, _build

PACKAGE = Path(__file__).resolve().parent.parent


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git: no commit to report
        return None


def source_commit(package: Path = PACKAGE) -> str:
    """normscan's own commit: $NORMSCAN_COMMIT (for a copy of a checkout without .git), else
    the HEAD of the git checkout normscan's sources are tracked in (with "-dirty" when they
    differ from it), else "unknown" (an installed wheel; or a checkout of something else,
    such as a project whose virtual environment holds normscan)."""
    if os.environ.get("NORMSCAN_COMMIT"):
        return os.environ["NORMSCAN_COMMIT"]
    tracked = _git(package, "ls-files", "--error-unmatch", "__init__.py")
    if tracked is None or tracked.returncode != 0:
        return "unknown"
    head = _git(package, "rev-parse", "--short", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    status = _git(package, "status", "--porcelain", "--untracked-files=no", "--", ".")
    dirty = status is not None and bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _nvcc() -> str:
    try:
        return _build.nvcc()
    except _build.BuildError:
        return "none found (needed for kernels not prebuilt)"


def facts() -> list[tuple[str, str]]:
    rows = [("normscan", f"{__version__} (commit {source_commit()})"), ("python", platform.python_version()),
            ("torch", torch.__version__), ("torch CUDA", str(torch.version.cuda)),
            ("nvcc", _nvcc())]
    manifest = _build.prebuilt_manifest()
    rows += [("prebuilt kernels", f"{', '.join(manifest['archs'])}, PTX {manifest.get('ptx') or 'none'} "
                                  f"({manifest['toolchain']})" if manifest else "none in this package")]
    cuda = torch.cuda.is_available()
    if cuda:
        major, minor = _build.arch()
        props = torch.cuda.get_device_properties(0)
        rows += [("device", f"{props.name} (sm_{major}{minor}, {props.multi_processor_count} SMs, "
                            f"{props.total_memory / 2**30:.0f} GiB)")]
    else:
        rows += [("device", "no CUDA device visible to torch")]
    rows += [("cache folder", str(_build.cache_dir()))]
    for extension in _build.extensions():
        if not cuda:
            rows.append((f"{extension} kernels built", "no: the CUDA kernels cannot be built or run here (no CUDA "
                                                       "device); CPU tensors use the reference"))
            continue
        use = ("a gradient through it" if extension.endswith(_build.BACKWARD) else
               "its first call with out_dtype=" if extension.endswith(_build.OUT) else "its first call")
        if _build.prebuilt_serves(extension, _build.arch()):
            rows.append((f"{extension} kernels built", "every op's, prebuilt"))
            continue
        built = [f for f, op in _build.extension_ops(extension).items() if _build.is_built(extension, op)]
        rows.append((f"{extension} kernels built", f"{', '.join(built) or 'none'} (each op's on {use})"))
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    del p  # no options


def main(args: argparse.Namespace) -> int:
    rows = facts()
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    return 0
