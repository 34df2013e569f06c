// kiln's native guard check: a guard set's reads and checks as one C program (kiln.runtime.native_guards).
//
// A Program is built from two lists made in Python (kiln.graph.guards_native):
//   nodes:  (op, parent, arg)  op 0 = L, 1 = G, 2 = a constant (arg), 3 = getattr(parent, arg),
//           4 = parent[arg], 5 = parent.get(value of node arg)   (parents come before children)
//   checks: (kind, node, arg)  see the Kind enum; run in order, the first that fails ends the call.
// Calling it with (L, G) reads each node at most once, when a check first needs it, and answers True or
// False. Every check means exactly what its Python form in kiln.graph does (guards_codegen, guards_plan);
// a read that raises an Exception fails the check, as there. A tensor of a type other than torch.Tensor,
// nn.Parameter and nn.Buffer, or one with symbolic sizes, ends the call with None: the caller checks that
// call in Python (no Python code runs inside this loop but the reads' own).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace {

enum Op { OP_L = 0, OP_G = 1, OP_CONST = 2, OP_ATTR = 3, OP_ITEM = 4, OP_GET = 5 };
enum Kind { K_ID = 0, K_TYPE = 1, K_EQUALS = 2, K_LENGTH = 3, K_KEYS = 4, K_NONE = 5, K_NOT_NONE = 6,
            K_TENSOR = 7 };

constexpr int64_t kAny = INT64_MIN;  // a size or stride the guard leaves free (symbolic)

struct Node {
  int op;
  Py_ssize_t parent;
  PyObject* arg;  // owned: the attribute name, the key, or the constant
  Py_ssize_t key_node;  // OP_GET: the node whose value is the key
};

struct TensorWant {
  int scalar_type;
  int device_type;
  int device_index;  // -1: any index of device_type
  bool requires_grad;
  std::vector<int64_t> sizes, strides;  // kAny where free
};

constexpr int kAskPython = 2;  // a check's answer: this value is for the Python check to judge

struct Check {
  int kind;
  Py_ssize_t node;
  PyObject* arg;  // owned (K_TENSOR: unused)
  uintptr_t id;  // K_ID
  Py_ssize_t length;  // K_LENGTH
  int tensor;  // K_TENSOR: index into tensors
};

PyObject* g_cdata = nullptr;  // "_cdata": a tensor's TensorImpl address
PyObject* g_keys = nullptr;
PyObject* g_get = nullptr;
PyObject* g_getattribute = nullptr;  // "__getattribute__"
PyObject* g_getattr = nullptr;  // "__getattr__"
PyObject* g_object_getattribute = nullptr;  // object.__getattribute__
PyObject* g_dict_keys = nullptr;  // dict.keys
PyTypeObject* g_plain[3] = {nullptr, nullptr, nullptr};  // torch.Tensor, nn.Parameter, nn.Buffer
// Where a tensor object holds its TensorImpl pointer (torch's THPVariable: the head, then ``at::Tensor
// cdata``, or in older releases a ``c10::MaybeOwned<at::Tensor>`` whose pointer sits one word further), as
// ``calibrate`` found it on probe tensors; -1: read ``_cdata`` (a Python attribute, ~40 ns a tensor).
Py_ssize_t g_cdata_offset = -1;

struct Program {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::vector<Node>* nodes;
  std::vector<Check>* checks;
  std::vector<TensorWant>* tensors;
};

// A read's exception: False for an Exception (the guard fails), an error for anything else (a
// KeyboardInterrupt propagates, as through the Python check's ``except Exception``).
int failed_read() {
  if (PyErr_ExceptionMatches(PyExc_Exception)) {
    PyErr_Clear();
    return 0;
  }
  return -1;
}

