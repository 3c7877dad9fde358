// qlink_torch: the Python package's torch side in C. A batch of N leaves costs one call
// here instead of several Python attribute reads, an allocation or view and a DLTensor
// per leaf, and a prepared plan's replay reads the current streams without entering
// Python. Tensors are read and made through PyTorch's stable C shim (torch_shim.h).
//
// A CPython extension on the limited API: one build loads into every CPython from 3.10
// on. The package keeps its plain-Python path where this module or the shim is missing
// (older PyTorch, free-threaded CPython).
//
// Handles come from torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors, a new reference
// each; every call releases the handles it takes or makes before it returns, except
// those it hands back to PyTorch as new tensors.

#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "plugin_api/qlink.h"
#include "python/bridge/torch_shim.h"

namespace qlink {
namespace bridge {
namespace {

using CopyBatch = qlink_status (*)(qlink_context*, const qlink_copy_args*);
// copy_plan_execute and all_reduce_plan_execute alike: (plan, streams, count), the plan an
// opaque pointer.
using ExecutePlan = qlink_status (*)(void*, const qlink_stream*, size_t);

// torch._C._aoti's conversions, set by bind() with the shim (calls run under the GIL:
// the limited API has no free-threaded build).
PyObject* to_handles = nullptr;    // unsafe_alloc_void_ptrs_from_tensors
PyObject* from_handles = nullptr;  // alloc_tensors_by_stealing_from_void_ptrs

constexpr int64_t kAlign = 256;    // bytes: leaves sharing one allocation start on this boundary
constexpr int64_t kOwn = 8 << 20;  // bytes from which a moved leaf gets an allocation of its own:
                                   // it copies for longer than allocating takes, and frees alone

bool Bound() {
  if (to_handles != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "qlink_torch: bind() was not called");
  return false;
}

// Appends the handles of the tensors in `tensors` (a sequence); false with a Python error
// (TypeError for a leaf that is not a tensor).
bool TakeHandles(PyObject* tensors, Handles* out) {
  PyObject* capsules = PyObject_CallFunctionObjArgs(to_handles, tensors, nullptr);
  if (capsules == nullptr) return false;
  const Py_ssize_t n = PyList_Size(capsules);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* capsule = PyList_GetItem(capsules, i);  // borrowed
    out->Add(PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule)));
  }
  Py_DECREF(capsules);
  return !PyErr_Occurred();
}

// The handles at `which` as new tensors, in that order; their ownership passes to PyTorch
// (should its conversion fail, they are lost with it: nothing here could free them twice).
PyObject* GiveTensors(Handles* handles, const std::vector<size_t>& which) {
  PyObject* capsules = PyList_New(static_cast<Py_ssize_t>(which.size()));
  if (capsules == nullptr) return nullptr;
  for (size_t k = 0; k < which.size(); ++k) {
    PyObject* capsule = PyCapsule_New((*handles)[which[k]], nullptr, nullptr);
    if (capsule == nullptr) {
      Py_DECREF(capsules);
      return nullptr;
    }
    PyList_SetItem(capsules, static_cast<Py_ssize_t>(k), capsule);  // steals
  }
  for (size_t i : which) handles->Release(i);
  PyObject* tensors = PyObject_CallFunctionObjArgs(from_handles, capsules, nullptr);
  Py_DECREF(capsules);
  return tensors;
}

// PyTorch's current stream of each device, as qlink_stream entries.
bool CurrentStreams(DLDeviceType type, const std::vector<int32_t>& devices, std::vector<qlink_stream>* out) {
  if (shim().get_current_cuda_stream == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "qlink_torch: this PyTorch has no GPU streams");
    return false;
  }
  out->resize(devices.size());
  for (size_t k = 0; k < devices.size(); ++k) {
    (*out)[k].device = DLDevice{type, devices[k]};
    if (shim().get_current_cuda_stream(devices[k], &(*out)[k].stream)) {
      PyErr_Format(PyExc_RuntimeError, "qlink_torch: no current stream for device %d", devices[k]);
      return false;
    }
  }
  return true;
}

// A contiguous run of bytes on a device: one side of a leaf's copy.
struct Bytes {
  uint64_t data;
  int64_t nbytes;
  int32_t device;
};

// Where copy() and move() hand their leaves: the plugin's copy_batch (its address), the
// context and its device type, their first three arguments.
struct Plugin {
  CopyBatch copy_batch;
  qlink_context* ctx;
  DLDeviceType type;
};

