// Reduce-then-scale family: y = x * scale(sum(map(x))) [* w], over one dim of any tensor
// seen as (outer, length, inner). L2, L1 and RMS normalisation differ only in their functor.
//
// Kernels, by layout:
//   rows     (inner == 1, rows contiguous): each row is held in registers, by a group of
//            threads, a block, or a thread-block cluster (Hopper) that exchanges one
//            partial sum through distributed shared memory; x is read from DRAM once.
//   reread   (rows too long for registers, or x and y rows aligned differently): one
//            block per row reads the row twice, scalar loads.
//   strided  (inner > 1): threads along inner (coalesced), each holding its column's
//            values in registers when they fit, else reading the column twice.
#pragma once

#include "launch.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#define NORMSCAN_CLUSTERS 1
#endif

// Tuning knobs (tools/tune.py builds variants with -D); the defaults are the measured best.
#ifndef NORMSCAN_ROWS_CLUSTER_BLOCK  // threads per block when a cluster holds a long row
#define NORMSCAN_ROWS_CLUSTER_BLOCK 512
#endif
#ifndef NORMSCAN_STRIDED_BX  // positions along inner per block in the short-length strided kernels
#define NORMSCAN_STRIDED_BX 256
#endif
#ifndef NORMSCAN_STRIDED_VEC_BX  // threads along inner per block in the short-length vector kernels
#define NORMSCAN_STRIDED_VEC_BX 64
#endif
#ifndef NORMSCAN_STRIDED_MINB  // resident blocks per SM asked of the register-held strided kernels
#define NORMSCAN_STRIDED_MINB 2
#endif

namespace normscan {

template <typename T> struct ReduceScaleArgs {
  const T* x;
  T* y;
  const T* w;  // optional, may be null: one weight per position along the reduced dim
  int64_t outer, length, inner;
  int64_t x_so, x_sl, x_si;  // element strides of x in the (outer, length, inner) view
  int64_t y_so, y_sl, y_si;
  double eps;
};

// ---------------------------------------------------------------- functors
// The ops by the name the binding dispatches on.
#define NORMSCAN_FOR_EACH_REDUCE_SCALE_OP(X) X("l2", L2NormOp) X("l1", L1NormOp) X("rms", RmsNormOp)

// map: what is summed; scale: the factor every element of the row is multiplied by.
struct L2NormOp {
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t, double) {
    return A(1) / sqrt(s);
  }
};
struct L1NormOp {
  template <typename A> static __device__ __forceinline__ A map(A v) { return fabs(v); }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double) {
    return A(1) / (s / A(n));
  }
};
struct RmsNormOp {
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double eps) {
    return A(1) / sqrt(s / A(n) + A(eps));
  }
};

// y = x * scale [* w], one element.
template <typename T>
__device__ __forceinline__ T scale_one(T x, acc_t<T> scale, const T* w, int64_t l) {
  acc_t<T> v = Convert<T>::to_acc(x) * scale;
  if (w != nullptr) v *= Convert<T>::to_acc(w[l]);
  return Convert<T>::from_acc(v);
}

