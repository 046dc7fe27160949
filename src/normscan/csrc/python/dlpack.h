// The DLPack C ABI (dmlc/dlpack, version 1.x), the part the bindings use: a tensor's
// description (DLTensor), an owned one (DLManagedTensorVersioned), and the C exchange API a
// framework publishes on its tensor type as the capsule `__dlpack_c_exchange_api__` (DLPack
// 1.3; torch >= 2.10). Through it the bindings read torch tensors, allocate with torch's
// allocator and launch on torch's current stream without torch's headers or C++ ABI.
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };
struct DLDevice {
  int32_t device_type;  // DLDeviceType
  int32_t device_id;
};

enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12,
};
struct DLDataType {
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL: compact row-major
  uint64_t byte_offset;
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

// The exchange API's functions; each returns 0, or -1 with a Python exception set.
typedef int (*DLPackManagedTensorAllocator)(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
                                            void (*set_error)(void* error_ctx, const char* kind, const char* message));
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(void* py_object, DLManagedTensorVersioned** out);
typedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned* tensor, void** out_py_object);
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void* py_object, DLTensor* out);
typedef int (*DLPackCurrentWorkStream)(int32_t device_type, int32_t device_id, void** out_current_stream);

struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  DLPackExchangeAPIHeader* prev_api;
};

struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  DLPackManagedTensorAllocator managed_tensor_allocator;
  DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
  DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
  DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;  // may be NULL
  DLPackCurrentWorkStream current_work_stream;
};

}  // extern "C"
