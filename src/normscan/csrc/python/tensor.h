// The bindings' tensors, without torch: a torch tensor read through the DLPack exchange API
// (dlpack.h), or one allocated by torch's allocator through it; their checks' errors; the
// current device and stream. Host code, compiled into each extension's CPython module
// (module.h), which sets the exchange API when it is imported.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "dlpack.h"

namespace normscan {
namespace {  // each extension's own (its module's exchange API), as module.h's definitions

// torch's exchange API (torch.Tensor.__dlpack_c_exchange_api__), set by the module's import.
const DLPackExchangeAPI* exchange_api = nullptr;

}  // namespace

// A check that failed: the entry raises RuntimeError with this message.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A Python exception is set already (an exchange API function failed): the entry raises it.
struct PythonError {};

// Numbers go through std::to_string (docs/design-notes.md, "Numbers in check messages").
inline std::string num(int64_t v) { return std::to_string(v); }

// Raises Error with the message's parts (strings) joined where the condition is false.
#define NORMSCAN_CHECK(cond, ...)                                                      \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::string normscan_message_;                                                   \
      for (const std::string& part : std::initializer_list<std::string>{__VA_ARGS__}) { \
        normscan_message_ += part;                                                     \
      }                                                                                \
      throw ::normscan::Error(normscan_message_);                                      \
    }                                                                                  \
  } while (false)

// The element types the bindings tell apart (torch's of the same names).
enum class ScalarType : uint8_t { Float, Double, Half, BFloat16, Bool, Byte, Float8_e4m3fn, Float8_e5m2, Other };
inline constexpr ScalarType kFloat = ScalarType::Float, kDouble = ScalarType::Double, kHalf = ScalarType::Half,
                            kBFloat16 = ScalarType::BFloat16, kBool = ScalarType::Bool, kByte = ScalarType::Byte,
                            kFloat8_e4m3fn = ScalarType::Float8_e4m3fn, kFloat8_e5m2 = ScalarType::Float8_e5m2;

inline ScalarType scalar_type_of(DLDataType t) {
  if (t.lanes != 1) return ScalarType::Other;
  switch (t.code) {
    case kDLFloat: return t.bits == 32 ? kFloat : t.bits == 64 ? kDouble : t.bits == 16 ? kHalf : ScalarType::Other;
    case kDLBfloat: return t.bits == 16 ? kBFloat16 : ScalarType::Other;
    case kDLBool: return t.bits == 8 ? kBool : ScalarType::Other;
    case kDLUInt: return t.bits == 8 ? kByte : ScalarType::Other;
    case kDLFloat8_e4m3fn: return t.bits == 8 ? kFloat8_e4m3fn : ScalarType::Other;
    case kDLFloat8_e5m2: return t.bits == 8 ? kFloat8_e5m2 : ScalarType::Other;
    default: return ScalarType::Other;
  }
}

inline DLDataType dl_type_of(ScalarType t) {
  switch (t) {
    case kFloat: return {kDLFloat, 32, 1};
    case kDouble: return {kDLFloat, 64, 1};
    case kHalf: return {kDLFloat, 16, 1};
    case kBFloat16: return {kDLBfloat, 16, 1};
    case kBool: return {kDLBool, 8, 1};
    case kByte: return {kDLUInt, 8, 1};
    case kFloat8_e4m3fn: return {kDLFloat8_e4m3fn, 8, 1};
    case kFloat8_e5m2: return {kDLFloat8_e5m2, 8, 1};
    default: throw Error("normscan: no DLPack type for this dtype");
  }
}