bool ParsePlugin(PyObject* const* args, Plugin* out) {
  out->copy_batch = reinterpret_cast<CopyBatch>(PyLong_AsVoidPtr(args[0]));
  out->ctx = static_cast<qlink_context*>(PyLong_AsVoidPtr(args[1]));
  out->type = static_cast<DLDeviceType>(PyLong_AsLong(args[2]));
  return !PyErr_Occurred();
}

// copy_batch of src[i] -> dst[i] on the current streams of every device involved, with
// every join (as peer_copy_batch promises). False with a Python error if the streams
// cannot be read; otherwise *status is qlink's answer.
bool EnqueueCopy(const Plugin& plugin, const std::vector<Bytes>& src, const std::vector<Bytes>& dst,
                 qlink_status* status) {
  const DLDeviceType type = plugin.type;
  const size_t n = src.size();
  std::vector<int64_t> shapes(2 * n);
  std::vector<DLTensor> tensors(2 * n);
  std::vector<int32_t> devices;
  for (size_t i = 0; i < 2 * n; ++i) {
    const Bytes& b = i < n ? src[i] : dst[i - n];
    shapes[i] = b.nbytes;
    tensors[i] = DLTensor{reinterpret_cast<void*>(b.data),
                          DLDevice{type, b.device},
                          1,
                          DLDataType{kDLUInt, 8, 1},
                          &shapes[i],
                          nullptr,
                          0};
    if (std::find(devices.begin(), devices.end(), b.device) == devices.end()) devices.push_back(b.device);
  }
  std::vector<qlink_stream> streams;
  if (!CurrentStreams(type, devices, &streams)) return false;
  qlink_copy_args args{
      sizeof(qlink_copy_args), tensors.data(), tensors.data() + n, n, streams.data(), streams.size(), 0};
  Py_BEGIN_ALLOW_THREADS* status = plugin.copy_batch(plugin.ctx, &args);
  Py_END_ALLOW_THREADS return true;
}

// Indices of the leaves in `candidates` whose bytes overlap another candidate's (views
// of one storage): their tie is kept by the caller's regular path.
std::vector<bool> Overlapping(const std::vector<Leaf>& leaves, const std::vector<size_t>& candidates) {
  std::vector<size_t> order(candidates);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return leaves[a].data < leaves[b].data; });
  std::vector<bool> tied(leaves.size(), false);
  size_t cluster = 0;  // first of the current run of mutually overlapping leaves
  uint64_t end = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const Leaf& leaf = leaves[order[k]];
    if (k > 0 && leaf.data < end) {
      for (size_t j = cluster; j <= k; ++j) tied[order[j]] = true;
    } else {
      cluster = k;
    }
    end = std::max(end, leaf.data + static_cast<uint64_t>(leaf.nbytes));
  }
  return tied;
}

PyObject* Fail(PyObject* type, const char* message) {
  PyErr_SetString(type, message);
  return nullptr;
}

// bind(libtorch_cpu, libtorch_cuda or None, to_handles, from_handles)
PyObject* bind(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) return Fail(PyExc_TypeError, "bind(libtorch_cpu, libtorch_cuda, to_handles, from_handles)");
  if (to_handles != nullptr) Py_RETURN_NONE;
  const char* cpu = PyUnicode_AsUTF8AndSize(args[0], nullptr);
  const char* cuda = args[1] == Py_None ? nullptr : PyUnicode_AsUTF8AndSize(args[1], nullptr);
  if (cpu == nullptr || (args[1] != Py_None && cuda == nullptr)) return nullptr;
  std::string error;
  if (!BindShim(cpu, cuda, &error)) return PyErr_Format(PyExc_OSError, "qlink_torch: %s", error.c_str());
  Py_INCREF(args[2]);
  Py_INCREF(args[3]);
  to_handles = args[2];
  from_handles = args[3];
  Py_RETURN_NONE;
}

// has_streams() -> whether the current GPU streams can be read (libtorch_cuda's shim found)
PyObject* has_streams(PyObject*, PyObject*) {
  return PyBool_FromLong(to_handles != nullptr && shim().get_current_cuda_stream != nullptr);
}

// describe(tensors) -> bytes: one Leaf per tensor
PyObject* describe(PyObject*, PyObject* tensors) {
  if (!Bound()) return nullptr;
  Handles handles;
  if (!TakeHandles(tensors, &handles)) return nullptr;
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(handles.size() * sizeof(Leaf)));
  if (out == nullptr) return nullptr;
  auto* leaves = reinterpret_cast<Leaf*>(PyBytes_AsString(out));  // a new bytes object may be filled in place
  for (size_t i = 0; i < handles.size(); ++i) leaves[i] = Describe(handles[i]);
  return out;
}

