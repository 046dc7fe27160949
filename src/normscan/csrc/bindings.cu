// Torch glue, the only file here that sees torch: checks, dtype and op dispatch, launch on
// the current stream. Shapes arrive already folded to (outer, length, inner) with element
// strides by normscan/ops.py; everything is 64-bit.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#include <string>

#include "half_types.cuh"
#include "reduce_scale.cuh"
#include "scan.cuh"

namespace {

template <typename T> struct CudaType { using type = T; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };

void check_cuda(cudaError_t err, const std::string& what) {
  TORCH_CHECK(err == cudaSuccess, "normscan: ", what, " failed: ", cudaGetErrorString(err));
}

void check_pair(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "normscan: x and y must be CUDA tensors");
  TORCH_CHECK(x.device() == y.device(), "normscan: x and y must be on one device");
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), "normscan: x and y must have one dtype");
}

// The op by name, through the header's list of ops.
template <typename T>
void launch_reduce_scale_named(const std::string& op, const normscan::ReduceScaleArgs<T>& a, cudaStream_t stream) {
#define NORMSCAN_LAUNCH(name, Op)                                                                         \
  if (op == name) {                                                                                      \
    TORCH_CHECK(a.w == nullptr || normscan::Op::kWeighted, "normscan: op '", op,                      \
                "' takes no weight (of the reduce-scale ops only 'rms' does): pass None");                \
    return check_cuda(normscan::launch_reduce_scale<T, normscan::Op>(a, stream), op);                    \
  }
  NORMSCAN_FOR_EACH_REDUCE_SCALE_OP(NORMSCAN_LAUNCH)
#undef NORMSCAN_LAUNCH
  TORCH_CHECK(false, "normscan: unknown reduce-scale op '", op, "'");
}

template <typename T>
void launch_scan_named(const std::string& op, const normscan::ScanArgs<T>& a, void* workspace, cudaStream_t stream) {
#define NORMSCAN_LAUNCH(name, Op) \
  if (op == name) return check_cuda(normscan::launch_scan<T, normscan::Op>(a, workspace, stream), op);
  NORMSCAN_FOR_EACH_SCAN_OP(NORMSCAN_LAUNCH)
#undef NORMSCAN_LAUNCH
  TORCH_CHECK(false, "normscan: unknown scan op '", op, "'");
}

}  // namespace

void reduce_scale(const at::Tensor& x, at::Tensor& y, const std::optional<at::Tensor>& weight, const std::string& op,
                  int64_t outer, int64_t length, int64_t inner, int64_t x_so, int64_t x_sl, int64_t x_si,
                  int64_t y_so, int64_t y_sl, int64_t y_si, double eps) {
  check_pair(x, y);
  if (weight) {
    TORCH_CHECK(weight->device() == x.device() && weight->scalar_type() == x.scalar_type() &&
                    weight->is_contiguous() && weight->numel() == length,
                "normscan: weight must be a contiguous tensor of ", length, " elements, dtype and device of x");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "normscan_reduce_scale", [&] {
    using T = typename CudaType<scalar_t>::type;
    normscan::ReduceScaleArgs<T> a;
    a.x = reinterpret_cast<const T*>(x.const_data_ptr<scalar_t>());
    a.y = reinterpret_cast<T*>(y.mutable_data_ptr<scalar_t>());
    a.w = weight ? reinterpret_cast<const T*>(weight->const_data_ptr<scalar_t>()) : nullptr;
    a.outer = outer, a.length = length, a.inner = inner;
    a.x_so = x_so, a.x_sl = x_sl, a.x_si = x_si;
    a.y_so = y_so, a.y_sl = y_sl, a.y_si = y_si;
    a.eps = eps;
    launch_reduce_scale_named(op, a, stream);
  });
}

void scan(const at::Tensor& x, at::Tensor& y, const std::string& op, int64_t outer, int64_t length, int64_t inner,
          int64_t x_so, int64_t x_sl, int64_t x_si, int64_t y_so, int64_t y_sl, int64_t y_si, bool reverse,
          bool exclusive) {
  check_pair(x, y);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "normscan_scan", [&] {
    using T = typename CudaType<scalar_t>::type;
    normscan::ScanArgs<T> a;
    a.x = reinterpret_cast<const T*>(x.const_data_ptr<scalar_t>());
    a.y = reinterpret_cast<T*>(y.mutable_data_ptr<scalar_t>());
    a.outer = outer, a.length = length, a.inner = inner;
    a.x_so = x_so, a.x_sl = x_sl, a.x_si = x_si;
    a.y_so = y_so, a.y_sl = y_sl, a.y_si = y_si;
    a.reverse = reverse, a.exclusive = exclusive;
    int64_t bytes = 0;
    check_cuda(normscan::scan_workspace_bytes(a, &bytes), "sizing the scan workspace");
    // Allocated through torch's caching allocator, on the current stream.
    const at::Tensor workspace = at::empty({bytes}, x.options().dtype(at::kByte));
    launch_scan_named(op, a, workspace.data_ptr(), stream);
  });
}
