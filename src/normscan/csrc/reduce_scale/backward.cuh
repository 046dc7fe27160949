// The fused backward of a reduce-scale op (ops.cuh: the op's Gradient) over rows (inner ==
// 1) held on chip; for the norms, y = x * c(S) [* w], S = sum(map(x)):
//   dx = c * g * w + grad_coef(c, n) * D * dmap(x),  D = sum(g * w * x)
//   dw = sum over rows of g * x * c
// the softmaxes from their maximum-shifted x (the row's maximum first, then the sums), and
// layer_norm from x less its mean, the mean and rstd its forward's (stats; db = sum over
// rows of g). x and g are read once, dx written once. Where a weight's gradient is
// summed the grid is persistent: each block (cluster) visits a fixed set of rows, and rows
// of 16-byte vectors are staged: each thread copies its own vectors of the rows STAGES - 1
// visits ahead into shared memory (cp.async; a thread reads only what it copied, so no
// barrier), and the next rows' loads are in flight while this one is reduced and stored.
// The weight and each thread's dw (db) of its columns stay in registers: a thread keeps the
// same columns on every row (rows of one launch share their alignment). At the end the
// block adds its row groups' dw in group order into its slot of dw_part ([slots][length],
// one a block or cluster; a biased op's [slots][2 length], db after dw);
// reduce_scale_dw_sum_kernel then adds the slots in order: the same input gives the same
// bits. Elsewhere (backward_dispatch.cuh) a block (cluster) takes one row group, loaded
// straight into registers. The long rows' configuration (IN_SMEM) copies each row in one
// stage and reads it from shared memory on each pass, its weight kept there too: twice
// the vectors a thread that registers hold. A pipelined cluster (PIPELINE, for ops of one
// exchange a row) posts a row's sums and scales the row before it while they travel, so
// that a cluster's blocks may run a row apart: its rows are read from their stages (ops of
// one exchange: all but the max-shifted ones).
//
// TPR threads hold a row (BLOCK / TPR rows a block), NV vectors of V elements each; with a
// cluster of C blocks (TPR == BLOCK), the row is spread over the C blocks.
#pragma once

#include "../device/async.cuh"
#include "../device/cluster.cuh"
#include "../device/memory.cuh"
#include "ops.cuh"

