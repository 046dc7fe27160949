"""The command line on any machine: arguments, the no-GPU path, the JSON record, the plot, exports."""

import json
import math
import re
import subprocess
import sys

import pytest
import torch

from normscan import cli
from normscan.cli import bench, device_log, export, verify
from normscan.problems import PROBLEMS


def test_arguments():
    args = cli.parser().parse_args(["bench", "--sweep", "--ops", "cumprod", "l2_normalize", "--dtype", "bfloat16",
                                    "--repeat", "5", "--out", "somewhere"])
    assert args.sweep and args.ops == ["cumprod", "l2_normalize"] and args.dtype == ["bfloat16"]
    assert args.repeat == 5 and str(args.out) == "somewhere"
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["bench", "--ops", "softmax"])
    with pytest.raises(SystemExit):
        cli.parser().parse_args([])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_bench_without_gpu_says_so_and_exits_zero():
    run = subprocess.run([sys.executable, "-m", "normscan", "bench"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "no CUDA device here" in run.stdout and "IS the PyTorch" in run.stdout
    for name in PROBLEMS:
        assert name in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_verify_and_env_without_gpu():
    run = subprocess.run([sys.executable, "-m", "normscan", "verify"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "no CUDA device" in run.stdout
    run = subprocess.run([sys.executable, "-m", "normscan", "env"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "cache folder" in run.stdout and "kernels built" in run.stdout


def _rows():
    return [bench.Row("39_L2Norm_", "l2_normalize", [32768, 65535], "float32", 17179344896,
                      {"normscan": 5.9, "eager": 10.1, "compile": 13.7}, 3e-7, 1e-5, True),
            bench.Row("90_cumprod", "cumprod", [32768, 32768], "float32", 8589934592,
                      {"normscan": 2.9, "eager": 5.1, "compile": 3.2}, 4e-6, 8e-6, True)]


def test_json_record_and_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install normscan[extras])")
    record, plotted = bench.write_outputs(_rows(), 3000.0, tmp_path, False, 20, 3)
    loaded = json.loads((tmp_path / "bench.json").read_text())
    assert loaded == record
    for key in ["device", "date", "normscan", "commit", "torch", "cuda", "python", "repeat", "rounds", "copy_gbs",
                "device_state", "rows"]:
        assert key in loaded
    row = loaded["rows"][0]
    assert set(row) == {"label", "op", "shape", "dtype", "bytes", "ms", "error", "bound", "correct", "rounds_ms",
                        "warmup_ms"}
    assert set(row["ms"]) >= {"normscan", "eager", "compile"}
    assert plotted and (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_device_log_summary():
    gpu, other = "GPU-aaaa-1111", "GPU-bbbb-2222"
    text = "\n".join([
        f"{gpu}, 1980, 2619, 390.5, 46, 0x0000000000000000",
        f"{gpu}, 345, 2619, 70.0, 40, 0x0000000000000001",  # idle: not in the clock figures
        f"{gpu}, 1755, 2619, 699.0, 61, 0x0000000000000004",  # power-capped
        f"{other}, 1000, 1000, 1.0, 1, 0x0000000000000000",  # another GPU
        f"{gpu}, [N/A], 2619, 300.0, 50, 0x0000000000000000",  # not a sample
        "No devices were found",
    ])
    state = device_log.summarize(text, "aaaa-1111")
    assert state["uuid"] == "aaaa-1111" and state["samples"] == 3 and state["busy_samples"] == 2
    assert state["sm_mhz"] == [1755.0, 1867.5, 1980.0] and state["power_w"][2] == 699.0
    assert state["reasons"] == ["idle", "software power cap"]
    line = device_log.describe(state)
    assert "SM clock 1868 MHz (busy samples 1755-1980)" in line and "clock limits seen: software power cap" in line
    # Without a uuid: only a lone GPU's samples are taken, not a mix of two.
    assert device_log.summarize(text, None)["samples"] == 0
    lone = device_log.summarize(text.replace(other, gpu), None)
    assert lone["samples"] == 4 and lone["uuid"] == "aaaa-1111"
    assert "not recorded" in device_log.describe(device_log.summarize("", None))
    assert "not recorded" in device_log.describe(None)


def test_table_figures():
    rows = bench.table_rows(_rows(), 3000.0)
    assert rows[0][:3] == ["39_L2Norm_", "float32", "5.900"]
    assert rows[0][6] == "97.1%" and rows[0][7] == "1.71x" and rows[0][8] == "2.32x"


# KernelBench's static checker, restated: comments end at '#' or '//' on a line.
FORBIDDEN = [r"\btry\s*:", r"\bexcept\s*:", r"\bexcept\s+\w+", r"\bpass\b", r"torch\.cuda\.Stream\s*\(",
             r"cuda\.Stream\s*\(", r"with\s+torch\.cuda\.stream", r"\.wait_stream\s*\(", r"\.record_stream\s*\(",
             r"threading", r"multiprocessing", r"concurrent\.futures", r"ThreadPoolExecutor",
             r"__float2half(_rn)?\s*\(", r"\(\s*__half\s*\)\s*[\w\->\.]+", r"static_cast\s*<\s*(__half|half)\s*>",
             r"\.half\s*\(", r"\.to\s*\(\s*(dtype\s*=\s*)?torch\.(float16|half)\b",
             r"torch\.nn\.(?!(Module|parameter|Parameter|ParameterList|ParameterDict|ModuleList|ModuleDict|init)\b)",
             r"\bnn\.functional\.\w+"]


def _strip(code):
    lines = []
    for line in code.split("\n"):
        line = line.split("#", 1)[0]
        lines.append(line.split("//", 1)[0])
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_exported_solution_is_self_contained_and_clean(tmp_path, name):
    path = next(p for p in export.write_all(tmp_path) if p.stem == name)
    source = path.read_text()
    compile(source, str(path), "exec")
    code = _strip(source)
    for pattern in FORBIDDEN:
        assert not re.search(pattern, code), (pattern, re.search(pattern, code))
    assert "__global__" in code and "load_inline" in code and re.search(r"\bthreadIdx\.", code)
    assert "normscan" not in re.findall(r"^\s*(?:import|from)\s+(\S+)", source, re.M)
    assert "class ModelNew(nn.Module)" in source
    assert PROBLEMS[name].inputs_source in source
    # The problem's own input functions, as KernelBench defines them.
    namespace = {"torch": torch}
    exec(PROBLEMS[name].inputs_source, namespace)
    assert list(namespace["get_init_inputs"]()) == list(PROBLEMS[name].init_inputs)


def test_checker_patterns_can_fail():
    assert re.search(FORBIDDEN[3], _strip("x = 1\npass\n"))
    assert not re.search(FORBIDDEN[3], _strip("x = 1  # pass\n"))


def test_rel_error_takes_overflow_in_the_output_dtype():
    """An exact result beyond float32's range is inf in float32, as PyTorch's op gives it;
    a finite output there, or inf where the rounded result is finite, is still a mismatch."""
    ref = torch.tensor([1.0, 1e39, -1e39, 2.0**127], dtype=torch.float64)
    ok = torch.tensor([1.0, math.inf, -math.inf, 2.0**127], dtype=torch.float32)
    assert verify.rel_error(ok, ref) == (0.0, "")
    finite_there = torch.tensor([1.0, 3.4e38, -math.inf, 2.0**127], dtype=torch.float32)
    assert verify.rel_error(finite_there, ref)[1] == "inf mismatch"
    wrong_sign = torch.tensor([1.0, -math.inf, -math.inf, 2.0**127], dtype=torch.float32)
    assert verify.rel_error(wrong_sign, ref)[1] == "inf mismatch"
    inf_too_early = torch.tensor([1.0, math.inf, -math.inf, math.inf], dtype=torch.float32)
    assert verify.rel_error(inf_too_early, ref)[1] == "inf mismatch"
