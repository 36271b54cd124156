// StoreError as a Python exception, by code (store/errors.h):
//   OutOfRange -> IndexError, NotFound -> KeyError, InvalidArgument and Corrupt -> ValueError,
//   Io -> OSError, Full -> StoreFullError (a MemoryError and a RuntimeError), Unavailable ->
//   ConnectionError, PermissionDenied -> PermissionError, Protocol -> RuntimeError.
#include "python/store_errors.h"

#include <string>

#include "store/errors.h"

namespace py = pybind11;

namespace recdev::python {

using store::ErrorCode;
using store::StoreError;

namespace {

// Set once by bind_store_errors; kept for the life of the process like the module that owns it.
PyObject* store_full_error = nullptr;

void translate_store_error(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const StoreError& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.code()) {
      case ErrorCode::OutOfRange: type = PyExc_IndexError; break;
      case ErrorCode::NotFound: type = PyExc_KeyError; break;
      case ErrorCode::InvalidArgument:
      case ErrorCode::Corrupt: type = PyExc_ValueError; break;
      case ErrorCode::Io: type = PyExc_OSError; break;
      case ErrorCode::Full: type = store_full_error != nullptr ? store_full_error : PyExc_MemoryError; break;
      case ErrorCode::Unavailable: type = PyExc_ConnectionError; break;
      case ErrorCode::PermissionDenied:
      case ErrorCode::ReadOnly: type = PyExc_PermissionError; break;
      case ErrorCode::Protocol: break;  // RuntimeError: the two sides disagree on the protocol
    }
    // "replace": a message quoting a damaged file's table name may not be valid UTF-8.
    const std::string message = e.what();
    PyObject* text = PyUnicode_DecodeUTF8(message.data(), py::ssize_t(message.size()), "replace");
    PyErr_SetObject(type, text);
    Py_XDECREF(text);
  }
}

}  // namespace

void bind_store_errors(py::module_& m, ErrorScope scope) {
  const std::string name = py::str(m.attr("__name__")).cast<std::string>() + ".StoreFullError";
  store_full_error = PyErr_NewException(
      name.c_str(), py::make_tuple(py::handle(PyExc_MemoryError), py::handle(PyExc_RuntimeError)).ptr(), nullptr);
  if (store_full_error == nullptr) throw py::error_already_set();
  m.attr("StoreFullError") = py::handle(store_full_error);
  if (scope == ErrorScope::Local) {
    py::register_local_exception_translator(&translate_store_error);
  } else {
    py::register_exception_translator(&translate_store_error);
  }
}

}  // namespace recdev::python
