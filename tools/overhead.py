import time, torch, normscan
from normscan import ops, _build, reference
x = torch.randn(4, 8, device="cuda")
ext = _build.load()
def t(fn, n=3000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return 1e6 * (time.perf_counter() - s) / n
_, y, v = ops._prepare(x, 1)
print("public l2_normalize   %.1f us" % t(lambda: normscan.l2_normalize(x, 1)))
print("_reduce_scale_cuda    %.1f us" % t(lambda: ops._reduce_scale_cuda("l2", x, 1, None, 0.0)))
print("_prepare              %.1f us" % t(lambda: ops._prepare(x, 1)))
print("ext.reduce_scale      %.1f us" % t(lambda: ext.reduce_scale(x, y, None, "l2", *v.args(), 0.0)))
print("torch.empty_like      %.1f us" % t(lambda: torch.empty_like(x)))
print("reference expression  %.1f us" % t(lambda: reference.l2_normalize(x, 1)))
print("torch.ops dispatcher  %.1f us" % t(lambda: torch.ops.normscan.l2_normalize(x, 1)))
