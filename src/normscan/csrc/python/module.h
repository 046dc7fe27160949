// Each extension's CPython module: its entries (csrc/entries.h) as METH_FASTCALL functions of
// CPython's stable ABI (Py_LIMITED_API: one build serves every Python from 3.10), taking torch
// tensors through the DLPack exchange API (tensor.h). No torch header: one build serves every
// torch that has the exchange API. normscan/_build.py's module_source lists the entries.
#pragma once

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor.h"

// The module's name and its PyInit function's, from the macro NORMSCAN_MODULE (_build.py's -D).
#define NORMSCAN_CONCAT_(a, b) a##b
#define NORMSCAN_CONCAT(a, b) NORMSCAN_CONCAT_(a, b)
#define NORMSCAN_STRINGIFY_(x) #x
#define NORMSCAN_STRINGIFY(x) NORMSCAN_STRINGIFY_(x)

namespace normscan::module {
namespace {  // internal linkage: each op's build is a module of its own, with the same C++ names

PyObject* tensor_type = nullptr;     // torch.Tensor
PyObject* parameter_type = nullptr;  // torch.nn.Parameter
PyObject* grad_enabled = nullptr;    // torch.is_grad_enabled
PyObject* any_autocast = nullptr;    // torch._C._is_any_autocast_enabled
PyObject* requires_grad = nullptr;   // the attribute's name

bool type_error(PyObject* given, const char* expected) {
  PyObject* type = PyObject_Type(given);
  PyObject* name = type ? PyObject_GetAttrString(type, "__name__") : nullptr;
  PyErr_Format(PyExc_TypeError, "normscan: expected %s, got %S", expected, name ? name : Py_None);
  Py_XDECREF(name);
  Py_XDECREF(type);
  return false;
}

// A torch tensor argument, read for the call (the DLTensor the caller's object describes).
struct TensorArg {
  Tensor tensor;
  DLManagedTensorVersioned* managed = nullptr;  // where torch gives no borrowed description
  TensorArg() = default;
  TensorArg(const TensorArg&) = delete;
  TensorArg& operator=(const TensorArg&) = delete;
  ~TensorArg() {
    if (managed != nullptr) managed->deleter(managed);
  }
  bool from(PyObject* o) {
    const int is_tensor = PyObject_IsInstance(o, tensor_type);
    if (is_tensor != 1) return is_tensor == 0 ? type_error(o, "a Tensor") : false;
    DLTensor t;
    if (exchange_api->dltensor_from_py_object_no_sync != nullptr) {
      if (exchange_api->dltensor_from_py_object_no_sync(o, &t) != 0) return false;
    } else {
      if (exchange_api->managed_tensor_from_py_object_no_sync(o, &managed) != 0) return false;
      t = managed->dl_tensor;
    }
    tensor = Tensor(t, o);
    return true;
  }
};

// A Python argument as an entry's parameter of type P: `from` converts it into the holder
// (false, with a TypeError set, where it is not of that type); `get` gives the parameter.
template <typename P> struct Arg;

template <> struct Arg<const Tensor&> {
  TensorArg held;
  bool from(PyObject* o) { return held.from(o); }
  const Tensor& get() { return held.tensor; }
};
template <> struct Arg<Tensor&> {
  TensorArg held;
  bool from(PyObject* o) { return held.from(o); }
  Tensor& get() { return held.tensor; }
};
template <> struct Arg<const std::optional<Tensor>&> {
  TensorArg held;
  std::optional<Tensor> value;
  bool from(PyObject* o) {
    if (o == Py_None) return true;
    if (!held.from(o)) return false;
    value = held.tensor;
    return true;
  }
  const std::optional<Tensor>& get() { return value; }
};
template <> struct Arg<int64_t> {
  int64_t value = 0;
  bool from(PyObject* o) {
    if (!PyLong_Check(o) || PyBool_Check(o)) return type_error(o, "an int");
    value = PyLong_AsLongLong(o);
    return !(value == -1 && PyErr_Occurred());  // an OverflowError where it does not fit
  }
  int64_t get() { return value; }
};
template <> struct Arg<bool> {
  bool value = false;
  bool from(PyObject* o) {
    if (!PyBool_Check(o)) return type_error(o, "a bool");
    value = o == Py_True;
    return true;
  }
  bool get() { return value; }
};
template <> struct Arg<double> {
  double value = 0;
  bool from(PyObject* o) {
    if (!(PyFloat_Check(o) || (PyLong_Check(o) && !PyBool_Check(o)))) return type_error(o, "a float");
    value = PyFloat_AsDouble(o);
    return !(value == -1.0 && PyErr_Occurred());
  }
  double get() { return value; }
};
template <> struct Arg<std::optional<double>> {
  std::optional<double> value;
  bool from(PyObject* o) {
    if (o == Py_None) return true;
    if (!PyFloat_Check(o)) return type_error(o, "a float or None");
    value = PyFloat_AsDouble(o);
    return true;
  }
  std::optional<double> get() { return value; }
};
template <> struct Arg<IntList> {
  std::vector<int64_t> values;
  bool from(PyObject* o) {
    if (!PyTuple_Check(o) && !PyList_Check(o)) return type_error(o, "a tuple or list of ints");
    const Py_ssize_t n = PySequence_Size(o);
    values.resize(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PySequence_GetItem(o, i);  // a new reference
      const bool ok = item != nullptr && PyLong_Check(item) && !PyBool_Check(item);
      if (ok) values[i] = PyLong_AsLongLong(item);
      Py_XDECREF(item);
      if (!ok) return item == nullptr ? false : type_error(o, "a tuple or list of ints");
      if (values[i] == -1 && PyErr_Occurred()) return false;
    }
    return true;
  }
  IntList get() { return {values.data(), values.size()}; }
};

// An entry's result as a new Python reference.
inline PyObject* result(bool v) { return PyBool_FromLong(v); }
inline PyObject* result(const Tensor& t) { return t.to_python(); }
inline PyObject* result(const std::optional<Tensor>& t) {
  if (!t) Py_RETURN_NONE;
  return t->to_python();
}
inline PyObject* result(const std::vector<Tensor>& ts) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(ts.size()));
  for (size_t i = 0; list != nullptr && i < ts.size(); ++i) PyList_SetItem(list, i, ts[i].to_python());
  return list;
}
template <typename... R> PyObject* result(const std::tuple<R...>& t) {
  PyObject* tuple = PyTuple_New(sizeof...(R));
  Py_ssize_t i = 0;
  bool ok = tuple != nullptr;
  const auto put = [&](PyObject* item) {  // steals item
    if (!ok || item == nullptr) {
      Py_XDECREF(item);
      ok = false;
      return;
    }
    PyTuple_SetItem(tuple, i++, item);
  };
  std::apply([&](const auto&... v) { (put(result(v)), ...); }, t);
  if (!ok) Py_CLEAR(tuple);
  return tuple;
}

