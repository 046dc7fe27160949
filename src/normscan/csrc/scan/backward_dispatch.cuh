// Picks the kernel of cumprod's gradient for a view, and launches it. Host only; built into
// the family's backward extension (backward_binding.cu).
#pragma once

#include <tuple>
#include <type_traits>

#include "../device/launch.cuh"
#include "backward.cuh"

namespace normscan {

// Rows of at most 128, 256 and 1024 vectors are held by one block (128 threads of one and two
// vectors, 256 of four); longer ones, up to 4M fp32 elements, take the chunked kernel: fp32
// (fp64 arithmetic) one vector a thread at 4 blocks a SM (two at 3 spilled), others two at 3.
// Measured configurations: docs/design-notes.md, "Scans".
using CumprodBackwardHeldRows = std::tuple<CumprodBackwardConfig<128, 1, 8, 1>, CumprodBackwardConfig<128, 2, 6, 1>,
                                           CumprodBackwardConfig<256, 4, 2, 1>>;
template <typename T>
using CumprodBackwardRows = std::conditional_t<std::is_same_v<T, float>, CumprodBackwardConfig<256, 1, 4, 4096>,
                                               CumprodBackwardConfig<256, 2, 3, 2048>>;

// Whether every row of x, g and dx starts 16-byte aligned and is whole vectors: the kernels
// read no unaligned head or tail.
template <typename T> inline bool whole_vector_rows(const CumprodBackwardArgs<T>& a) {
  constexpr int V = vec16<T>();
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const View& v = a.view;
  return v.length % V == 0 && aligned(a.x) && aligned(a.g) && aligned(a.dx) &&
         (v.outer == 1 || (v.x_so % V == 0 && v.y_so % V == 0 && a.g_so % V == 0));
}

// Rows of nvec vectors of V elements, launched by the first held configuration from I on
// that holds them, else in chunks.
template <typename T, int V, size_t I = 0>
inline cudaError_t launch_cumprod_backward_vectors(const CumprodBackwardArgs<T>& a, int64_t nvec, cudaStream_t stream) {
  if constexpr (I < std::tuple_size_v<CumprodBackwardHeldRows>) {
    using Held = std::tuple_element_t<I, CumprodBackwardHeldRows>;
    if (nvec > Held::kChunkVecs) return launch_cumprod_backward_vectors<T, V, I + 1>(a, nvec, stream);
    return launch_units<cumprod_backward_held_kernel<T, V, Held>>(Grid::PerUnit, dim3(Held::kBlock), 1, a.view.outer, 0,
                                                                  stream, a);
  } else {
    using Rows = CumprodBackwardRows<T>;
    return launch_units<cumprod_backward_rows_kernel<T, V, Rows>>(Grid::PerUnit, dim3(Rows::kBlock), 1, a.view.outer, 0,
                                                                  stream, a);
  }
}

// Launches cumprod's gradient over rows; *launched false (nothing done) where no kernel
// serves the view: not rows, or rows of more than CumprodBackwardRows' kMaxChunks chunks.
template <typename T>
inline cudaError_t launch_cumprod_backward(const CumprodBackwardArgs<T>& a, cudaStream_t stream, bool* launched) {
  constexpr int V = vec16<T>();
  const View& v = a.view;
  *launched = false;
  if (!v.rows()) return cudaSuccess;
  const bool vectors = whole_vector_rows(a);
  const int64_t nvec = vectors ? v.length / V : v.length;
  using Rows = CumprodBackwardRows<T>;
  if (ceil_div(nvec, Rows::kChunkVecs) > Rows::kMaxChunks) return cudaSuccess;
  *launched = true;
  if (v.empty()) return cudaSuccess;
  return vectors ? launch_cumprod_backward_vectors<T, V>(a, nvec, stream)
                 : launch_cumprod_backward_vectors<T, 1>(a, nvec, stream);
}

}  // namespace normscan
