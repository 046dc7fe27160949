// Reduce-then-scale family: y = x * scale(sum(map(x))) [* w], over one dim of any tensor
// seen as (outer, length, inner). L2, L1 and RMS normalisation differ only in their functor.
//
// Kernels, by layout:
//   rows     (inner == 1, rows contiguous): each row is held on chip (registers, then
//            shared memory), by a group of threads, a block, or a thread-block cluster
//            (Hopper) that exchanges one partial sum through distributed shared memory;
//            x is read from DRAM once.
//   reread   (rows longer than 8 clusters hold, or x and y rows aligned differently): one
//            block per row reads the row twice, 16-byte vectors where the alignment allows.
//   strided  (inner > 1): threads along inner (coalesced), each holding its column's
//            values in registers when they fit; longer columns are split over a cluster
//            (Hopper) whose blocks exchange column sums; longer still, read twice.
#pragma once

#include <type_traits>

#include "launch.cuh"

struct __half;  // as cuda_fp16.h declares it: named below, defined only where fp16 is used

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#define NORMSCAN_CLUSTERS 1
#endif

// Tuning knobs (tools/tune.py builds variants with -D); the defaults are the measured best.
#ifndef NORMSCAN_ROWS_CLUSTER_BLOCK  // threads per block when a cluster holds a long row
#define NORMSCAN_ROWS_CLUSTER_BLOCK 512
#endif
#ifndef NORMSCAN_ROWS_HELD  // vectors per thread, registers and shared memory, for long rows
#define NORMSCAN_ROWS_HELD 16
#endif
#ifndef NORMSCAN_STRIDED_BX  // positions along inner per block in the short-length strided kernels
#define NORMSCAN_STRIDED_BX 256
#endif
#ifndef NORMSCAN_STRIDED_VEC_BX  // threads along inner per block in the short-length vector kernels
#define NORMSCAN_STRIDED_VEC_BX 64
#endif
#ifndef NORMSCAN_STRIDED_CLUSTERS  // 0: no clusters for long columns (they are read twice)
#define NORMSCAN_STRIDED_CLUSTERS 1
#endif
#ifndef NORMSCAN_STRIDED_MINB  // resident blocks per SM asked of the register-held strided kernels
#define NORMSCAN_STRIDED_MINB 2
#endif

