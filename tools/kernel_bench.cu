// Times the kernels alone, without torch, to compare -D variants of csrc/ in seconds rather
// than a load_inline build each. Every case runs on freshly allocated buffers, with L2
// flushed (a 256 MB read) before each call; the median of CUDA events is set beside a
// plain 16-byte copy of the same bytes on the same buffers, so allocation noise shows in
// both. A few rows or columns of each result are checked against a double reference.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I src/normscan/csrc [-DNORMSCAN_...=...] \
//        tools/kernel_bench.cu -o kernel_bench
//   ./kernel_bench [--rounds N] [--reps N] [name-substring ...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/half.cuh"
#include "reduce_scale/dispatch.cuh"
#include "scan/dispatch.cuh"

using namespace normscan;

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

enum class DType { F32, BF16 };

// An op by its functor's name in its family's list (csrc/<family>/ops.cuh).
struct Case {
  const char* name;
  const char* functor;
  bool weight;  // rms_norm with a weight
  DType dtype;
  int64_t outer, length, inner;
};

const Case kCases[] = {
    {"l2 32768x65535", "L2NormOp", false, DType::F32, 32768, 65535, 1},
    {"l1 32768x65535", "L1NormOp", false, DType::F32, 32768, 65535, 1},
    {"l2 65536x1024", "L2NormOp", false, DType::F32, 65536, 1024, 1},
    {"l2 8192x16384", "L2NormOp", false, DType::F32, 8192, 16384, 1},
    {"l2 32768x4096", "L2NormOp", false, DType::F32, 32768, 4096, 1},
    {"l2 1024x262144", "L2NormOp", false, DType::F32, 1024, 262144, 1},
    {"l2 65536x1024 bf16", "L2NormOp", false, DType::BF16, 65536, 1024, 1},
    {"l2 8192x16384 bf16", "L2NormOp", false, DType::BF16, 8192, 16384, 1},
    {"l2 1024x262144 bf16", "L2NormOp", false, DType::BF16, 1024, 262144, 1},
    {"rmsw 32768x4096", "RmsNormOp", true, DType::F32, 32768, 4096, 1},
    {"rmsw 32768x4096 bf16", "RmsNormOp", true, DType::BF16, 32768, 4096, 1},
    {"rmsw 65536x1024", "RmsNormOp", true, DType::F32, 65536, 1024, 1},
    {"rmsw 65536x1024 bf16", "RmsNormOp", true, DType::BF16, 65536, 1024, 1},
    {"rmsw 8192x16384", "RmsNormOp", true, DType::F32, 8192, 16384, 1},
    {"rmsw 8192x16384 bf16", "RmsNormOp", true, DType::BF16, 8192, 16384, 1},
    {"rms 65536x1024 bf16", "RmsNormOp", false, DType::BF16, 65536, 1024, 1},
    {"rms 32768x4096", "RmsNormOp", false, DType::F32, 32768, 4096, 1},
    {"rms ch 112x64x512x512", "RmsNormOp", false, DType::F32, 112, 64, 512 * 512},
    {"rms ch 112x3x512x512", "RmsNormOp", false, DType::F32, 112, 3, 512 * 512},
    {"rms ch 16x256x128x128", "RmsNormOp", false, DType::F32, 16, 256, 128 * 128},
    {"rms ch 8x1024x64x64", "RmsNormOp", false, DType::F32, 8, 1024, 64 * 64},
    {"rms ch 16x256x128x128 bf16", "RmsNormOp", false, DType::BF16, 16, 256, 128 * 128},
    {"cumprod 32768x32768", "ProdOp", false, DType::F32, 32768, 32768, 1},
    {"cumprod dim0 32768x32768", "ProdOp", false, DType::F32, 1, 32768, 32768},
    {"cumprod 1x2**28", "ProdOp", false, DType::F32, 1, int64_t(1) << 28, 1},
    {"cumsum 1x2**28", "SumOp", false, DType::F32, 1, int64_t(1) << 28, 1},
    {"cumprod 4096x4096", "ProdOp", false, DType::F32, 4096, 4096, 1},
    {"cumsum 4096x4096", "SumOp", false, DType::F32, 4096, 4096, 1},
    {"cumprod 8192x16384", "ProdOp", false, DType::F32, 8192, 16384, 1},
    {"cumprod 16x2**24", "ProdOp", false, DType::F32, 16, int64_t(1) << 24, 1},
    // Small look-back cases (every line checked): unaligned rows, several rows, bf16.
    {"lb cumprod 3x4194309", "ProdOp", false, DType::F32, 3, 4194309, 1},
    {"lb cumsum 64x65539", "SumOp", false, DType::F32, 64, 65539, 1},
    {"lb cumsum 64x65539 bf16", "SumOp", false, DType::BF16, 64, 65539, 1},
};

