// Host side: per-device facts, and grid launches with or without a thread-block cluster.
#pragma once

#include "types.cuh"

namespace normscan {

// Per-device facts the launchers need, read once per device.
struct DeviceInfo {
  int sms = 0;
  int major = 0;
};

inline cudaError_t device_info(DeviceInfo* out) {
  constexpr int kMaxDevices = 64;
  static DeviceInfo cache[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  DeviceInfo& d = cache[dev];
  if (d.sms == 0) {
    err = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
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
//            as one finishes (2-6% faster than Persistent on row and scan kernels: NOTES.md).
//   Persistent: no more clusters than are resident at once; for kernels that fetch their
//            next unit while working on this one.
enum class Grid { PerUnit, Persistent };

// Launch `kernel` with `threads` threads per block and `smem` bytes of dynamic shared
// memory (fixed per kernel) over `units` units of `cluster` blocks. Residency is measured
// once per kernel, device and cluster size.
template <auto kernel, typename... Args>
inline cudaError_t launch_units(Grid grid, dim3 threads, int cluster, int64_t units, size_t smem, cudaStream_t stream,
                                const Args&... args) {
  constexpr int kMaxDevices = 64;
  constexpr int kMaxCluster = 8;
  // Resident clusters per device and cluster size; 0 = not measured yet.
  static int64_t resident[kMaxDevices][kMaxCluster + 1] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices || cluster < 1 || cluster > kMaxCluster) return cudaErrorInvalidValue;
  const int nthreads = static_cast<int>(threads.x * threads.y * threads.z);

  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.blockDim = threads;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  if (cluster > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  int64_t& fit = resident[dev][cluster];
  if (fit == 0) {
    if (smem > 48 * 1024) {  // above the default limit a kernel must opt in, once per device
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
    }
    int64_t n = 0;
    if (cluster == 1) {
      err = resident_blocks(kernel, nthreads, smem, &n);
    } else {
      int c = 0;
      cfg.gridDim = dim3(cluster, 1, 1);
      err = cudaOccupancyMaxActiveClusters(&c, kernel, &cfg);
      n = c;
    }
    if (err != cudaSuccess) return err;
    fit = n > 0 ? n : 1;
  }
  const int64_t grid_units = min64(units, grid == Grid::Persistent ? fit : 0x7fffffff / cluster);
  cfg.gridDim = dim3(static_cast<unsigned>(grid_units * cluster), 1, 1);
  err = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace normscan
