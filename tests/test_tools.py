"""tools/ without a GPU: what tools/tune.py builds for the entries it times."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import tune  # noqa: E402

from normscan.registry import REGISTRY  # noqa: E402


def test_tune_builds_the_timed_entries_ops_alone():
    softmax, layer_norm = REGISTRY["softmax"].op_id, REGISTRY["layer_norm"].op_id
    assert tune.builds(["23_Softmax", "40_LayerNorm"], "") == [("reduce_scale", softmax), ("reduce_scale", layer_norm)]
    cumprod, rms = REGISTRY["cumprod"].op_id, REGISTRY["rms_norm"].op_id
    assert tune.builds(["cumprod"], "backward") == [("scan", cumprod), ("scan_backward", cumprod)]
    log_softmax = REGISTRY["log_softmax"].op_id
    assert tune.builds(["rms_norm", "log_softmax"], "backward") == [  # log_softmax's gradient has no kernel
        ("reduce_scale", rms), ("reduce_scale", log_softmax), ("reduce_scale_backward", rms)]
    assert len(tune.builds([], "")) == len({(s.family.name, s.op_id) for s in REGISTRY.values()})


def test_tune_selects_entries_by_label_and_its_scripts_compile():
    labels = [e.label for e in tune.selected_entries(["90_cumprod"], "")]
    assert labels == ["90_cumprod"]
    assert len(tune.selected_entries([], "")) > 100
    compile(tune.LOAD.format(builds=tune.builds(["cumprod"], ""), tuned=[]) + tune.TIMING, "<tune>", "exec")


def test_tune_main_starts_one_build_a_variant(monkeypatch):
    """--build-only: each variant's builds in a process of its own, the LOAD script given the
    timed entries' builds and the variant's flags."""
    started = []

    class Proc:
        def __init__(self, command, env):
            started.append(command)

        def wait(self):
            return 0

    monkeypatch.setenv("NORMSCAN_TUNE_CASES", "90_cumprod")
    monkeypatch.setattr(tune.subprocess, "Popen", Proc)
    assert tune.main(["", "-DNORMSCAN_SCAN_VECS=8"], build_only=True) == 0
    assert [c[-1] for c in started] == ["", "-DNORMSCAN_SCAN_VECS=8"]
    assert f"[('scan', {REGISTRY['cumprod'].op_id})]" in started[0][2]