// getattr(obj, name). A class that defines ``__getattr__`` in Python (nn.Module) reads every attribute
// through a slot that looks both methods up and calls them from Python; when its ``__getattribute__`` is
// object's, this does what that slot does without the detour: the generic lookup, then on AttributeError
// the class's ``__getattr__`` (a plain function) called with (obj, name).
PyObject* get_attr(PyObject* obj, PyObject* name) {
  PyTypeObject* tp = Py_TYPE(obj);
  if (tp->tp_getattro == PyObject_GenericGetAttr || _PyType_Lookup(tp, g_getattribute) != g_object_getattribute) {
    return PyObject_GetAttr(obj, name);
  }
  PyObject* got = PyObject_GenericGetAttr(obj, name);
  if (got != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return got;
  PyObject* hook = _PyType_Lookup(tp, g_getattr);
  if (hook == nullptr || !PyFunction_Check(hook)) {
    if (hook == nullptr) return nullptr;  // no __getattr__: the AttributeError stands
    PyErr_Clear();
    return PyObject_GetAttr(obj, name);
  }
  PyErr_Clear();
  PyObject* args[2] = {obj, name};
  return PyObject_Vectorcall(hook, args, 2, nullptr);
}

// The value of node i (borrowed from vals), reading it and its parents on first use; nullptr with an
// exception set when a read raised.
PyObject* value(const std::vector<Node>& nodes, std::vector<PyObject*>& vals, Py_ssize_t i) {
  if (vals[i] != nullptr) return vals[i];
  const Node& n = nodes[i];
  PyObject* parent = value(nodes, vals, n.parent);
  if (parent == nullptr) return nullptr;
  PyObject* got = nullptr;
  switch (n.op) {
    case OP_ATTR:
      got = get_attr(parent, n.arg);
      break;
    case OP_ITEM:
      got = PyObject_GetItem(parent, n.arg);
      break;
    case OP_GET: {
      PyObject* key = value(nodes, vals, n.key_node);
      if (key == nullptr) return nullptr;
      if (PyDict_CheckExact(parent)) {
        got = PyDict_GetItemWithError(parent, key);
        if (got == nullptr && PyErr_Occurred()) return nullptr;
        got = got == nullptr ? Py_None : got;
        Py_INCREF(got);
      } else {
        got = PyObject_CallMethodOneArg(parent, g_get, key);
      }
      break;
    }
    default:
      PyErr_SetString(PyExc_AssertionError, "kiln native guards: a root node without a value");
      return nullptr;
  }
  vals[i] = got;
  return got;
}

// ``type(v) is type(e) and bool(v == e)``, and item by item for tuples (kiln.graph's typed_equal):
// 1 equal, 0 not, -1 an exception.
int typed_equal(PyObject* v, PyObject* e) {
  if (Py_TYPE(v) != Py_TYPE(e)) return 0;
  PyObject* eq = PyObject_RichCompare(v, e, Py_EQ);
  if (eq == nullptr) return -1;
  int same = PyObject_IsTrue(eq);
  Py_DECREF(eq);
  if (same != 1 || !PyTuple_CheckExact(e)) return same;
  Py_ssize_t n = PyTuple_GET_SIZE(e);
  if (PyTuple_GET_SIZE(v) != n) return 0;
  for (Py_ssize_t k = 0; k < n; ++k) {
    int r = typed_equal(PyTuple_GET_ITEM(v, k), PyTuple_GET_ITEM(e, k));
    if (r != 1) return r;
  }
  return 1;
}

// ``list(v.keys()) == keys``: 1, 0 or -1. A dict, or a subclass that keeps dict's ``keys`` (an
// optimizer's ``state``, a defaultdict), lists its keys without calling into Python.
int keys_equal(PyObject* v, PyObject* keys) {
  PyObject* listed;
  if (PyDict_Check(v) && (PyDict_CheckExact(v) || _PyType_Lookup(Py_TYPE(v), g_keys) == g_dict_keys)) {
    if (PyDict_GET_SIZE(v) != PyList_GET_SIZE(keys)) return 0;
    listed = PyDict_Keys(v);
  } else {
    PyObject* view = PyObject_CallMethodNoArgs(v, g_keys);
    if (view == nullptr) return -1;
    listed = PySequence_List(view);
    Py_DECREF(view);
  }
  if (listed == nullptr) return -1;
  int r = PyObject_RichCompareBool(listed, keys, Py_EQ);
  Py_DECREF(listed);
  return r;
}

// TENSOR_MATCH: 1, 0, -1, or kAskPython (a tensor subclass, a non-tensor, symbolic sizes).
int tensor_matches(const TensorWant& w, PyObject* v) {
  PyTypeObject* t = Py_TYPE(v);
  if (t != g_plain[0] && t != g_plain[1] && t != g_plain[2]) return kAskPython;
  c10::TensorImpl* impl;
  if (g_cdata_offset >= 0) {
    impl = *reinterpret_cast<c10::TensorImpl**>(reinterpret_cast<char*>(v) + g_cdata_offset);
  } else {
    PyObject* cdata = PyObject_GetAttr(v, g_cdata);
    if (cdata == nullptr) return -1;
    impl = static_cast<c10::TensorImpl*>(PyLong_AsVoidPtr(cdata));
    Py_DECREF(cdata);
  }
  if (impl == nullptr) return PyErr_Occurred() ? -1 : 0;
  if (impl->has_symbolic_sizes_strides()) return kAskPython;
  if (static_cast<int>(impl->dtype().toScalarType()) != w.scalar_type) return 0;
  if (impl->requires_grad() != w.requires_grad) return 0;
  c10::Device dev = impl->device();
  if (static_cast<int>(dev.type()) != w.device_type) return 0;
  if (w.device_index >= 0 && dev.index() != w.device_index) return 0;
  c10::IntArrayRef sizes = impl->sizes();
  if (sizes.size() != w.sizes.size()) return 0;
  c10::IntArrayRef strides = impl->strides();
  for (size_t d = 0; d < w.sizes.size(); ++d) {
    if (w.sizes[d] != kAny && sizes[d] != w.sizes[d]) return 0;
    if (w.strides[d] != kAny && strides[d] != w.strides[d]) return 0;
  }
  return 1;
}

int run_check(Program* self, const Check& c, PyObject* v) {
  switch (c.kind) {
    case K_ID:
      return reinterpret_cast<uintptr_t>(v) == c.id;
    case K_TYPE:
      return reinterpret_cast<PyObject*>(Py_TYPE(v)) == c.arg;
    case K_EQUALS:
      return typed_equal(v, c.arg);
    case K_LENGTH: {
      Py_ssize_t n = PyObject_Length(v);
      return n < 0 ? -1 : n == c.length;
    }
    case K_KEYS:
      return keys_equal(v, c.arg);
    case K_NONE:
      return v == Py_None;
    case K_NOT_NONE:
      return v != Py_None;
    case K_TENSOR:
      try {
        return tensor_matches((*self->tensors)[c.tensor], v);
      } catch (const std::exception& e) {  // sizes of a tensor kind c10 cannot give: let Python check it
        return kAskPython;
      }
    default:
      PyErr_SetString(PyExc_AssertionError, "kiln native guards: unknown check kind");
      return -1;
  }
}

PyObject* program_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<Program*>(callable);
  if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != nullptr) {
    PyErr_SetString(PyExc_TypeError, "kiln native guards: a check takes (L, G)");
    return nullptr;
  }
  const std::vector<Node>& nodes = *self->nodes;
  std::vector<PyObject*> vals(nodes.size(), nullptr);  // owned for reads, borrowed for roots and constants
  vals[0] = args[0];
  vals[1] = args[1];
  for (size_t i = 2; i < nodes.size(); ++i) {
    if (nodes[i].op == OP_CONST) vals[i] = nodes[i].arg;
  }
  int ok = 1;
  for (const Check& c : *self->checks) {
    PyObject* v = value(nodes, vals, c.node);
    ok = v == nullptr ? failed_read() : run_check(self, c, v);
    if (ok == -1) ok = failed_read();
    if (ok != 1) break;  // (kAskPython too: the rest is the Python check's)
  }
  for (size_t i = 2; i < nodes.size(); ++i) {
    if (nodes[i].op != OP_CONST) Py_XDECREF(vals[i]);
  }
  if (ok == -1) return nullptr;
  if (ok == kAskPython) Py_RETURN_NONE;
  return PyBool_FromLong(ok);
}