namespace normscan {

#ifdef NORMSCAN_CLUSTERS
namespace cg = cooperative_groups;
#endif

// This block's place in its thread-block cluster: .x the cluster's size, .y the block's
// rank (1 and 0 where there are no clusters).
__device__ __forceinline__ int2 cluster_place() {
#ifdef NORMSCAN_CLUSTERS
  const cg::cluster_group cluster = cg::this_cluster();
  return make_int2(static_cast<int>(cluster.num_blocks()), static_cast<int>(cluster.block_rank()));
#else
  return make_int2(1, 0);
#endif
}

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

// map: what is summed; scale: the factor every element of the row is multiplied by;
// kWeighted: whether the op takes a weight.
struct L2NormOp {
  static constexpr bool kWeighted = false;
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t, double) {
    return A(1) / sqrt(s);
  }
};
struct L1NormOp {
  static constexpr bool kWeighted = false;
  template <typename A> static __device__ __forceinline__ A map(A v) { return fabs(v); }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double) {
    return A(1) / (s / A(n));
  }
};
struct RmsNormOp {
  static constexpr bool kWeighted = true;
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
// every block slot of an H100, where clusters of 4 left 16 of 264 empty. CLUSTER: launched
// in clusters; without it the block's place is known at compile time, and every row is
// spared the divisions by a run-time cluster size. W_AHEAD: rows of at most 4 register
// vectors a thread load their weight with x, so the scaling waits on no load. L2_LAST:
// unclustered kernels load x and store y under an L2 evict_last policy, as torch.compile
// loads x. Rows of 1024-16384 elements ran 0.6-2.4% faster, and the 256 MB read after
// the kernel no slower, so no write is merely put off; on a machine where our kernels ran
// 1.5-2% slow without them (NOTES.md), rows ran as fast as on the others. Why L2 does
// better so is not measured. The clustered fp32 kernel ran 0.3% slower with the store hint.
template <typename T, typename Op, int BLOCK, int TPR, int NV, int SNV, int MINB, bool CLUSTER>
__global__ void __launch_bounds__(BLOCK, MINB) reduce_scale_rows_kernel(ReduceScaleArgs<T> a) {
  using A = acc_t<T>;
  using VT = Vec<T, vec16<T>()>;
  constexpr int V = vec16<T>();
  constexpr int GROUPS = BLOCK / TPR;
  constexpr int WARPS_PER_ROW = TPR / 32;
  static_assert(BLOCK % TPR == 0 && TPR % 32 == 0, "rows are held by whole warps");
  __shared__ A warp_part[2][BLOCK / 32];  // double-buffered: one barrier per row
  __shared__ A cta_part[2];
  extern __shared__ uint4 held[];
  const int t = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Unclustered kernels of ops without a weight carry no weight code, and skip the edge
  // loops of aligned rows under one branch (fewer instructions a row: short rows up to 0.6%
  // faster). The clustered kernel keeps both as they were: at 64 registers its schedule
  // moves with any change, and a new register allocation alone cost it 0.5%.
  const T* const w = (Op::kWeighted || CLUSTER) ? a.w : nullptr;
#ifdef NORMSCAN_CLUSTERS  // sm_90 (measured there); on sm_80 one-warp 16-bit rows spill with it
  constexpr bool W_AHEAD = Op::kWeighted && SNV == 0 && NV <= 4;
  // Not for weighted fp16 rows: the load hint's registers spilled there (4-12 bytes), and the
  // store hint alone was not measured. Weighted 16-bit rows on 1024 threads (8 bytes spilled)
  // keep the store hint, with x loaded plainly.
  constexpr bool L2_LAST = !CLUSTER && !(Op::kWeighted && std::is_same<T, __half>::value);
  constexpr bool X_L2_LAST = L2_LAST && !(W_AHEAD && sizeof(T) == 2 && BLOCK == 1024);
#else
  constexpr bool W_AHEAD = false;
  constexpr bool L2_LAST = false;
  constexpr bool X_L2_LAST = false;
#endif
  const int2 place = CLUSTER ? cluster_place() : make_int2(1, 0);
  const int csize = place.x, crank = place.y;
  const int64_t first = static_cast<int64_t>(blockIdx.x / csize) * GROUPS;
  const int64_t step = static_cast<int64_t>(gridDim.x / csize) * GROUPS;

  // This thread's share of the row group starting at `base`.
  struct Share {
    const T* x;    // row start
    T* y;
    int body;      // first element of this block's aligned body
    int mine;      // body vectors of this block (0: inactive)
    int edge_start, edge_count;  // unaligned head or tail elements this thread holds
  };
  auto share_of = [&](int64_t base) {
    Share p;
    const int64_t row = base + group;
    const bool active = row < a.outer;
    p.x = a.x + (active ? row : 0) * a.x_so;
    p.y = a.y + (active ? row : 0) * a.y_so;
    const RowSplit s = split_row<T, V>(p.x, a.length);
    // In-row offsets fit 32 bits: a row held on chip is at most a few MB.
    const int per_cta = static_cast<int>((s.nvec + csize - 1) / csize);
    const int v0 = crank * per_cta;
    p.mine = active ? max(0, min(per_cta, static_cast<int>(s.nvec) - v0)) : 0;
    p.body = static_cast<int>(s.head) + v0 * V;
    // The head goes to thread 0 of rank 0, the tail to the last thread of the last rank.
    const bool holds_head = active && t == 0 && crank == 0;
    const bool holds_tail = active && t == TPR - 1 && crank == csize - 1;
    p.edge_start = holds_head ? 0 : static_cast<int>(s.head + s.nvec * V);
    p.edge_count = holds_head ? static_cast<int>(s.head) : (holds_tail ? static_cast<int>(s.tail) : 0);
    return p;
  };
  // Body vector k of this thread: registers for k < NV, shared-memory slot k - NV after.
  auto has = [&](const Share& p, int k) { return k * TPR + t < p.mine; };
  auto at = [&](const Share& p, int k) { return p.body + (k * TPR + t) * V; };
  auto slot = [&](int k) { return reinterpret_cast<VT*>(&held[(k - NV) * BLOCK + threadIdx.x]); };

  int parity = 0;
  for (int64_t base = first; base < a.outer; base += step, parity ^= 1) {
    const Share cur = share_of(base);
    // Each thread holds NV vectors in registers, SNV in its shared-memory slots, and its
    // edge elements (packed: 16-bit edges as loose registers spill). Edges are loaded with
    // the body and held: a load after the sum, or again for the store, would put two
    // dependent round trips on every row's critical path. The slots were last read by this
    // thread's stores of the previous row, which needed the values: those reads are done
    // before new copies start. Shared-memory slots go first: their copies land while the
    // register loads are issued.
    VT buf[NV];
    VT edge;
    VT w_ahead[W_AHEAD ? NV : 1];
#pragma unroll
    for (int k = NV; k < NV + SNV; ++k)
      if (has(cur, k)) cp_async16(slot(k), cur.x + at(cur, k));
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (has(cur, k)) buf[k] = load_vec<T, V, X_L2_LAST>(cur.x + at(cur, k));
    if constexpr (W_AHEAD) {
      // w_vec's test below; one test hoisted here for both moved the clustered kernel's code.
      if (w != nullptr && reinterpret_cast<uintptr_t>(w + cur.body) % 16 == 0) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
          if (has(cur, k)) w_ahead[k] = load_vec<T, V>(w + at(cur, k));
      }
    }
    if (CLUSTER || cur.edge_count > 0) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i < cur.edge_count) edge.v[i] = cur.x[cur.edge_start + i];
    }
    A sum = A(0);
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (has(cur, k)) {
#pragma unroll
        for (int i = 0; i < V; ++i) sum += Op::map(Convert<T>::to_acc(buf[k].v[i]));
      }
    if (SNV > 0) {
      cp_async_wait_all();
#pragma unroll
      for (int k = NV; k < NV + SNV; ++k)
        if (has(cur, k)) {
          const VT v = *slot(k);
#pragma unroll
          for (int i = 0; i < V; ++i) sum += Op::map(Convert<T>::to_acc(v.v[i]));
        }
    }
    if (CLUSTER || cur.edge_count > 0) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i < cur.edge_count) sum += Op::map(Convert<T>::to_acc(edge.v[i]));
    }

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
      cg::this_cluster().sync();
      A c = A(0);
      if (lane < csize) c = *cg::this_cluster().map_shared_rank(&cta_part[parity], lane);
      sum = warp_reduce<SumOp>(c);
    }
