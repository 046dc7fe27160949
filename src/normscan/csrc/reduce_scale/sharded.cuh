// The local passes of rms_norm and layer_norm over a hidden dim sharded across ranks
// (normscan/distributed.py): each rank's rows' partial statistics (x read once), then, once
// the ranks' statistics are merged, y = (x - shift) * scale [* w] [+ b] with each row's
// (shift, scale) (x read and y written once). A row is walked by a group of 1-8 warps, as
// few as leave each thread two trips of kShardedUnroll units (16-byte vectors where every row
// starts on 16 bytes and is whole vectors, elements otherwise), chosen from the row's length
// alone: a row's bits do not depend on the rows beside it. The scale, an element's own,
// splits longer rows into spans of 8 warps' two trips.
#pragma once

#include <type_traits>

#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"
#include "reread.cuh"

namespace normscan {

constexpr int kShardedBlock = 256;
constexpr int kShardedUnroll = 4;  // units in flight a thread

template <typename T> struct ShardedRows {
  const T* x;
  int64_t rows, length, x_stride;  // strides between rows, in elements
  bool vectors;                    // every row starts on 16 bytes and is whole vectors
};

// A row's units: 16-byte vectors where the rows are, else elements.
template <typename T> __host__ __device__ inline int64_t row_units(const ShardedRows<T>& a) {
  return a.vectors ? a.length / vec16<T>() : a.length;
}

// Warps a row of `units`: 1, 2, 4 or 8, the fewest that leave no thread more than two trips.
inline int sharded_row_warps(int64_t units) {
  int warps = 1;
  while (warps < kShardedBlock / 32 && units > int64_t(warps) * 32 * 2 * kShardedUnroll) warps *= 2;
  return warps;
}

// f(j, present, v) for the units of a row of x that thread t of its THREADS takes, kShardedUnroll
// loaded before f sees them: v[u] is unit j + u * THREADS, the first `present` of v are in the row.
template <int THREADS, int W, typename T, typename F>
__device__ __forceinline__ void for_row_units(const T* x, int64_t units, int t, F&& f) {
  constexpr int U = kShardedUnroll;
  for (int64_t j = t; j < units; j += int64_t(THREADS) * U) {
    Vec<T, W> v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (j + u * THREADS < units) v[u] = load_vec<T, W>(x + (j + u * THREADS) * W);
    f(j, static_cast<int>(min64(U, (units - j + THREADS - 1) / THREADS)), v);
  }
}

// Each row's sum of squares (out[r]), or, CENTERED, its mean and the sum of squared deviations
// from it (out[2r], out[2r + 1]), x read once: each thread merges its batches' moments
// (RowAccumulator, of x less the row's first element), the row's warps merge the threads'.
template <typename T, bool CENTERED, int WARPS>
__global__ void __launch_bounds__(kShardedBlock) sharded_partial_stats_kernel(ShardedRows<T> a, acc_t<T>* out) {
  using A = acc_t<T>;
  using Op = std::conditional_t<CENTERED, LayerNormOp, RmsNormOp>;
  constexpr int THREADS = 32 * WARPS, ROWS = kShardedBlock / THREADS;
  __shared__ RowStat<Op, A> warp_stat[2][kShardedBlock / 32];
  const WarpPlace me = WarpPlace::of_thread();
  const int group = me.warp / WARPS, t = static_cast<int>(threadIdx.x) % THREADS;
  int parity = 0;
  for (int64_t first = int64_t(blockIdx.x) * ROWS; first < a.rows; first += int64_t(gridDim.x) * ROWS, parity ^= 1) {
    const int64_t r = first + group;
    RowAccumulator<Op, A> acc;
    if (r < a.rows && a.length > 0) {
      const T* x = a.x + r * a.x_stride;
      if constexpr (CENTERED) acc.pilot = Convert<T>::to_acc(x[0]);
      const auto add = [&](int64_t, int present, const auto& v) {
        constexpr int W = sizeof(v[0].v) / sizeof(T);
        A vals[kShardedUnroll * W];
#pragma unroll
        for (int u = 0; u < kShardedUnroll; ++u)
#pragma unroll
          for (int i = 0; i < W; ++i) vals[u * W + i] = Convert<T>::to_acc(v[u].v[i]);
        acc.add(vals, present * W);
      };
      if (a.vectors) for_row_units<THREADS, vec16<T>()>(x, a.length / vec16<T>(), t, add);
      else for_row_units<THREADS, 1>(x, a.length, t, add);
    }
    // Every warp of the block takes the group's barrier (the loop's trips are the block's).
    const auto stat = block_group_reduce<RowStatOp<Op>, WARPS>(acc.stat(), warp_stat[parity], group * WARPS, me);
    if (r < a.rows && t == 0) {
      if constexpr (CENTERED) {
        out[2 * r] = acc.pilot + stat.mean;
        out[2 * r + 1] = stat.m2;
      } else {
        out[r] = stat;
      }
    }
  }
}

// Units of a row a group of the scale takes at most: a row longer than a block's two trips is
// split into spans of it, each a block's (whole rows left the last of few waves part empty).
constexpr int64_t kShardedSpan = int64_t(kShardedBlock) * 2 * kShardedUnroll;
__host__ __device__ inline int64_t sharded_spans(int64_t units) { return (units + kShardedSpan - 1) / kShardedSpan; }

// y = (x - shift) * scale [* w] [+ b], row r's (shift, scale) at stats[2r], stats[2r + 1];
// w and b (x's dtype, or float32 beside 16-bit x) 16-byte aligned where the rows are vectors.
// Each group takes a span of a row (kShardedSpan units, a row where it is shorter).
// At most 1 block a SM asked: at ptxas's default bound for 256 threads (64 registers) the fp32
// kernels spilled; at their 70-72, 3 blocks a SM keep 4 vectors a thread in flight.
template <typename T, typename P, int WARPS>
__global__ void __launch_bounds__(kShardedBlock, 1)
    sharded_scale_kernel(ShardedRows<T> a, T* y, int64_t y_stride, const acc_t<T>* stats, const P* w, const P* b) {
  using A = acc_t<T>;
  constexpr int THREADS = 32 * WARPS, ROWS = kShardedBlock / THREADS;
  const int group = static_cast<int>(threadIdx.x) / THREADS, t = static_cast<int>(threadIdx.x) % THREADS;
  const int64_t units = row_units(a), spans = sharded_spans(units);
  for (int64_t item = int64_t(blockIdx.x) * ROWS + group; item < a.rows * spans; item += int64_t(gridDim.x) * ROWS) {
    const int64_t r = item / spans, begin = (item - r * spans) * kShardedSpan;
    const A shift = stats[2 * r], scale = stats[2 * r + 1];
    T* yr = y + r * y_stride;
    // All kShardedUnroll units are loaded before any is stored: a store might alias a later
    // load (no __restrict__), so loads after it would wait for it.
    const auto store = [&](int64_t j, int present, const auto& v) {
      constexpr int W = sizeof(v[0].v) / sizeof(T);
#pragma unroll
      for (int u = 0; u < kShardedUnroll; ++u) {
        if (u >= present) break;
        const int64_t l = (begin + j + u * THREADS) * W;
        A o[W];
#pragma unroll
        for (int i = 0; i < W; ++i) o[i] = (Convert<T>::to_acc(v[u].v[i]) - shift) * scale;
        if (w != nullptr) {
          const Vec<P, W> wv = load_params<P, W>(w + l);
#pragma unroll
          for (int i = 0; i < W; ++i) o[i] *= Convert<P>::to_acc(wv.v[i]);
        }
        if (b != nullptr) {
          const Vec<P, W> bv = load_params<P, W>(b + l);
#pragma unroll
          for (int i = 0; i < W; ++i) o[i] += Convert<P>::to_acc(bv.v[i]);
        }
        store_vec<T, W>(yr + l, from_acc_vec<T, W>(o));
      }
    };
    const T* x = a.x + r * a.x_stride;
    const int64_t mine = min64(kShardedSpan, units - begin);
    if (a.vectors) for_row_units<THREADS, vec16<T>()>(x + begin * vec16<T>(), mine, t, store);
    else for_row_units<THREADS, 1>(x + begin, mine, t, store);
  }
}

// f(std::integral_constant<int, warps>) for a row of `units`.
template <typename F> inline void with_row_warps(int64_t units, F&& f) {
  switch (sharded_row_warps(units)) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}
inline unsigned sharded_grid(int64_t rows, int warps) {
  const int64_t row_groups = kShardedBlock / (32 * warps);
  return static_cast<unsigned>(min64((rows + row_groups - 1) / row_groups, int64_t(1) << 30));
}

template <typename T, bool CENTERED>
inline cudaError_t launch_sharded_partial_stats(const ShardedRows<T>& a, acc_t<T>* out, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  with_row_warps(row_units(a), [&](auto warps) {
    sharded_partial_stats_kernel<T, CENTERED, warps()><<<sharded_grid(a.rows, warps()), kShardedBlock, 0, stream>>>(a, out);
  });
  return cudaGetLastError();
}

template <typename T, typename P>
inline cudaError_t launch_sharded_scale(const ShardedRows<T>& a, T* y, int64_t y_stride, const acc_t<T>* stats,
                                        const P* w, const P* b, cudaStream_t stream) {
  if (a.rows == 0 || a.length == 0) return cudaSuccess;
  with_row_warps(row_units(a), [&](auto warps) {
    sharded_scale_kernel<T, P, warps()><<<sharded_grid(a.rows * sharded_spans(row_units(a)), warps()), kShardedBlock,
                                          0, stream>>>(a, y, y_stride, stats, w, b);
  });
  return cudaGetLastError();
}

}  // namespace normscan
