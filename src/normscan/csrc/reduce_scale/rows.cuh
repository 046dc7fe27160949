// Rows held on chip: y = apply(x, scale(sum over the row)) [* w] [+ b], where the reduced
// dim is contiguous (inner == 1). x is read from DRAM once; a max-shifted op (softmax)
// reduces (maximum, sum of exp(x - maximum)) pairs: each thread its own values', then the
// row's; a centered op (layer_norm) reduces the row's sum, then its squared deviations
// from the mean.
//
// TPR threads hold one row (BLOCK / TPR rows per block); with a cluster of C blocks
// (TPR == BLOCK), the row is spread over the C blocks. Each thread holds NV vectors of the
// row's aligned body in registers and SNV more in its own slots of shared memory (filled by
// cp.async, slot k of thread i at held[k * BLOCK + i]); thread 0 of rank 0 also holds the
// unaligned head, the last thread of the last rank the tail. Capacity: C * TPR * (NV + SNV)
// whole vectors. CLUSTER: launched in clusters; without it the block's place is known at
// compile time, and every row is spared the divisions by a run-time cluster size.
// W_AHEAD: short weighted rows load their weight with x, so the scaling waits on no load.
// L2_LAST: unclustered kernels (and clustered fp32 ones of ops without a weight: l2, l1 and
// the softmaxes) load x and store y under an L2 evict_last policy, as torch.compile loads x
// (docs/design-notes.md, "Row kernels").
#pragma once

#include <type_traits>

#include "../device/async.cuh"
#include "../device/cluster.cuh"
#include "../device/memory.cuh"
#include "ops.cuh"

struct __half;  // as cuda_fp16.h declares it: named below, defined only where fp16 is used