void program_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<Program*>(obj);
  if (self->nodes) {
    for (Node& n : *self->nodes) Py_XDECREF(n.arg);
    delete self->nodes;
  }
  if (self->checks) {
    for (Check& c : *self->checks) Py_XDECREF(c.arg);
    delete self->checks;
  }
  delete self->tensors;
  Py_TYPE(obj)->tp_free(obj);
}

bool int_item(PyObject* tuple, Py_ssize_t k, long long* out) {
  *out = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, k));
  return !(*out == -1 && PyErr_Occurred());
}

// sizes/strides: a tuple of ints and Nones
bool dims(PyObject* seq, std::vector<int64_t>* out) {
  if (!PyTuple_Check(seq)) {
    PyErr_SetString(PyExc_TypeError, "kiln native guards: sizes and strides are tuples");
    return false;
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(seq); ++k) {
    PyObject* d = PyTuple_GET_ITEM(seq, k);
    if (d == Py_None) {
      out->push_back(kAny);
      continue;
    }
    long long n = PyLong_AsLongLong(d);
    if (n == -1 && PyErr_Occurred()) return false;
    out->push_back(n);
  }
  return true;
}

PyObject* program_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *nodes, *checks;
  if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &nodes, &PyList_Type, &checks)) return nullptr;
  auto* self = reinterpret_cast<Program*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = program_vectorcall;
  self->nodes = new std::vector<Node>();
  self->checks = new std::vector<Check>();
  self->tensors = new std::vector<TensorWant>();
  Py_ssize_t n_nodes = PyList_GET_SIZE(nodes);
  for (Py_ssize_t i = 0; i < n_nodes; ++i) {
    PyObject* row = PyList_GET_ITEM(nodes, i);
    long long op, parent;
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 3 || !int_item(row, 0, &op) || !int_item(row, 1, &parent)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "kiln native guards: a node is (op, parent, arg)");
      Py_DECREF(self);
      return nullptr;
    }
    bool bad = i < 2 ? op != i : (op != OP_CONST && op != OP_ATTR && op != OP_ITEM && op != OP_GET)
                                 || (op != OP_CONST && (parent < 0 || parent >= i));
    if (bad) {
      PyErr_Format(PyExc_ValueError, "kiln native guards: node %zd (op %lld, parent %lld) is out of order", i, op,
                   parent);
      Py_DECREF(self);
      return nullptr;
    }
    Node n{static_cast<int>(op), static_cast<Py_ssize_t>(parent), PyTuple_GET_ITEM(row, 2), -1};
    if (op == OP_GET) {
      long long key;
      if (!int_item(row, 2, &key) || key < 0 || key >= i) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "kiln native guards: node %zd's key is not read before it", i);
        Py_DECREF(self);
        return nullptr;
      }
      n.key_node = static_cast<Py_ssize_t>(key);
      n.arg = nullptr;
    } else if (op == OP_ATTR && !PyUnicode_Check(n.arg)) {
      PyErr_Format(PyExc_TypeError, "kiln native guards: node %zd reads an attribute whose name is not a str", i);
      Py_DECREF(self);
      return nullptr;
    }
    Py_XINCREF(n.arg);
    if (op == OP_L || op == OP_G) {
      Py_XDECREF(n.arg);
      n.arg = nullptr;
    }
    self->nodes->push_back(n);
  }
  if (n_nodes < 2) {
    PyErr_SetString(PyExc_ValueError, "kiln native guards: nodes 0 and 1 are L and G");
    Py_DECREF(self);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(checks); ++i) {
    PyObject* row = PyList_GET_ITEM(checks, i);
    long long kind, node;
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 3 || !int_item(row, 0, &kind) || !int_item(row, 1, &node)
        || kind < K_ID || kind > K_TENSOR || node < 0 || node >= n_nodes) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "kiln native guards: check %zd is not (kind, node, arg)", i);
      Py_DECREF(self);
      return nullptr;
    }
    PyObject* arg = PyTuple_GET_ITEM(row, 2);
    Check c{static_cast<int>(kind), static_cast<Py_ssize_t>(node), nullptr, 0, 0, -1};
    if (kind == K_ID) {
      c.id = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(arg));
    } else if (kind == K_LENGTH) {
      c.length = PyLong_AsSsize_t(arg);
    } else if (kind == K_TYPE && !PyType_Check(arg)) {
      PyErr_Format(PyExc_TypeError, "kiln native guards: check %zd's type is not a class", i);
    } else if (kind == K_KEYS && !PyList_CheckExact(arg)) {
      PyErr_Format(PyExc_TypeError, "kiln native guards: check %zd's keys are not a list", i);
    } else if (kind == K_TENSOR) {
      // (scalar type, device type, device index or -1, sizes, strides, requires_grad)
      TensorWant w{0, 0, -1, false, {}, {}};
      long long st, dt, di;
      if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 6) {
        PyErr_Format(PyExc_TypeError, "kiln native guards: check %zd's tensor is not a 6-tuple", i);
      } else if (int_item(arg, 0, &st) && int_item(arg, 1, &dt) && int_item(arg, 2, &di)
                 && dims(PyTuple_GET_ITEM(arg, 3), &w.sizes) && dims(PyTuple_GET_ITEM(arg, 4), &w.strides)) {
        if (w.sizes.size() != w.strides.size()) {
          PyErr_Format(PyExc_ValueError, "kiln native guards: check %zd has %zu sizes and %zu strides", i,
                       w.sizes.size(), w.strides.size());
        } else {
          w.scalar_type = static_cast<int>(st);
          w.device_type = static_cast<int>(dt);
          w.device_index = static_cast<int>(di);
          w.requires_grad = PyObject_IsTrue(PyTuple_GET_ITEM(arg, 5)) == 1;
          c.tensor = static_cast<int>(self->tensors->size());
          self->tensors->push_back(w);
        }
      }
    }
    if (PyErr_Occurred()) {
      Py_DECREF(self);
      return nullptr;
    }
    if (kind != K_TENSOR && kind != K_ID && kind != K_LENGTH) {
      c.arg = arg;
      Py_INCREF(arg);
    }
    self->checks->push_back(c);
  }
  return reinterpret_cast<PyObject*>(self);
}

