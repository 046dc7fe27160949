"""The exported KernelBench solution files (cli/export.py, problems.py)."""

import importlib.util
import re
import subprocess
import sys

import pytest
import torch

from normscan.bench.cli import export
from normscan.bench.problems import all_problems

PROBLEMS = all_problems()

# KernelBench's static checker (src/kernelbench/kernel_static_checker.py), restated: its
# strict checks and its warnings. Comments end at '#' or '//' on a line.
FORBIDDEN = [r"\btry\s*:", r"\bexcept\s*:", r"\bexcept\s+\w+", r"\bpass\b", r"torch\.cuda\.Stream\s*\(",
             r"cuda\.Stream\s*\(", r"with\s+torch\.cuda\.stream", r"\.wait_stream\s*\(", r"\.record_stream\s*\(",
             r"threading", r"multiprocessing", r"concurrent\.futures", r"ThreadPoolExecutor",
             r"_make_subclass", r"class\s+\w+.*\(torch\.Tensor\)", r"torch\.Tensor\.__new__",
             r"__float2half(_rn)?\s*\(", r"\(\s*__half\s*\)\s*[\w\->\.]+", r"static_cast\s*<\s*(__half|half)\s*>",
             r"\.half\s*\(", r"\.to\s*\(\s*(dtype\s*=\s*)?torch\.(float16|half)\b",
             r"torch\.nn\.(?!(Module|parameter|Parameter|ParameterList|ParameterDict|ModuleList|ModuleDict|init)\b)",
             r"\bnn\.functional\.\w+", r"\bF\.(conv|linear|relu|gelu|softmax|batch_norm|layer_norm|dropout)",
             r"\btorch\.(softmax|log_softmax|rms_norm|layer_norm|batch_norm|group_norm|instance_norm|normalize|"
             r"logsumexp|cumsum|cumprod|norm)\s*\("]


def _strip(code):
    return "\n".join(line.split("#", 1)[0].split("//", 1)[0] for line in code.split("\n"))


