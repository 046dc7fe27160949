"""tools/ without a GPU: what tools/tune.py builds for the entries it times."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import tune  # noqa: E402

from normscan.registry import REGISTRY  # noqa: E402


def test_tune_builds_the_timed_entries_ops_alone():
    softmax, layer_norm = REGISTRY["softmax"].op_id, REGISTRY["layer_norm"].op_id
    assert tune.extension_flags(["23_Softmax", "40_LayerNorm"], "") == {
        "reduce_scale": f"-DNORMSCAN_ONLY_OPS={1 << softmax | 1 << layer_norm:#x}ull"}
    cumprod = REGISTRY["cumprod"].op_id
    flags = f"-DNORMSCAN_ONLY_OPS={1 << cumprod:#x}ull"
    assert tune.extension_flags(["cumprod"], "backward") == {"scan": flags, "scan_backward": flags}
    assert tune.extension_flags([], "") == {e: "" for e in ["reduce_scale", "reduce_scale_backward", "scan",
                                                             "scan_backward"]}


def test_tune_selects_entries_by_label_and_its_scripts_compile():
    labels = [e.label for e in tune.selected_entries(["90_cumprod"], "")]
    assert labels == ["90_cumprod"]
    assert len(tune.selected_entries([], "")) > 100
    compile(tune.LOAD.format(only=tune.extension_flags(["cumprod"], ""), tuned=[]) + tune.TIMING, "<tune>", "exec")