PyTypeObject ProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// scalar_type(tensor) -> the int of its c10::ScalarType (the Python side maps torch dtypes with it)
PyObject* scalar_type(PyObject*, PyObject* t) {
  PyObject* cdata = PyObject_GetAttr(t, g_cdata);
  if (cdata == nullptr) return nullptr;
  auto* impl = static_cast<c10::TensorImpl*>(PyLong_AsVoidPtr(cdata));
  Py_DECREF(cdata);
  if (impl == nullptr) return nullptr;
  return PyLong_FromLong(static_cast<long>(impl->dtype().toScalarType()));
}

// device_type("cuda") -> the int of c10::DeviceType
PyObject* device_type(PyObject*, PyObject* name) {
  const char* text = PyUnicode_AsUTF8(name);
  if (text == nullptr) return nullptr;
  try {
    return PyLong_FromLong(static_cast<long>(c10::Device(std::string(text)).type()));
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_ValueError, "kiln native guards: %s is not a device: %s", text, e.what());
    return nullptr;
  }
}

// set_plain_types(torch.Tensor, nn.Parameter, nn.Buffer): the types read directly
PyObject* set_plain_types(PyObject*, PyObject* args) {
  PyObject *a, *b, *c;
  if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &a, &PyType_Type, &b, &PyType_Type, &c)) return nullptr;
  PyObject* types[3] = {a, b, c};
  for (int k = 0; k < 3; ++k) {
    Py_INCREF(types[k]);
    Py_XDECREF(reinterpret_cast<PyObject*>(g_plain[k]));
    g_plain[k] = reinterpret_cast<PyTypeObject*>(types[k]);
  }
  Py_RETURN_NONE;
}

