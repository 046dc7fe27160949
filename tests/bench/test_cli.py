"""The command line on any machine: arguments, the no-GPU paths, the JSON record, the plot,
broken pipes, the source commit."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from normscan.bench import catalogue, cli, timing
from normscan.bench.cli import bench, device_log, env
from normscan.registry import REGISTRY

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


def normscan(*args, timeout=600, **kwargs):
    return subprocess.run([sys.executable, "-m", "normscan", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def test_arguments():
    args = cli.parser().parse_args(["bench", "--sweep", "--ops", "cumprod", "l2_normalize", "--dtype", "bfloat16",
                                    "--repeat", "5", "--out", "somewhere"])
    assert args.sweep and args.ops == ["cumprod", "l2_normalize"] and args.dtype == ["bfloat16"]
    assert args.repeat == 5 and str(args.out) == "somewhere"
    # bench and verify take the same op names: the public functions'.
    assert cli.parser().parse_args(["verify", "--ops", *REGISTRY]).ops == list(REGISTRY)
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["bench", "--ops", "weight_norm"])
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["verify", "--ops", "prod"])
    with pytest.raises(SystemExit):
        cli.parser().parse_args([])


@pytest.mark.parametrize("flag", ["--repeat", "--rounds"])
@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_counts_must_be_positive_and_the_error_says_so(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["bench", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected a whole number of at least 1, got" in err and value.lstrip("-") in err


def test_defaults_are_the_documented_ones():
    args = cli.parser().parse_args(["bench"])
    assert (str(args.out), args.repeat, args.rounds) == ("normscan-bench", 20, 3)


@NO_GPU
def test_bench_without_gpu_honours_its_arguments(tmp_path):
    out = tmp_path / "run"
    run = normscan("bench", "--sweep", "--ops", "cumsum", "--dtype", "float32", "--repeat", "2", "--rounds", "1",
                   "--out", out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert bench.CPU_NOTE in run.stdout and "reference ms (normscan's CPU path)" in run.stdout
    assert "% copy" not in run.stdout and "GB/s " not in run.stdout
    record = json.loads((out / "bench.json").read_text())
    assert record["repeat"] == 2 and record["rounds"] == 1 and record["device"].startswith("cpu")
    assert record["note"] == bench.CPU_NOTE
    labels = [r["label"] for r in record["rows"]]
    assert len(labels) == len(catalogue.SCAN_SHAPES)
    assert all(r["op"] == "cumsum" and r["dtype"] == "float32" for r in record["rows"])
    for row in record["rows"]:
        assert all(len(times) == 1 for times in row["rounds_ms"].values())  # one round, after a warm-up
        assert set(row["warmup_ms"]) == set(row["ms"]) >= {"normscan", "eager", "compile"}
        assert row["correct"]
    if (out / "bench.png").exists() or pytest.importorskip("matplotlib"):
        assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@NO_GPU
@pytest.mark.parametrize("mode", [[], ["--sweep", "--no-compile"], ["--training", "--no-compile"]])
def test_every_bench_entry_runs_on_the_cpu(mode, tmp_path):
    """The main job, the sweeps and the training entries, every op, on a machine without a GPU
    (at reduced sizes, the reference timed): each entry runs and is checked correct. The sweeps
    leave torch.compile out (its C++ build of each of their ~230 entries took most of 6 minutes
    a run here); the main job and the tests above time it on the CPU."""
    run = normscan("bench", *mode, "--repeat", "1", "--rounds", "1", "--out", tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    channel_norms = {"group_norm", "instance_norm", "batch_norm"}  # no training entries: their rows are not rows
    assert {r["op"] for r in rows} == set(REGISTRY) - (channel_norms if "--training" in mode else set())
    assert all(r["correct"] for r in rows), [r["label"] for r in rows if not r["correct"]]
    assert all(("compile" in r["ms"]) == ("--no-compile" not in mode) for r in rows)


@NO_GPU
def test_bench_training_without_gpu_times_the_backward_and_checks_the_gradients(tmp_path):
    run = normscan("bench", "--training", "--ops", "rms_norm", "--modes", "backward", "--dtype", "float32",
                   "--repeat", "1", "--rounds", "1", "--out", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert len(rows) == 12 and all(r["label"].endswith("backward") for r in rows)
    plain = [r for r in rows if "+residual" not in r["label"]]
    assert len(plain) == 6
    for row in plain:  # x and g read, dx written: three tensors' bytes
        assert row["bytes"] == 3 * 4 * row["shape"][0] * row["shape"][1] and row["correct"]
        assert {"normscan", "eager", "compile", "F.rms_norm"} <= set(row["ms"])
    for row in rows[6:]:  # the residual form's: h, dy and dh read, dx written
        assert "+residual" in row["label"] and row["correct"]
        assert row["bytes"] == 4 * 4 * row["shape"][0] * row["shape"][1]
        assert {"normscan", "eager", "compile"} <= set(row["ms"])


@NO_GPU
def test_bench_training_takes_the_hidden_sizes_asked(tmp_path):
    """--hidden picks the LLM ops' and the residual forms' sizes (rows filling 128 MB, then cut
    for the CPU); without --training it is refused, saying why."""
    run = normscan("bench", "--training", "--ops", "rms_norm", "--modes", "forward+backward", "--dtype", "float32",
                   "--hidden", "3072", "--repeat", "1", "--rounds", "1", "--out", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["label"].split(" at ")[0] for r in rows] == ["rms_norm+w 10922x3072 float32",
                                                            "rms_norm+w+residual 10922x3072 float32"]
    assert all(r["shape"][-1] == 3072 and r["correct"] for r in rows)
    run = normscan("bench", "--hidden", "3072", "--out", tmp_path)
    assert run.returncode == 2 and "add --training" in run.stdout, run.stdout + run.stderr


def test_training_entries_of_every_op_count_their_backwards_bytes():
    """`bench --training` without --ops: every op's entries, with their byte floors."""
    from normscan.bench import catalogue
    entries = catalogue.training_entries(None, [torch.float32, torch.bfloat16])
    assert {e.op for e in entries} >= {"rms_norm", "l2_normalize", "cumsum", "cumprod", "masked_cumsum"}
    for e in entries:
        n, size = math.prod(e.shape), e.dtype.itemsize
        if e.op == "masked_cumsum":  # the gradient read, dx written, and the bool mask read each way
            both = e.mode == "forward+backward"
            assert e.bytes_moved == n * ((4 if both else 2) * size + (2 if both else 1)), e.label


