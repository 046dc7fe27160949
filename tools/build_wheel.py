"""Build normscan's wheel with prebuilt kernels: python tools/build_wheel.py [--archs 80,90,100,120].

Each extension is built once with every op's kernels, for each arch's device code and the
newest arch's PTX, into normscan/prebuilt/ (the modules take tensors through DLPack and are
of CPython's stable ABI: one wheel, cp310-abi3, serves every torch >= 2.10 and Python >= 3.10),
with a manifest of the archs and of the sources' keys (normscan/_build.py, "prebuilt kernels").
The wheel is the package's own (pip's build of it) with those files added and tagged for the
platform. Prints each module's size, and the device code each arch adds.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from normscan import _build  # noqa: E402

TAG = "cp310-abi3-linux_x86_64"  # CPython's stable ABI from 3.10 (_build.PY_LIMITED_API)


def build_modules(archs: list[tuple[int, int]], folder: Path, jobs: int, extra: list[str],
                  intermediates: bool = False) -> dict[str, str]:
    """Every extension's module (all its ops) into `folder`; nvcc's output into <module>.log,
    its intermediate files (each arch's PTX) into <module>.files/ where `intermediates`. The
    sources' keys, by extension."""
    threads = max(1, min(len(archs), jobs))

    def one(extension: str) -> str:
        start = time.perf_counter()
        name = f"normscan_{extension}"
        flags = [*_build.gencode(archs, ptx=True), "--threads", str(threads), *extra]
        if intermediates:
            (folder / f"{name}.files").mkdir(exist_ok=True)
            flags += ["--keep", "--keep-dir", str(folder / f"{name}.files")]
        _build.compile_module(name, _build.extension_source(extension), flags, folder, log=folder / f"{name}.log")
        return f"{extension}: {time.perf_counter() - start:.0f} s"

    with ThreadPoolExecutor(max(1, jobs // threads)) as pool:
        for line in pool.map(one, _build.extensions()):
            print(f"built {line}", flush=True)
    return {e: _build.source_key(e) for e in _build.extensions()}


def spills_by_arch(folder: Path, archs: list[tuple[int, int]]) -> dict[str, list[str]]:
    """Each arch's kernels with spills or a stack frame, from the modules' ptxas reports."""
    found: dict[str, list[str]] = {f"sm_{a}{b}": [] for a, b in archs}
    for log in sorted(folder.glob("*.log")):
        for line in _build.spilling_kernels(log.read_text()):
            found[re.search(r"\((sm_\d+)\)", line).group(1)].append(f"{log.stem}: {line}")
    return found


def device_code_by_arch(library: Path) -> dict[str, int]:
    """Bytes of device code a module holds for each arch (sm_XY) and its PTX (compute_XY), from
    its fatbin's entries (the CUDA fatbin container: a 16-byte header, then entries, each a
    header giving its kind, size and arch)."""
    data = library.read_bytes()
    sizes: dict[str, int] = {}
    for match in re.finditer(rb"\x50\xed\x55\xba", data):  # the container's magic, little-endian
        start = match.start()
        header_size = int.from_bytes(data[start + 6:start + 8], "little")
        total = int.from_bytes(data[start + 8:start + 16], "little")
        if header_size != 16 or total <= 0 or start + 16 + total > len(data):
            continue
        at, end = start + 16, start + 16 + total
        while at + 32 <= end:
            kind = int.from_bytes(data[at:at + 2], "little")
            entry_header = int.from_bytes(data[at + 4:at + 8], "little")
            payload = int.from_bytes(data[at + 8:at + 16], "little")
            arch = int.from_bytes(data[at + 28:at + 32], "little")
            if kind not in (1, 2) or entry_header < 32 or payload <= 0:
                break
            label = f"{'compute' if kind == 1 else 'sm'}_{arch}"
            sizes[label] = sizes.get(label, 0) + entry_header + payload
            at += entry_header + payload
    return sizes


def pure_wheel(out: Path) -> Path:
    """pip's wheel of the package as it is (no prebuilt kernels)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out),
                    str(ROOT)], check=True)
    (wheel,) = out.glob("normscan-*.whl")
    return wheel


def _record_row(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def platform_wheel(pure: Path, prebuilt: Path, dist: Path) -> Path:
    """The pure wheel with normscan/prebuilt/ added, tagged TAG (not pure Python: the WHEEL
    file's Root-Is-Purelib false), its RECORD rewritten."""
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(pure) as z:
        for name in z.namelist():
            files[name] = z.read(name)
    info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/WHEEL"))
    for path in sorted(prebuilt.iterdir()):
        if path.suffix in (".so", ".json"):
            files[f"normscan/prebuilt/{path.name}"] = path.read_bytes()
    wheel_meta = files[f"{info}/WHEEL"].decode()
    wheel_meta = re.sub(r"^Root-Is-Purelib: .*$", "Root-Is-Purelib: false", wheel_meta, flags=re.M)
    wheel_meta = re.sub(r"^Tag: .*\n?", "", wheel_meta, flags=re.M).rstrip("\n") + f"\nTag: {TAG}\n"
    files[f"{info}/WHEEL"] = wheel_meta.encode()
    record_name = f"{info}/RECORD"
    files.pop(record_name, None)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        writer.writerow(_record_row(name, data))
    writer.writerow([record_name, "", ""])
    files[record_name] = record.getvalue().encode()
    version = info.removesuffix(".dist-info").split("-")[1]
    target = dist / f"normscan-{version}-{TAG}.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", default="80,90,100,120", help="compute capabilities, e.g. 80,90 (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes at once")
    p.add_argument("--dist", type=Path, default=ROOT / "dist", help="folder for the wheel (default: ./dist)")
    p.add_argument("--keep", type=Path, help="keep the modules and nvcc's logs here")
    p.add_argument("--keep-intermediates", action="store_true", help="and nvcc's intermediate files (with --keep)")
    p.add_argument("--nvcc-flags", default="", help="more nvcc flags")
    p.add_argument("--spill-free", default="80,90",
                   help="archs whose kernels must neither spill nor use a stack frame (default: %(default)s); "
                        "every arch's count is printed")
    args = p.parse_args(argv)
    archs = [(int(a) // 10, int(a) % 10) for a in args.archs.split(",")]
    spill_free = {f"sm_{a}" for a in args.spill_free.split(",") if a}
    args.dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        prebuilt = args.keep or Path(tmp) / "prebuilt"
        prebuilt.mkdir(parents=True, exist_ok=True)
        keys = build_modules(archs, prebuilt, args.jobs, ["-Xptxas", "-v", *args.nvcc_flags.split()],
                             args.keep_intermediates)
        spills = spills_by_arch(prebuilt, archs)
        print("kernels with spills or a stack frame: " + ", ".join(f"{a} {len(k)}" for a, k in spills.items()))
        failed = {a: k for a, k in spills.items() if a in spill_free and k}
        for arch, kernels in failed.items():
            print(f"{arch} must be spill-free (--spill-free {args.spill_free}), and these kernels are not; no wheel "
                  "written (change their policy, or leave the arch out of --spill-free to ship them):",
                  *kernels[:20], sep="\n  ")
        if failed:
            return 1
        manifest = {"archs": [f"sm_{a}{b}" for a, b in archs], "ptx": "compute_{}{}".format(*max(archs)),
                    "toolchain": _build.toolchain(_build.nvcc()), "keys": keys}
        (prebuilt / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        wheel = platform_wheel(pure_wheel(Path(tmp) / "pure"), prebuilt, args.dist)
        by_arch: dict[str, int] = {}
        for library in sorted(prebuilt.glob("*.abi3.so")):
            codes = device_code_by_arch(library)
            for label, size in codes.items():
                by_arch[label] = by_arch.get(label, 0) + size
            print(f"{library.name}: {library.stat().st_size / 2**20:.1f} MiB")
        print("device code: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(by_arch.items())))
        print(f"wrote {wheel} ({wheel.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