// A torch flag (a function of no arguments returning a bool): 1, 0, or -1 with an error set.
int flag(PyObject* function) {
  PyObject* r = PyObject_CallNoArgs(function);
  if (r == nullptr) return -1;
  const int set = r == Py_True;
  Py_DECREF(r);
  return set;
}

// The fast path's condition on a call (normscan/registry.py): each tensor argument a
// torch.Tensor or Parameter of no other subclass (a DTensor's or torch.compile's tensors take
// the checked path), no gradient wanted of any, autocast off on every device.
bool plain_call(PyObject* const* args, Py_ssize_t nargs) {
  int grad = -1;  // torch.is_grad_enabled(), read at the first tensor
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* o = args[i];
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
    if (type == tensor_type || type == parameter_type) {
      if (grad < 0 && (grad = flag(grad_enabled)) < 0) return false;
      if (grad == 1) {
        PyObject* wanted = PyObject_GetAttr(o, requires_grad);
        if (wanted == nullptr) return false;
        Py_DECREF(wanted);
        if (wanted == Py_True) return false;
      }
    } else if (PyType_IsSubtype(Py_TYPE(o), reinterpret_cast<PyTypeObject*>(tensor_type))) {
      return false;
    }
  }
  return flag(any_autocast) == 0;
}

// f()'s result, or nullptr with the C++ exception f threw raised in Python.
template <typename F> PyObject* raising(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (const PythonError&) {  // set already
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

template <auto Entry> struct Function;

template <typename R, typename... A, R (*Entry)(A...)> struct Function<Entry> {
  static const char* name;

  // An argument not of its parameter's type raises TypeError.
  static PyObject* call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != static_cast<Py_ssize_t>(sizeof...(A))) {
      PyErr_Format(PyExc_TypeError, "normscan: %s takes %d positional arguments, got %zd", name,
                   static_cast<int>(sizeof...(A)), nargs);
      return nullptr;
    }
    return raising([&] { return convert_and_call<false>(args, std::index_sequence_for<A...>{}); });
  }

  // A fast-path entry's: None (the caller then takes the checked path, which says what is
  // wrong) where the call is not plain_call's case or an argument not of its parameter's type.
  static PyObject* call_fast(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != static_cast<Py_ssize_t>(sizeof...(A))) return call(module, args, nargs);
    if (!plain_call(args, nargs)) {
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    return raising([&] { return convert_and_call<true>(args, std::index_sequence_for<A...>{}); });
  }

  template <bool Lenient, size_t... I>
  static PyObject* convert_and_call(PyObject* const* args, std::index_sequence<I...>) {
    std::tuple<Arg<A>...> held;
    if (!(std::get<I>(held).from(args[I]) && ...)) {  // the first wrong one's error
      if constexpr (!Lenient) return nullptr;
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    if constexpr (std::is_void_v<R>) {
      Entry(std::get<I>(held).get()...);
      Py_RETURN_NONE;
    } else {
      return result(Entry(std::get<I>(held).get()...));
    }
  }
};
template <typename R, typename... A, R (*Entry)(A...)> const char* Function<Entry>::name = nullptr;

// The method table's row of an entry, named `name` (a string literal: CPython keeps it); a
// fast-path entry's (`fast`) gives None where the call is not its case.
template <auto Entry> PyMethodDef method(const char* name, bool fast = false) {
  using FastcallFunction = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t);  // METH_FASTCALL's
  Function<Entry>::name = name;
  const FastcallFunction call = fast ? &Function<Entry>::call_fast : &Function<Entry>::call;
  return {name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call)), METH_FASTCALL, name};
}