#endif
    const A scale = Op::scale(sum, a.length, a.eps);
    const bool w_vec = w != nullptr && reinterpret_cast<uintptr_t>(w + cur.body) % 16 == 0;
    // The weight is tested once a vector, not once an element, and 16-bit results are
    // rounded two to an instruction. With CLUSTER above, the bf16 kernel for 65536x1024
    // went from 42.1 M to 29.4 M warp instructions (ncu) and bf16 rows ran 1-3% faster.
    // W_AHEAD is written so that kernels without it keep their code: a variant that only
    // reallocated the clustered fp32 kernel's registers measured 0.5% slower.
    auto scale_store = [&](const VT& x, int l, int k) {
      A v[V];
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = Convert<T>::to_acc(x.v[i]) * scale;
      if (w_vec) {
        VT wv;
        if constexpr (W_AHEAD) wv = w_ahead[k];
        else wv = load_vec<T, V>(w + l);
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] *= Convert<T>::to_acc(wv.v[i]);
      } else if (w != nullptr) {
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] *= Convert<T>::to_acc(w[l + i]);
      }
      store_vec<T, V, L2_LAST>(cur.y + l, from_acc_vec<T, V>(v));
    };
#pragma unroll
    for (int k = 0; k < NV + SNV; ++k)
      if (has(cur, k)) scale_store(k < NV ? buf[k] : *slot(k), at(cur, k), k);
    if (CLUSTER || cur.edge_count > 0) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i < cur.edge_count) cur.y[cur.edge_start + i] = scale_one(edge.v[i], scale, w, cur.edge_start + i);
    }
  }
