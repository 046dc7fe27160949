// The scan family's entry (csrc/entries.h).

#include "../binding.cuh"
#include "dispatch.cuh"

void scan(const at::Tensor& x, at::Tensor& y, int64_t op, at::IntArrayRef view, bool reverse, bool exclusive) {
  using namespace normscan;
  const View v = checked_view(x, y, view);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::scan", [&] {
    using T = cuda_t<scalar_t>;
    const ScanArgs<T> a{data<T>(x), mutable_data<T>(y), v, reverse, exclusive};
    const bool known = with_scan_op(op, [&](auto functor) {
      check_cuda(launch_scan<T, decltype(functor)>(a, stream, Workspace(x)), "scan");
    });
    TORCH_CHECK(known, "normscan: no scan op has id ", num(op));
  });
}