namespace normscan {

// P: the weight's element type (ops.cuh, param_t).
template <typename T, typename P = T> struct ReduceScaleBackwardArgs {
  const T* x;
  const T* g;  // rows contiguous, g_so apart (0: one row broadcast)
  T* dx;
  const P* w;          // null without a weight
  acc_t<T>* dw_part;   // [slots][length]; null when dw is not wanted
  const acc_t<T>* stats;  // a kRowStats op's: row r's mean and rstd at 2r, 2r + 1 (its forward's)
  View view;           // x's and dx's strides
  int64_t g_so;
  double eps;
  const T* dh = nullptr;  // a gradient added to dx (the residual form's, reaching h), rows dh_so apart
  int64_t dh_so = 0;
};

// PERSISTENT: a grid of the resident blocks (clusters), each visiting a fixed set of row
// groups (a weight's gradient is summed per block: dw_part); else a block (cluster) a row group.
// IN_SMEM: rows of 16-byte vectors are read from shared memory on each pass, not held in
// registers (then one stage stages them too).
// MAX_CLUSTER: the most blocks a cluster of it (CLUSTER) has.
// PIPELINE: a cluster's row is scaled after the next row's sums are posted (staged rows of an
// op with one exchange a row; the others ignore it): STAGES holds that row, the one summed
// and STAGES - 2 on their way. STAGES_16: STAGES for 16-bit rows.
template <int BLOCK, int TPR, int NV, int MINB, int STAGES, bool CLUSTER = false, bool PERSISTENT = true,
          bool IN_SMEM = false, int MAX_CLUSTER = kMaxPortableCluster, bool PIPELINE = false, int STAGES_16 = STAGES>
struct BackwardRowsConfig {
  static constexpr int kBlock = BLOCK, kThreadsPerRow = TPR, kVecs = NV, kMinBlocks = MINB;
  template <typename T> static __host__ __device__ constexpr int stages() { return sizeof(T) == 2 ? STAGES_16 : STAGES; }
  static constexpr int kGroups = BLOCK / TPR;  // rows a block holds at once
  static constexpr bool kCluster = CLUSTER, kPersistent = PERSISTENT, kRowsInSmem = IN_SMEM;
  static constexpr bool kPipeline = CLUSTER && PERSISTENT && PIPELINE;
  static constexpr int kMaxCluster = CLUSTER ? MAX_CLUSTER : 1;
  static constexpr int64_t kVecsPerBlock = int64_t(TPR) * NV;  // of one row
  // Staged: rows of 16-byte vectors (others load straight into registers).
  template <typename T, int V> static __host__ __device__ constexpr bool staged() {
    return (stages<T>() > 1 || IN_SMEM) && sizeof(T) * V == 16;
  }
  // The weight kept in shared memory past the stages (its registers spilled beside the
  // long rows' dw: docs/design-notes.md, "Backward"); not a float32 weight P beside 16-bit rows
  // (weight_held).
  template <typename T, int V, bool WEIGHTED, typename P = T> static __host__ __device__ constexpr bool weight_in_smem() {
    return WEIGHTED && IN_SMEM && staged<T, V>() && sizeof(P) == sizeof(T);
  }
  // A kRowStats op's statistics of a row copied into its stage with it, a copy a thread, where
  // a cluster holds the row: loaded after the row's copies landed, they put an L2-cold load in
  // each row's path there; staged in blocks of a row or less, they cost 2-5%
  // (docs/design-notes.md, "Backward").
  template <typename T, int V, bool ROW_STATS> static __host__ __device__ constexpr bool stats_staged() {
    return ROW_STATS && CLUSTER && staged<T, V>();
  }
  // Dynamic shared memory: the stages of x and g (and the weight, and the staged statistics),
  // or the row groups' dw sums at the end.
  template <typename T, int V, bool WEIGHTED, bool ROW_STATS, typename P = T> static constexpr size_t smem_bytes() {
    const size_t stats = stats_staged<T, V, ROW_STATS>() ? size_t(stages<T>()) * BLOCK * 2 * sizeof(acc_t<T>) : 0;
    const size_t staging =
        staged<T, V>() ? size_t(stages<T>() * 2 + weight_in_smem<T, V, WEIGHTED, P>()) * NV * BLOCK * 16 + stats : 0;
    const size_t sums = WEIGHTED && kGroups > 1 ? size_t(BLOCK) * NV * V * sizeof(acc_t<T>) : 0;
    return staging > sums ? staging : sums;
  }
};

// Doubles hold twice the registers: half the resident blocks asked. ADDS: dx += a.dh (a
// kFusedRowForms op's backward over the residual form's h).
template <typename T, typename Op, typename Cfg, int V, bool WEIGHTED, bool ADDS = false>
__global__ void __launch_bounds__(Cfg::kBlock, sizeof(T) == 8 ? (Cfg::kMinBlocks + 1) / 2 : Cfg::kMinBlocks)
    reduce_scale_backward_rows_kernel(ReduceScaleBackwardArgs<T, param_t<T, Op>> a) {
  // The weight's sums (reduce_scale_dw_sum_kernel, launched early) may take their places
  // beside this grid's blocks now: they wait for its end, not for their launch.
  if constexpr (WEIGHTED) allow_next_grid();
  constexpr int BLOCK = Cfg::kBlock, TPR = Cfg::kThreadsPerRow, NV = Cfg::kVecs, GROUPS = Cfg::kGroups;
  constexpr int WARPS_PER_ROW = TPR / 32;
  constexpr bool STAGED = Cfg::template staged<T, V>();
  constexpr int STAGES = STAGED ? Cfg::template stages<T>() : 1;
  static_assert(BLOCK % TPR == 0 && TPR % 32 == 0, "rows are held by whole warps");
  static_assert(!Cfg::kCluster || (TPR == BLOCK && WARPS_PER_ROW > 1), "ClusterRounds needs a block barrier a round");
  // A row scaled once the next one's sums are posted (one row group a block: a cluster's).
  constexpr bool PIPELINED = Cfg::kPipeline && STAGED && !Op::kMaxShifted;
  static_assert(!PIPELINED || STAGES >= 2, "the row scaled and the row summed");
  using A = acc_t<T>;
  using VT = Vec<T, V>;
  using P = param_t<T, Op>;
  using PV = Vec<P, V>;  // a vector's weights
  using Gradient = typename Op::Gradient;
  // A centered op's staged rows are read from shared memory on each of their passes, not
  // held in registers: beside the weight, dw and db, 16-bit rows of 4 vectors a thread
  // spilled at 128 registers (36-72 bytes, when they took three passes).
  constexpr bool ROWS_IN_SMEM = STAGED && (Op::kCentered || Cfg::kRowsInSmem || PIPELINED);
  // Each element's value (the softmaxes' exp) replaces x in its registers where T holds it
  // exactly: computed once, not again for dx.
  constexpr bool KEEPS_VALUES = sizeof(T) == sizeof(A) && !ROWS_IN_SMEM;
  using Sums = SumPair<A>;  // the row's two sums (the norms' S and D)
  // A centered op's row statistics (its forward's): mean, rstd.
  static_assert(!Op::kCentered || Op::kRowStats, "a centered op's gradient reads its forward's statistics");
  using Stat = SumPair<A>;
  constexpr bool STATS_STAGED = Cfg::template stats_staged<T, V, Op::kRowStats>();
  constexpr bool BIAS_GRAD = WEIGHTED && Op::kBiased;  // db summed beside dw
  constexpr bool WEIGHT_IN_SMEM = Cfg::template weight_in_smem<T, V, WEIGHTED, P>();
  // A float32 weight beside 16-bit rows (twice a 16-bit vector's registers) is held too, but
  // where it spilled: in layer_norm's rows of a block or cluster (db and the statistics beside,
  // 4 bytes) and the long rows (8); there it is loaded where it is used, from L1 (every row
  // reads it).
  constexpr bool WEIGHT_HELD =
      WEIGHTED && !WEIGHT_IN_SMEM && (sizeof(P) == sizeof(T) || !(Cfg::kRowsInSmem || (Op::kCentered && TPR == BLOCK)));
  __shared__ Sums warp_part[2][BLOCK / 32];    // [parity]: one barrier a row
  __shared__ A warp_shift[2][BLOCK / 32];  // the same for a max-shifted op's maximum
  const int t = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const WarpPlace me = WarpPlace::of_thread();
  const int2 place = Cfg::kCluster ? cluster_place() : make_int2(1, 0);
  const int csize = place.x, crank = place.y;
#ifdef NORMSCAN_CLUSTERS
  __shared__ ClusterRounds<Sums, Cfg::kMaxCluster, PIPELINED ? 4 : 2> cluster_sums;
  __shared__ ClusterRounds<A, Cfg::kMaxCluster> cluster_shift;
  if (csize > 1) {
    cluster_sums.init();
    if constexpr (Op::kMaxShifted) cluster_shift.init();
    cg::this_cluster().sync();
  }
#endif
  const int64_t n = a.view.length;
  // This block's share of a row, in vectors (the dispatcher checked n % V == 0 and that a
  // row fits: in-row offsets fit 32 bits).
  const int nvec = static_cast<int>(n / V);
  const int per_cta = (nvec + csize - 1) / csize;
  const int mine = max(0, min(per_cta, nvec - crank * per_cta));
  auto has = [&](int k) { return k * TPR + t < mine; };
  auto col = [&](int k) { return (crank * per_cta + k * TPR + t) * V; };

  extern __shared__ uint4 smem[];
  // Stage s of tensor j (0: x, 1: g), this thread's vector k: consecutive threads, consecutive
  // 16 bytes.
  auto slot = [&](int s, int j, int k) { return reinterpret_cast<VT*>(smem + ((s * 2 + j) * NV + k) * BLOCK + threadIdx.x); };
  // The weight's vector k past the stages, where it is kept there.
  auto weight_slot = [&](int k) { return reinterpret_cast<PV*>(smem + (STAGES * 2 * NV + k) * BLOCK + threadIdx.x); };
  // This thread's copy of the statistics of stage s's row, past those (staged rows).
  auto stat_slot = [&](int s) {
    return reinterpret_cast<Stat*>(smem + (STAGES * 2 + WEIGHT_IN_SMEM) * NV * BLOCK) + s * BLOCK + threadIdx.x;
  };

  const int64_t first = static_cast<int64_t>(blockIdx.x / csize) * GROUPS;  // the block's first row group
  const int64_t step = static_cast<int64_t>(gridDim.x / csize) * GROUPS;
  // This thread's copies of its vectors of the row group at `base` into stage s, as one group
  // (empty past the last row).
  auto stage_in = [&](int64_t base, int s) {
    const int64_t row = base + group;
    if (row < a.view.outer) {
      const T* xr = a.x + row * a.view.x_so;
      const T* gr = a.g + row * a.g_so;
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (has(k)) {
          cp_async16(slot(s, 0, k), xr + col(k));
          cp_async16(slot(s, 1, k), gr + col(k));
        }
      if constexpr (STATS_STAGED) cp_async_bytes<sizeof(Stat)>(stat_slot(s), a.stats + 2 * row);
    }
    cp_async_commit();
  };
  if constexpr (STAGED) {
#pragma unroll
    for (int s = 0; s + 1 < STAGES; ++s) stage_in(first + s * step, s);
  }
  PV wv[WEIGHT_HELD ? NV : 1];  // this thread's weight vectors, where held
  A dw[NV][V];
  A db[BIAS_GRAD ? NV : 1][V];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    if constexpr (WEIGHTED) {
      if (has(k)) {
        if constexpr (WEIGHT_IN_SMEM) *weight_slot(k) = load_vec<P, V>(a.w + col(k));
        else if constexpr (WEIGHT_HELD) wv[k] = load_vec<P, V>(a.w + col(k));
      }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      dw[k][i] = A(0);
      if constexpr (BIAS_GRAD) db[k][i] = A(0);
    }
  }
  auto w_at = [&](int k) -> PV {
    if constexpr (!WEIGHTED) return PV{};
    else if constexpr (WEIGHT_IN_SMEM) return *weight_slot(k);
    else if constexpr (WEIGHT_HELD) return wv[k];
    else return load_params<P, V>(a.w + col(k));
  };
  auto weighted = [&](A ga, const PV& wk, int i) {
    if constexpr (WEIGHTED) return ga * Convert<P>::to_acc(wk.v[i]);
    return ga;
  };