// calibrate([tensors of the plain types]) -> the offset of the TensorImpl pointer in a tensor object, found
// where it equals ``_cdata`` for every probe, or -1 (and ``_cdata`` is read per check)
PyObject* calibrate(PyObject*, PyObject* probes) {
  if (!PyList_CheckExact(probes) || PyList_GET_SIZE(probes) < 3) {
    PyErr_SetString(PyExc_TypeError, "kiln native guards: calibrate takes a list of at least 3 tensors");
    return nullptr;
  }
  std::vector<void*> impls;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(probes); ++k) {
    PyObject* t = PyList_GET_ITEM(probes, k);
    PyTypeObject* tp = Py_TYPE(t);
    if (tp != g_plain[0] && tp != g_plain[1] && tp != g_plain[2]) {
      PyErr_SetString(PyExc_TypeError, "kiln native guards: calibrate's probes are plain tensors (set_plain_types first)");
      return nullptr;
    }
    PyObject* cdata = PyObject_GetAttr(t, g_cdata);
    if (cdata == nullptr) return nullptr;
    impls.push_back(PyLong_AsVoidPtr(cdata));
    Py_DECREF(cdata);
    if (PyErr_Occurred()) return nullptr;
  }
  g_cdata_offset = -1;
  for (Py_ssize_t offset : {static_cast<Py_ssize_t>(sizeof(PyObject)), static_cast<Py_ssize_t>(sizeof(PyObject) + sizeof(void*))}) {
    bool all = true;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(probes) && all; ++k) {
      char* obj = reinterpret_cast<char*>(PyList_GET_ITEM(probes, k));
      all = *reinterpret_cast<void**>(obj + offset) == impls[k];
    }
    if (all) {
      g_cdata_offset = offset;
      break;
    }
  }
  return PyLong_FromSsize_t(g_cdata_offset);
}

