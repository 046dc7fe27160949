// The fused forms of rms_norm and layer_norm over rows held by one block:
// - the residual add: h = x + residual, rounded to R (the residual's dtype, float32 beside a
//   16-bit x or x's own), then y = norm(h) [* w] [+ b]: x and the residual read once, h and y
//   written once, four tensors where the add and the norm apart move five;
// - y written as O, another dtype than x's (float32 beside 16-bit x, 16-bit beside float32),
//   or FP8 as y / scale saturated to the format's finite range, the scale given (one float32)
//   or each row's own, max |y| / the format's largest value, written beside y.
// y is computed in float32 (float64 for double x) and rounded once, to O.
//
// One block a row, each thread holding K of its vectors (of h, or of x without a residual) in
// registers, as rounded to R: the norm sees the h it returns. The row's sums are combined in a
// fixed order, so a row's result does not depend on the rows beside it. Rows of whole 16-byte
// vectors of x, every tensor 16-byte aligned (the binding's condition).
#pragma once

#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"

namespace normscan {

template <typename T, typename R, typename P, typename O = T> struct FusedRowsArgs {
  const T* x;
  const R* residual;  // the residual form's (RESIDUAL), as h
  R* h;
  O* y;
  const P* w;  // optional, as the bias
  const P* b;
  int64_t rows, length;
  int64_t x_stride, r_stride, h_stride, y_stride;  // between rows, in elements
  double eps;
  acc_t<T>* stats;  // layer_norm's: row r's mean and rstd at 2r, 2r + 1 (its backward reads them)
  // An FP8 y's scale: one for every row (out_scale), or each row's own, written to row_scales.
  const float* out_scale;
  float* row_scales;
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

// The smallest scale of a row of its own (vLLM's, for FP8 e4m3: 1 / (448 * 512)): a row of
// zeros divides by it, not by 0.
template <typename O> __device__ __forceinline__ float min_row_scale() { return 1.0f / (OutFormat<O>::kMax * 512.0f); }

// Blocks a SM asked of the kernels: the out forms' (y of another dtype than x's) two on
// sm_90 without a residual, so that one row's loads run beside another's reductions
// (measured: docs/performance.md, "Out forms at two blocks a SM"); one elsewhere (at two,
// sm_80's spilled up to 32 bytes) and with a residual (hundreds); the residual form's none.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
constexpr int kFusedOutMinBlocks = 2;
#else
constexpr int kFusedOutMinBlocks = 1;
#endif
template <typename T, typename O, bool RESIDUAL>
constexpr int kFusedMinBlocks = std::is_same<O, T>::value ? 0 : RESIDUAL ? 1 : kFusedOutMinBlocks;

// The most threads a block. The residual form's rows of 2049-4096 vectors of 16-bit or float64
// x take 4 vectors a thread on up to 1024 (64 registers: 32 warps an SM): 8 on 512 took 105
// registers (16 warps) and spilled at 64. Float32 x's take 8 on 512 (64 registers: two
// blocks), and so do the out forms.
template <typename T, typename O>
constexpr int kFusedMaxThreads = std::is_same<O, T>::value && !std::is_same<T, float>::value ? 1024 : 512;

// K vectors a thread (2, 4 or 8). Rows of up to 2048 vectors take at most 512 threads, two
// blocks of a row each an SM, so that one row's loads overlap another's reductions.
template <typename T, typename R, typename P, typename O, typename Op, int K, bool RESIDUAL>
__global__ void __launch_bounds__(kFusedMaxThreads<T, O>, (kFusedMinBlocks<T, O, RESIDUAL>))
    fused_norm_rows_kernel(FusedRowsArgs<T, R, P, O> a) {
  using A = acc_t<T>;
  constexpr int V = vec16<T>();
  constexpr bool kFp8 = OutFormat<O>::kFp8;
  static_assert(std::is_same<A, acc_t<R>>::value, "the residual accumulates as x does");
  static_assert(RESIDUAL || std::is_same<R, T>::value, "without a residual the row is held as x");
  __shared__ A scratch[32];
  const int nvec = static_cast<int>(a.length / V);
  const int threads = blockDim.x, t = threadIdx.x;
  const A n = A(a.length);
  A inv_scale = A(1);
  if constexpr (kFp8) {
    if (a.row_scales == nullptr) inv_scale = A(1) / A(a.out_scale[0]);
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* x = a.x + row * a.x_stride;
    const R* r = RESIDUAL ? a.residual + row * a.r_stride : nullptr;
    R* h = RESIDUAL ? a.h + row * a.h_stride : nullptr;
    O* y = a.y + row * a.y_stride;
    Vec<R, V> held[K];
    A sum = A(0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = k * threads + t;
      if (j < nvec) {
        const Vec<T, V> xv = load_vec<T, V>(x + j * V);
        if constexpr (RESIDUAL) {
          const Vec<R, V> rv = load_params<R, V>(r + j * V);
#pragma unroll
          for (int i = 0; i < V; ++i)
            held[k].v[i] = Convert<R>::from_acc(Convert<T>::to_acc(xv.v[i]) + Convert<R>::to_acc(rv.v[i]));
          store_params<R, V>(h + j * V, held[k]);
        } else {
          held[k] = xv;
        }
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
    // y of held vector k (vector j of the row), before any FP8 scale.
    const auto normed = [&](int k, int j, A (&v)[V]) {
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
    };
    if constexpr (kFp8) {
      if (a.row_scales != nullptr) {  // the row's own scale: its largest |y| first (a NaN wins)
        A most = A(0);
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int j = k * threads + t;
          if (j < nvec) {
            A v[V];
            normed(k, j, v);
#pragma unroll
            for (int i = 0; i < V; ++i) most = MaxOp::apply(most, fabs(v[i]));
          }
        }
        most = block_reduce_in_order<MaxOp>(most, scratch);
        const A row_scale = MaxOp::apply(most / A(OutFormat<O>::kMax), A(min_row_scale<O>()));
        if (t == 0) a.row_scales[row] = row_scale;
        inv_scale = A(1) / row_scale;
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = k * threads + t;
      if (j < nvec) {
        A v[V];
        normed(k, j, v);
        if constexpr (kFp8) {
#pragma unroll
          for (int i = 0; i < V; ++i) v[i] *= inv_scale;
        }
        store_params<O, V>(y + j * V, from_acc_vec<O, V>(v));
      }
    }
  }
}

// The most vectors a thread holds: 4 where the block may take 1024 threads, and for an FP8 y
// beside a float32 h of a 16-bit x (at 8, the scale's second pass over y spilled layer_norm's
// kernels at the 128 registers a thread); 8 else.
template <typename T, typename R, typename O>
constexpr int kFusedMostVectors =
    kFusedMaxThreads<T, O> >= 1024 || (OutFormat<O>::kFp8 && sizeof(R) > sizeof(T)) ? 4 : 8;

// How fused_norm_rows holds a row of `length` elements of T (h of R, y of O): {vectors a
// thread, the block's threads}: 2 up to 1024 vectors, 4 up to 2048, then kFusedMostVectors, on
// at most kFusedMaxThreads (rows of up to 32768 16-bit elements); {0, 0} where it does not
// (not whole vectors, or longer).
template <typename T, typename R = T, typename O = T> inline int2 fused_rows_shape(int64_t length) {
  constexpr int V = vec16<T>();
  if (length % V != 0) return make_int2(0, 0);
  const int64_t nvec = length / V;
  const int k = nvec <= 1024 ? 2 : nvec <= 2048 ? 4 : kFusedMostVectors<T, R, O>;
  const int64_t threads = (ceil_div(nvec, k) + 31) / 32 * 32;
  if (threads > kFusedMaxThreads<T, O>) return make_int2(0, 0);
  return make_int2(k, static_cast<int>(threads < 32 ? 32 : threads));
}

// Whether fused_norm_rows holds rows of `length` elements of T (h of R, y of O).
template <typename T, typename R = T, typename O = T> inline bool fused_rows_held(int64_t length) {
  return fused_rows_shape<T, R, O>(length).x > 0;
}

template <typename T, typename R, typename P, typename O, typename Op, bool RESIDUAL>
inline cudaError_t launch_fused_norm_rows(const FusedRowsArgs<T, R, P, O>& a, cudaStream_t stream) {
  const int2 shape = fused_rows_shape<T, R, O>(a.length);
  const unsigned grid = static_cast<unsigned>(min64(a.rows, int64_t(1) << 30));
  if (a.rows == 0) return cudaSuccess;
  switch (shape.x) {
    case 2: fused_norm_rows_kernel<T, R, P, O, Op, 2, RESIDUAL><<<grid, shape.y, 0, stream>>>(a); break;
    case 4: fused_norm_rows_kernel<T, R, P, O, Op, 4, RESIDUAL><<<grid, shape.y, 0, stream>>>(a); break;
    case 8:
      if constexpr (kFusedMostVectors<T, R, O> >= 8) {
        fused_norm_rows_kernel<T, R, P, O, Op, 8, RESIDUAL><<<grid, shape.y, 0, stream>>>(a);
        break;
      }
      return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace normscan