namespace normscan {

// A rows kernel's shape: BLOCK threads, TPR of them a row, each holding NV vectors in
// registers and SNV in shared memory; MINB resident blocks a SM asked of the compiler;
// CLUSTER: rows spread over a thread-block cluster (sm_90); PIPELINE: the next row's loads
// overlap this row's stores; WBATCH: weight vectors a weighted row with shared memory loads
// at a time ahead of their stores (0: one at each store). tuning.cuh names the ones used.
template <int BLOCK, int TPR, int NV, int SNV, int MINB, bool CLUSTER = false, bool PIPELINE = false, int WBATCH = 0>
struct RowsConfig {
  static constexpr int kBlock = BLOCK, kThreadsPerRow = TPR, kRegVecs = NV, kSmemVecs = SNV, kMinBlocks = MINB;
  static constexpr int kWeightBatch = WBATCH;
  static constexpr bool kCluster = CLUSTER, kPipeline = PIPELINE;
  static constexpr int64_t kVecsPerBlock = int64_t(TPR) * (NV + SNV);  // of one row
  static constexpr size_t kSmemBytes = size_t(BLOCK) * SNV * 16;
};

template <typename T, typename Op, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, (min_blocks<T, Op>(Cfg::kMinBlocks))) reduce_scale_rows_kernel(ArgsFor<T, Op> a) {
  constexpr int BLOCK = Cfg::kBlock, TPR = Cfg::kThreadsPerRow, NV = Cfg::kRegVecs, SNV = Cfg::kSmemVecs;
  constexpr bool CLUSTER = Cfg::kCluster, PIPELINE = Cfg::kPipeline;
  using A = acc_t<T>;
  using VT = Vec<T, vec16<T>()>;
  constexpr int V = vec16<T>();
  using P = param_t<T, Op>;
  using PV = Vec<P, V>;  // a vector's weights (biases)
  constexpr int GROUPS = BLOCK / TPR;
  constexpr int WARPS_PER_ROW = TPR / 32;
  static_assert(BLOCK % TPR == 0 && TPR % 32 == 0, "rows are held by whole warps");
  constexpr bool SHIFTED = Op::kMaxShifted;  // reduces MaxSum pairs instead (map is exp)
  // A centered op reduces MeanM2 moments (map is a square); a grouped one its sum, then its
  // squared deviations (buffers 0 and 1).
  constexpr bool CENTERED = Op::kCentered, MOMENTS = CENTERED && !Op::kGrouped;
  // IN_PLACE: fp32 and fp64 rows held in registers alone hold x less the row's first value.
  constexpr bool IN_PLACE = MOMENTS && std::is_same<T, A>::value && SNV == 0 && !CLUSTER;
  __shared__ A warp_part[2][SHIFTED || MOMENTS ? 1 : BLOCK / 32];  // double-buffered: one barrier per row
  __shared__ A cta_part[2];
  __shared__ MeanM2<A> warp_m2[2][MOMENTS ? BLOCK / 32 : 1];
  __shared__ MeanM2<A> cta_m2[2];
  __shared__ MaxSum<A> warp_stat[2][SHIFTED ? BLOCK / 32 : 1];
  __shared__ MaxSum<A> cta_stat[2];
  extern __shared__ uint4 held[];
  const int t = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const WarpPlace me = WarpPlace::of_thread();
  // Unclustered kernels of ops without a weight carry no weight code, and skip the edge
  // loops of aligned rows under one branch. The clustered kernel keeps both: its schedule
  // at 64 registers moves with any change (docs/design-notes.md, "Row kernels").
  const P* const w = (Op::kWeighted || CLUSTER) ? a.w : nullptr;
  const P* const b = Op::kBiased ? a.b : nullptr;
#ifdef NORMSCAN_CLUSTERS  // sm_90, where they were measured; on sm_80 one-warp 16-bit rows spill with them
  // With a bias, or a float32 weight beside 16-bit rows (twice the registers), it spilled.
  constexpr bool W_AHEAD = Op::kWeighted && !Op::kBiased && SNV == 0 && NV <= 4 && sizeof(P) == sizeof(T);
  // Weighted fp16 rows take neither hint, and weighted 16-bit rows on 1024 threads load x
  // plainly: the hints' registers spill there. Clustered rows take them only in fp32 without
  // a weight (measured: docs/tuning-record.md, rows-cluster-l2-last).
  constexpr bool CLUSTER_L2_LAST = std::is_same<T, float>::value && !Op::kWeighted;
  constexpr bool L2_LAST = (!CLUSTER || CLUSTER_L2_LAST) && !(Op::kWeighted && std::is_same<T, __half>::value);
  constexpr bool X_L2_LAST = L2_LAST && !(W_AHEAD && sizeof(T) == 2 && BLOCK == 1024);
#else
  constexpr bool W_AHEAD = false;
  constexpr bool L2_LAST = false;
  constexpr bool X_L2_LAST = false;
#endif
  // Weighted rows held in shared memory may load their weight (and bias) a batch of vectors
  // at a time ahead of the batch's stores: a load at each store waits behind the stores
  // before it (they might alias it), so every store waits on its own round trip to L2.
  // tuning.cuh says which rows do.
  constexpr int W_BATCH = Cfg::kWeightBatch;
  static_assert(W_BATCH == 0 || (Op::kWeighted && SNV > 0), "a batch of a weight (and bias)");
  const int2 place = CLUSTER ? cluster_place() : make_int2(1, 0);
  const int csize = place.x, crank = place.y;
  const int64_t first = static_cast<int64_t>(blockIdx.x / csize) * GROUPS;
  const int64_t step = static_cast<int64_t>(gridDim.x / csize) * GROUPS;

  // This thread's share of the row group starting at `base`.
  struct Share {
    int64_t row;
    const T* x;    // row start
    T* y;
    int body;      // first element of this block's aligned body
    int mine;      // body vectors of this block (0: inactive)
    int edge_start, edge_count;  // unaligned head or tail elements this thread holds
  };
  auto share_of = [&](int64_t base) {
    Share p;
    const int64_t row = base + group;
    const bool active = row < a.view.outer;
    p.row = row;
    p.x = a.x + (active ? row : 0) * a.view.x_so;
    p.y = a.y + (active ? row : 0) * a.view.y_so;
    const RowSplit s = split_row<T, V>(p.x, a.view.length);
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

  // Each thread holds NV vectors in registers, SNV in its shared-memory slots, and its edge
  // elements (packed: 16-bit edges as loose registers spill). Edges are loaded with the body
  // and held: a load after the sum, or again for the store, would put two dependent round
  // trips on every row's critical path. A slot is refilled only after this thread's store
  // of its value, which needed that value: the read is done before the new copy starts.
  // Shared-memory slots go first: their copies land while the register loads are issued.
  // PIPELINE (one row a block): the next row's slots are filled during this row's stores,
  // each right after the store that frees it, so that reads and writes overlap. Rows share
  // their layout (the dispatcher's condition), so the next row's slot k is at the same
  // offset; registers only for its start (the register vectors wait for the loop's top: at
  // 64 registers, holding the next row's place spilled).
  static_assert(!PIPELINE || GROUPS == 1, "a pipelined block holds one row");
  auto fill_slots = [&](const T* x, const Share& p) {
#pragma unroll
    for (int k = NV; k < NV + SNV; ++k)
      if (has(p, k)) cp_async16(slot(k), x + at(p, k));
  };
  if (PIPELINE && first < a.view.outer) {
    const Share p = share_of(first);
    fill_slots(p.x, p);
  }
  int parity = 0;
  for (int64_t base = first; base < a.view.outer; base += step, parity ^= 1) {
    const Share cur = share_of(base);
    VT buf[NV];
    VT edge;
    PV w_ahead[W_AHEAD ? NV : 1];
    if (!PIPELINE) fill_slots(cur.x, cur);
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (has(cur, k)) buf[k] = load_vec<T, V, X_L2_LAST>(cur.x + at(cur, k));
    if constexpr (W_AHEAD) {
      // w_vec's test below; one test hoisted here for both moved the clustered kernel's code.
      if (w != nullptr && reinterpret_cast<uintptr_t>(w + cur.body) % 16 == 0) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
          if (has(cur, k)) w_ahead[k] = load_params<P, V>(w + at(cur, k));
      }
    }
    if (CLUSTER || cur.edge_count > 0) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i < cur.edge_count) edge.v[i] = cur.x[cur.edge_start + i];
    }
    // R over this thread's held values, f(value) of each; of_vector(acc, vector) takes a
    // whole body vector's at once.
    auto fold_with = [&](auto combine, auto acc, auto f, auto of_vector) {
      using R = decltype(combine);
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (has(cur, k)) acc = of_vector(acc, buf[k]);
      if (SNV > 0) {
        cp_async_wait_all();
#pragma unroll
        for (int k = NV; k < NV + SNV; ++k)
          if (has(cur, k)) {
            const VT v = *slot(k);  // one 16-byte read
            acc = of_vector(acc, v);
          }
      }
      if (CLUSTER || cur.edge_count > 0) {
#pragma unroll
        for (int i = 0; i < V; ++i)
          if (i < cur.edge_count) acc = R::apply(acc, f(Convert<T>::to_acc(edge.v[i])));
      }
      return acc;
    };
    auto fold = [&](auto combine, auto acc, auto f) {
      using R = decltype(combine);
      return fold_with(combine, acc, f, [&](auto s, const VT& v) {
#pragma unroll
        for (int i = 0; i < V; ++i) s = R::apply(s, f(Convert<T>::to_acc(v.v[i])));
        return s;
      });
    };
    A shift = A(0), sum;
    A held_mean = A(0);  // IN_PLACE: the mean of the held values (x - pilot)
    if constexpr (SHIFTED) {
      // This thread's maximum and sum of map(x - maximum), then the row's (one reduction).
      MaxSum<A> stat{fold_with(MaxOp{}, MaxOp::identity<A>(), [](A v) { return v; },
                               [](A m, const VT& v) { return vec_max(v, m); }),
                     A(0)};
      if (stat.max != MaxOp::identity<A>()) stat.sum = fold(SumOp{}, A(0), [&](A v) { return Op::map(v - stat.max); });
      stat = block_group_reduce<MaxSumOp, WARPS_PER_ROW>(stat, warp_stat[parity], group * WARPS_PER_ROW, me);
#ifdef NORMSCAN_CLUSTERS
      if (csize > 1) stat = cluster_reduce<MaxSumOp>(stat, &cta_stat[parity], csize);
#endif
      shift = stat.max;
      sum = stat.sum;
    } else {
      if constexpr (MOMENTS) {
        // The moments of x less the row's first element (summing x itself lost 0.7 ulp of a
        // mean of 1e3; PyTorch's Welford 0.3): this thread's count, mean and squared
        // deviations from it, then the row's, merged in one reduction (MeanM2Op; one barrier
        // a row where the mean's sum and then the squared deviations' took two).
        const A pilot = Convert<T>::to_acc(cur.x[0]);
        // has(cur, k) for k * TPR + t < mine: the first min(NV + SNV, ceil((mine - t) / TPR)).
        auto held_count = [&] { return V * min(NV + SNV, max(0, (cur.mine - t + TPR - 1) / TPR)) + cur.edge_count; };
        MeanM2<A> m = [&] {
          if constexpr (sizeof(T) == 2 && !CLUSTER) {
            // 16-bit rows a block holds, whose kernels are bound by their instructions: one
            // pass, the sums of d and d^2 about this thread's first value (d = x - pilot -
            // first), m2 = sum(d^2) - sum(d)^2 / n. The first value being one of the
            // thread's, sum(d^2) is at most (n + 1) m2 (about 1 + z^2 for a first value z
            // deviations out): a bounded cancellation, which 16-bit rounding hides.
            const A first = has(cur, 0) ? Convert<T>::to_acc(buf[0].v[0]) - pilot : A(0);
            // d about the thread's first value itself, one subtraction an element: two 16-bit
            // values' difference is exact in fp32 (unless over 2**13 apart in fp16, 2**16 in
            // bf16), so d is (x - pilot) - first (docs/design-notes.md, "Row kernels").
            const A center = pilot + first;
            const auto moment = [&](A v) {
              const A d = v - center;
              return SumPair<A>{d, d * d};
            };
            const SumPair<A> s = fold(SumPairOp{}, SumPair<A>{A(0), A(0)}, moment);
            const int count = held_count();
            const A n = A(count), mean = count > 0 ? ratio(s.a, n) : A(0);
            return MeanM2<A>{n, first + mean, max(A(0), s.b - s.a * mean)};
          } else {
            // The mean first, then the squared deviations from it (exact, two passes). IN_PLACE:
            // the held values less the pilot first, in place (u = x - pilot), so that these
            // passes and y take one subtraction an element fewer (docs/design-notes.md, "Row
            // kernels").
            if constexpr (IN_PLACE) {
#pragma unroll
              for (int k = 0; k < NV; ++k)
                if (has(cur, k)) {
#pragma unroll
                  for (int i = 0; i < V; ++i) buf[k].v[i] -= pilot;
                }
              if (cur.edge_count > 0) {
#pragma unroll
                for (int i = 0; i < V; ++i)
                  if (i < cur.edge_count) edge.v[i] -= pilot;
              }
            }
            const A held_pilot = IN_PLACE ? A(0) : pilot;  // what the held values are less of
            const A total = fold(SumOp{}, A(0), [&](A v) { return v - held_pilot; });
            const int count = held_count();
            const A n = A(count), mean = count > 0 ? ratio(total, n) : A(0);
            return MeanM2<A>{n, mean, fold(SumOp{}, A(0), [&](A v) { return Op::map(v - held_pilot - mean); })};
          }
        }();
        m = block_group_reduce<MeanM2Op, WARPS_PER_ROW>(m, warp_m2[parity], group * WARPS_PER_ROW, me);
#ifdef NORMSCAN_CLUSTERS
        if (csize > 1) m = cluster_reduce<MeanM2Op>(m, &cta_m2[parity], csize);
#endif
        shift = pilot + m.mean;
        held_mean = m.mean;
        sum = m.m2;
      } else if constexpr (CENTERED) {
        // A grouped op's rows (their channels' weight and bias beside): the row's sum first,
        // then its squared deviations, two reductions (in one, its 16-bit clustered kernels
        // spilled 4-8 bytes).
        const A pilot = Convert<T>::to_acc(cur.x[0]);
        A total = fold(SumOp{}, A(0), [&](A v) { return v - pilot; });
        total = block_group_sum<WARPS_PER_ROW>(total, warp_part[0], group * WARPS_PER_ROW, me);
#ifdef NORMSCAN_CLUSTERS
        if (csize > 1) total = cluster_sum(total, &cta_part[0], csize);
#endif
        shift = pilot + total / A(a.view.length);
        sum = fold(SumOp{}, A(0), [&](A v) { return Op::map(v - shift); });
        sum = block_group_sum<WARPS_PER_ROW>(sum, warp_part[1], group * WARPS_PER_ROW, me);
#ifdef NORMSCAN_CLUSTERS
        if (csize > 1) sum = cluster_sum(sum, &cta_part[1], csize);
#endif
      } else {
        sum = fold(SumOp{}, A(0), [&](A v) { return Op::map(v); });
        sum = block_group_sum<WARPS_PER_ROW>(sum, warp_part[parity], group * WARPS_PER_ROW, me);
#ifdef NORMSCAN_CLUSTERS
        if (csize > 1) sum = cluster_sum(sum, &cta_part[parity], csize);
#endif
      }
    }
    const A scale = Op::scale(sum, a.view.length, a.eps);
    const A held_shift = IN_PLACE ? held_mean : shift;  // the shift of the values as held
    if constexpr (kWritesStats<Op>) {
      if (t == 0 && crank == 0 && cur.row < a.view.outer) write_stat(a, cur.row, RowScale<A>{scale, shift}, sum);
    }
    using Channels = ChannelRow<T, false, P>;
    const Channels ch = [&] {  // a grouped op's weight and bias (only theirs: the others' code stays)
      if constexpr (Op::kGrouped) return Channels::at(a, cur.row);
      else return Channels{};
    }();
    const bool w_vec = w != nullptr && reinterpret_cast<uintptr_t>(w + cur.body) % 16 == 0;
    const bool b_vec = b != nullptr && reinterpret_cast<uintptr_t>(b + cur.body) % 16 == 0;
    constexpr int W_SLOTS = W_BATCH > 0 ? W_BATCH : 1;
    PV w_batch[W_SLOTS];
    PV b_batch[Op::kBiased ? W_SLOTS : 1];
    // A biased op's batches (its bias beside the weight) start past the register vectors,
    // whose registers they take over: from the first, beside them, they spilled.
    constexpr int FIRST_BATCHED = W_BATCH > 0 && Op::kBiased ? NV : 0;
    auto batched = [](int k) { return W_BATCH > 0 && k >= FIRST_BATCHED; };
    // The weight is tested once a vector, not once an element, and 16-bit results are
    // rounded two to an instruction (fewer instructions a row). W_AHEAD is written
    // so that kernels without it keep their code.
    auto scale_store = [&](const VT& x, int l, int k) {
      if constexpr (Op::kGrouped) {
        store_vec<T, V, L2_LAST>(cur.y + l, ch.template scale<Op>(x, scale, shift, l));
        return;
      }
      A v[V];
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = scaled_value<Op>(x.v[i], scale, held_shift);
      if (w_vec) {
        PV wv;
        if constexpr (W_AHEAD) wv = w_ahead[k];
        else if (batched(k)) wv = w_batch[k % W_SLOTS];
        else wv = load_params<P, V>(w + l);
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] *= Convert<P>::to_acc(wv.v[i]);
      } else if (w != nullptr) {
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] *= Convert<P>::to_acc(w[l + i]);
      }
      if constexpr (Op::kBiased) {
        if (b_vec) {
          const PV bv = batched(k) ? b_batch[k % W_SLOTS] : load_params<P, V>(b + l);
#pragma unroll
          for (int i = 0; i < V; ++i) v[i] += Convert<P>::to_acc(bv.v[i]);
        } else if (b != nullptr) {
#pragma unroll
          for (int i = 0; i < V; ++i) v[i] += Convert<P>::to_acc(b[l + i]);
        }
      }
      store_vec<T, V, L2_LAST>(cur.y + l, from_acc_vec<T, V>(v));
    };
    const bool next_row = PIPELINE && base + step < a.view.outer;
    const T* const next_x = cur.x + step * a.view.x_so;
    constexpr int HELD = NV + SNV, BATCH = W_BATCH > 0 ? W_BATCH : HELD;