// written_overlap(values, (positions...), (written...), fixed=0) -> whether a written tensor shares memory
// with another tensor (their bytes in one StorageImpl overlap; strided views that interleave count as
// overlapping): ``values[positions[k]]`` are the tensors, written are indices into positions, and the first
// ``fixed`` positions are pinned tensors whose sharing among themselves is not asked. None when one is not a
// plain tensor with storage (the caller asks Python). kiln.capture's aliasing check of input tensors
// (aliasing.py's ``overlap``, the same sweep over spans sorted by storage and first byte).
PyObject* written_overlap(PyObject*, PyObject* args) {
  PyObject* values;
  PyObject* positions;
  PyObject* written;
  Py_ssize_t fixed = 0;
  if (!PyArg_ParseTuple(args, "O!O!O!|n", &PyList_Type, &values, &PyTuple_Type, &positions, &PyTuple_Type, &written,
                        &fixed))
    return nullptr;
  struct Span {
    int64_t start;
    int64_t end;
    bool written;
    bool loose;  // not one of the first ``fixed``
  };
  const Py_ssize_t n = PyTuple_GET_SIZE(positions);
  std::vector<c10::TensorImpl*> impls(static_cast<size_t>(n), nullptr);
  for (Py_ssize_t k = 0; k < n; ++k) {
    const Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, k));
    if (at < 0 || at >= PyList_GET_SIZE(values)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "kiln native guards: position out of range");
      return nullptr;
    }
    PyObject* v = PyList_GET_ITEM(values, at);
    PyTypeObject* t = Py_TYPE(v);
    if ((t != g_plain[0] && t != g_plain[1] && t != g_plain[2]) || g_cdata_offset < 0) Py_RETURN_NONE;
    c10::TensorImpl* impl = *reinterpret_cast<c10::TensorImpl**>(reinterpret_cast<char*>(v) + g_cdata_offset);
    if (impl == nullptr || !impl->has_storage() || impl->has_symbolic_sizes_strides()) Py_RETURN_NONE;
    impls[static_cast<size_t>(k)] = impl;
  }
  std::vector<char> written_at(static_cast<size_t>(n), 0);
  for (Py_ssize_t w = 0; w < PyTuple_GET_SIZE(written); ++w) {
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(written, w));
    if (i < 0 || i >= n) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "kiln native guards: written index out of range");
      return nullptr;
    }
    written_at[static_cast<size_t>(i)] = 1;
  }
  // tensors by storage (pointers sorted: the usual call has no storage twice and stops there); the bytes
  // of each are compared only within a storage that several tensors hold
  std::vector<std::pair<const void*, Py_ssize_t>> by_storage;
  by_storage.reserve(static_cast<size_t>(n));
  for (Py_ssize_t k = 0; k < n; ++k) {
    c10::TensorImpl* impl = impls[static_cast<size_t>(k)];
    if (impl->numel() > 0) by_storage.emplace_back(impl->unsafe_storage().unsafeGetStorageImpl(), k);
  }
  std::sort(by_storage.begin(), by_storage.end(), [](const auto& a, const auto& b) {
    return std::less<const void*>()(a.first, b.first);
  });
  std::vector<Span> spans;
  for (size_t r = 0; r < by_storage.size();) {
    size_t e = r + 1;
    while (e < by_storage.size() && by_storage[e].first == by_storage[r].first) ++e;
    if (e - r > 1) {
      spans.clear();
      for (size_t j = r; j < e; ++j) {
        const Py_ssize_t k = by_storage[j].second;
        c10::TensorImpl* impl = impls[static_cast<size_t>(k)];
        const int64_t item = static_cast<int64_t>(impl->dtype().itemsize());
        int64_t last = 0;
        const auto sizes = impl->sizes();
        const auto strides = impl->strides();
        for (size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * (strides[d] < 0 ? -strides[d] : strides[d]);
        const int64_t start = impl->storage_offset() * item;
        spans.push_back(Span{start, start + (last + 1) * item, written_at[static_cast<size_t>(k)] != 0, k >= fixed});
      }
      std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
      // a pair overlaps when one is written and not both are pinned; spans still reaching past each start
      std::vector<const Span*> active;
      for (const Span& sp : spans) {
        size_t kept = 0;
        for (const Span* o : active)
          if (o->end > sp.start) active[kept++] = o;
        active.resize(kept);
        for (const Span* o : active)
          if ((o->written || sp.written) && (o->loose || sp.loose)) Py_RETURN_TRUE;
        active.push_back(&sp);
      }
    }
    r = e;
  }
  Py_RETURN_FALSE;
}

