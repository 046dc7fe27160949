"""Host time per eager call on a tiny CUDA input, by layer: what a host-bound caller (a decode
step) pays. python tools/overhead.py (needs a GPU)."""
import time

import torch

import normscan
from normscan import _build, reference, view
from normscan.registry import REGISTRY

x = torch.randn(4, 8, device="cuda")
spec = REGISTRY["l2_normalize"]
ext = _build.load(spec.family.name)


def t(fn, n=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    s = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - s) / n


_, y, v = view.prepare(x, 1)
print("public l2_normalize   %.1f us" % t(lambda: normscan.l2_normalize(x, 1)))
print("spec.launch           %.1f us" % t(lambda: spec.launch(x, 1)))
print("view.prepare          %.1f us" % t(lambda: view.prepare(x, 1)))
print("ext.reduce_scale      %.1f us" % t(lambda: ext.reduce_scale(x, y, None, None, spec.op_id, v, 0.0)))
print("torch.empty_like      %.1f us" % t(lambda: torch.empty_like(x)))
print("reference expression  %.1f us" % t(lambda: reference.l2_normalize(x, 1)))
print("torch.ops dispatcher  %.1f us" % t(lambda: spec.custom_op(x, 1)))