  // This thread's vector k of a row's x (j 0) or g (1): from its stage s where rows are read
  // from shared memory, else from its registers held.
  auto vec_at = [&](int s, int j, int k, const auto& held) -> VT {
    if constexpr (ROWS_IN_SMEM) return *slot(s, j, k);
    else return held[k];
  };
  // Row `row`'s dx from its vectors (stage s or xv and gv), and its share of dw (db).
  auto scale_row = [&](int64_t row, bool active, int s, const auto& xv, const auto& gv, A shift, const auto& coefs) {
    T* dxr = a.dx + (active ? row : 0) * a.view.y_so;
    const T* dhr = ADDS ? a.dh + (active ? row : 0) * a.dh_so : nullptr;  // the gradient added
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (active && has(k)) {
        const VT hk = ADDS ? load_vec<T, V>(dhr + col(k)) : VT{};
        const VT xk = vec_at(s, 0, k, xv), gk = vec_at(s, 1, k, gv);
        const PV wk = w_at(k);
        A out[V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const A xa = Convert<T>::to_acc(xk.v[i]), ga = Convert<T>::to_acc(gk.v[i]);
          const A v = KEEPS_VALUES ? xa : Gradient::template value<T>(shifted<Op>(xa, shift));
          out[i] = Gradient::grad(v, weighted(ga, wk, i), coefs);
          if constexpr (ADDS) out[i] += Convert<T>::to_acc(hk.v[i]);
          if constexpr (WEIGHTED) dw[k][i] += Gradient::weight_grad(v, ga, coefs);
          if constexpr (BIAS_GRAD) db[k][i] += ga;
        }
        if constexpr (V == 1) dxr[col(k)] = Convert<T>::from_acc(out[0]);
        else store_vec<T, V>(dxr + col(k), from_acc_vec<T, V>(out));
      }
  };
  // The row's coefficients from its sums (and a centered op's statistics).
  auto coefs_of = [&](Sums sd, Stat stat) {
    if constexpr (Op::kCentered) return Gradient::coefs(sd, stat.b, n);
    else return Gradient::coefs(sd, n, a.eps);
  };
  // The pipelined block's sums of the row it posted last (its cluster's, once taken).
  Sums posted_sums{A(0), A(0)};
  // Scales row `row`, posted in round `round` from stage s, once its cluster's sums are in (a
  // cluster holds one row a visit and visits rows only: it is active).
  auto scale_posted = [&](unsigned round, int64_t row, int s) {
    if constexpr (PIPELINED) {
      Sums sd = posted_sums;
#ifdef NORMSCAN_CLUSTERS
      if (csize > 1) sd = cluster_sums.template take<SumPairOp>(csize, round);
#endif
      const VT unused[NV]{};  // its rows are read from their stages
      const Stat stat = STATS_STAGED ? *stat_slot(s) : Stat{A(0), A(0)};
      scale_row(row, true, s, unused, unused, stat.a, coefs_of(sd, stat));
    }
  };