// data_ptrs(values, out, skip) -> True once ``out`` (a writable buffer of len(values) uint64s) holds each
// value's ``Tensor.data_ptr()``, 0 where ``skip`` (bytes, one per value, or None) is nonzero; None when a value
// is not a plain tensor with an initialised storage (the caller reads them in Python). kiln.runtime's C++
// wrapper call hands its library the inputs' pointers with it (~10 ns a tensor against ~70 in Python).
PyObject* data_ptrs(PyObject*, PyObject* args) {
  PyObject* values;
  Py_buffer out;
  PyObject* skip;
  if (!PyArg_ParseTuple(args, "O!w*O", &PyList_Type, &values, &out, &skip)) return nullptr;
  const Py_ssize_t n = PyList_GET_SIZE(values);
  const char* skipped = nullptr;
  if (skip != Py_None) {
    if (!PyBytes_Check(skip) || PyBytes_GET_SIZE(skip) != n) {
      PyBuffer_Release(&out);
      PyErr_SetString(PyExc_ValueError, "kiln native guards: data_ptrs' skip is bytes, one per value");
      return nullptr;
    }
    skipped = PyBytes_AS_STRING(skip);
  }
  if (out.len != n * static_cast<Py_ssize_t>(sizeof(uint64_t))) {
    PyBuffer_Release(&out);
    PyErr_SetString(PyExc_ValueError, "kiln native guards: data_ptrs' out holds one uint64 per value");
    return nullptr;
  }
  auto* dst = static_cast<uint64_t*>(out.buf);
  PyObject* answer = g_cdata_offset >= 0 ? Py_True : Py_None;
  for (Py_ssize_t k = 0; k < n && answer == Py_True; ++k) {
    if (skipped != nullptr && skipped[k]) {
      dst[k] = 0;
      continue;
    }
    PyObject* v = PyList_GET_ITEM(values, k);
    PyTypeObject* t = Py_TYPE(v);
    if (t != g_plain[0] && t != g_plain[1] && t != g_plain[2]) {
      answer = Py_None;
      break;
    }
    c10::TensorImpl* impl = *reinterpret_cast<c10::TensorImpl**>(reinterpret_cast<char*>(v) + g_cdata_offset);
    if (impl == nullptr || !impl->has_storage() || !impl->dtype_initialized()) {
      answer = Py_None;
      break;
    }
    try {
      dst[k] = reinterpret_cast<uintptr_t>(impl->mutable_data());  // what Tensor.data_ptr() answers
    } catch (const std::exception&) {
      answer = Py_None;
    }
  }
  PyBuffer_Release(&out);
  Py_INCREF(answer);
  return answer;
}