def test_problems_are_the_declared_ones():
    assert sorted(PROBLEMS) == ["23_Softmax", "24_LogSoftmax", "33_BatchNorm", "34_InstanceNorm", "35_GroupNorm_",
                                "36_RMSNorm_", "37_FrobeniusNorm_", "38_L1Norm_", "39_L2Norm_", "40_LayerNorm", "89_cumsum",
                                "90_cumprod", "91_cumsum_reverse", "92_cumsum_exclusive", "93_masked_cumsum"]
    assert PROBLEMS["92_cumsum_exclusive"].kwargs() == {"dim": 1, "exclusive": True}
    assert PROBLEMS["37_FrobeniusNorm_"].kwargs() == {}
    assert PROBLEMS["40_LayerNorm"].kwargs() == {"normalized_shape": (64, 256, 256)}
    from normscan.bench import catalogue  # floors: x read twice where every element comes first (over L2)
    entries = {e.label: e for e in catalogue.kernelbench_entries()}
    assert {name: entries[name].tensors for name in ["37_FrobeniusNorm_", "33_BatchNorm", "34_InstanceNorm",
                                                     "35_GroupNorm_"]} == \
        {"37_FrobeniusNorm_": 3, "33_BatchNorm": 3, "34_InstanceNorm": 2, "35_GroupNorm_": 2}
    assert entries["93_masked_cumsum"].bytes_moved == 32768 * 32768 * 9  # x and y, and the bool mask
    assert PROBLEMS["35_GroupNorm_"].kwargs() == {"num_groups": 8}
    assert PROBLEMS["33_BatchNorm"].kwargs() == {"running_mean": None, "running_var": None, "training": True}
    assert PROBLEMS["36_RMSNorm_"].kwargs() == {"dim": 1, "eps": 1e-5}
    assert PROBLEMS["90_cumprod"].kwargs(0) == {"dim": 0}


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_exported_solution_is_self_contained_and_clean(tmp_path, name):
    path = next(p for p in export.write_all(tmp_path) if p.stem == name)
    source = path.read_text()
    # as KernelBench's load_custom_model runs it with a build folder: its two lines first (the
    # literal split so that test_docs does not read it as an environment variable we read)
    compile("import os\nos.environ" "['TORCH_EXTENSIONS_DIR'] = '/tmp/x'\n" + source, str(path), "exec")
    code = _strip(source)
    for pattern in FORBIDDEN:
        assert not re.search(pattern, code), (pattern, re.search(pattern, code))
    assert "__global__" in code and "load_inline" in code and re.search(r"\bthreadIdx\.", code)
    # float32 forward kernels of this op only, without the fp16 header
    spec = PROBLEMS[name].spec
    assert f'CUDA_SOURCE = r"""\n#define {spec.family.ops_macro}(X) X({spec.op_id}, {spec.functor})\n' in source
    cuda = source.split('CUDA_SOURCE = r"""')[1].split('"""')[0]
    # the float32-only build resolved: no other dtype, no fast path
    assert "cuda_fp16.h" not in cuda and "NORMSCAN_FLOAT32_ONLY" not in cuda
    assert "TypeTag<float>" in cuda and not re.search(r"TypeTag<(double|__half|__nv_bfloat16)>", cuda)
    assert "contiguous_view" not in cuda and "empty_contiguous_like" not in cuda
    assert "__global__" in cuda and not re.search(r"__global__[^;{]*backward", cuda)
    assert not re.findall(r"^\s*(?:import|from)\s+normscan", source, re.M)
    assert "class ModelNew(nn.Module)" in source
    namespace = {"torch": torch}
    exec(PROBLEMS[name].inputs_source, namespace)
    assert list(namespace["get_init_inputs"]()) == list(PROBLEMS[name].init_inputs)
    assert [tuple(t.shape) for t in _small(namespace["get_inputs"])] == \
        [tuple(s // 64 for s in PROBLEMS[name].shape)] * (1 + len(PROBLEMS[name].inputs))
    assert "DEFAULTS = " in source  # the op's own defaults (eps), not the launcher's


def _smaller(problem) -> tuple[int, ...]:
    """The problem's input shape with each dim an eighth, but those its Model's constructor
    fixes: layer_norm's normalized dims, the channel norms' channels."""
    spec, shape = problem.spec, problem.shape
    kept = set(range(len(shape) - len(problem.kwargs()["normalized_shape"]), len(shape))) if spec.trailing else \
        {1} if spec.grouped else set()
    return tuple(s if d in kept else max(1, s // 8) for d, s in enumerate(shape))


def _small(get_inputs):
    """get_inputs() at a 64th of each size (its torch.rand patched), for a test without the GBs."""
    rand = torch.rand
    torch.rand = lambda *shape, **kw: rand(*(s // 64 for s in shape), **kw)
    try:
        return get_inputs()
    finally:
        torch.rand = rand


def test_checker_patterns_can_fail():
    assert re.search(FORBIDDEN[3], _strip("x = 1\npass\n"))
    assert not re.search(FORBIDDEN[3], _strip("x = 1  # pass\n"))
    assert re.search(FORBIDDEN[-1], _strip("y = torch.cumsum(x, 1)"))


@pytest.fixture(scope="module")
def built_exports(tmp_path_factory):
    """The exported files, each first run by a process of its own, side by side: a file's
    load_inline build takes about a minute on one core (its bindings include all of torch), and
    the in-process import that follows finds it built."""
    paths = {p.stem: p for p in export.write_all(tmp_path_factory.mktemp("exported"))}
    builds = {name: subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True) for name, path in paths.items()}
    outputs = {name: proc.communicate()[0] for name, proc in builds.items()}
    failed = {name: outputs[name] for name, proc in builds.items() if proc.returncode != 0}
    assert not failed, failed
    return paths


@pytest.mark.gpu
@pytest.mark.xdist_group("full_size_inputs")  # one at a time: a problem's inputs take up to 25 GB
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_exported_solution_matches_reference(name, built_exports):
    """Each exported file, loaded alone (no normscan import), against its problem's Model."""
    path = built_exports[name]
    spec = importlib.util.spec_from_file_location(f"kb_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    problem = PROBLEMS[name]
    model = module.ModelNew(*module.get_init_inputs())
    for trial in range(5):  # KernelBench's check: 5 random-input trials, atol = rtol = 1e-4
        inputs = problem.make_inputs(shape=_smaller(problem))
        torch.testing.assert_close(model(*inputs), problem.reference(*inputs), atol=1e-4, rtol=1e-4)
    inputs = [t.cuda() for t in module.get_inputs()]
    torch.testing.assert_close(model(*inputs), problem.reference(*inputs), atol=1e-4, rtol=1e-4)


def test_float32_only_resolves_its_conditionals_and_refuses_nested_ones():
    source = ("a\n#ifndef NORMSCAN_FLOAT32_ONLY  // why\nhalf\n#endif\n"
              "#ifdef NORMSCAN_FLOAT32_ONLY\nfloat\n#else\nall\n#endif\nb\n")
    assert export.float32_only(source) == "a\nfloat\nb\n"
    with pytest.raises(ValueError, match="a conditional inside a NORMSCAN_FLOAT32_ONLY block"):
        export.float32_only("#ifndef NORMSCAN_FLOAT32_ONLY\n#if X\nx\n#endif\ny\n#endif\n")