  unsigned visit = 0;
  int stage = 0;
  // The stage the visit before held (stages are taken in turn).
  const auto stage_before = [](int s) { return s == 0 ? STAGES - 1 : s - 1; };
  // Every group of the block takes the loop's barriers: it runs while any group has a row.
  for (int64_t base = first; base < a.view.outer; base += step, ++visit) {
    const int64_t row = base + group;
    const bool active = row < a.view.outer;
    VT xv[NV], gv[NV];
    const int held = stage;  // this row's stage (staged rows)
    // The stage the next rows' copies go to: the one held the visit before.
    const int freed = stage_before(stage);
    if constexpr (STAGED) {
      // Pipelined, the stage held the visit before is freed only once that row is scaled.
      if constexpr (!PIPELINED) stage_in(base + (STAGES - 1) * step, freed);
      cp_async_wait_groups<PIPELINED ? STAGES - 2 : STAGES - 1>();  // this row's copies have landed
      if constexpr (!ROWS_IN_SMEM) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
          if (active && has(k)) {
            xv[k] = *slot(stage, 0, k);
            gv[k] = *slot(stage, 1, k);
          }
      }
      stage = stage + 1 == STAGES ? 0 : stage + 1;
    } else {
      const int64_t r = active ? row : 0;
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (active && has(k)) {
          xv[k] = load_vec<T, V>(a.x + r * a.view.x_so + col(k));
          gv[k] = load_vec<T, V>(a.g + r * a.g_so + col(k));
        }
    }
    // This thread's vector k of the row, of x and of g.
    auto x_at = [&](int k) { return vec_at(held, 0, k, xv); };
    auto g_at = [&](int k) { return vec_at(held, 1, k, gv); };
    // A kRowStats op's statistics of the row (its forward's): staged with the row, else
    // loaded once its copies have landed (before, the 16-bit rows of a 256-thread block
    // spilled 4 bytes).
    Stat stat{A(0), A(0)};
    if constexpr (Op::kRowStats) {
      if (active) stat = STATS_STAGED ? *stat_slot(held) : Stat{a.stats[2 * row], a.stats[2 * row + 1]};
    }
    A shift = stat.a;  // a centered op's mean (0 for the others)
    if constexpr (Op::kMaxShifted) {
      A m = CompareMaxOp::identity<A>();
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (active && has(k)) {
          const VT xk = x_at(k);
#pragma unroll
          for (int i = 0; i < V; ++i) m = CompareMaxOp::apply(m, Convert<T>::to_acc(xk.v[i]));
        }
      m = block_group_reduce<CompareMaxOp, WARPS_PER_ROW>(m, warp_shift[visit & 1], group * WARPS_PER_ROW, me);
#ifdef NORMSCAN_CLUSTERS
      if (csize > 1) m = cluster_shift.template reduce<CompareMaxOp>(m, csize, crank, visit);
#endif
      shift = m;
    }
    // This thread's two sums of pair(x, g * w, k, i) over its elements i of vectors k of the row.
    auto thread_sums = [&](auto pair) {
      Sums s{A(0), A(0)};
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (active && has(k)) {
          const VT xk = x_at(k), gk = g_at(k);
          const PV wk = w_at(k);
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const Sums t = pair(Convert<T>::to_acc(xk.v[i]), weighted(Convert<T>::to_acc(gk.v[i]), wk, i), k, i);
            s.a += t.a;
            s.b += t.b;
          }
        }
      return s;
    };
    Sums sd = thread_sums([&](A x, A gw, int k, int i) {
      const A v = Gradient::template value<T>(shifted<Op>(x, shift));
      if constexpr (KEEPS_VALUES) xv[k].v[i] = v;
      return Gradient::terms(v, gw);
    });
    sd = block_group_reduce<SumPairOp, WARPS_PER_ROW>(sd, warp_part[visit & 1], group * WARPS_PER_ROW, me);
    if constexpr (PIPELINED) {
#ifdef NORMSCAN_CLUSTERS
      if (csize > 1) cluster_sums.post(sd, csize, crank, visit);
#endif
      if (visit > 0) scale_posted(visit - 1, row - step, freed);
      posted_sums = sd;
      stage_in(base + (STAGES - 1) * step, freed);
    } else {
#ifdef NORMSCAN_CLUSTERS
      if (csize > 1) sd = cluster_sums.template reduce<SumPairOp>(sd, csize, crank, visit);
#endif
      scale_row(row, active, held, xv, gv, shift, coefs_of(sd, stat));
    }
  }
  if constexpr (PIPELINED) {
    if (visit > 0) scale_posted(visit - 1, first + (visit - 1) * step, stage_before(stage));
  }
  // The block's row groups' sums added in group order, into the block's slot (its cluster's,
  // each block its own columns): dw, then db at n past it.
  if constexpr (WEIGHTED) {
    if (a.dw_part != nullptr) {
      A* part = a.dw_part + static_cast<int64_t>(blockIdx.x / csize) * n * (BIAS_GRAD ? 2 : 1);
      auto store = [&](const A (&sum_of)[NV][V], A* to) {
        if constexpr (GROUPS == 1) {
#pragma unroll
          for (int k = 0; k < NV; ++k)
            if (has(k)) {
#pragma unroll
              for (int i = 0; i < V; ++i) to[col(k) + i] = sum_of[k][i];
            }
        } else {
          // Consecutive threads, consecutive words; over the stages, which no copy still
          // fills (the last ones were empty) and no thread still reads after the barrier.
          A* const sums = reinterpret_cast<A*>(smem);
          __syncthreads();
#pragma unroll
          for (int k = 0; k < NV; ++k)
#pragma unroll
            for (int i = 0; i < V; ++i) sums[(k * V + i) * BLOCK + threadIdx.x] = sum_of[k][i];
          __syncthreads();
          if (group == 0) {
#pragma unroll
            for (int k = 0; k < NV; ++k)
              if (has(k)) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                  A sum = A(0);
                  for (int j = 0; j < GROUPS; ++j) sum += sums[(k * V + i) * BLOCK + j * TPR + t];
                  to[col(k) + i] = sum;
                }
              }
          }
        }
      };
      store(dw, part);
      if constexpr (BIAS_GRAD) store(db, part + n);
    }
  }
