// A transformer block's residual add fused into its norm: h = x + residual, rounded to R (the
// residual's dtype, float32 beside a 16-bit x or x's own), then y = norm(h) [* w] [+ b] in x's
// dtype (rms_norm, layer_norm). x and the residual are read once, h and y written once: four
// tensors, where the add and the norm apart move five.
//
// One block a row, each thread holding K of its vectors of h in registers (as rounded to R:
// the norm sees the h it returns); the row's sums are combined in a fixed order, so a row's
// result does not depend on the rows beside it. Rows of whole 16-byte vectors of x, every
// tensor 16-byte aligned (the binding's condition).
#pragma once

#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"

namespace normscan {

template <typename T, typename R, typename P> struct ResidualArgs {
  const T* x;
  const R* residual;
  R* h;
  T* y;
  const P* w;  // optional, as the bias
  const P* b;
  int64_t rows, length;
  int64_t x_stride, r_stride, h_stride, y_stride;  // between rows, in elements
  double eps;
  acc_t<T>* stats;  // layer_norm's: row r's mean and rstd at 2r, 2r + 1 (its backward reads them)
};

// N elements of S to p, in 16-byte stores (a float32 vector of 8 takes two).
template <typename S, int N> __device__ __forceinline__ void store_params(S* p, const Vec<S, N>& v) {
  constexpr int H = N * sizeof(S) > 16 ? 16 / sizeof(S) : N;
#pragma unroll
  for (int i = 0; i < N; i += H) {
    Vec<S, H> part;
#pragma unroll
    for (int j = 0; j < H; ++j) part.v[j] = v.v[i + j];
    store_vec<S, H>(p + i, part);
  }
}

// K vectors a thread (2, 4 or 8), up to 512 threads a block: two blocks of a row each an SM,
// so that one row's loads overlap another's reductions; h of 8 vectors of a float32 residual
// beside 16-bit x fits the 128 registers a thread that leaves (K = 16 spilled).
template <typename T, typename R, typename P, typename Op, int K>
__global__ void __launch_bounds__(512) residual_norm_rows_kernel(ResidualArgs<T, R, P> a) {
  using A = acc_t<T>;
  constexpr int V = vec16<T>();
  static_assert(std::is_same<A, acc_t<R>>::value, "the residual accumulates as x does");
  __shared__ A scratch[32];
  const int nvec = static_cast<int>(a.length / V);
  const int threads = blockDim.x, t = threadIdx.x;
  const A n = A(a.length);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* x = a.x + row * a.x_stride;
    const R* r = a.residual + row * a.r_stride;
    R* h = a.h + row * a.h_stride;
    T* y = a.y + row * a.y_stride;
    Vec<R, V> held[K];
    A sum = A(0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = k * threads + t;
      if (j < nvec) {
        const Vec<T, V> xv = load_vec<T, V>(x + j * V);
        const Vec<R, V> rv = load_params<R, V>(r + j * V);
#pragma unroll
        for (int i = 0; i < V; ++i)
          held[k].v[i] = Convert<R>::from_acc(Convert<T>::to_acc(xv.v[i]) + Convert<R>::to_acc(rv.v[i]));
        store_params<R, V>(h + j * V, held[k]);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const A v = Convert<R>::to_acc(held[k].v[i]);
          sum += Op::kCentered ? v : v * v;
        }
      }
    }
    sum = block_sum_in_order(sum, scratch);
    A shift = A(0), scale;
    if constexpr (Op::kCentered) {  // the mean first, then the squared deviations from it
      shift = sum / n;
      A m2 = A(0);
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (k * threads + t < nvec) {
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const A d = Convert<R>::to_acc(held[k].v[i]) - shift;
            m2 += d * d;
          }
        }
      scale = Op::scale(block_sum_in_order(m2, scratch), a.length, a.eps);
      if (a.stats != nullptr && t == 0) {
        a.stats[2 * row] = shift;
        a.stats[2 * row + 1] = scale;
      }
    } else {
      scale = Op::scale(sum, a.length, a.eps);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = k * threads + t;
      if (j < nvec) {
        A v[V];
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] = (Convert<R>::to_acc(held[k].v[i]) - shift) * scale;
        if (a.w != nullptr) {
          const Vec<P, V> wv = load_params<P, V>(a.w + j * V);
#pragma unroll
          for (int i = 0; i < V; ++i) v[i] *= Convert<P>::to_acc(wv.v[i]);
        }
        if constexpr (Op::kBiased) {
          if (a.b != nullptr) {
            const Vec<P, V> bv = load_params<P, V>(a.b + j * V);
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] += Convert<P>::to_acc(bv.v[i]);
          }
        }
        store_vec<T, V>(y + j * V, from_acc_vec<T, V>(v));
      }
    }
  }
}

// The vectors a thread holds for a row of `nvec` vectors (2 up to 1024, 4 up to 2048, 8 up to
// 4096: rows of up to 32768 16-bit elements), and the block's threads; {0, 0} where no kernel
// holds it.
template <int V> inline int2 residual_shape(int64_t nvec) {
  const int k = nvec <= 1024 ? 2 : nvec <= 2048 ? 4 : 8;
  if (nvec > 4096) return make_int2(0, 0);
  const int64_t threads = (ceil_div(nvec, k) + 31) / 32 * 32;
  return make_int2(k, static_cast<int>(threads < 32 ? 32 : threads));
}

// Whether residual_norm_rows holds rows of `length` elements of T.
template <typename T> inline bool residual_rows_held(int64_t length) {
  return length % vec16<T>() == 0 && residual_shape<vec16<T>()>(length / vec16<T>()).x > 0;
}

template <typename T, typename R, typename P, typename Op>
inline cudaError_t launch_residual_norm_rows(const ResidualArgs<T, R, P>& a, cudaStream_t stream) {
  constexpr int V = vec16<T>();
  const int2 shape = residual_shape<V>(a.length / V);
  const unsigned grid = static_cast<unsigned>(min64(a.rows, int64_t(1) << 30));
  if (a.rows == 0) return cudaSuccess;
  switch (shape.x) {
    case 2: residual_norm_rows_kernel<T, R, P, Op, 2><<<grid, shape.y, 0, stream>>>(a); break;
    case 4: residual_norm_rows_kernel<T, R, P, Op, 4><<<grid, shape.y, 0, stream>>>(a); break;
    case 8: residual_norm_rows_kernel<T, R, P, Op, 8><<<grid, shape.y, 0, stream>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace normscan