#ifdef NORMSCAN_CLUSTERS
  // No block may leave while another can still read its shared memory.
  if (csize > 1) cg::this_cluster().sync();
#endif
}

// ---------------------------------------------------------------- rows, read twice
// One block per row: a pass that sums, then a pass that scales, in V-element vectors when
// x and y rows share their alignment (V == 1 otherwise). The second pass walks the row
// backwards, so it starts with the lines the first pass read last: those most likely
// still in L2.
template <typename T, typename Op, int BLOCK, int V>
__global__ void __launch_bounds__(BLOCK) reduce_scale_reread_kernel(ReduceScaleArgs<T> a) {
  using A = acc_t<T>;
  using VT = Vec<T, V>;
  constexpr int UNROLL = 4;  // vectors in flight per thread
  __shared__ A warp_part[2][BLOCK / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.outer; row += gridDim.x, parity ^= 1) {
    const T* xr = a.x + row * a.x_so;
    T* yr = a.y + row * a.y_so;
    const RowSplit s = split_row<T, V>(xr, a.length);
    const T* xb = xr + s.head;
    // Edge element e (head, then tail; fewer than 2 * V) belongs to thread e.
    const int head = static_cast<int>(s.head), edges = static_cast<int>(s.head + s.tail);
    const int64_t edge_at = threadIdx.x < head ? threadIdx.x : s.nvec * V + threadIdx.x;
    A sum = A(0);
    if (threadIdx.x < edges) sum += Op::map(Convert<T>::to_acc(xr[edge_at]));
    for (int64_t j = threadIdx.x; j < s.nvec; j += int64_t(BLOCK) * UNROLL) {
      VT v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j + u * BLOCK < s.nvec) v[u] = load_vec<T, V>(xb + (j + u * BLOCK) * V);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j + u * BLOCK < s.nvec) {
#pragma unroll
          for (int i = 0; i < V; ++i) sum += Op::map(Convert<T>::to_acc(v[u].v[i]));
        }
    }
    sum = warp_reduce<SumOp>(sum);
    if (lane == 0) warp_part[parity][warp] = sum;
    __syncthreads();
    sum = A(0);
#pragma unroll
    for (int i = 0; i < BLOCK / 32; ++i) sum += warp_part[parity][i];
    const A scale = Op::scale(sum, a.length, a.eps);
    if (threadIdx.x < edges) yr[edge_at] = scale_one(xr[edge_at], scale, a.w, edge_at);
    T* yb = yr + s.head;
    for (int64_t j = s.nvec - 1 - threadIdx.x; j >= 0; j -= int64_t(BLOCK) * UNROLL) {
      VT v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j - u * BLOCK >= 0) v[u] = load_vec<T, V>(xb + (j - u * BLOCK) * V);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j - u * BLOCK >= 0) {
          const int64_t l = s.head + (j - u * BLOCK) * V;
          VT out;
#pragma unroll
          for (int i = 0; i < V; ++i) out.v[i] = scale_one(v[u].v[i], scale, a.w, l + i);
          store_vec<T, V>(yb + (j - u * BLOCK) * V, out);
        }
    }
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
// while the current tile is reduced, scaled and stored. Longer columns go to a cluster
// (Hopper, IN_REGS): block rank r holds positions [r * BY * ITEMS, (r + 1) * BY * ITEMS),
// and the blocks' column sums cross the cluster through distributed shared memory.
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
  const int2 place = cluster_place();
  const int csize = place.x, crank = place.y;
