"""tools/ without a GPU: what tools/tune.py builds for the entries it times; what
tools/kernelbench_eval.py checks; tools/ncu_probe.py's programs; tools/device-check.sh's steps."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import pytest  # noqa: E402
import tune  # noqa: E402

from normscan.registry import REGISTRY  # noqa: E402


def test_tune_builds_the_timed_entries_ops_alone():
    softmax, layer_norm = REGISTRY["softmax"].op_id, REGISTRY["layer_norm"].op_id
    assert tune.builds(["23_Softmax", "40_LayerNorm"], "") == [("reduce_scale", softmax), ("reduce_scale", layer_norm)]
    cumprod, rms = REGISTRY["cumprod"].op_id, REGISTRY["rms_norm"].op_id
    assert tune.builds(["cumprod"], "backward") == [("scan", cumprod), ("scan_backward", cumprod)]
    masked = REGISTRY["masked_cumsum"].op_id
    assert tune.builds(["rms_norm", "masked_cumsum"], "backward") == [  # masked_cumsum's gradient has no kernel
        ("reduce_scale", rms), ("scan", masked), ("reduce_scale_backward", rms)]
    assert len(tune.builds([], "")) == len({(s.family.name, s.op_id) for s in REGISTRY.values()})


def test_tune_selects_entries_by_label_and_its_scripts_compile():
    labels = [e.label for e in tune.selected_entries(["90_cumprod"], "")]
    assert labels == ["90_cumprod"]
    both = [e.label for e in tune.selected_entries(["rms_norm&65536)"], "")]
    assert both == [f"rms_norm last-dim{w} (1024, 65536) {dt}" for dt in ("float32", "bfloat16") for w in ("", "+w")]
    assert len(tune.selected_entries([], "")) > 100
    compile(tune.LOAD.format(builds=tune.builds(["cumprod"], ""), tuned=[]) + tune.TIMING, "<tune>", "exec")


def test_tune_main_starts_one_build_a_variant(monkeypatch, tmp_path):
    """--build-only: each variant's builds in a process of its own, the LOAD script given the
    timed entries' builds and the variant's flags."""
    started = []

    class Proc:
        def __init__(self, command, env):
            started.append(command)

        def wait(self):
            return 0

    monkeypatch.setenv("NORMSCAN_TUNE_CASES", "90_cumprod")
    monkeypatch.setenv("NORMSCAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tune.subprocess, "Popen", Proc)
    assert tune.main(["", "ScanRowsPolicy.kVecs=8 -lineinfo"], build_only=True) == 0
    assert started[0][-1] == ""
    assert started[1][-1].startswith("-DNORMSCAN_TUNED_SCAN -I") and started[1][-1].endswith(" -lineinfo")
    assert f"[('scan', {REGISTRY['cumprod'].op_id})]" in started[0][2]


def test_tune_builds_whole_policies_from_the_values_given(tmp_path):
    """A variant's values become a header that names every policy of the family, the changed
    ones derived from their defaults: compiled with policy.cuh, it gives those values and
    keeps the others; a value no policy has is refused with the list of those there are."""
    csrc = Path(tune.__file__).resolve().parents[1] / "src" / "normscan" / "csrc"
    flags = tune.policy_flags(["LookbackPolicy.kVecs=3", "RowsPolicy.kHeld=8"], csrc, tmp_path)
    assert flags[:2] == ["-DNORMSCAN_TUNED_REDUCE_SCALE", "-DNORMSCAN_TUNED_SCAN"] and flags[2].startswith("-I")
    compiler = shutil.which("c++")
    if compiler is None:
        pytest.skip("no host C++ compiler (c++)")
    src = tmp_path / "check.cpp"
    src.write_text('#include "reduce_scale/policy.cuh"\n#include "scan/policy.cuh"\nusing namespace normscan;\n'
                   "static_assert(LookbackPolicy::kVecs == 3 && RowsPolicy::kHeld == 8, \"the values given\");\n"
                   "static_assert(LookbackPolicy::kBlock == DefaultLookbackPolicy::kBlock, \"the rest kept\");\n"
                   "static_assert(BackwardPolicy::kVecs == DefaultBackwardPolicy::kVecs, \"other policies kept\");\n")
    for given in ([], flags):
        run = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", f"-I{csrc}", *given, str(src)],
                             capture_output=True, text=True)
        assert (run.returncode == 0) == bool(given), run.stderr[-2000:]
    with pytest.raises(SystemExit, match="names no policy value.*LookbackPolicy.kVecs"):
        tune.policy_flags(["Lookback.kVecs=3"], csrc, tmp_path)


def test_tune_prints_each_variant_as_it_is_timed(monkeypatch, capsys):
    """A variant's figures are printed before the next is timed: one that fails (or a call's
    time limit) leaves the earlier ones in the log."""

    class Proc:
        def __init__(self, command, env):
            pass

        def wait(self):
            return 0

    class Run:
        def __init__(self, stdout):
            self.stdout, self.stderr = stdout, "the second variant's error"

    result = 'RESULT {"copy_gbs": 4000.0, "90_cumprod": [[2.0, 4000.0], [2.1, 3800.0], [2.2, 3600.0]]}'
    outputs = iter([result, ""])
    monkeypatch.setenv("NORMSCAN_TUNE_CASES", "90_cumprod")
    monkeypatch.setattr(tune.subprocess, "Popen", Proc)
    monkeypatch.setattr(tune.subprocess, "run", lambda *a, **k: Run(next(outputs)))
    assert tune.main(["", "-lineinfo"]) == 1
    out = capsys.readouterr().out
    assert "(defaults) (copy 4000 GB/s)" in out
    assert "median   2.100 ms  rounds 2.000 2.100 2.200  best 100.0% of copy" in out
    assert "the second variant's error" in out


def test_tune_variant_of_another_tree_imports_its_sources(monkeypatch, tmp_path):
    """A variant "@TREE FLAGS" builds and times TREE's src/ with FLAGS; the others this tree's
    (whose policies the values of a variant name: tmp_path has none)."""
    started = []

    class Proc:
        def __init__(self, command, env):
            started.append((command[-1], env["PYTHONPATH"].split(os.pathsep)[0]))

        def wait(self):
            return 0

    monkeypatch.setenv("NORMSCAN_TUNE_CASES", "90_cumprod")
    monkeypatch.setattr(tune.subprocess, "Popen", Proc)
    assert tune.main(["", f"@{tmp_path} -lineinfo"], build_only=True) == 0
    root = Path(tune.__file__).resolve().parent.parent
    assert started == [("", str(root / "src")), ("-lineinfo", str(tmp_path.resolve() / "src"))]


def test_kernelbench_eval_runs_the_checkouts_checker_on_each_exported_file(tmp_path, monkeypatch, capsys):
    """tools/kernelbench_eval.py on a stand-in checkout: its checker sees each exported file
    (KernelBench's real one runs on the device and in the closing checks); without a GPU
    nothing is evaluated, and a rejected file fails the run."""
    import kernelbench_eval

    source = tmp_path / "kb" / "src" / "kernelbench"
    source.mkdir(parents=True)
    for name in ("eval", "timing", "dataset"):
        (source / f"{name}.py").write_text("")
    (source / "kernel_static_checker.py").write_text(
        "def validate_kernel_static(code, backend, precision):\n"
        "    ok = 'class ModelNew' in code and backend == 'cuda' and precision == 'fp32'\n"
        "    return ok and 'cumprod' not in code, [] if ok and 'cumprod' not in code else ['rejected'], []\n")
    monkeypatch.setattr(kernelbench_eval.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "records.json"
    assert kernelbench_eval.main(["--kernelbench", str(tmp_path / "kb"), "--problems", "39_L2Norm_", "89_cumsum",
                                  "--out", str(out)]) == 0
    assert "39_L2Norm_             static ok, not evaluated (no GPU)" in capsys.readouterr().out
    assert [r["problem"] for r in json.loads(out.read_text())] == ["39_L2Norm_", "89_cumsum"]
    assert kernelbench_eval.main(["--kernelbench", str(tmp_path / "kb"), "--problems", "90_cumprod"]) == 1
    assert "failed: 90_cumprod" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="src/kernelbench lacks eval.py"):
        kernelbench_eval.main(["--kernelbench", str(tmp_path), "--problems", "89_cumsum"])


def test_ncu_probe_scripts_compile_and_quack_cases_need_quack(tmp_path, capsys, monkeypatch):
    """Every case's program is valid Python; without quack its cases are named and left out
    before ncu runs, in both modes (here no case is left, so it stops with the list of cases)."""
    import importlib.util

    import ncu_probe

    for name, (call, shape, dtype) in ncu_probe.CASES.items():
        compile(ncu_probe.script(call, shape, dtype), name, "exec")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "quack" else real(n, *a))
    quack_cases = sum(n.startswith("quack ") for n in ncu_probe.CASES)
    for run in (ncu_probe.main, ncu_probe.source_pages):  # the bytes, and --source
        assert run(tmp_path, ["quack"]) == 2
        out = capsys.readouterr().out
        assert out.count("left out, quack does not import") == quack_cases > 0


def test_ncu_source_summary_ranks_instructions_reasons_and_opcodes():
    """The --source summary of a two-kernel SASS page: each kernel's stall reasons by share,
    its instructions by samples, its executed instructions by opcode (predicates dropped)."""
    import ncu_probe

    head = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
            '"stall_barrier","stall_wait","stall_barrier (Not Issued)"\n')
    page = ('"Kernel Name","void k1(int)",\n' + head
            + '"0x0","  LDS.128 R4, [R2]","10","100","0","10","0"\n'
            + '"0x10","  BAR.SYNC.DEFER_BLOCKING 0x0","30","100","30","0","30"\n'
            + '"0x20","@P0   BRA 0x40","0","200","0","0","0"\n'
            + '"Kernel Name","void k2(int)",\n' + head
            + '"0x0","  DADD R2, R2, R4","5","50","0","5","0"\n')
    out = ncu_probe.source_summary(page, top=1).splitlines()
    assert out[0].startswith("void k1(int): 40 samples, 400 warp instructions executed")
    assert out[1] == "  stalls: barrier 75.0%, wait 25.0%"
    assert out[2].split()[:3] == ["1", "75.0%", "BAR.SYNC.DEFER_BLOCKING"] and out[2].endswith("barrier")
    assert out[3] == "  executed: BRA 50.0%, LDS 25.0%, BAR 25.0%"
    assert out[4].startswith("void k2(int): 5 samples") and out[5] == "  stalls: wait 100.0%"


def test_views_time_parses_its_shapes_and_refuses_bad_ones():
    import views_time

    args = views_time.parse(["--op", "cumsum", "--shapes", "1024,4096,3,3", "8,1048576,8,4", "--step"])
    assert args.shapes == [(1024, 4096, 3, 3), (8, 1048576, 8, 4)] and args.step and args.dtypes == ["float32"]
    with pytest.raises(SystemExit):
        views_time.parse(["--shapes", "8,1024,4,8"])  # inner past full
    assert set(views_time.OPS) <= set(REGISTRY)


def test_device_check_parses_and_names_every_step_in_its_usage():
    import re
    import subprocess
    script = Path(__file__).resolve().parents[2] / "tools" / "device-check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    usage = set(re.search(r"# Usage: \S+ OUTDIR \[([^\]]+)\]", text).group(1).split("|"))
    cased = set()
    for pattern in re.findall(r"^ +([a-z|]+)\)", text, re.M):
        cased |= set(pattern.split("|"))
    assert usage == cased, (usage ^ cased)


def test_kernel_coverage_matches_launched_kernels_to_the_built_ones(tmp_path):
    """tools/kernel_coverage.py: a build's kernels are the entry functions of `cuobjdump -symbols`,
    demangled as the profiler names them; a kernel is keyed by its name and template arguments
    (the parameter list dropped, parentheses in the arguments kept), and each built one is
    launched or listed as never launched, counted by its template."""
    import kernel_coverage as kc

    # cuobjdump 13.1's -symbols of a build of two such kernels (sm_90)
    symbols = ("\nFatbin elf code:\n================\narch = sm_90\n\nsymbols:\n"
               "STT_OBJECT       STB_WEAK   STV_DEFAULT  U .nv.reservedSmem.offset0\n"
               "STT_FUNC         STB_GLOBAL STO_ENTRY      "
               "_ZN8normscan16scan_slab_kernelIfNS_5SumOpELi2ELNS_8SlabCopyE0ENS_3CfgILi256ELi5ELl64EEEEEvPT_l\n"
               "STT_FUNC         STB_GLOBAL STV_DEFAULT    _Z6helperv\n")
    (mangled,) = kc.entry_kernels(symbols)
    slab = "void normscan::scan_slab_kernel<float, normscan::SumOp, 2, (normscan::SlabCopy)0, normscan::Cfg<256, 5, 64l> >"
    assert kc.demangle(mangled) == slab + "(float*, long)"
    rows = "void normscan::reduce_scale_rows_kernel<float, normscan::L2NormOp, normscan::RowsConfig<256, 32, 4, 0, 4> >"
    assert kc.kernel_key(rows + "(normscan::ReduceScaleArgs<float>)") == rows
    assert kc.kernel_key(slab + "(float*, long)") == slab
    assert kc.template_of(rows) == "reduce_scale_rows_kernel"
    (tmp_path / "launched-1.txt").write_text(f"3\t{rows}(normscan::ReduceScaleArgs<float>)\n1\tMemset (Device)\n")
    (tmp_path / "launched-2.txt").write_text("")
    launched = kc.launched_keys([tmp_path])
    never, lines, total = kc.coverage({"reduce_scale L2NormOp": [rows + "(args)", rows + "(args)"],
                                       "scan SumOp": [slab + "(args)"]}, launched)
    assert never == [("scan SumOp", slab)] and total == 2
    assert lines == ["reduce_scale_rows_kernel: 1 of 1 launched", "scan_slab_kernel: 0 of 1 launched"]


def test_sharded_time_runs_each_pass_on_the_cpu(capsys):
    import sharded_time

    sharded_time.main(["--device", "cpu", "--mb", "0.01", "--lengths", "8", "100", "--dtypes", "bfloat16", "--repeat", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| bfloat16")]
    assert [r.split(" | ")[1] for r in rows] == ["655x8", "52x100"]
    assert all(len(r.split(" | ")) == 7 for r in rows)