// ---------------------------------------------------------------- rows, in registers
// TPR threads hold one row (BLOCK / TPR rows per block); with a cluster of C blocks
// (TPR == BLOCK), the row is spread over the C blocks. Each thread holds NV vectors of the
// row's aligned body in registers and SNV more in its own slots of shared memory (filled by
// cp.async, slot k of thread i at held[k * BLOCK + i]); thread 0 of rank 0 also holds the
// unaligned head, the last thread of the last rank the tail. Capacity: C * TPR * (NV + SNV)
// whole vectors. Shared memory halves the cluster a long row needs, and clusters of 2 fill
// every block slot of an H100, where clusters of 4 left 16 of 264 empty.
template <typename T, typename Op, int BLOCK, int TPR, int NV, int SNV, int MINB>
__global__ void __launch_bounds__(BLOCK, MINB) reduce_scale_rows_kernel(ReduceScaleArgs<T> a) {
  using A = acc_t<T>;
  constexpr int V = vec16<T>();
  constexpr int GROUPS = BLOCK / TPR;
  constexpr int WARPS_PER_ROW = TPR / 32;
  static_assert(BLOCK % TPR == 0 && TPR % 32 == 0, "rows are held by whole warps");
  __shared__ A warp_part[2][BLOCK / 32];  // double-buffered: one barrier per row
  __shared__ A cta_part[2];
  extern __shared__ uint4 held[];
  const int t = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int csize = 1, crank = 0;
#ifdef NORMSCAN_CLUSTERS
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  csize = static_cast<int>(cluster.num_blocks());
  crank = static_cast<int>(cluster.block_rank());
#endif
  const int64_t first = static_cast<int64_t>(blockIdx.x / csize) * GROUPS;
  const int64_t step = static_cast<int64_t>(gridDim.x / csize) * GROUPS;
  int parity = 0;
  for (int64_t base = first; base < a.outer; base += step, parity ^= 1) {
    const int64_t row = base + group;
    const bool active = row < a.outer;
    const T* xr = a.x + (active ? row : 0) * a.x_so;
    T* yr = a.y + (active ? row : 0) * a.y_so;
    const RowSplit s = split_row<T, V>(xr, a.length);
    // In-row offsets fit 32 bits: a row held in registers is at most a few MB.
    const int per_cta = static_cast<int>((s.nvec + csize - 1) / csize);
    const int v0 = crank * per_cta;
    const int mine = active ? max(0, min(per_cta, static_cast<int>(s.nvec) - v0)) : 0;
    const int body = static_cast<int>(s.head) + v0 * V;  // first element of this block's body
    // Edge elements: the head goes to thread 0 of rank 0, the tail to the last thread of
    // the last rank; both lie outside the aligned body.
    const bool holds_head = active && t == 0 && crank == 0;
    const bool holds_tail = active && t == TPR - 1 && crank == csize - 1;
    const int edge_start = holds_head ? 0 : static_cast<int>(s.head + s.nvec * V);
    const int edge_count = holds_head ? static_cast<int>(s.head) : (holds_tail ? static_cast<int>(s.tail) : 0);

    // The edge elements are loaded with the body and held: a load after the sum, or again
    // for the store, would put two dependent round trips on every row's critical path.
    Vec<T, V> buf[NV];
    Vec<T, V> edge;  // packed: 16-bit edges as loose registers spill
    // The slots were last read by this thread's stores of the previous row, which needed the
    // values: those reads are done before these copies start.
    const T* mine_x = xr + body + t * V;
#pragma unroll
    for (int k = 0; k < SNV; ++k)
      if ((NV + k) * TPR + t < mine) cp_async16(&held[k * BLOCK + threadIdx.x], mine_x + (NV + k) * TPR * V);
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (k * TPR + t < mine) buf[k] = load_vec<T, V>(mine_x + k * TPR * V);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (i < edge_count) edge.v[i] = xr[edge_start + i];

    A sum = A(0);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (k * TPR + t < mine) {
#pragma unroll
        for (int i = 0; i < V; ++i) sum += Op::map(Convert<T>::to_acc(buf[k].v[i]));
      }
    }
    if (SNV > 0) {
      cp_async_wait_all();
#pragma unroll
      for (int k = 0; k < SNV; ++k) {
        if ((NV + k) * TPR + t < mine) {
          const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(&held[k * BLOCK + threadIdx.x]);
#pragma unroll
          for (int i = 0; i < V; ++i) sum += Op::map(Convert<T>::to_acc(v.v[i]));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (i < edge_count) sum += Op::map(Convert<T>::to_acc(edge.v[i]));

    sum = warp_reduce<SumOp>(sum);
    if (WARPS_PER_ROW > 1) {
      if (lane == 0) warp_part[parity][warp] = sum;
      __syncthreads();
      sum = A(0);
#pragma unroll
      for (int i = 0; i < WARPS_PER_ROW; ++i) sum += warp_part[parity][group * WARPS_PER_ROW + i];
    }
#ifdef NORMSCAN_CLUSTERS
    if (csize > 1) {
      // One partial per block crosses the cluster; every warp sums them in rank order.
      if (threadIdx.x == 0) cta_part[parity] = sum;
      cluster.sync();
      A c = A(0);
      if (lane < csize) c = *cluster.map_shared_rank(&cta_part[parity], lane);
      sum = warp_reduce<SumOp>(c);
    }
#endif
    const A scale = Op::scale(sum, a.length, a.eps);
    const bool w_vec = a.w != nullptr && reinterpret_cast<uintptr_t>(a.w + body) % 16 == 0;
    auto scale_store = [&](const Vec<T, V>& x, int l) {
      Vec<T, V> out;
      if (w_vec) {
        const Vec<T, V> wv = load_vec<T, V>(a.w + l);
#pragma unroll
        for (int i = 0; i < V; ++i)
          out.v[i] = Convert<T>::from_acc(Convert<T>::to_acc(x.v[i]) * scale * Convert<T>::to_acc(wv.v[i]));
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = scale_one(x.v[i], scale, a.w, l + i);
      }
      store_vec<T, V>(yr + l, out);
    };
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (k * TPR + t < mine) scale_store(buf[k], body + (k * TPR + t) * V);
#pragma unroll
    for (int k = 0; k < SNV; ++k)
      if ((NV + k) * TPR + t < mine)
        scale_store(*reinterpret_cast<const Vec<T, V>*>(&held[k * BLOCK + threadIdx.x]), body + ((NV + k) * TPR + t) * V);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (i < edge_count) yr[edge_start + i] = scale_one(edge.v[i], scale, a.w, edge_start + i);
  }
#ifdef NORMSCAN_CLUSTERS
  // No block may leave while another can still read its shared memory.
  if (csize > 1) cluster.sync();
#endif
}

// ---------------------------------------------------------------- rows, read twice
template <typename T, typename Op>
__global__ void __launch_bounds__(512) reduce_scale_reread_kernel(ReduceScaleArgs<T> a) {
  using A = acc_t<T>;
  constexpr int BLOCK = 512;
  __shared__ A warp_part[2][BLOCK / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.outer; row += gridDim.x, parity ^= 1) {
    const T* xr = a.x + row * a.x_so;
    T* yr = a.y + row * a.y_so;
    A sum = A(0);
    for (int64_t l = threadIdx.x; l < a.length; l += BLOCK) sum += Op::map(Convert<T>::to_acc(xr[l]));
    sum = warp_reduce<SumOp>(sum);
    if (lane == 0) warp_part[parity][warp] = sum;
    __syncthreads();
    sum = A(0);
#pragma unroll
    for (int i = 0; i < BLOCK / 32; ++i) sum += warp_part[parity][i];
    const A scale = Op::scale(sum, a.length, a.eps);
    for (int64_t l = threadIdx.x; l < a.length; l += BLOCK) yr[l] = scale_one(xr[l], scale, a.w, l);
  }
}

// ---------------------------------------------------------------- strided (inner > 1)
// Whether the strided kernel fetches held values ahead through shared memory: only whole
// 16-byte vectors can go by cp.async.
template <typename T, bool IN_REGS, int VI>
__host__ __device__ constexpr bool strided_prefetches() {
  return IN_REGS && VI * sizeof(T) == 16;
}

// A block is BX threads along inner (coalesced) by BY threads along the reduced dim. Thread
// tx takes CPT groups of VI adjacent positions along inner, groups BX * VI apart: VI > 1
// reads them as one 16-byte vector (inner contiguous and aligned), CPT > 1 gives short
// columns enough bytes in flight. Thread (tx, ty) takes positions l = ty + k * BY of its
// columns: with IN_REGS it holds them in registers (k < ITEMS, length <= BY * ITEMS),
// otherwise it reads them twice. Held 16-byte vectors arrive through shared memory: the
// thread's vectors of the block's next tile are fetched (cp.async) into its own slots
// while the current tile is reduced, scaled and stored.
template <typename T, typename Op, int BX, int BY, int ITEMS, bool IN_REGS, int CPT, int VI, int MINB>
__global__ void __launch_bounds__(BX * BY, MINB) reduce_scale_strided_kernel(ReduceScaleArgs<T> a) {
  using A = acc_t<T>;
  using VT = Vec<T, VI>;
  constexpr int HELD = IN_REGS ? ITEMS : 1;  // vectors a thread holds per group
  constexpr int TILE = BX * CPT * VI;        // positions along inner per tile
  constexpr bool PREFETCH = strided_prefetches<T, IN_REGS, VI>();
  constexpr int NT = BX * BY;
  __shared__ A part[2][BY > 1 ? BY : 1][BY > 1 ? TILE : 1];
  extern __shared__ uint4 ahead[];  // PREFETCH: vector (c, k) of thread i at ahead[(c * HELD + k) * NT + i]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * BX + tx;
  const int64_t tiles_inner = (a.inner + TILE - 1) / TILE;
  const int64_t ntiles = a.outer * tiles_inner;
  const int64_t count = a.length > ty ? (a.length - ty + BY - 1) / BY : 0;  // positions of this thread
  const int64_t x_step = BY * a.x_sl, y_step = BY * a.y_sl;
  // Stepping pointers (not k * step) keeps the compiler from hoisting ITEMS offsets.
  auto column = [&](int64_t tile, int c) {
    return a.x + (tile / tiles_inner) * a.x_so + ((tile % tiles_inner) * TILE + tx * VI + c * BX * VI) * a.x_si +
           ty * a.x_sl;
  };
  auto in_inner = [&](int64_t tile, int c) { return (tile % tiles_inner) * TILE + tx * VI + c * BX * VI < a.inner; };
  auto prefetch = [&](int64_t tile) {
    if (tile < ntiles) {
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        if (!in_inner(tile, c)) continue;
        const T* p = column(tile, c);
#pragma unroll
        for (int k = 0; k < HELD; ++k, p += x_step)
          if (k < count) cp_async16(&ahead[(c * HELD + k) * NT + tid], p);
      }
    }
  };
  if (PREFETCH) prefetch(blockIdx.x);
  int parity = 0;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x, parity ^= 1) {
    const int64_t o = tile / tiles_inner;
    const int64_t i0 = (tile % tiles_inner) * TILE + tx * VI;
    VT vals[CPT][HELD];
    A sum[CPT][VI];
    if (PREFETCH) cp_async_wait_all();
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
#pragma unroll
      for (int v = 0; v < VI; ++v) sum[c][v] = A(0);
      if (IN_REGS && in_inner(tile, c)) {
        const T* p = column(tile, c);
#pragma unroll
        for (int k = 0; k < HELD; ++k, p += x_step)
          if (k < count)
            vals[c][k] = PREFETCH ? *reinterpret_cast<const VT*>(&ahead[(c * HELD + k) * NT + tid])
                                  : *reinterpret_cast<const VT*>(p);
      }
    }
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      const int64_t i = i0 + c * BX * VI;
      if (i >= a.inner) continue;
      if (IN_REGS) {
#pragma unroll
        for (int k = 0; k < HELD; ++k)
          if (k < count) {
#pragma unroll
            for (int v = 0; v < VI; ++v) sum[c][v] += Op::map(Convert<T>::to_acc(vals[c][k].v[v]));
          }
      } else {
        const T* p = a.x + o * a.x_so + i * a.x_si + ty * a.x_sl;
#pragma unroll 8
        for (int64_t k = 0; k < count; ++k, p += x_step) {
          const VT x = *reinterpret_cast<const VT*>(p);
#pragma unroll
          for (int v = 0; v < VI; ++v) sum[c][v] += Op::map(Convert<T>::to_acc(x.v[v]));
        }
      }
    }
    if (PREFETCH) prefetch(tile + gridDim.x);  // the sums have consumed every value read from the slots
    if (BY > 1) {
#pragma unroll
      for (int c = 0; c < CPT; ++c)
#pragma unroll
        for (int v = 0; v < VI; ++v) part[parity][ty][(tx + c * BX) * VI + v] = sum[c][v];
      __syncthreads();
#pragma unroll
      for (int c = 0; c < CPT; ++c)
#pragma unroll
        for (int v = 0; v < VI; ++v) {
          sum[c][v] = A(0);
#pragma unroll
          for (int j = 0; j < BY; ++j) sum[c][v] += part[parity][j][(tx + c * BX) * VI + v];
        }
    }
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      const int64_t i = i0 + c * BX * VI;
      if (i >= a.inner) continue;
      A scale[VI];