// copy(copy_batch, context, device_type, sources, targets) -> status, or None when some
// leaf is not a contiguous GPU tensor (the caller's general path takes the batch then).
PyObject* copy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) return Fail(PyExc_TypeError, "copy(copy_batch, context, device_type, sources, targets)");
  Plugin plugin;
  Handles handles;
  if (!Bound() || !ParsePlugin(args, &plugin) || !TakeHandles(args[3], &handles)) return nullptr;
  const size_t n = handles.size();
  if (!TakeHandles(args[4], &handles)) return nullptr;
  if (handles.size() != 2 * n) return Fail(PyExc_ValueError, "copy: sources and targets differ in length");
  std::vector<Bytes> sides[2];
  for (size_t i = 0; i < 2 * n; ++i) {
    const Leaf leaf = Describe(handles[i]);
    if (leaf.device < 0 || !(leaf.flags & kContiguous)) Py_RETURN_NONE;
    sides[i / n].push_back(Bytes{leaf.data, leaf.nbytes, leaf.device});
  }
  qlink_status status = QLINK_OK;
  if (n > 0 && !EnqueueCopy(plugin, sides[0], sides[1], &status)) return nullptr;
  return PyLong_FromLong(status);
}

// move(copy_batch, context, device_type, tensors, target) -> (status, moved): moved[i] is
// tensors[i]'s copy on GPU `target`, tensors[i] itself if it is there already, or None
// for the leaves left to the caller (on the host, empty, not contiguous, or sharing
// bytes with another leaf). The copies share one new allocation, but for leaves of kOwn
// bytes and more, and all are made by one copy_batch on the current streams.
PyObject* move(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) return Fail(PyExc_TypeError, "move(copy_batch, context, device_type, tensors, target)");
  Plugin plugin;
  Handles handles;
  if (!Bound() || !ParsePlugin(args, &plugin)) return nullptr;
  const auto target = static_cast<int32_t>(PyLong_AsLong(args[4]));
  if (PyErr_Occurred() || !TakeHandles(args[3], &handles)) return nullptr;
  const size_t n = handles.size();
  std::vector<Leaf> leaves(n);
  std::vector<size_t> fast;
  for (size_t i = 0; i < n; ++i) {
    leaves[i] = Describe(handles[i]);
    const Leaf& l = leaves[i];
    if (l.device >= 0 && l.device != target && (l.flags & kContiguous) && l.nbytes > 0) fast.push_back(i);
  }
  const std::vector<bool> tied = Overlapping(leaves, fast);
  fast.erase(std::remove_if(fast.begin(), fast.end(), [&](size_t i) { return tied[i]; }), fast.end());

  const Shim& s = shim();
  std::vector<int64_t> offsets(n, -1);  // bytes into the shared allocation
  int64_t shared = 0;
  for (size_t i : fast) {
    if (leaves[i].nbytes >= kOwn) continue;
    offsets[i] = shared;
    shared += (leaves[i].nbytes + kAlign - 1) / kAlign * kAlign;
  }
  Handles pool;  // the shared allocation, while leaves are placed in it
  if (shared > 0) {
    const int64_t one = 1;
    Handle h = nullptr;
    if (s.empty_strided(1, &shared, &one, s.uint8, s.cuda, target, &h)) {
      return PyErr_Format(PyExc_MemoryError, "move: cannot allocate %lld bytes on device %d",
                          static_cast<long long>(shared), target);
    }
    pool.Add(h);
  }
  Handles made;  // made[i]: leaf i's copy, null for the leaves left to the caller
  for (size_t i = 0; i < n; ++i) made.Add(nullptr);
  std::vector<Bytes> src, dst;
  for (size_t i : fast) {
    const Handle leaf = handles[i];
    int32_t dtype = 0;
    int64_t dim = 0, *sizes = nullptr, *strides = nullptr;
    if (s.get_dtype(leaf, &dtype) || s.get_dim(leaf, &dim) || s.get_sizes(leaf, &sizes) ||
        s.get_strides(leaf, &strides)) {
      return PyErr_Format(PyExc_RuntimeError, "move: tensors[%zu] cannot be read", i);
    }
    // Laid out like the leaf (contiguous, so its strides are compact); filled by the copy
    // below before any later work on the target's stream can see it.
    Handle out = nullptr;
    const ShimError e = offsets[i] >= 0 ? s.alloc_from_pool(pool[0], offsets[i], dtype, dim, sizes, strides, &out)
                                        : s.empty_strided(dim, sizes, strides, dtype, s.cuda, target, &out);
    if (e != 0) {
      return PyErr_Format(PyExc_MemoryError, "move: no room for tensors[%zu] (%lld bytes) on device %d", i,
                          static_cast<long long>(leaves[i].nbytes), target);
    }
    made.Set(i, out);
    void* data = nullptr;
    if (s.get_data_ptr(out, &data)) {
      return PyErr_Format(PyExc_RuntimeError, "move: the copy of tensors[%zu] cannot be read", i);
    }
    src.push_back(Bytes{leaves[i].data, leaves[i].nbytes, leaves[i].device});
    dst.push_back(Bytes{reinterpret_cast<uint64_t>(data), leaves[i].nbytes, target});
  }
  qlink_status status = QLINK_OK;
  if (!fast.empty() && !EnqueueCopy(plugin, src, dst, &status)) return nullptr;
  if (status != QLINK_OK) return Py_BuildValue("(iO)", static_cast<int>(status), Py_None);
  PyObject* tensors = GiveTensors(&made, fast);
  if (tensors == nullptr) return nullptr;
  PyObject* moved = PyList_New(static_cast<Py_ssize_t>(n));
  if (moved == nullptr) {
    Py_DECREF(tensors);
    return nullptr;
  }
  for (size_t i = 0, k = 0; i < n; ++i) {
    PyObject* item;
    if (k < fast.size() && fast[k] == i) {
      item = PyList_GetItem(tensors, static_cast<Py_ssize_t>(k++));
      Py_INCREF(item);
    } else if (leaves[i].device == target) {
      item = PySequence_GetItem(args[3], static_cast<Py_ssize_t>(i));  // new reference
    } else {
      item = Py_None;
      Py_INCREF(item);
    }
    if (item == nullptr) {
      Py_DECREF(tensors);
      Py_DECREF(moved);
      return nullptr;
    }
    PyList_SetItem(moved, static_cast<Py_ssize_t>(i), item);  // steals
  }
  Py_DECREF(tensors);
  return Py_BuildValue("(iN)", static_cast<int>(QLINK_OK), moved);
}

