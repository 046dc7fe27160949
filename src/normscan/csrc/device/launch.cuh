// Host side: per-device facts, and grid launches with or without a thread-block cluster.
#pragma once

#include "types.cuh"

namespace normscan {

constexpr int kMaxDevices = 64;

// Per-device facts the launchers need, read once per device.
struct DeviceInfo {
  int sms = 0;
  int major = 0;
  int smem_optin = 0;      // shared memory a block can have, opted in
  int smem_sm = 0;         // a SM's, its blocks' and their reserves together
  double dram_per_sm = 0;  // peak DRAM bytes a second a SM: memory clock x 2 x bus width / SMs (0: not reported)
  int64_t l2_bytes = 0;
};

// Devices whose DRAM feeds a SM more than this at peak need more independent bytes in flight
// a SM to stream at their copy rate: an H100 SXM 25.4e9 (2619 MHz, 5120 bits), an H200 36.4e9
// (3201 MHz, 6016 bits as it reports them). The configurations the two measure best apart
// ask this (tuning.cuh).
constexpr double kFastDramPerSm = 30e9;
inline bool fast_dram(const DeviceInfo& d) { return d.dram_per_sm > kFastDramPerSm; }

inline cudaError_t device_info(DeviceInfo* out) {
  static DeviceInfo cache[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  DeviceInfo& d = cache[dev];
  if (d.sms == 0) {
    err = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&d.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    if (err != cudaSuccess) return err;
    int clock_khz = 0, bus_bits = 0, sms = 0;
    err = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    d.dram_per_sm = sms > 0 ? 1e3 * clock_khz * 2 * (bus_bits / 8.0) / sms : 0;
    int l2 = 0;
    err = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
    if (err != cudaSuccess) return err;
    d.l2_bytes = l2;
    d.sms = sms;  // last: a nonzero sms marks the entry read
  }
  *out = d;
  return cudaSuccess;
}

// Blocks of `kernel` that fit on the whole device at once: the size of a persistent grid.
template <typename Kernel>
inline cudaError_t resident_blocks(Kernel kernel, int threads, size_t smem, int64_t* out) {
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (err != cudaSuccess) return err;
  *out = static_cast<int64_t>(per_sm > 0 ? per_sm : 1) * d.sms;
  return cudaSuccess;
}

// How a grid covers its work units (each unit is one cluster of blocks; kernels loop over
// units with a grid stride, so both cover any count):
//   PerUnit: one cluster per unit, up to the grid limit; the hardware starts a unit as soon
//            as one finishes (faster than Persistent on row and scan kernels: docs/design-notes.md).
//   Persistent: no more clusters than are resident at once; for kernels that fetch their
//            next unit while working on this one.
//   Cooperative: Persistent, launched cooperatively (every block resident at once, or the
//            launch fails): for kernels whose blocks wait for each other.
enum class Grid { PerUnit, Persistent, Cooperative };

// A launch of `threads` threads a block, `smem` bytes of dynamic shared memory and
// clusters of `cluster` blocks, or cooperative; attr is its storage for the attributes (two).
// early: the kernel's blocks may start before the kernel before it in the stream has ended
// (programmatic dependent launch, sm_90): it calls wait_for_prior_grid() before reading
// anything that kernel wrote.
inline cudaLaunchConfig_t launch_config(dim3 threads, int cluster, size_t smem, cudaStream_t stream,
                                        cudaLaunchAttribute* attr, bool cooperative = false, bool early = false) {
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = threads;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  if (cluster > 1) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[cfg.numAttrs].val.clusterDim.x = cluster;
    attr[cfg.numAttrs].val.clusterDim.y = 1;
    attr[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  } else if (cooperative) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeCooperative;
    attr[cfg.numAttrs].val.cooperative = 1;
    ++cfg.numAttrs;
  }
  if (early) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++cfg.numAttrs;
  }
  return cfg;
}

// Clusters of `cluster` blocks of `kernel` resident on the device at once (0: such a cluster
// cannot run at all, as where a block asks more shared memory than the device gives),
// measured once per kernel, device and cluster size.
template <auto kernel>
inline cudaError_t resident_units(dim3 threads, int cluster, size_t smem, int64_t* out) {
  static int64_t resident[kMaxDevices][kMaxCluster + 1] = {};  // count + 1; 0 = not measured yet
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices || cluster < 1 || cluster > kMaxCluster) return cudaErrorInvalidValue;
  int64_t& fit = resident[dev][cluster];
  if (fit == 0) {
    // Above 48 KB, static and dynamic together, a kernel must opt in, once per device.
    cudaFuncAttributes attrs;
    err = cudaFuncGetAttributes(&attrs, kernel);
    if (err != cudaSuccess) return err;
    DeviceInfo d;
    err = device_info(&d);
    if (err != cudaSuccess) return err;
    if (smem + attrs.sharedSizeBytes > static_cast<size_t>(d.smem_optin)) {
      fit = 1;  // no block of it can run here
    } else {
      if (smem + attrs.sharedSizeBytes > 48 * 1024) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        if (err != cudaSuccess) return err;
      }
      if (cluster > kMaxPortableCluster) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (err != cudaSuccess) return err;
      }
      int64_t n = 0;
      if (cluster == 1) {
        err = resident_blocks(kernel, static_cast<int>(threads.x * threads.y * threads.z), smem, &n);
      } else {
        cudaLaunchAttribute attr[2];
        cudaLaunchConfig_t cfg = launch_config(threads, cluster, smem, nullptr, attr);
        cfg.gridDim = dim3(cluster, 1, 1);
        int c = 0;
        err = cudaOccupancyMaxActiveClusters(&c, kernel, &cfg);
        n = c;
      }
      if (err != cudaSuccess) return err;
      fit = n + 1;
    }
  }
  *out = fit - 1;
  return cudaSuccess;
}

// The clusters a grid of `units` units launches.
template <auto kernel>
inline cudaError_t grid_units(Grid grid, dim3 threads, int cluster, int64_t units, size_t smem, int64_t* out) {
  int64_t fit = 0;
  const cudaError_t err = resident_units<kernel>(threads, cluster, smem, &fit);
  if (err != cudaSuccess) return err;
  *out = min64(units, grid != Grid::PerUnit ? (fit > 0 ? fit : 1) : 0x7fffffff / cluster);
  return cudaSuccess;
}

// Launch `kernel` with `threads` threads per block and `smem` bytes of dynamic shared
// memory (fixed per kernel) over `units` units of `cluster` blocks; early: see launch_config.
template <auto kernel, typename... Args>
inline cudaError_t launch_units_as(Grid grid, bool early, dim3 threads, int cluster, int64_t units, size_t smem,
                                   cudaStream_t stream, const Args&... args) {
  int64_t launched = 0;
  cudaError_t err = grid_units<kernel>(grid, threads, cluster, units, smem, &launched);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg = launch_config(threads, cluster, smem, stream, attr, grid == Grid::Cooperative, early);
  cfg.gridDim = dim3(static_cast<unsigned>(launched * cluster), 1, 1);
  err = cudaLaunchKernelEx(&cfg, kernel, args...);
  // A launch refused for its configuration also leaves the error for the next check to
  // find: take it, so that only this call reports it.
  const cudaError_t last = cudaGetLastError();
  return err != cudaSuccess ? err : last;
}
template <auto kernel, typename... Args>
inline cudaError_t launch_units(Grid grid, dim3 threads, int cluster, int64_t units, size_t smem, cudaStream_t stream,
                                const Args&... args) {
  return launch_units_as<kernel>(grid, false, threads, cluster, units, smem, stream, args...);
}

}  // namespace normscan