#pragma unroll
      for (int v = 0; v < VI; ++v) scale[v] = Op::scale(sum[c][v], a.length, a.eps);
      auto scale_vec = [&](const VT& x, int64_t l) {
        VT out;
#pragma unroll
        for (int v = 0; v < VI; ++v) out.v[v] = scale_one(x.v[v], scale[v], a.w, l);
        return out;
      };
      T* q = a.y + o * a.y_so + i * a.y_si + ty * a.y_sl;
      if (IN_REGS) {
#pragma unroll
        for (int k = 0; k < HELD; ++k, q += y_step)
          if (k < count) *reinterpret_cast<VT*>(q) = scale_vec(vals[c][k], ty + int64_t(k) * BY);
      } else {
        const T* p = a.x + o * a.x_so + i * a.x_si + ty * a.x_sl;
#pragma unroll 8
        for (int64_t k = 0; k < count; ++k, p += x_step, q += y_step)
          *reinterpret_cast<VT*>(q) = scale_vec(*reinterpret_cast<const VT*>(p), ty + k * BY);
      }
    }
  }
}

// ---------------------------------------------------------------- launchers
template <typename T, typename Op, int BLOCK, int TPR, int NV, int SNV, int MINB>
inline cudaError_t launch_rows(const ReduceScaleArgs<T>& a, int cluster, cudaStream_t stream) {
  const int64_t units = cluster > 1 ? a.outer : ceil_div(a.outer, BLOCK / TPR);
  constexpr size_t smem = size_t(BLOCK) * SNV * 16;
  return launch_persistent<reduce_scale_rows_kernel<T, Op, BLOCK, TPR, NV, SNV, MINB>>(dim3(BLOCK), cluster, units, smem,
                                                                                      stream, a);
}

