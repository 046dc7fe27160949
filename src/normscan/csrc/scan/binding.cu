// The scan family's entry (csrc/entries.h).

#include "../binding.cuh"
#include "dispatch.cuh"

namespace {

// scan on a checked view.
void launch_view(const at::Tensor& x, at::Tensor& y, int64_t op, const normscan::View& v, bool reverse, bool exclusive,
                 const std::optional<at::Tensor>& mask) {
  using namespace normscan;
  if (mask) {
    TORCH_CHECK((mask->scalar_type() == at::kBool || mask->scalar_type() == x.scalar_type()) &&
                    mask->device() == x.device(),
                "normscan: mask must be a bool tensor, or one of x's dtype, on x's device");
    check_reach(*mask, v.x_so, v.x_sl, v.x_si, v, "mask");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::scan", [&] {
    using T = cuda_t<scalar_t>;
    const ScanArgs<T> common{data<T>(x), mutable_data<T>(y), v, reverse, exclusive};
    const bool known = with_scan_op(op, [&](auto functor) {
      using Op = decltype(functor);
      TORCH_CHECK(kMasked<Op> == mask.has_value(), "normscan: scan op ", num(op),
                  kMasked<Op> ? " needs a mask" : " takes no mask: mask must be None");
      if constexpr (kMasked<Op>) {  // by the mask's element: a bool's byte, or x's
        auto launch = [&](auto by, const auto* m) {
          using Masked = decltype(by);
          MaskedScanArgs<T, typename Masked::Mask> a{common, m};
          check_cuda(launch_scan<T, Masked>(a, stream, Workspace(x)), "scan");
        };
        if (mask->scalar_type() == at::kBool) launch(MaskedBy<uint8_t>{}, static_cast<const uint8_t*>(mask->const_data_ptr()));
        else launch(MaskedBy<T>{}, data<T>(*mask));
      } else {
        check_cuda(launch_scan<T, Op>(common, stream, Workspace(x)), "scan");
      }
    });
    TORCH_CHECK(known, "normscan: no scan op has id ", num(op), " in this build");
  });
}

}  // namespace

void scan(const at::Tensor& x, at::Tensor& y, int64_t op, at::IntArrayRef view, bool reverse, bool exclusive,
          const std::optional<at::Tensor>& mask) {
  launch_view(x, y, op, normscan::checked_view(x, y, view), reverse, exclusive, mask);
}

#ifndef NORMSCAN_FLOAT32_ONLY  // the fast path (binding.cuh)
std::optional<at::Tensor> scan_contiguous(const at::Tensor& x, int64_t dim, int64_t op, bool reverse, bool exclusive) {
  const std::optional<normscan::View> v = normscan::contiguous_view(x, dim, std::nullopt);
  if (!v) return std::nullopt;
  at::Tensor y = normscan::empty_contiguous_like(x);
  if (!v->empty()) launch_view(x, y, op, *v, reverse, exclusive, std::nullopt);
  return y;
}
#endif
