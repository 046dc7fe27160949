"""`normscan env`: versions, device, architecture, the cache folder, and whether the kernels are built."""

from __future__ import annotations

import argparse
import platform
import shutil

import torch

from .. import __version__, _build


def facts() -> list[tuple[str, str]]:
    rows = [("normscan", __version__), ("python", platform.python_version()), ("torch", torch.__version__),
            ("torch CUDA", str(torch.version.cuda)), ("nvcc", shutil.which("nvcc") or "not on PATH")]
    if torch.cuda.is_available():
        major, minor = _build.arch()
        props = torch.cuda.get_device_properties(0)
        rows += [("device", f"{props.name} (sm_{major}{minor}, {props.multi_processor_count} SMs, "
                            f"{props.total_memory / 2**30:.0f} GiB)")]
    else:
        rows += [("device", "no CUDA device visible to torch")]
    rows += [("cache folder", str(_build.cache_dir())),
             ("kernels built", "yes" if _build.is_built() else "no (built on first use)")]
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    del p  # no options


def main(args: argparse.Namespace) -> int:
    width = max(len(k) for k, _ in facts())
    for key, value in facts():
        print(f"{key.ljust(width)}  {value}")
    return 0