// torch's exchange API, from torch.Tensor: the capsule __dlpack_c_exchange_api__ (torch >=
// 2.11), or __c_dlpack_exchange_api__ (torch 2.10: an int or a capsule). False, with an
// ImportError set, where torch has neither.
bool find_exchange_api() {
  PyObject* torch = PyImport_ImportModule("torch");
  if (torch == nullptr) return false;
  tensor_type = PyObject_GetAttrString(torch, "Tensor");
  PyObject* version = PyObject_GetAttrString(torch, "__version__");
  Py_DECREF(torch);
  if (tensor_type == nullptr || version == nullptr) {
    Py_XDECREF(version);
    return false;
  }
  const void* api = nullptr;
  for (const char* attr : {"__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__"}) {
    PyObject* found = PyObject_GetAttrString(tensor_type, attr);
    if (found == nullptr) {
      PyErr_Clear();
      continue;
    }
    if (PyLong_Check(found)) {
      api = PyLong_AsVoidPtr(found);
    } else if (PyCapsule_CheckExact(found)) {
      api = PyCapsule_GetPointer(found, PyCapsule_GetName(found));
    }
    Py_DECREF(found);
    if (api != nullptr || PyErr_Occurred()) break;
  }
  if (api == nullptr || static_cast<const DLPackExchangeAPI*>(api)->header.version.major != 1) {
    PyErr_Clear();
    PyErr_Format(PyExc_ImportError,
                 "normscan: the CUDA kernels take torch tensors through DLPack's C exchange API "
                 "(torch.Tensor.__dlpack_c_exchange_api__, version 1), which torch %S lacks: install torch >= 2.10",
                 version);
    Py_DECREF(version);
    return false;
  }
  Py_DECREF(version);
  exchange_api = static_cast<const DLPackExchangeAPI*>(api);
  return true;
}

// What plain_call reads of torch.
bool find_torch_state() {
  PyObject* nn = PyImport_ImportModule("torch.nn");
  PyObject* c = PyImport_ImportModule("torch._C");
  if (nn != nullptr && c != nullptr) {
    parameter_type = PyObject_GetAttrString(nn, "Parameter");
    grad_enabled = PyObject_GetAttrString(c, "is_grad_enabled");
    any_autocast = PyObject_GetAttrString(c, "_is_any_autocast_enabled");
    requires_grad = PyUnicode_InternFromString("requires_grad");
  }
  Py_XDECREF(nn);
  Py_XDECREF(c);
  return parameter_type != nullptr && grad_enabled != nullptr && any_autocast != nullptr && requires_grad != nullptr;
}

// The module `def` describes, with torch's exchange API and state found: its PyInit function's body.
PyObject* create(PyModuleDef* def) {
  static bool found = false;
  if (!found && !(found = find_exchange_api() && find_torch_state())) return nullptr;
  return PyModule_Create(def);
}

}  // namespace
}  // namespace normscan::module
