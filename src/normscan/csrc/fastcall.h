// The fast path's entries (<family>_contiguous, csrc/entries.h) as CPython METH_FASTCALL
// functions: a pybind11 call took more host time than the entry itself (docs/design-notes.md,
// "Host time a call"). Host code, compiled with the module's definition
// (normscan/_build.py, module_source).
#pragma once

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

// Internal linkage (the unnamed namespace): each op's build is a module of its own, and g++
// makes a template's static member, such as Function<Entry>::def, one object across every
// module that defines it (STB_GNU_UNIQUE, even under RTLD_LOCAL): the second op's build then
// rebound the first one's def, and every op's fast path ran the first op's build.
namespace normscan::fastcall {
namespace {

inline bool type_error(PyObject* given, const char* expected) {
  PyErr_Format(PyExc_TypeError, "normscan: expected %s, got %s", expected, Py_TYPE(given)->tp_name);
  return false;
}

// A Python argument as an entry's parameter of type P, into `out` (std::decay_t<P>); false,
// with a TypeError set, where it is not of that type.
template <typename P> struct Arg;

template <> struct Arg<const at::Tensor&> {
  static bool from(PyObject* o, at::Tensor& out) {
    if (!THPVariable_Check(o)) return type_error(o, "a Tensor");
    out = THPVariable_Unpack(o);
    return true;
  }
};
template <> struct Arg<const std::optional<at::Tensor>&> {
  static bool from(PyObject* o, std::optional<at::Tensor>& out) {
    if (o != Py_None && !THPVariable_Check(o)) return type_error(o, "a Tensor or None");
    if (o != Py_None) out = THPVariable_Unpack(o);
    return true;
  }
};
template <> struct Arg<int64_t> {
  static bool from(PyObject* o, int64_t& out) {
    if (!PyLong_Check(o) || PyBool_Check(o)) return type_error(o, "an int");
    out = PyLong_AsLongLong(o);
    return !(out == -1 && PyErr_Occurred());  // an OverflowError where it does not fit
  }
};
template <> struct Arg<bool> {
  static bool from(PyObject* o, bool& out) {
    if (!PyBool_Check(o)) return type_error(o, "a bool");
    out = o == Py_True;
    return true;
  }
};
template <> struct Arg<std::optional<double>> {
  static bool from(PyObject* o, std::optional<double>& out) {
    if (o != Py_None && !PyFloat_Check(o)) return type_error(o, "a float or None");
    if (o != Py_None) out = PyFloat_AS_DOUBLE(o);
    return true;
  }
};

template <auto Entry> struct Function;

// An entry std::optional<at::Tensor> f(A...): called with exactly sizeof...(A) positional
// arguments; returns the tensor, or None where the entry declined the call.
template <typename... A, std::optional<at::Tensor> (*Entry)(A...)> struct Function<Entry> {
  static PyObject* call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
    HANDLE_TH_ERRORS
    if (nargs != static_cast<Py_ssize_t>(sizeof...(A))) {
      PyErr_Format(PyExc_TypeError, "normscan: %s takes %d positional arguments, got %zd", def.ml_name,
                   static_cast<int>(sizeof...(A)), nargs);
      return nullptr;
    }
    return convert_and_call(args, std::index_sequence_for<A...>{});
    END_HANDLE_TH_ERRORS
  }

  template <size_t... I> static PyObject* convert_and_call(PyObject* const* args, std::index_sequence<I...>) {
    std::tuple<std::decay_t<A>...> values;
    if (!(Arg<A>::from(args[I], std::get<I>(values)) && ...)) return nullptr;  // the first wrong one's error
    std::optional<at::Tensor> y = Entry(std::get<I>(values)...);
    if (!y) Py_RETURN_NONE;
    return THPVariable_Wrap(std::move(*y));
  }

  static inline PyMethodDef def = {nullptr, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call)),
                                   METH_FASTCALL, nullptr};
};

// Adds Entry to the module under `name` (a string literal: CPython keeps the pointer).
template <auto Entry> void add(pybind11::module_& m, const char* name) {
  PyMethodDef& def = Function<Entry>::def;
  def.ml_name = name;
  def.ml_doc = name;
  PyObject* f = PyCFunction_NewEx(&def, nullptr, m.attr("__name__").ptr());
  if (f == nullptr) throw pybind11::error_already_set();
  m.add_object(name, pybind11::reinterpret_steal<pybind11::object>(f));
}

}  // namespace
}  // namespace normscan::fastcall