#ifdef NORMSCAN_CLUSTERS
  // No block may leave while another can still read its shared memory.
  if (csize > 1) cg::this_cluster().sync();
#endif
}

// dw from dw_part's first `length` columns ([slots][stride]): each column's slots added in
// fp64 and written in the weight's dtype, one launch (in fp32, the slots of 1000 rows of 37
// erred up to 2x PyTorch's own error: docs/design-notes.md). A block takes COLS columns at a time, LANES
// threads a column, each adding every LANES-th slot in order, then the lanes in order: the
// same partial sums give the same bits.
template <typename T, int COLS, int LANES>
__global__ void __launch_bounds__(COLS * LANES)
    reduce_scale_dw_sum_kernel(const acc_t<T>* part, int64_t slots, int64_t stride, int64_t length, T* dw) {
  __shared__ double lanes[LANES][COLS];
  const int c = threadIdx.x % COLS, lane = threadIdx.x / COLS;
  wait_for_prior_grid();  // the backward kernel's partial sums
  for (int64_t first = blockIdx.x * int64_t(COLS); first < length; first += gridDim.x * int64_t(COLS)) {
    const int64_t col = first + c;
    double sum = 0;
    if (col < length)
      for (int64_t k = lane; k < slots; k += LANES) sum += part[k * stride + col];
    lanes[lane][c] = sum;
    __syncthreads();
    if (lane == 0 && col < length) {
      double total = 0;
#pragma unroll
      for (int j = 0; j < LANES; ++j) total += lanes[j][c];
      dw[col] = Convert<T>::from_acc(static_cast<acc_t<T>>(total));
    }
    __syncthreads();
  }
}

}  // namespace normscan