#ifdef NORMSCAN_CLUSTERS
  constexpr bool CLUSTERED = IN_REGS && BY > 1;  // the launchers cluster only such blocks
  // Column sums of each block of the cluster, pushed by that block.
  __shared__ A cta_sum[2][CLUSTERED ? 8 : 1][CLUSTERED ? TILE : 1];
  // A block may write another's shared memory only once that block has started
  // (compute-sanitizer's racecheck flagged the first push without this barrier).
  if (CLUSTERED && csize > 1) cg::this_cluster().sync();
#endif
  const int64_t tiles_inner = (a.inner + TILE - 1) / TILE;
  const int64_t ntiles = a.outer * tiles_inner;
  const int64_t l0 = int64_t(crank) * BY * ITEMS;  // this block's first position along the reduced dim
  const int64_t slice = csize > 1 ? min64(int64_t(BY) * ITEMS, a.length - l0) : a.length;
  const int64_t count = slice > ty ? (slice - ty + BY - 1) / BY : 0;  // positions of this thread
  const int64_t first_tile = blockIdx.x / csize, tile_step = gridDim.x / csize;
  const int64_t x_step = BY * a.x_sl, y_step = BY * a.y_sl;
  // Stepping pointers (not k * step) keeps the compiler from hoisting ITEMS offsets.
  auto column = [&](int64_t tile, int c) {
    return a.x + (tile / tiles_inner) * a.x_so + ((tile % tiles_inner) * TILE + tx * VI + c * BX * VI) * a.x_si +
           (l0 + ty) * a.x_sl;
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
  if (PREFETCH) prefetch(first_tile);
  int parity = 0;
  for (int64_t tile = first_tile; tile < ntiles; tile += tile_step, parity ^= 1) {
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
    if (PREFETCH) prefetch(tile + tile_step);  // the sums have consumed every value read from the slots
    if (BY > 1) {
#pragma unroll
      for (int c = 0; c < CPT; ++c)
#pragma unroll
        for (int v = 0; v < VI; ++v) part[parity][ty][(tx + c * BX) * VI + v] = sum[c][v];
    }
    if (BY > 1 && csize == 1) {
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
#ifdef NORMSCAN_CLUSTERS
    if constexpr (CLUSTERED) {
      if (csize > 1) {
        // Each block pushes its column sums into every block of the cluster: remote stores
        // do not wait, and after the barrier every read is local. Double-buffered: a block
        // can be at most one tile ahead of the cluster's readers.
        __syncthreads();  // part[parity] is complete
        for (int j = tid; j < TILE; j += NT) {
          A col = A(0);
#pragma unroll
          for (int k = 0; k < BY; ++k) col += part[parity][k][j];
          for (int r = 0; r < csize; ++r) *cg::this_cluster().map_shared_rank(&cta_sum[parity][crank][j], r) = col;
        }
        cg::this_cluster().sync();
#pragma unroll
        for (int c = 0; c < CPT; ++c)
#pragma unroll
          for (int v = 0; v < VI; ++v) {
            sum[c][v] = A(0);
            for (int r = 0; r < csize; ++r) sum[c][v] += cta_sum[parity][r][(tx + c * BX) * VI + v];
          }
      }
    }
#endif
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
      T* q = a.y + o * a.y_so + i * a.y_si + (l0 + ty) * a.y_sl;
      if (IN_REGS) {
#pragma unroll
        for (int k = 0; k < HELD; ++k, q += y_step)
          if (k < count) *reinterpret_cast<VT*>(q) = scale_vec(vals[c][k], l0 + ty + int64_t(k) * BY);
      } else {
        const T* p = a.x + o * a.x_so + i * a.x_si + ty * a.x_sl;
#pragma unroll 8
        for (int64_t k = 0; k < count; ++k, p += x_step, q += y_step)
          *reinterpret_cast<VT*>(q) = scale_vec(*reinterpret_cast<const VT*>(p), ty + k * BY);
      }
    }
  }
#ifdef NORMSCAN_CLUSTERS
  // No block may leave while another can still read its shared memory.
  if (csize > 1) cg::this_cluster().sync();
#endif
}