PyMethodDef methods[] = {
    {"calibrate", calibrate, METH_O, "find where tensor objects hold their TensorImpl pointer"},
    {"written_overlap", written_overlap, METH_VARARGS, "whether a written tensor shares storage with another"},
    {"scalar_type", scalar_type, METH_O, "the c10::ScalarType of a tensor, as an int"},
    {"device_type", device_type, METH_O, "the c10::DeviceType of a device string, as an int"},
    {"set_plain_types", set_plain_types, METH_VARARGS, "the tensor types checked without Python"},
    {"data_ptrs", data_ptrs, METH_VARARGS, "the data pointers of a list of tensors, into a uint64 buffer"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "kiln_native_guards", "kiln's native guard check", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_kiln_native_guards() {
  ProgramType.tp_name = "kiln_native_guards.Program";
  ProgramType.tp_basicsize = sizeof(Program);
  ProgramType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  ProgramType.tp_vectorcall_offset = offsetof(Program, vectorcall);
  ProgramType.tp_call = PyVectorcall_Call;
  ProgramType.tp_new = program_new;
  ProgramType.tp_dealloc = program_dealloc;
  ProgramType.tp_doc = "Program(nodes, checks): a guard set's check, called with (L, G)";
  if (PyType_Ready(&ProgramType) < 0) return nullptr;
  g_cdata = PyUnicode_InternFromString("_cdata");
  g_keys = PyUnicode_InternFromString("keys");
  g_get = PyUnicode_InternFromString("get");
  g_getattribute = PyUnicode_InternFromString("__getattribute__");
  g_getattr = PyUnicode_InternFromString("__getattr__");
  // what _PyType_Lookup finds for classes that inherit them (not through tp_dict: from Python 3.12 a
  // static builtin type's tp_dict is NULL, its dict kept per interpreter)
  g_object_getattribute = _PyType_Lookup(&PyBaseObject_Type, g_getattribute);
  g_dict_keys = _PyType_Lookup(&PyDict_Type, g_keys);
  if (g_object_getattribute == nullptr || g_dict_keys == nullptr) {
    PyErr_SetString(PyExc_ImportError, "kiln native guards: object.__getattribute__ or dict.keys not found");
    return nullptr;
  }
  Py_INCREF(g_object_getattribute);
  Py_INCREF(g_dict_keys);
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&ProgramType);
  if (PyModule_AddObject(m, "Program", reinterpret_cast<PyObject*>(&ProgramType)) < 0) {
    Py_DECREF(&ProgramType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