// run(execute, plan, device_type, devices) -> status: a prepared plan replayed (qlink's
// copy_plan_execute or all_reduce_plan_execute at its address, `plan` one of its plans) on
// the current stream of each of `devices` (a tuple).
PyObject* run(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) return Fail(PyExc_TypeError, "run(execute, plan, device_type, devices)");
  if (!Bound()) return nullptr;
  auto execute = reinterpret_cast<ExecutePlan>(PyLong_AsVoidPtr(args[0]));
  void* plan = PyLong_AsVoidPtr(args[1]);
  const auto type = static_cast<DLDeviceType>(PyLong_AsLong(args[2]));
  const Py_ssize_t count = PyTuple_Size(args[3]);
  if (PyErr_Occurred()) return nullptr;
  std::vector<int32_t> devices(static_cast<size_t>(count));
  for (Py_ssize_t k = 0; k < count; ++k) devices[k] = static_cast<int32_t>(PyLong_AsLong(PyTuple_GetItem(args[3], k)));
  std::vector<qlink_stream> streams;
  if (PyErr_Occurred() || !CurrentStreams(type, devices, &streams)) return nullptr;
  qlink_status status;
  Py_BEGIN_ALLOW_THREADS status = execute(plan, streams.data(), streams.size());
  Py_END_ALLOW_THREADS return PyLong_FromLong(status);
}

template <typename F>
PyCFunction Fast(F f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

PyMethodDef kMethods[] = {
    {"bind", Fast(bind), METH_FASTCALL, "bind(libtorch_cpu, libtorch_cuda, to_handles, from_handles)"},
    {"has_streams", has_streams, METH_NOARGS, "whether the current GPU streams can be read"},
    {"describe", describe, METH_O, "describe(tensors) -> bytes: data, nbytes, device, flags per tensor"},
    {"copy", Fast(copy), METH_FASTCALL, "copy(copy_batch, context, device_type, sources, targets) -> status or None"},
    {"move", Fast(move), METH_FASTCALL, "move(copy_batch, context, device_type, tensors, target) -> (status, moved)"},
    {"run", Fast(run), METH_FASTCALL, "run(execute, plan, device_type, devices) -> status"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "qlink_torch", "qlink's torch side in C", -1, kMethods, nullptr, nullptr, nullptr, nullptr};

}  // namespace
}  // namespace bridge
}  // namespace qlink

PyMODINIT_FUNC PyInit_qlink_torch() { return PyModule_Create(&qlink::bridge::kModule); }