// ---------------------------------------------------------------- launchers
template <typename T, typename Op, int BLOCK, int TPR, int NV, int SNV, int MINB, bool CLUSTER = false>
inline cudaError_t launch_rows(const ReduceScaleArgs<T>& a, int cluster, cudaStream_t stream) {
  const int64_t units = cluster > 1 ? a.outer : ceil_div(a.outer, BLOCK / TPR);
  constexpr size_t smem = size_t(BLOCK) * SNV * 16;
  return launch_units<reduce_scale_rows_kernel<T, Op, BLOCK, TPR, NV, SNV, MINB, CLUSTER>>(
      Grid::PerUnit, dim3(BLOCK), cluster, units, smem, stream, a);
}

template <typename T, typename Op>
inline cudaError_t launch_reduce_scale_rows(const ReduceScaleArgs<T>& a, cudaStream_t stream) {
  constexpr int V = vec16<T>();
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  const int64_t nvec = a.length / V;  // whole vectors in the worst-aligned row
  const int max_cluster = d.major >= 9 ? 8 : 1;
  const bool aligned = rows_share_alignment(a.x, a.y, a.x_so, a.y_so, a.outer);
  if (aligned) {
    // The fewest threads per row that hold it in 4 vectors each: a thread whose vector slots
    // sit half empty keeps half the bytes in flight (65536x1024 fp32 measured 0.95x of
    // torch.compile on 128 threads per row). Rows of 16384 floats: 1024 threads of 4
    // vectors measured 0.5% faster than 512 of 8 (two blocks a SM).
    if (nvec <= 32 * 4) return launch_rows<T, Op, 256, 32, 4, 0, 4>(a, 1, stream);
    if (nvec <= 64 * 4) return launch_rows<T, Op, 256, 64, 4, 0, 4>(a, 1, stream);
    if (nvec <= 128 * 4) return launch_rows<T, Op, 256, 128, 4, 0, 4>(a, 1, stream);
    if (nvec <= 256 * 4) return launch_rows<T, Op, 256, 256, 4, 0, 4>(a, 1, stream);
    if (nvec <= 512 * 4) return launch_rows<T, Op, 512, 512, 4, 0, 2>(a, 1, stream);
    if (nvec <= 1024 * 4) return launch_rows<T, Op, 1024, 1024, 4, 0, 1>(a, 1, stream);
    // Longer rows: a cluster whose blocks hold 16 vectors a thread, the rest of them in
    // shared memory (fp32 keeps 5 in registers: 8 and 8, or 6 and 10, spill; other types 4).
    constexpr int CB = NORMSCAN_ROWS_CLUSTER_BLOCK;
    constexpr int RNV = sizeof(T) == 4 ? 5 : 4;
    constexpr int SNV = NORMSCAN_ROWS_HELD - RNV;
    constexpr int64_t per_block = int64_t(CB) * (RNV + SNV);
    if (nvec <= per_block * max_cluster)
      return launch_rows<T, Op, CB, CB, RNV, SNV, 1024 / CB, true>(a, static_cast<int>(ceil_div(nvec, per_block)), stream);
  }
  if (aligned)
    return launch_units<reduce_scale_reread_kernel<T, Op, 512, V>>(Grid::PerUnit, dim3(512), 1, a.outer, 0, stream, a);
  return launch_units<reduce_scale_reread_kernel<T, Op, 512, 1>>(Grid::PerUnit, dim3(512), 1, a.outer, 0, stream, a);
}

