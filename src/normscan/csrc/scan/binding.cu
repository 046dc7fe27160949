// The scan family's entry (csrc/entries.h).

#include "../binding.cuh"
#include "dispatch.cuh"

namespace {

// scan on a checked view.
void launch_view(const Tensor& x, Tensor& y, int64_t op, const normscan::View& v, bool reverse, bool exclusive,
                 const std::optional<Tensor>& mask) {
  using namespace normscan;
  if (mask) {
    NORMSCAN_CHECK((mask->scalar_type() == normscan::kBool || mask->scalar_type() == x.scalar_type()) &&
                       mask->device() == x.device(),
                   "normscan: mask must be a bool tensor, or one of x's dtype, on x's device");
    check_reach(*mask, v.x_so, v.x_sl, v.x_si, v, "mask");
  }
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::scan", [&] {
    using T = scalar_t;
    const ScanArgs<T> common{data<T>(x), mutable_data<T>(y), v, reverse, exclusive};
    const bool known = with_scan_op(op, [&](auto functor) {
      using Op = decltype(functor);
      NORMSCAN_CHECK(kMasked<Op> == mask.has_value(), "normscan: scan op ", num(op),
                     kMasked<Op> ? " needs a mask" : " takes no mask: mask must be None");
      if constexpr (kMasked<Op>) {  // by the mask's element: a bool's byte, or x's
        auto launch = [&](auto by, const auto* m) {
          using Masked = decltype(by);
          MaskedScanArgs<T, typename Masked::Mask> a{common, m};
          check_cuda(launch_scan<T, Masked>(a, stream, Workspace(x)), "scan");
        };
        if (mask->scalar_type() == normscan::kBool) launch(MaskedBy<uint8_t>{}, static_cast<const uint8_t*>(mask->const_data_ptr()));
        else launch(MaskedBy<T>{}, data<T>(*mask));
      } else {
        check_cuda(launch_scan<T, Op>(common, stream, Workspace(x)), "scan");
      }
    });
    NORMSCAN_CHECK(known, "normscan: no scan op has id ", num(op), " in this build");
  });
}

}  // namespace

void scan(const Tensor& x, Tensor& y, int64_t op, IntList view, bool reverse, bool exclusive,
          const std::optional<Tensor>& mask) {
  launch_view(x, y, op, normscan::checked_view(x, y, view), reverse, exclusive, mask);
}

#ifndef NORMSCAN_FLOAT32_ONLY  // the fast path (binding.cuh)
std::optional<Tensor> scan_contiguous(const Tensor& x, int64_t dim, int64_t op, bool reverse, bool exclusive) {
  const std::optional<normscan::View> v = normscan::contiguous_view(x, dim, std::nullopt);
  if (!v) return std::nullopt;
  Tensor y = normscan::empty_contiguous_like(x);
  if (!v->empty()) launch_view(x, y, op, *v, reverse, exclusive, std::nullopt);
  return y;
}
#endif
