// The scan family's backward entry (csrc/entries.h), an extension of its own: a forward-only
// user never builds it, and exported KernelBench files never include it. cumsum's gradient is
// the forward's reverse scan (normscan/backward.py); this is cumprod's.

#include "../binding.cuh"
#include "backward_dispatch.cuh"

bool scan_backward(const Tensor& x, const Tensor& g, Tensor& dx, int64_t op, IntList view,
                   int64_t g_row_stride, bool reverse, bool exclusive) {
  using namespace normscan;
  const View v = checked_view(x, dx, view);
  NORMSCAN_CHECK(g.device() == x.device() && g.scalar_type() == x.scalar_type(),
                 "normscan: the gradient must have x's dtype and device");
  check_reach(g, g_row_stride, 1, 0, View{v.outer, v.length, 1, 0, 0, 0, 0, 0, 0}, "the gradient");
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  bool launched = false;
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::scan_backward", [&] {
    using T = scalar_t;
    const bool known = with_scan_backward_op(op, [&](ProdOp) {
      const CumprodBackwardArgs<T> a{data<T>(x), data<T>(g), mutable_data<T>(dx), v, g_row_stride, reverse, exclusive};
      check_cuda(launch_cumprod_backward(a, stream, &launched), "scan_backward");
    });
    NORMSCAN_CHECK(known, "normscan: scan op ", num(op), " has no backward kernel; scan_backward takes cumprod's (op 0). ",
                   "cumsum's gradient is its forward's reverse scan (normscan/backward.py)");
  });
  return launched;
}