def test_residual_entries_count_four_tensors_a_pass():
    """The residual forms' entries: rms_norm's and layer_norm's at hidden 2048-65536, forward
    in the sweep (x, residual read; h, y written), backward and forward+backward in training,
    beside the peers' fused add + norm."""
    from normscan.bench import catalogue
    entries = [e for e in catalogue.training_entries(None, [torch.bfloat16]) +
               catalogue.sweep_entries(["rms_norm", "layer_norm"], [torch.bfloat16]) if e.residual]
    assert {(e.op, e.mode) for e in entries} == {(op, m) for op in ("rms_norm", "layer_norm")
                                                  for m in ("forward", "backward", "forward+backward")}
    for e in entries:
        assert e.shape[-1] in catalogue.TRAINING_HIDDEN and "residual" in e.params and "+residual" in e.label
        assert e.bytes_moved == math.prod(e.shape) * 2 * {"forward": 4, "backward": 4, "forward+backward": 8}[e.mode]


def test_training_entries_are_what_llms_train_through():
    """Issue #87's table: the five ops at hidden 2048-65536, rows filling 128 MB, layer_norm with
    weight and bias (nn.LayerNorm's default) and with its weight alone, beside the peers;
    forward+backward's floor five tensors (x, y; x, dy, dx)."""
    from normscan.bench import catalogue
    entries = catalogue.training_entries(None, [torch.bfloat16], ["forward+backward"])
    rows = {(e.op, e.params, e.shape[-1]): e for e in entries if e.op in catalogue.TRAINING_OPS}
    for hidden in (2048, 4096, 8192, 16384, 32768, 65536):
        for key in [("rms_norm", ("weight",)), ("layer_norm", ("weight", "bias")), ("layer_norm", ("weight",)),
                    ("softmax", ()), ("log_softmax", ()), ("l2_normalize", ())]:
            e = rows[(*key, hidden)]
            assert math.prod(e.shape) * 2 == 128 << 20 and e.tensors == 5 and e.mode == "forward+backward", e.label
            assert {"eager", "compile"} <= set(e.baselines)