// The op id of a functor in the reduce-scale list, else in the scan list (scan: true); -1 if in neither.
int op_id(const char* functor, bool* scan) {
#define NORMSCAN_FIND(id, Op) \
  if (!std::strcmp(functor, #Op)) return id;
  *scan = false;
  NORMSCAN_REDUCE_SCALE_OPS(NORMSCAN_FIND)
  *scan = true;
  NORMSCAN_SCAN_OPS(NORMSCAN_FIND)
#undef NORMSCAN_FIND
  return -1;
}
bool is(const Case& c, const char* functor) { return !std::strcmp(c.functor, functor); }

// ------------------------------------------------------------------ device helpers
__device__ __forceinline__ float uniform(uint64_t i, uint64_t seed) {  // [0, 1)
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}
// Norms: mixed signs; products: 1 + small noise with random signs, so they stay in range.
template <typename T>
__global__ void fill(T* p, int64_t n, uint64_t seed, bool near_one) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = uniform(i, seed);
    // exp(noise): the running product's log is a random walk with no drift.
    float v = near_one ? expf(0.01f * (uniform(i, seed + 1) - 0.5f)) : 2.0f * u - 1.0f;
    if (near_one && u < 0.5f) v = -v;
    p[i] = Convert<T>::from_acc(v);
  }
}
__global__ void poison(uint32_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = 0x7fc07fc0u;  // NaN as fp32, and as both bf16 halves
}
__global__ void read_all(const uint4* p, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc ^= p[i].x ^ p[i].w;
  if (acc == 0x12345678u) *sink = acc;
}
__global__ void copy16(const uint4* x, uint4* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i];
}

