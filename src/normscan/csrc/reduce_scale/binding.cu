// The reduce-scale family's entry (csrc/entries.h).
#include "../binding.cuh"
#include "dispatch.cuh"

void reduce_scale(const at::Tensor& x, at::Tensor& y, const std::optional<at::Tensor>& weight, int64_t op,
                  at::IntArrayRef view, double eps) {
  using namespace normscan;
  const View v = checked_view(x, y, view);
  if (weight) {
    TORCH_CHECK(weight->device() == x.device() && weight->scalar_type() == x.scalar_type() &&
                    weight->is_contiguous() && weight->numel() == v.length,
                "normscan: weight must be a contiguous tensor of ", num(v.length), " elements, dtype and device of x");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::reduce_scale", [&] {
    using T = cuda_t<scalar_t>;
    const ReduceScaleArgs<T> a{data<T>(x), mutable_data<T>(y), weight ? data<T>(*weight) : nullptr, v, eps};
    const bool known = with_reduce_scale_op(op, [&](auto functor) {
      using Op = decltype(functor);
      TORCH_CHECK(a.w == nullptr || Op::kWeighted, "normscan: reduce-scale op ", num(op),
                  " takes no weight: weight must be None");
      check_cuda(launch_reduce_scale<T, Op>(a, stream), "reduce_scale");
    });
    TORCH_CHECK(known, "normscan: no reduce-scale op has id ", num(op));
  });
}
