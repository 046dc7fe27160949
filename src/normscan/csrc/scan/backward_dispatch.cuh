// Picks the kernel of cumprod's gradient for a view, and launches it. Host only; built into
// the family's backward extension (backward_binding.cu).
#pragma once

#include "../device/launch.cuh"
#include "backward.cuh"

#ifndef NORMSCAN_CUMPROD_BACKWARD_VECS  // vectors a thread holds of a chunk
#define NORMSCAN_CUMPROD_BACKWARD_VECS 2
#endif
#ifndef NORMSCAN_CUMPROD_BACKWARD_MINB  // resident blocks a SM asked of the compiler
#define NORMSCAN_CUMPROD_BACKWARD_MINB 3
#endif

namespace normscan {

// 256 threads of 2 vectors (fp32 chunks of 2048 elements), 3 blocks a SM, rows of up to 2048
// chunks; rows of one short chunk take 128 threads. fp32 ms at 8192x32768, 32768x4096,
// 65536x1024 (H100, NOTES.md): 4 vectors at 2 blocks a SM 2.025, 0.978, 1.639; 2 at 3
// 2.051, 0.942, 0.795; 1 at 3 2.792, 1.355, 0.663.
using CumprodBackwardRows = CumprodBackwardConfig<256, NORMSCAN_CUMPROD_BACKWARD_VECS, NORMSCAN_CUMPROD_BACKWARD_MINB, 2048>;
using CumprodBackwardShortRows = CumprodBackwardConfig<128, NORMSCAN_CUMPROD_BACKWARD_VECS, 2 * NORMSCAN_CUMPROD_BACKWARD_MINB, 1>;

// Whether every row of x, g and dx starts 16-byte aligned and is whole vectors: the kernel
// reads no unaligned head or tail.
template <typename T> inline bool whole_vector_rows(const CumprodBackwardArgs<T>& a) {
  constexpr int V = vec16<T>();
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const View& v = a.view;
  return v.length % V == 0 && aligned(a.x) && aligned(a.g) && aligned(a.dx) &&
         (v.outer == 1 || (v.x_so % V == 0 && v.y_so % V == 0 && a.g_so % V == 0));
}

template <typename T, int V, typename Cfg>
inline cudaError_t launch_cumprod_backward_rows(const CumprodBackwardArgs<T>& a, cudaStream_t stream) {
  return launch_units<cumprod_backward_rows_kernel<T, V, Cfg>>(Grid::PerUnit, dim3(Cfg::kBlock), 1, a.view.outer, 0,
                                                               stream, a);
}

// Launches cumprod's gradient over rows; *launched false (nothing done) where the kernel
// does not serve the view: not rows, or rows of more than kMaxChunks chunks.
template <typename T>
inline cudaError_t launch_cumprod_backward(const CumprodBackwardArgs<T>& a, cudaStream_t stream, bool* launched) {
  constexpr int V = vec16<T>();
  const View& v = a.view;
  *launched = false;
  if (!v.rows()) return cudaSuccess;
  const bool vectors = whole_vector_rows(a);
  const int64_t nvec = vectors ? v.length / V : v.length;
  if (ceil_div(nvec, CumprodBackwardRows::kChunkVecs) > CumprodBackwardRows::kMaxChunks) return cudaSuccess;
  *launched = true;
  if (v.empty()) return cudaSuccess;
  const bool short_rows = nvec <= CumprodBackwardShortRows::kChunkVecs;
  if (vectors)
    return short_rows ? launch_cumprod_backward_rows<T, V, CumprodBackwardShortRows>(a, stream)
                      : launch_cumprod_backward_rows<T, V, CumprodBackwardRows>(a, stream);
  return short_rows ? launch_cumprod_backward_rows<T, 1, CumprodBackwardShortRows>(a, stream)
                    : launch_cumprod_backward_rows<T, 1, CumprodBackwardRows>(a, stream);
}

}  // namespace normscan