#pragma unroll
    for (int k0 = 0; k0 < HELD; k0 += BATCH) {
      if constexpr (W_BATCH > 0) {
#pragma unroll
        for (int k = k0; k < k0 + BATCH && k < HELD; ++k)
          if (has(cur, k) && batched(k)) {
            if (w_vec) w_batch[k % W_SLOTS] = load_params<P, V>(w + at(cur, k));
            if constexpr (Op::kBiased) {
              if (b_vec) b_batch[k % W_SLOTS] = load_params<P, V>(b + at(cur, k));
            }
          }
      }
#pragma unroll
      for (int k = k0; k < k0 + BATCH && k < HELD; ++k)
        if (has(cur, k)) {
          scale_store(k < NV ? buf[k] : *slot(k), at(cur, k), k);
          if (k >= NV && next_row) cp_async16(slot(k), next_x + at(cur, k));
        }
    }
    if (CLUSTER || cur.edge_count > 0) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i < cur.edge_count) {
          const int l = cur.edge_start + i;
          if constexpr (Op::kGrouped) cur.y[l] = ch.template scale<Op>(edge.v[i], scale, shift, l);
          else cur.y[l] = scale_one<Op>(edge.v[i], scale, held_shift, w, b, l);
        }
    }
  }
#ifdef NORMSCAN_CLUSTERS
  // No block may leave while another can still read its shared memory.
  if (csize > 1) cg::this_cluster().sync();
#endif
}

}  // namespace normscan