struct Device {
  int32_t type, index;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Integers given as a Python sequence (a view's fields, a grouping), or a tensor's shape.
class IntList {
 public:
  IntList() = default;
  IntList(const int64_t* data, size_t size) : data_(data), size_(size) {}
  const int64_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t operator[](size_t i) const { return data_[i]; }
  bool operator==(const IntList& o) const {
    if (size_ != o.size_) return false;
    for (size_t i = 0; i < size_; ++i) {
      if (data_[i] != o.data_[i]) return false;
    }
    return true;
  }

 private:
  const int64_t* data_ = nullptr;
  size_t size_ = 0;
};

// A tensor as the bindings see it: a torch tensor given by the caller (borrowed for the call:
// its description lives in the caller's object), or one allocated here (empty()), returned to
// Python or released with its last copy.
class Tensor {
 public:
  Tensor() = default;
  Tensor(const DLTensor& t, PyObject* given) : t_(t), given_(given) {}

  bool defined() const { return t_.data != nullptr || given_ != nullptr || owned_ != nullptr; }
  ScalarType scalar_type() const { return scalar_type_of(t_.dtype); }
  int64_t dim() const { return t_.ndim; }
  int64_t size(int64_t d) const { return t_.shape[d]; }
  int64_t stride(int64_t d) const { return t_.strides ? t_.strides[d] : compact_stride(d); }
  IntList sizes() const { return {t_.shape, static_cast<size_t>(t_.ndim)}; }
  Device device() const { return {t_.device.device_type, t_.device.device_id}; }
  bool is_cuda() const { return t_.device.device_type == kDLCUDA; }
  int64_t element_size() const { return t_.dtype.bits / 8; }
  int64_t numel() const {
    int64_t n = 1;
    for (int32_t d = 0; d < t_.ndim; ++d) n *= t_.shape[d];
    return n;
  }
  // torch's is_contiguous: strides of size-1 dims do not matter.
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int32_t d = t_.ndim - 1; d >= 0; --d) {
      if (t_.shape[d] == 0) return true;
      if (t_.shape[d] != 1 && stride(d) != expected) return false;
      expected *= t_.shape[d];
    }
    return true;
  }
  // The elements' extent in memory from the first: the largest offset any index reaches
  // (strides are never negative in torch).
  int64_t last_offset() const {
    int64_t last = 0;
    for (int32_t d = 0; d < t_.ndim; ++d) {
      if (t_.shape[d] == 0) return -1;
      last += (t_.shape[d] - 1) * stride(d);
    }
    return last;
  }
  void* data_ptr() const { return static_cast<char*>(t_.data) + t_.byte_offset; }
  const void* const_data_ptr() const { return data_ptr(); }
  void* mutable_data_ptr() const { return data_ptr(); }

  // A new reference to the tensor as a torch tensor (None where undefined).
  PyObject* to_python() const;
  // A new tensor of `shape` and `type` on `device`, from torch's allocator.
  static Tensor empty(std::initializer_list<int64_t> shape, ScalarType type, Device device) {
    return empty(IntList(shape.begin(), shape.size()), type, device);
  }
  static Tensor empty(IntList shape, ScalarType type, Device device);

 private:
  // An allocated tensor's owner: the DLPack tensor until it goes to Python, then the object.
  struct Owned {
    DLManagedTensorVersioned* managed = nullptr;
    PyObject* object = nullptr;
    ~Owned() {
      if (managed != nullptr) managed->deleter(managed);
      Py_XDECREF(object);
    }
  };
  int64_t compact_stride(int64_t d) const {
    int64_t s = 1;
    for (int32_t i = t_.ndim - 1; i > d; --i) s *= t_.shape[i];
    return s;
  }

  DLTensor t_{};
  PyObject* given_ = nullptr;  // borrowed: the caller's argument
  std::shared_ptr<Owned> owned_;
};

inline PyObject* Tensor::to_python() const {
  if (given_ != nullptr) {
    Py_INCREF(given_);
    return given_;
  }
  if (owned_ == nullptr) Py_RETURN_NONE;
  if (owned_->object == nullptr) {
    void* object = nullptr;
    if (exchange_api->managed_tensor_to_py_object_no_sync(owned_->managed, &object) != 0) throw PythonError{};
    owned_->managed = nullptr;  // the object owns it now
    owned_->object = static_cast<PyObject*>(object);
  }
  Py_INCREF(owned_->object);
  return owned_->object;
}

inline Tensor Tensor::empty(IntList shape, ScalarType type, Device device) {
  // The allocator reads the prototype's shape, never writes it.
  DLTensor prototype{nullptr, {device.type, device.index}, static_cast<int32_t>(shape.size()), dl_type_of(type),
                     const_cast<int64_t*>(shape.data()), nullptr, 0};
  std::string message;
  const auto set_error = [](void* ctx, const char* kind, const char* text) {
    *static_cast<std::string*>(ctx) = std::string(kind) + ": " + text;
  };
  DLManagedTensorVersioned* managed = nullptr;
  if (exchange_api->managed_tensor_allocator(&prototype, &managed, &message, set_error) != 0 || managed == nullptr) {
    if (PyErr_Occurred()) throw PythonError{};
    throw Error("normscan: allocating a tensor failed: " + message);
  }
  Tensor t(managed->dl_tensor, nullptr);
  t.owned_ = std::make_shared<Owned>();
  t.owned_->managed = managed;
  return t;
}

inline void check_cuda(cudaError_t err, const char* what) {
  NORMSCAN_CHECK(err == cudaSuccess, "normscan: ", what, " failed: ", cudaGetErrorString(err));
}

// The device of `d` current for a scope (as torch's CUDAGuard).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device d) {
    check_cuda(cudaGetDevice(&previous_), "reading the current device");
    if (d.index != previous_) {
      check_cuda(cudaSetDevice(d.index), "setting the device");
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// torch's current stream on the device (torch.cuda.current_stream(device)).
inline cudaStream_t current_stream(Device d) {
  void* stream = nullptr;
  if (exchange_api->current_work_stream(kDLCUDA, d.index, &stream) != 0) throw PythonError{};
  return static_cast<cudaStream_t>(stream);
}

}  // namespace normscan