template <typename T, typename Op>
inline cudaError_t launch_reduce_scale_rows(const ReduceScaleArgs<T>& a, cudaStream_t stream) {
  constexpr int V = vec16<T>();
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  const int64_t nvec = a.length / V;  // whole vectors in the worst-aligned row
  const int max_cluster = d.major >= 9 ? 8 : 1;
  // Vectors per thread in the 64-register configurations: 32 elements of 16 or 32 bits,
  // 8 doubles (fp64 math needs the room).
  constexpr int NV = sizeof(T) == 4 ? 8 : 4;
  if (rows_share_alignment(a.x, a.y, a.x_so, a.y_so, a.outer)) {
    // The fewest threads per row that hold it in 4 vectors each: a thread whose vector slots
    // sit half empty keeps half the bytes in flight (65536x1024 fp32 measured 0.95x of
    // torch.compile on 128 threads per row).
    if (nvec <= 32 * 4) return launch_rows<T, Op, 256, 32, 4, 0, 4>(a, 1, stream);
    if (nvec <= 64 * 4) return launch_rows<T, Op, 256, 64, 4, 0, 4>(a, 1, stream);
    if (nvec <= 128 * 4) return launch_rows<T, Op, 256, 128, 4, 0, 4>(a, 1, stream);
    if (nvec <= 256 * 4) return launch_rows<T, Op, 256, 256, 4, 0, 4>(a, 1, stream);
    if (nvec <= 512 * 4) return launch_rows<T, Op, 512, 512, 4, 0, 2>(a, 1, stream);
    constexpr int CB = NORMSCAN_ROWS_CLUSTER_BLOCK;
    if (nvec <= int64_t(CB) * NV) return launch_rows<T, Op, CB, CB, NV, 0, 1024 / CB>(a, 1, stream);
    // Longer rows: a cluster whose blocks hold as much again in shared memory (fp32 keeps
    // 5 vectors in registers and 11 in shared memory: 8 and 8, or 6 and 10, spill).
    constexpr int RNV = sizeof(T) == 4 ? 5 : NV;
    constexpr int SNV = 2 * NV - RNV;
    constexpr int64_t per_block = int64_t(CB) * (RNV + SNV);
    if (nvec <= per_block * max_cluster)
      return launch_rows<T, Op, CB, CB, RNV, SNV, 1024 / CB>(a, static_cast<int>(ceil_div(nvec, per_block)), stream);
  }
  return launch_persistent<reduce_scale_reread_kernel<T, Op>>(dim3(512), 1, a.outer, 0, stream, a);
}

