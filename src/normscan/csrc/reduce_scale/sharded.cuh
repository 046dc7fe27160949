// The local passes of rms_norm and layer_norm over a hidden dim sharded across ranks
// (normscan/distributed.py): each rank's rows' partial statistics (x read once), then, once
// the ranks' statistics are merged, y = (x - shift) * scale [* w] [+ b] with each row's
// (shift, scale) (x read and y written once). A block a row, its sums combined in a fixed
// order. Rows are contiguous; 16-byte vectors where a row starts on 16 bytes and is whole
// vectors, elements otherwise.
#pragma once

#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"

namespace normscan {

constexpr int kShardedBlock = 256;

template <typename T> struct ShardedRows {
  const T* x;
  int64_t rows, length, x_stride;  // strides between rows, in elements
  bool vectors;                    // every row starts on 16 bytes and is whole vectors
};

// f(i, value) for each of this thread's elements of row r, in a fixed order.
template <typename T, typename F> __device__ __forceinline__ void for_row(const ShardedRows<T>& a, int64_t r, F&& f) {
  constexpr int V = vec16<T>();
  const T* x = a.x + r * a.x_stride;
  if (a.vectors) {
#pragma unroll 4  // four loads in flight a thread
    for (int64_t j = threadIdx.x; j < a.length / V; j += blockDim.x) {
      const Vec<T, V> v = load_vec<T, V>(x + j * V);
#pragma unroll
      for (int i = 0; i < V; ++i) f(j * V + i, Convert<T>::to_acc(v.v[i]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < a.length; j += blockDim.x) f(j, Convert<T>::to_acc(x[j]));
  }
}

// Each row's sum of squares (out[r]), or, CENTERED, its mean and the sum of squared deviations
// from it (out[2r], out[2r + 1]): the mean first, then the deviations on a second read of the
// row, which the block has just read (L1 and L2 hold it).
template <typename T, bool CENTERED>
__global__ void __launch_bounds__(kShardedBlock) sharded_partial_stats_kernel(ShardedRows<T> a, acc_t<T>* out) {
  using A = acc_t<T>;
  __shared__ A scratch[kShardedBlock / 32];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    A sum = A(0);
    for_row(a, r, [&](int64_t, A v) { sum += CENTERED ? v : v * v; });
    sum = block_sum_in_order(sum, scratch);
    if constexpr (CENTERED) {
      const A mean = a.length > 0 ? sum / A(a.length) : A(0);
      A m2 = A(0);
      for_row(a, r, [&](int64_t, A v) { m2 += (v - mean) * (v - mean); });
      m2 = block_sum_in_order(m2, scratch);
      if (threadIdx.x == 0) {
        out[2 * r] = mean;
        out[2 * r + 1] = m2;
      }
    } else if (threadIdx.x == 0) {
      out[r] = sum;
    }
  }
}

// y = (x - shift) * scale [* w] [+ b], row r's (shift, scale) at stats[2r], stats[2r + 1];
// w and b (x's dtype, or float32 beside 16-bit x) 16-byte aligned where the rows are vectors.
template <typename T, typename P>
__global__ void __launch_bounds__(kShardedBlock)
    sharded_scale_kernel(ShardedRows<T> a, T* y, int64_t y_stride, const acc_t<T>* stats, const P* w, const P* b) {
  using A = acc_t<T>;
  constexpr int V = vec16<T>();
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const A shift = stats[2 * r], scale = stats[2 * r + 1];
    T* yr = y + r * y_stride;
    const auto value = [&](int64_t i, A v) {
      A out = (v - shift) * scale;
      if (w != nullptr) out *= Convert<P>::to_acc(w[i]);
      if (b != nullptr) out += Convert<P>::to_acc(b[i]);
      return out;
    };
    if (a.vectors) {
      // U vectors loaded before any is stored: a store might alias a later load (no
      // __restrict__), so loads after it would wait for it.
      constexpr int U = 4;
      const T* x = a.x + r * a.x_stride;
      const int64_t nvec = a.length / V;
      for (int64_t j0 = threadIdx.x; j0 < nvec; j0 += int64_t(U) * blockDim.x) {
        Vec<T, V> v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = j0 + int64_t(u) * blockDim.x;
          if (j < nvec) v[u] = load_vec<T, V>(x + j * V);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = j0 + int64_t(u) * blockDim.x;
          if (j >= nvec) break;
          A o[V];
#pragma unroll
          for (int i = 0; i < V; ++i) o[i] = (Convert<T>::to_acc(v[u].v[i]) - shift) * scale;
          if (w != nullptr) {
            const Vec<P, V> wv = load_params<P, V>(w + j * V);
#pragma unroll
            for (int i = 0; i < V; ++i) o[i] *= Convert<P>::to_acc(wv.v[i]);
          }
          if (b != nullptr) {
            const Vec<P, V> bv = load_params<P, V>(b + j * V);
#pragma unroll
            for (int i = 0; i < V; ++i) o[i] += Convert<P>::to_acc(bv.v[i]);
          }
          store_vec<T, V>(yr + j * V, from_acc_vec<T, V>(o));
        }
      }
    } else {
      for_row(a, r, [&](int64_t i, A v) { yr[i] = Convert<T>::from_acc(value(i, v)); });
    }
  }
}

inline unsigned sharded_grid(int64_t rows) { return static_cast<unsigned>(min64(rows, int64_t(1) << 30)); }

template <typename T, bool CENTERED>
inline cudaError_t launch_sharded_partial_stats(const ShardedRows<T>& a, acc_t<T>* out, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  sharded_partial_stats_kernel<T, CENTERED><<<sharded_grid(a.rows), kShardedBlock, 0, stream>>>(a, out);
  return cudaGetLastError();
}

template <typename T, typename P>
inline cudaError_t launch_sharded_scale(const ShardedRows<T>& a, T* y, int64_t y_stride, const acc_t<T>* stats,
                                        const P* w, const P* b, cudaStream_t stream) {
  if (a.rows == 0 || a.length == 0) return cudaSuccess;
  sharded_scale_kernel<T, P><<<sharded_grid(a.rows), kShardedBlock, 0, stream>>>(a, y, y_stride, stats, w, b);
  return cudaGetLastError();
}

}  // namespace normscan
