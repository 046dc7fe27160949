"""What the GPU's clocks, power and temperature were while the bench ran (nvidia-smi).

The same kernels have timed up to 3% apart on different H100s of one model, while on one
machine they repeat within 0.5% (docs/design-notes.md, "Timing"). Each record names its GPU (uuid) and the
clocks and clock limits its run saw: whether a slow run had its clocks cut, and which runs
shared a GPU. (On the one slow machine seen so far the clocks were not the cause: 1980
MHz, no limits.)
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading

FIELDS = ("uuid", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")
FIGURES = ("sm_mhz", "mem_mhz", "power_w", "temp_c")  # FIELDS[1:5]
SAMPLE_MS = 200

# nvidia-smi's clocks_throttle_reasons bits.
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "software power cap", 0x8: "hardware slowdown",
           0x10: "sync boost", 0x20: "software thermal", 0x40: "hardware thermal", 0x80: "power brake",
           0x100: "display clocks"}
IDLE = 0x1


def _bare(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def summarize(text: str, uuid: str | None) -> dict:
    """nvidia-smi's CSV lines (no header, no units) of the GPU `uuid` (None: the only GPU
    listed) -> that GPU's uuid (as nvidia-smi prints it, without "GPU-"), [min, median,
    max] of each figure over the samples taken while busy (an idle GPU drops its clocks),
    and every clock-limit reason seen."""
    samples = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(FIELDS):
            continue
        try:
            samples.append((_bare(cells[0]), [float(c) for c in cells[1:5]], int(cells[5], 16)))
        except ValueError:  # "[N/A]" in a field: not a sample
            continue
    gpus = {s[0] for s in samples}
    want = _bare(uuid) if uuid else (gpus.pop() if len(gpus) == 1 else None)
    mine = [s for s in samples if s[0] == want]
    busy = [values for _, values, mask in mine if not mask & IDLE]
    seen = 0
    for _, _, mask in mine:
        seen |= mask
    out: dict = {"uuid": want, "samples": len(mine), "busy_samples": len(busy),
                 "reasons": [name for bit, name in REASONS.items() if seen & bit]}
    for i, key in enumerate(FIGURES):
        column = [v[i] for v in busy]
        out[key] = [min(column), statistics.median(column), max(column)] if column else None
    return out


def describe(state: dict | None) -> str:
    if not state or not state.get("sm_mhz"):
        return "device state: not recorded (no nvidia-smi, or no sample of this GPU busy)"
    sm, mem, power, temp = (state[k] for k in FIGURES)
    limits = [r for r in state["reasons"] if r != "idle"]
    return (f"SM clock {sm[1]:.0f} MHz (busy samples {sm[0]:.0f}-{sm[2]:.0f}), memory {mem[1]:.0f} MHz, "
            f"power up to {power[2]:.0f} W, {temp[0]:.0f}-{temp[2]:.0f} C, "
            f"clock limits seen: {', '.join(limits) if limits else 'none'}")


class DeviceLog:
    """Samples the GPU `uuid` about every SAMPLE_MS while in use: `with DeviceLog(uuid) as
    log: ...`, then `log.state` (None where there is no nvidia-smi, or not `enabled`). One
    query a sample, from a thread: a looping nvidia-smi's piped output can still sit in its
    buffer when stopped."""

    def __init__(self, uuid: str | None = None, enabled: bool = True):
        self.uuid = uuid
        self.state: dict | None = None
        smi = shutil.which("nvidia-smi") if enabled else None
        self._cmd = [smi, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"] if smi else None
        self._lines: list[str] = []
        self._failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                run = subprocess.run(self._cmd, capture_output=True, text=True, timeout=10)
                ok = run.returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            if ok:
                self._lines.append(run.stdout)
            else:
                self._failed += 1  # counted in the record: a gap in the log, not in the timings
            self._stop.wait(SAMPLE_MS / 1000)

    def __enter__(self) -> DeviceLog:
        if self._cmd:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self._cmd:
            return
        self._stop.set()
        self._thread.join()
        self.state = summarize("".join(self._lines), self.uuid)
        self.state["failed_queries"] = self._failed