@NO_GPU
def test_bench_without_gpu_reduces_over_the_problems_own_dim(tmp_path):
    run = normscan("bench", "--ops", "rms_norm", "--repeat", "2", "--rounds", "1", "--out", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    (row,) = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert row["label"].startswith("36_RMSNorm_") and row["shape"][1] == 64 and row["correct"]


def test_bench_ops_without_a_problem_says_so(tmp_path, monkeypatch, capsys):
    """Every op solves a problem today: an op without one is stood in for by none."""
    monkeypatch.setattr(bench.catalogue, "kernelbench_entries", lambda ops: [])
    args = cli.parser().parse_args(["bench", "--ops", "cumsum", "--out", str(tmp_path)])
    assert bench.main(args) == 2
    out = capsys.readouterr().out
    assert "no KernelBench problem uses cumsum" in out and "--sweep" in out
    assert not (tmp_path / "bench.json").exists()


@NO_GPU
def test_verify_without_gpu_fails_saying_nothing_was_verified():
    run = normscan("verify", timeout=120)
    assert run.returncode == 2 and "nothing was verified" in run.stdout


@NO_GPU
def test_env_without_gpu_says_the_kernels_cannot_be_built_here():
    run = normscan("env", timeout=120)
    assert run.returncode == 0 and "cache folder" in run.stdout
    for family in ("reduce_scale", "scan"):
        assert f"{family} kernels built" in run.stdout
    assert "cannot be built or run here" in run.stdout and "built on first use" not in run.stdout


@NO_GPU
def test_build_without_gpu_says_where_to_build():
    run = normscan("build", "--ops", "cumsum", timeout=120)
    assert run.returncode == 2 and "build them on that machine" in run.stdout and "Traceback" not in run.stderr


def test_build_takes_each_ops_forward_and_its_fused_backward():
    from normscan.bench.cli import build
    from normscan.registry import REGISTRY

    ids = {name: REGISTRY[name].op_id for name in REGISTRY}
    assert build.builds(["rms_norm", "softmax", "cumprod", "group_norm", "batch_norm"], True) == [
        ("reduce_scale", ids["rms_norm"]), ("reduce_scale", ids["softmax"]), ("scan", ids["cumprod"]),
        ("reduce_scale", ids["group_norm"]), ("reduce_scale_backward", ids["rms_norm"]),
        ("reduce_scale_backward", ids["softmax"]), ("scan_backward", ids["cumprod"])]
    # group_norm and batch_norm: one functor, one build; they have no fused backward yet
    assert build.builds(["rms_norm"], False) == [("reduce_scale", ids["rms_norm"])]
    assert build.builds(["rms_norm", "softmax"], False, out=True) == [
        ("reduce_scale", ids["rms_norm"]), ("reduce_scale", ids["softmax"]), ("reduce_scale_out", ids["rms_norm"])]


def test_export_into_a_file_or_an_unwritable_folder_is_one_line(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for target in (a_file, a_file / "sub"):
        run = normscan("export-kernelbench", target, timeout=120)
        assert run.returncode == 1 and "Traceback" not in run.stdout + run.stderr
        assert run.stdout.strip().count("\n") == 0 and f"cannot write into {target}" in run.stdout


@pytest.mark.parametrize("command", [["env"], ["export-kernelbench", "{tmp}"], ["bench", "--ops", "cumsum"]])
def test_a_closed_pipe_ends_quietly(command, tmp_path):
    """`normscan ... | head`: the reader is gone before anything is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-m", "normscan", *[a.format(tmp=tmp_path) for a in command]],
                             stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr
    assert run.returncode == 141


def _git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


def test_source_commit_is_normscans_own(tmp_path, monkeypatch):
    monkeypatch.delenv("NORMSCAN_COMMIT", raising=False)
    repo = tmp_path / "project"
    package = repo / "venv" / "site-packages" / "normscan"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    _git(repo, "init", "-q")
    (repo / "README").write_text("someone else's project")
    _git(repo, "add", "README")
    _git(repo, "commit", "-qm", "theirs")
    # An installed normscan inside another project's checkout: that is not normscan's commit.
    assert env.source_commit(package) == "unknown"
    _git(repo, "add", "-f", "venv/site-packages/normscan/__init__.py")
    _git(repo, "commit", "-qm", "ours")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert env.source_commit(package) == head
    (package / "__init__.py").write_text("changed = True\n")
    assert env.source_commit(package) == f"{head}-dirty"
    assert env.source_commit(tmp_path / "nowhere") == "unknown"
    monkeypatch.setenv("NORMSCAN_COMMIT", "abc1234")
    assert env.source_commit(package) == "abc1234"


def _rows():
    return [timing.Row("39_L2Norm_", "l2_normalize", [32768, 65535], "float32", 17179344896,
                       {"normscan": 5.9, "eager": 10.1, "compile": 13.7}, 3e-7, 1e-5, True),
            timing.Row("90_cumprod", "cumprod", [32768, 32768], "float32", 8589934592,
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
                        "warmup_ms", "peer_errors"}
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
    uncompiled = _rows()[0]
    del uncompiled.ms["compile"]  # --no-compile: its columns say it was not timed
    assert bench.table_rows([uncompiled], 3000.0)[0][3:9] == ["10.100", "-", "2912", "97.1%", "1.71x", "-"]
    assert bench.cpu_table_rows([uncompiled])[0][3:5] == ["10.100", "-"]


def test_a_timed_backward_gets_the_longer_lead():
    """Autograd's host path to a backward took longer than the forward's 0.7 ms lead: the
    training modes' timed calls follow more reads of the flush buffer."""
    assert timing.flush_reads_for("forward") == timing.FLUSH_READS
    for mode in timing.MODES[1:]:
        assert timing.flush_reads_for(mode) == timing.TRAINING_FLUSH_READS > timing.FLUSH_READS


def test_a_peer_that_refuses_an_entry_is_noted_and_the_rest_timed():
    """A peer's own limit (Liger's softmax refuses rows over 65536) is the entry's note, not
    the run's end; ours or a baseline raising still ends it."""
    def refuse(x, p):
        raise RuntimeError("n = 131072 exceeds the recommended Triton blocksize = 65536.\nmore")
    eager = lambda x, p: torch.softmax(x, -1)  # noqa: E731
    entry = timing.Entry("softmax (4, 8)", "softmax", (4, 8), torch.float32, -1,
                         baselines={"eager": eager, "compile": eager, "refuser": refuse})
    for mode in timing.MODES:  # the backward alone meets the refusal making its graph, before any timing
        entry.mode = mode
        row, = timing.run_entries([entry], bench.ours, repeat=2, rounds=1, device="cpu")
        assert row.peer_errors == {"refuser": "RuntimeError: n = 131072 exceeds the recommended Triton blocksize = 65536."}
        assert set(row.ms) == {"normscan", "eager", "compile"}, mode
    broken = timing.Entry("softmax (4, 8)", "softmax", (4, 8), torch.float32, -1,
                          baselines={"eager": refuse, "compile": eager})
    with pytest.raises(RuntimeError, match="exceeds"):
        timing.run_entries([broken], bench.ours, repeat=2, rounds=1, device="cpu")


def test_out_entries_time_fp8_y_with_its_floor_and_their_check_can_fail():
    """The out_dtype forms' entries (sweep, 16-bit): rms_norm+w and layer_norm+w+b to FP8 e4m3
    with each row's scale, floor x read and y written (3 bytes an element of bf16 x), beside
    PyTorch's norm, scale and cast; their check takes a y off by a spacing as wrong."""
    from normscan import out_forms
    from normscan.bench import catalogue, timing
    entries = [e for e in catalogue.sweep_entries(["rms_norm", "layer_norm"], [torch.bfloat16, torch.float32])
               if e.out_dtype is not None]
    assert {(e.op, e.shape[-1]) for e in entries} == {(op, n) for op in ("rms_norm", "layer_norm")
                                                       for n in catalogue.OUT_HIDDEN}
    for e in entries:
        assert e.dtype == torch.bfloat16 and e.bytes_moved == math.prod(e.shape) * 3 and e.label.endswith("float8_e4m3fn")
    for entry in catalogue.on_cpu(entries):
        assert timing.check_out(entry, bench.ours(entry), "cpu")[2], entry.label
    (entry,) = catalogue.on_cpu([entries[0]])
    good = bench.ours(entry)

    def off_by_a_spacing(x, p):
        y, s = good(x, p)
        return (y.float() * 1.2).to(out_forms.FP8[0]), s
    assert not timing.check_out(entry, off_by_a_spacing, "cpu")[2]