template <typename T, typename Op, int BX, int BY, int ITEMS, bool IN_REGS, int CPT, int VI, int MINB>
inline cudaError_t launch_strided(const ReduceScaleArgs<T>& a, cudaStream_t stream, int cluster = 1) {
  const int64_t tiles = a.outer * ceil_div(a.inner, BX * CPT * VI);
  constexpr size_t smem = strided_prefetches<T, IN_REGS, VI>() ? size_t(BX) * BY * CPT * ITEMS * 16 : 0;
  // Clustered tiles hide their cross-block reduction behind the next tile's prefetch: a
  // grid of one cluster per tile (which prefetches nothing) measured 2-3% slower on
  // (8, 1024, 64, 64); unclustered, one block per tile measured 2% faster.
  const Grid grid = cluster > 1 ? Grid::Persistent : Grid::PerUnit;
  return launch_units<reduce_scale_strided_kernel<T, Op, BX, BY, ITEMS, IN_REGS, CPT, VI, MINB>>(
      grid, dim3(BX, BY), cluster, tiles, smem, stream, a);
}

template <typename T, typename Op>
inline cudaError_t launch_reduce_scale(const ReduceScaleArgs<T>& a, cudaStream_t stream) {
  if (a.outer == 0 || a.length == 0 || a.inner == 0) return cudaSuccess;
  if (a.inner == 1 && a.x_sl == 1 && a.y_sl == 1) return launch_reduce_scale_rows<T, Op>(a, stream);
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  // Columns longer than one block holds go to a cluster of up to 8 blocks (Hopper).
  const int max_cluster = d.major >= 9 && NORMSCAN_STRIDED_CLUSTERS ? 8 : 1;
  auto blocks_for = [&](int64_t per_block) { return static_cast<int>(ceil_div(a.length, per_block)); };
  constexpr int MB = NORMSCAN_STRIDED_MINB;
  constexpr int VI = vec16<T>();
  const bool vec = inner_vectorizable(a, VI);
  // 16-byte vectors along inner, up to 16 per thread (256 bytes).
  if (vec) {
    constexpr int BX = NORMSCAN_STRIDED_VEC_BX;
    if (a.length <= 4) return launch_strided<T, Op, BX, 1, 4, true, 4, VI, MB>(a, stream);
    if (a.length <= 16) return launch_strided<T, Op, BX, 1, 16, true, 1, VI, MB>(a, stream);
    if (a.length <= 4 * 16) return launch_strided<T, Op, BX, 4, 16, true, 1, VI, MB>(a, stream);
    // (16-bit types spill at 8 x 16: their fp32 conversions need the registers.)
    constexpr int BY = sizeof(T) >= 4 ? 8 : 4;
    constexpr int per_block = BY * 16;
    if (a.length <= int64_t(per_block) * max_cluster)
      return launch_strided<T, Op, 256 / BY, BY, 16, true, 1, VI, MB>(a, stream, blocks_for(per_block));
  }
  // Items held per thread, in 32-bit registers' worth: doubles take two.
  constexpr int R = sizeof(T) > 4 ? 2 : 1;
  constexpr int BX = NORMSCAN_STRIDED_BX;
  // Short columns: several per thread, so that a thread keeps up to 64 values in flight.
  if (a.length <= 4 / R) return launch_strided<T, Op, BX, 1, 4 / R, true, 16 / R, 1, MB>(a, stream);
  if (a.length <= 64 / R) return launch_strided<T, Op, BX, 1, 64 / R, true, 1, 1, MB>(a, stream);
  constexpr int per_block = 8 * 64 / R;
  if (a.length <= int64_t(per_block) * max_cluster)
    return launch_strided<T, Op, 32, 8, 64 / R, true, 1, 1, MB>(a, stream, blocks_for(per_block));
  // Longer columns are read twice (the second time partly from L2).
  if (vec) return launch_strided<T, Op, 32, 8, 1, false, 1, VI, MB>(a, stream);
  return launch_strided<T, Op, 32, 32, 1, false, 1, 1, 1>(a, stream);
}

}  // namespace normscan