template <typename T, typename Op, int BX, int BY, int ITEMS, bool IN_REGS, int CPT, int VI, int MINB>
inline cudaError_t launch_strided(const ReduceScaleArgs<T>& a, cudaStream_t stream) {
  const int64_t tiles = a.outer * ceil_div(a.inner, BX * CPT * VI);
  constexpr size_t smem = strided_prefetches<T, IN_REGS, VI>() ? size_t(BX) * BY * CPT * ITEMS * 16 : 0;
  return launch_persistent<reduce_scale_strided_kernel<T, Op, BX, BY, ITEMS, IN_REGS, CPT, VI, MINB>>(
      dim3(BX, BY), 1, tiles, smem, stream, a);
}

template <typename T, typename Op>
inline cudaError_t launch_reduce_scale(const ReduceScaleArgs<T>& a, cudaStream_t stream) {
  if (a.outer == 0 || a.length == 0 || a.inner == 0) return cudaSuccess;
  if (a.inner == 1 && a.x_sl == 1 && a.y_sl == 1) return launch_reduce_scale_rows<T, Op>(a, stream);
  constexpr int MB = NORMSCAN_STRIDED_MINB;
  constexpr int VI = vec16<T>();
  const bool vec = inner_vectorizable(a, VI);
  // Columns of up to 128: 16-byte vectors along inner, up to 16 per thread (256 bytes).
  if (vec) {
    constexpr int BX = NORMSCAN_STRIDED_VEC_BX;
    if (a.length <= 4) return launch_strided<T, Op, BX, 1, 4, true, 4, VI, MB>(a, stream);
    if (a.length <= 16) return launch_strided<T, Op, BX, 1, 16, true, 1, VI, MB>(a, stream);
    if (a.length <= 4 * 16) return launch_strided<T, Op, BX, 4, 16, true, 1, VI, MB>(a, stream);
    // (16-bit types spill here: their fp32 conversions need the registers.)
    if constexpr (sizeof(T) >= 4)
      if (a.length <= 8 * 16) return launch_strided<T, Op, 32, 8, 16, true, 1, VI, MB>(a, stream);
  }
  // Items held per thread, in 32-bit registers' worth: doubles take two.
  constexpr int R = sizeof(T) > 4 ? 2 : 1;
  constexpr int BX = NORMSCAN_STRIDED_BX;
  // Short columns: several per thread, so that a thread keeps up to 64 values in flight.
  if (a.length <= 4 / R) return launch_strided<T, Op, BX, 1, 4 / R, true, 16 / R, 1, MB>(a, stream);
  if (a.length <= 64 / R) return launch_strided<T, Op, BX, 1, 64 / R, true, 1, 1, MB>(a, stream);
  if (a.length <= 8 * 64 / R) return launch_strided<T, Op, 32, 8, 64 / R, true, 1, 1, MB>(a, stream);
  // Long columns are read twice (the second time mostly from L2).
  if (vec) return launch_strided<T, Op, 32, 8, 1, false, 1, VI, MB>(a, stream);
  return launch_strided<T, Op, 32, 32, 1, false, 1, 1, 1>(a, stream);
}

}  // namespace normscan