// ------------------------------------------------------------------ host
template <typename T> float host_float(T v);
template <> float host_float<float>(float v) { return v; }
template <> float host_float<__nv_bfloat16>(__nv_bfloat16 v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Flush {
  uint4* buf = nullptr;
  unsigned* sink = nullptr;
  static constexpr int64_t kBytes = int64_t(256) << 20;
  Flush() {
    CHECK(cudaMalloc(&buf, kBytes));
    CHECK(cudaMemset(buf, 1, kBytes));
    CHECK(cudaMalloc(&sink, 4));
  }
  void operator()() { read_all<<<1056, 512>>>(buf, kBytes / 16, sink); }
};

template <typename F>
float median_ms(F launch, Flush& flush, int reps) {
  cudaEvent_t b, e;
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventCreate(&e));
  std::vector<float> t;
  for (int r = 0; r < reps + 2; ++r) {
    flush();
    CHECK(cudaEventRecord(b));
    launch();
    CHECK(cudaEventRecord(e));
    CHECK(cudaEventSynchronize(e));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, b, e));
    if (r >= 2) t.push_back(ms);  // two warm-up calls
  }
  CHECK(cudaEventDestroy(b));
  CHECK(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Worst error of one line of `length` elements (element stride `step`) against double.
template <typename T>
double line_error(const Case& c, const T* x, const T* y, const float* w, int64_t step) {
  const int64_t n = c.length;
  const bool prod = is(c, "ProdOp");
  double err = 0;
  if (prod || is(c, "SumOp")) {
    double run = prod ? 1.0 : 0.0, scale = 0;
    for (int64_t l = 0; l < n; ++l) {
      const double v = host_float(x[l * step]);
      run = prod ? run * v : run + v;
      scale = std::max(scale, std::fabs(run));
      const double got = host_float(y[l * step]);
      // Products: elementwise relative; sums: relative to the largest partial sum so far.
      const double ref_mag = prod ? std::fabs(run) : std::max(scale, 1.0);
      const double e = std::isnan(got) ? INFINITY : std::fabs(got - run) / ref_mag;
      err = std::max(err, e);
    }
    return err;
  }
  double s = 0;
  for (int64_t l = 0; l < n; ++l) {
    const double v = host_float(x[l * step]);
    s += is(c, "L1NormOp") ? std::fabs(v) : v * v;
  }
  double scale = is(c, "L2NormOp") ? 1.0 / std::sqrt(s) : is(c, "L1NormOp") ? n / s : 1.0 / std::sqrt(s / n + 1e-5);
  double num = 0, den = 0;
  for (int64_t l = 0; l < n; ++l) {
    const double ref = host_float(x[l * step]) * scale * (w ? w[l] : 1.0);
    const double got = host_float(y[l * step]);
    if (std::isnan(got)) return INFINITY;
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  return std::sqrt(num / den);
}

template <typename T>
void run_case(const Case& c, Flush& flush, int rounds, int reps, uint64_t seed) {
  const int64_t n = c.outer * c.length * c.inner;
  const size_t bytes = size_t(n) * sizeof(T);
  bool scan = false;
  const int op = op_id(c.functor, &scan);
  if (op < 0) {
    std::fprintf(stderr, "%s: no family lists a functor %s\n", c.name, c.functor);
    std::exit(2);
  }
  for (int round = 0; round < rounds; ++round) {
    T *x, *y, *w = nullptr;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    fill<T><<<1056, 512>>>(x, n, seed + 17 * round, is(c, "ProdOp"));
    std::vector<float> hw;
    if (c.weight) {
      CHECK(cudaMalloc(&w, c.length * sizeof(T)));
      fill<T><<<64, 256>>>(w, c.length, seed + 5, false);
      std::vector<T> tw(c.length);
      CHECK(cudaMemcpy(tw.data(), w, c.length * sizeof(T), cudaMemcpyDeviceToHost));
      for (auto v : tw) hw.push_back(host_float(v));
    }
    poison<<<1056, 512>>>(reinterpret_cast<uint32_t*>(y), int64_t(bytes / 4));
    void* workspace = nullptr;
    const View v{c.outer, c.length, c.inner, c.length * c.inner, c.inner, 1, c.length * c.inner, c.inner, 1};
    const ScanArgs<T> sa{x, y, v, false, false};
    const ReduceScaleArgs<T> ra{x, y, w, nullptr, v, 1e-5};
    // The launches' scratch (the same size every call): allocated at the first call, kept.
    auto alloc = [&](size_t bytes) {
      if (!workspace) CHECK(cudaMalloc(&workspace, bytes));
      return workspace;
    };
    auto launch = [&] {
      cudaError_t err = cudaSuccess;
      if (scan) with_scan_op(op, [&](auto f) {
        // masked scans take a mask this tool does not make
        if constexpr (kMasked<decltype(f)>) err = cudaErrorNotSupported;
        else err = launch_scan<T, decltype(f)>(sa, 0, alloc);
      });
      else with_reduce_scale_op(op, [&](auto f) {
        // grouped ops (group_norm's) take a grouping this tool does not make
        if constexpr (decltype(f)::kGrouped) err = cudaErrorNotSupported;
        else err = launch_reduce_scale<T, decltype(f)>(ra, 0, alloc);
      });
      CHECK(err);
    };
    launch();  // the checked call: y was poisoned
    CHECK(cudaDeviceSynchronize());
    // Check first, middle and last lines, or all of a small case (and every element was written).
    double err = 0;
    std::vector<int64_t> outs{0, c.outer / 2, c.outer - 1}, ins{0, c.inner / 2, c.inner - 1};
    if (n <= (int64_t(1) << 24)) {  // small: every line
      outs.clear();
      for (int64_t o = 0; o < c.outer; ++o) outs.push_back(o);
    }
    for (auto* v : {&outs, &ins}) v->erase(std::unique(v->begin(), v->end()), v->end());
    std::vector<T> hx(c.length * c.inner), hy(c.length * c.inner);
    for (int64_t o : outs) {
      CHECK(cudaMemcpy(hx.data(), x + o * c.length * c.inner, hx.size() * sizeof(T), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hy.data(), y + o * c.length * c.inner, hy.size() * sizeof(T), cudaMemcpyDeviceToHost));
      for (int64_t i : ins)
        err = std::max(err, line_error(c, hx.data() + i, hy.data() + i, hw.empty() ? nullptr : hw.data(), c.inner));
    }
    const float ms = median_ms(launch, flush, reps);
    const float copy_ms = median_ms([&] { copy16<<<1056, 512>>>(reinterpret_cast<const uint4*>(x),
                                                               reinterpret_cast<uint4*>(y), int64_t(bytes / 16)); },
                                    flush, reps);
    const double tol = sizeof(T) == 2 ? 1e-2 : 1e-5;
    std::printf("%-28s r%d %8.4f ms %7.1f GB/s  copy %8.4f ms %7.1f GB/s  %5.1f%%  err %.1e %s\n", c.name, round, ms,
                2.0 * bytes / ms / 1e6, copy_ms, 2.0 * bytes / copy_ms / 1e6, 100.0 * copy_ms / ms, err,
                err <= tol ? "ok" : "FAIL");
    std::fflush(stdout);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    if (w) CHECK(cudaFree(w));
    if (workspace) CHECK(cudaFree(workspace));
  }
}

int main(int argc, char** argv) {
  int rounds = 2, reps = 10;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else only.push_back(argv[i]);
  }
  Flush flush;
  for (const Case& c : kCases) {
    if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& s) {
          return std::string(c.name).find(s) != std::string::npos;
        }))
      continue;
    if (c.dtype == DType::F32) run_case<float>(c, flush, rounds, reps, 1234);
    else run_case<__nv_bfloat16>(c, flush, rounds, reps, 1234);
  }
  return 0;
}
