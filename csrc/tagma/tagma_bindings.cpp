// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// vllm._tagma_C: the tagma engine for Python, on the limited API 3.11 (one
// *.abi3.so for every CPython from 3.11 on). Pure C++: no torch, no CUDA.
//
// The module's Python equivalent (types and signatures; see _tagma_C.pyi):
//
//   class FreeRuns:
//       def __init__(self, num_blocks: int, alignment: int = 1): ...
//       def add(self, ids, /) -> None: ...          # ints or a uint32/int32/
//       def remove(self, ids, /) -> None: ...       # int64 buffer
//       def add_range(self, start, length, /) -> None: ...
//       def remove_range(self, start, length, /) -> None: ...
//       def take_after(self, block, n, /) -> int: ...
//       def take(self, n, max_ranges=256, /) -> list[tuple[int, int]]: ...
//       def runs(self) -> list[tuple[int, int]]: ...
//       def validate(self) -> bool: ...
//       num_free, largest_run, num_runs, num_blocks, alignment: int
//       def __contains__(self, block) -> bool: ...
//
//   class KVAllocator:
//       def __init__(self, num_blocks, alignment=1, max_ranges=256): ...
//       def allocate(self, req, count, /) -> None: ...
//       def grow(self, req, count, /) -> None: ...
//       def release(self, req, /) -> None: ...
//       def acquire_cached(self, req, keys, n=None, /) -> None: ...
//       def cache(self, req, first, keys, /) -> None: ...
//       def lookup(self, keys, /) -> int: ...
//       def evict(self, n, /) -> int: ...
//       def reset_cache(self) -> None: ...
//       def ranges(self, req, /) -> list[tuple[int, int, int]]: ...
//       def ranges_bytes(self, req, /) -> bytes: ...   # uint32 triples
//       def blocks(self, req, /) -> list[int]: ...
//       def request_blocks(self, req, /) -> int: ...
//       def physical_block(self, req, logical, /) -> int: ...
//       def stats(self) -> dict[str, int]: ...
//       def validate(self) -> bool: ...
//       num_blocks, alignment, max_ranges, num_requests: int
//       def __contains__(self, req) -> bool: ...
//
//   class KVCoordMap:
//       def __init__(self, num_layers, num_blocks, tokens_per_block,
//                    bytes_per_token): ...
//       def offset(self, layer, block, token, /) -> int: ...
//       def coord(self, offset, /) -> tuple[int, int, int, int]: ...
//       num_layers, num_blocks, tokens_per_block, bytes_per_token,
//       total_bytes: int
//
// Errors: out of memory -> MemoryError; unknown request, cache miss ->
// KeyError; anything else the caller got wrong -> ValueError (a wrong type
// -> TypeError; an int argument is an int or has __index__, as numpy's
// ints). Messages name the method, its arguments and the numbers, values
// as the caller passed them. `x in obj` raises nothing of its own: a
// non-int, or an int out of range, is not a member.
// A failing call leaves the object as it was. No C++ exception crosses into
// Python: std::bad_alloc becomes MemoryError.
//
// The hot methods are METH_FASTCALL with positional arguments only. The
// objects hold no Python references (no GC); the GIL guards them.

// Pinned: CPython 3.11's stable ABI (Py_buffer, METH_FASTCALL, heap types
// from a module). A build that asks for another one fails here.
#if defined(Py_LIMITED_API) && Py_LIMITED_API != 0x030B0000
  #error \
      "_tagma_C is built for the limited API 3.11 (Py_LIMITED_API 0x030B0000)"
#endif
#ifndef Py_LIMITED_API
  #define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv_allocator.h"
#include "kv_coord_map.h"
#include "kv_free_runs.h"

namespace {

using tagma::Status;

// ------------------------------------------------------------- helpers

struct ModuleState {
  PyObject* free_runs_type;
  PyObject* allocator_type;
  PyObject* coord_map_type;
};

template <class T>
PyCFunction fast(T* fn) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn));
}

// Runs f() (which returns a new reference or nullptr with an exception set);
// a C++ exception becomes a Python one.
template <class F>
PyObject* guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

bool check_nargs(const char* where, Py_ssize_t nargs, Py_ssize_t lo,
                 Py_ssize_t hi) {
  if (nargs >= lo && nargs <= hi) return true;
  if (lo == hi) {
    PyErr_Format(PyExc_TypeError,
                 "%s takes %zd positional arguments (%zd given)", where, lo,
                 nargs);
  } else {
    PyErr_Format(PyExc_TypeError,
                 "%s takes %zd to %zd positional arguments (%zd given)", where,
                 lo, hi, nargs);
  }
  return false;
}

// An int (or an object with __index__) as int64; false with TypeError or
// ValueError (does not fit) set.
bool to_i64(PyObject* o, const char* where, const char* name, int64_t* out) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0) {
    PyErr_Format(PyExc_ValueError, "%s: %s=%R does not fit in int64", where,
                 name, o);
    return false;
  }
  if (v == -1 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %R", where,
                   name, reinterpret_cast<PyObject*>(Py_TYPE(o)));
    }
    return false;
  }
  *out = static_cast<int64_t>(v);
  return true;
}

// o as an exact int: o itself, or what its __index__ gives (numpy ints);
// a new reference, or nullptr with TypeError "<where>: <name> must be an
// int, not <type>" (an error raised by __index__ itself is kept).
PyObject* as_int(PyObject* o, const char* where, const char* name) {
  if (!PyIndex_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %R", where, name,
                 reinterpret_cast<PyObject*>(Py_TYPE(o)));
    return nullptr;
  }
  return PyNumber_Index(o);
}

// An exact int as uint64; false, with no error set, if it is not in
// [0, 2**64).
bool int_to_u64(PyObject* i, uint64_t* out) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
  if (overflow == 0) {
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  if (overflow < 0) return false;
  // Above int64: maybe still a uint64.
  const unsigned long long u = PyLong_AsUnsignedLongLong(i);
  if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = static_cast<uint64_t>(u);
  return true;
}

// An int (or an object with __index__) in [0, 2**64); false with TypeError,
// or ValueError "<where>: <name>=<the value passed> out of range: <range>".
bool to_u64(PyObject* o, const char* where, const char* name, const char* range,
            uint64_t* out) {
  PyObject* i = as_int(o, where, name);
  if (i == nullptr) return false;
  const bool ok = int_to_u64(i, out);
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "%s: %s=%R out of range: %s", where, name, i,
                 range);
  }
  Py_DECREF(i);
  return ok;
}

// A request id: an int in [0, 2**64).
bool to_req(PyObject* o, const char* where, uint64_t* out) {
  return to_u64(o, where, "req", "request ids are in [0, 2**64)", out);
}

// A tuple of k ints.
template <class T>
PyObject* int_tuple(const T* v, Py_ssize_t k) {
  PyObject* t = PyTuple_New(k);
  if (t == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < k; ++i) {
    PyObject* x = PyLong_FromUnsignedLongLong(v[i]);
    if (x == nullptr || PyTuple_SetItem(t, i, x) != 0) {  // steals x
      Py_DECREF(t);
      return nullptr;
    }
  }
  return t;
}

PyObject* u64(uint64_t v) { return PyLong_FromUnsignedLongLong(v); }

// A sequence as a list or tuple we can index without new references:
// lists and tuples as they are, any other iterable copied into a list.
class Items {
 public:
  bool init(PyObject* o, const char* where, const char* name) {
    if (PyList_Check(o) || PyTuple_Check(o)) {
      obj_ = Py_NewRef(o);
    } else {
      obj_ = PySequence_List(o);
      if (obj_ == nullptr) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
          PyErr_Clear();
          PyErr_Format(PyExc_TypeError, "%s: %s must be iterable, not %R",
                       where, name, reinterpret_cast<PyObject*>(Py_TYPE(o)));
        }
        return false;
      }
    }
    list_ = PyList_Check(obj_) != 0;
    size_ = list_ ? PyList_Size(obj_) : PyTuple_Size(obj_);
    return size_ >= 0;
  }
  ~Items() { Py_XDECREF(obj_); }
  Py_ssize_t size() const { return size_; }
  // Borrowed; nullptr with IndexError if a list shrank under us.
  PyObject* get(Py_ssize_t i) const {
    return list_ ? PyList_GetItem(obj_, i) : PyTuple_GetItem(obj_, i);
  }

 private:
  PyObject* obj_ = nullptr;
  bool list_ = false;
  Py_ssize_t size_ = 0;
};

// A contiguous buffer, released on scope exit.
class Buffer {
 public:
  ~Buffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  // false (no error set) if o exports no C-contiguous buffer.
  bool get(PyObject* o) {
    if (!PyObject_CheckBuffer(o)) return false;
    if (PyObject_GetBuffer(o, &view_, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    return true;
  }
  Py_buffer& view() { return view_; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// Integer kind of a buffer format, or 0 if not one we read: 'u' uint32,
// 'i' int32, 'q' int64, 'Q' uint64.
char int_kind(const Py_buffer& v) {
  const char* f = v.format == nullptr ? "B" : v.format;
  if (*f == '@' || *f == '=' || *f == '<') ++f;  // native (little-endian)
  if (f[0] == '\0' || f[1] != '\0') return 0;
  const char c = f[0];
  if (v.itemsize == 4 && c == 'I') return 'u';
  if (v.itemsize == 4 && c == 'i') return 'i';
  if (v.itemsize == 8 && (c == 'q' || c == 'l')) return 'q';
  if (v.itemsize == 8 && (c == 'Q' || c == 'L')) return 'Q';
  return 0;
}

// The error of an id that does not even fit uint32, in the words the engine
// uses for one >= num_blocks: "<name>(<k ids>): block out of range: block
// <the id as passed> not in [0, n)". `id` is an int object.
bool id_out_of_range(const char* name, size_t k, PyObject* id, uint32_t n) {
  PyErr_Format(PyExc_ValueError, "%s(<%zu ids>): %s: block %R not in [0, %u)",
               name, k, tagma::status_str(Status::kOutOfRange), id, n);
  return false;
}

// The same for a buffer element, signed or unsigned.
bool buffer_id_out_of_range(const char* name, size_t k, bool is_unsigned,
                            uint64_t raw, uint32_t n) {
  PyObject* id = is_unsigned ? PyLong_FromUnsignedLongLong(raw)
                             : PyLong_FromLongLong(static_cast<long long>(raw));
  if (id == nullptr) return false;
  id_out_of_range(name, k, id, n);
  Py_DECREF(id);
  return false;
}

// Block ids from a uint32/int32/int64/uint64 buffer or an iterable of ints.
// *data/*count point at the ids: into the buffer itself for uint32 (no
// copy), else into *scratch. Ids must fit uint32 here; the engine checks
// them against num_blocks. Items of an iterable that are not ints run their
// __index__, which may call back into the same object: the caller must not
// hand out a *scratch that such a call could use too.
bool read_ids(PyObject* o, const char* name, uint32_t n, Buffer* buf,
              std::vector<uint32_t>* scratch, const uint32_t** data,
              size_t* count) {
  if (buf->get(o)) {
    const Py_buffer& v = buf->view();
    const char kind = int_kind(v);
    if (kind == 0) {
      PyErr_Format(PyExc_TypeError,
                   "%s: a buffer of ids must hold uint32, int32, int64 or "
                   "uint64, not format '%s'",
                   name, v.format == nullptr ? "B" : v.format);
      return false;
    }
    const size_t k = static_cast<size_t>(v.len / v.itemsize);
    if (kind == 'u') {
      *data = static_cast<const uint32_t*>(v.buf);
      *count = k;
      return true;
    }
    scratch->resize(k);
    for (size_t i = 0; i < k; ++i) {
      // The id as uint64 bits, and whether it is in [0, 2**32).
      uint64_t raw = 0;
      bool fits = false;
      if (kind == 'i') {
        const int32_t x = static_cast<const int32_t*>(v.buf)[i];
        raw = static_cast<uint64_t>(static_cast<int64_t>(x));
        fits = x >= 0;
      } else if (kind == 'q') {
        const int64_t x = static_cast<const int64_t*>(v.buf)[i];
        raw = static_cast<uint64_t>(x);
        fits = x >= 0 && x <= static_cast<int64_t>(UINT32_MAX);
      } else {
        raw = static_cast<const uint64_t*>(v.buf)[i];
        fits = raw <= UINT32_MAX;
      }
      if (!fits) return buffer_id_out_of_range(name, k, kind == 'Q', raw, n);
      (*scratch)[i] = static_cast<uint32_t>(raw);
    }
    *data = scratch->data();
    *count = k;
    return true;
  }
  Items items;
  if (!items.init(o, name, "ids")) return false;
  const size_t k = static_cast<size_t>(items.size());
  scratch->resize(k);
  for (size_t i = 0; i < k; ++i) {
    PyObject* it = items.get(static_cast<Py_ssize_t>(i));
    if (it == nullptr) return false;
    // Our own reference: __index__ may drop the list's.
    PyObject* x = PyLong_Check(it) ? Py_NewRef(it) : nullptr;
    if (x == nullptr) {
      Py_INCREF(it);
      char what[32];
      std::snprintf(what, sizeof(what), "ids[%zu]", i);
      x = as_int(it, name, what);
      Py_DECREF(it);
      if (x == nullptr) return false;
    }
    int overflow = 0;
    const long long id = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (overflow != 0 || id < 0 || id > static_cast<long long>(UINT32_MAX)) {
      id_out_of_range(name, k, x, n);
      Py_DECREF(x);
      return false;
    }
    Py_DECREF(x);
    (*scratch)[i] = static_cast<uint32_t>(id);
  }
  *data = scratch->data();
  *count = k;
  return true;
}

// Cache keys (bytes) into *out, the first n of them (n < 0: all).
bool read_keys(PyObject* o, const char* where, Py_ssize_t n,
               std::vector<std::string>* out, Py_ssize_t* size = nullptr) {
  Items items;
  if (!items.init(o, where, "keys")) return false;
  if (size != nullptr) *size = items.size();
  if (n < 0) n = items.size();
  if (n > items.size()) {
    PyErr_Format(PyExc_ValueError, "%s: n=%zd but only %zd keys", where, n,
                 items.size());
    return false;
  }
  if (out->size() < static_cast<size_t>(n)) out->resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* it = items.get(i);
    if (it == nullptr) return false;
    char* p = nullptr;
    Py_ssize_t len = 0;
    if (!PyBytes_Check(it)) {
      PyErr_Format(PyExc_TypeError, "%s: keys[%zd] must be bytes, not %R",
                   where, i, reinterpret_cast<PyObject*>(Py_TYPE(it)));
      return false;
    }
    if (PyBytes_AsStringAndSize(it, &p, &len) != 0) return false;
    (*out)[static_cast<size_t>(i)].assign(p, static_cast<size_t>(len));
  }
  return true;
}

PyObject* exc_for(Status s) {
  switch (s) {
    case Status::kOutOfMemory:
      return PyExc_MemoryError;
    case Status::kUnknownRequest:
    case Status::kCacheMiss:
      return PyExc_KeyError;
    default:
      return PyExc_ValueError;
  }
}

// Raises the exception of s: "<where>: <status>[: <detail>]".
PyObject* set_error(Status s, const char* where,
                    const std::string& detail = {}) {
  PyErr_Format(exc_for(s), "%s: %s%s%s", where, tagma::status_str(s),
               detail.empty() ? "" : ": ", detail.c_str());
  return nullptr;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

// The detail of kDuplicateKey: "keys[j] repeats keys[i]" for the first key
// of keys[0, n) equal to an earlier one (error path only).
std::string repeat_detail(const std::vector<std::string>& keys, size_t n) {
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(n);
  for (size_t j = 0; j < n; ++j) {
    const auto r = seen.emplace(keys[j], j);
    if (!r.second) {
      return fmt("keys[%zu] repeats keys[%zu]", j, r.first->second);
    }
  }
  return {};
}

// =============================================================== FreeRuns

struct FreeRunsObject {
  PyObject_HEAD tagma::FreeRuns* runs;
  std::vector<uint32_t>* ids;  // scratch for id conversion
  bool ids_busy;               // an add/remove is reading ids into *ids
};

FreeRunsObject* as_fr(PyObject* self) {
  return reinterpret_cast<FreeRunsObject*>(self);
}

PyObject* FreeRuns_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"num_blocks", "alignment", nullptr};
  PyObject *on = nullptr, *oa = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:FreeRuns",
                                   const_cast<char**>(kw), &on, &oa)) {
    return nullptr;
  }
  int64_t n = 0, a = 1;
  if (!to_i64(on, "FreeRuns()", "num_blocks", &n)) return nullptr;
  if (oa != nullptr && !to_i64(oa, "FreeRuns()", "alignment", &a)) {
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    tagma::FreeRuns probe(n, a);
    if (probe.config_status() != Status::kOk) {
      PyErr_Format(PyExc_ValueError,
                   "FreeRuns(num_blocks=%lld, alignment=%lld): invalid "
                   "configuration: num_blocks must be in [1, %lld] and "
                   "alignment in [1, num_blocks]",
                   static_cast<long long>(n), static_cast<long long>(a),
                   static_cast<long long>(tagma::FreeRuns::kMaxBlocks));
      return nullptr;
    }
    auto runs = std::make_unique<tagma::FreeRuns>(std::move(probe));
    auto ids = std::make_unique<std::vector<uint32_t>>();
    auto alloc = reinterpret_cast<allocfunc>(PyType_GetSlot(type, Py_tp_alloc));
    PyObject* self = alloc(type, 0);
    if (self == nullptr) return nullptr;
    as_fr(self)->runs = runs.release();
    as_fr(self)->ids = ids.release();
    as_fr(self)->ids_busy = false;
    return self;
  });
}

void FreeRuns_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete as_fr(self)->runs;
  delete as_fr(self)->ids;
  auto tp_free = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  tp_free(self);
  Py_DECREF(type);
}

PyObject* FreeRuns_raise(const tagma::FreeRuns& fr, Status s, const char* where,
                         int64_t bad) {
  switch (s) {
    case Status::kOutOfRange:
      if (bad >= 0) {
        return set_error(s, where,
                         fmt("block %lld not in [0, %u)",
                             static_cast<long long>(bad), fr.num_blocks()));
      }
      return set_error(s, where, fmt("num_blocks is %u", fr.num_blocks()));
    case Status::kAlreadyFree:
    case Status::kNotFree:
    case Status::kDuplicateBlock:
      return set_error(s, where,
                       fmt("block %lld", static_cast<long long>(bad)));
    case Status::kOutOfMemory:
      return set_error(s, where,
                       fmt("%llu free blocks, largest run %u",
                           static_cast<unsigned long long>(fr.num_free()),
                           fr.largest_run()));
    case Status::kMisaligned:
      return set_error(s, where, fmt("alignment %u", fr.alignment()));
    default:
      return set_error(s, where);
  }
}

// Sets a flag for a scope, restoring it on the way out (exceptions too);
// `nested`: it was set already, by a call further up the stack.
struct Busy {
  explicit Busy(bool* f) : flag(f), nested(*f) { *f = true; }
  ~Busy() { *flag = nested; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
  bool* flag;
  const bool nested;
};

// add(ids) / remove(ids): one body, two engine calls.
template <bool kAdd>
PyObject* FreeRuns_add_remove(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs) {
  const char* name = kAdd ? "FreeRuns.add" : "FreeRuns.remove";
  if (!check_nargs(name, nargs, 1, 1)) return nullptr;
  return guarded([&]() -> PyObject* {
    FreeRunsObject* o = as_fr(self);
    Buffer buf;
    const uint32_t* data = nullptr;
    size_t count = 0;
    // An id's __index__ may call add/remove on this object again: that call
    // converts into its own vector, not into the one being filled here.
    std::vector<uint32_t> own;
    const Busy busy(&o->ids_busy);
    if (!read_ids(args[0], name, o->runs->num_blocks(), &buf,
                  busy.nested ? &own : o->ids, &data, &count)) {
      return nullptr;
    }
    int64_t bad = -1;
    const Status s = kAdd ? o->runs->add(data, count, &bad)
                          : o->runs->remove(data, count, &bad);
    if (s != Status::kOk) {
      char where[96];
      std::snprintf(where, sizeof(where), "%s(<%zu ids>)", name, count);
      return FreeRuns_raise(*o->runs, s, where, bad);
    }
    Py_RETURN_NONE;
  });
}

template <bool kAdd>
PyObject* FreeRuns_range(PyObject* self, PyObject* const* args,
                         Py_ssize_t nargs) {
  const char* name = kAdd ? "FreeRuns.add_range" : "FreeRuns.remove_range";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  int64_t start = 0, length = 0;
  if (!to_i64(args[0], name, "start", &start) ||
      !to_i64(args[1], name, "length", &length)) {
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    tagma::FreeRuns& fr = *as_fr(self)->runs;
    int64_t bad = -1;
    const Status s = kAdd ? fr.add_range(start, length, &bad)
                          : fr.remove_range(start, length, &bad);
    if (s != Status::kOk) {
      char where[128];
      std::snprintf(where, sizeof(where), "%s(start=%lld, length=%lld)", name,
                    static_cast<long long>(start),
                    static_cast<long long>(length));
      if (s == Status::kInvalidArgument) {
        return set_error(s, where, "length must be >= 0");
      }
      return FreeRuns_raise(fr, s, where, bad);
    }
    Py_RETURN_NONE;
  });
}

PyObject* FreeRuns_take_after(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs) {
  const char* name = "FreeRuns.take_after";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  const tagma::FreeRuns& fr = *as_fr(self)->runs;
  PyObject* bo = as_int(args[0], name, "block");
  if (bo == nullptr) return nullptr;
  int64_t n = 0;
  if (!to_i64(args[1], name, "n", &n)) {
    Py_DECREF(bo);
    return nullptr;
  }
  // block + 1 is where taking starts: block -1 takes from block 0, the last
  // block takes nothing; anything else is no block of this object.
  int overflow = 0;
  const long long block = PyLong_AsLongLongAndOverflow(bo, &overflow);
  if (overflow != 0 || block < -1 ||
      block >= static_cast<long long>(fr.num_blocks())) {
    PyErr_Format(PyExc_ValueError,
                 "%s(block=%R, n=%lld): %s: block %R not in [-1, %u)", name, bo,
                 static_cast<long long>(n),
                 tagma::status_str(Status::kOutOfRange), bo, fr.num_blocks());
    Py_DECREF(bo);
    return nullptr;
  }
  Py_DECREF(bo);
  if (n < 0) {
    PyErr_Format(PyExc_ValueError, "%s(block=%lld, n=%lld): %s: n must be >= 0",
                 name, block, static_cast<long long>(n),
                 tagma::status_str(Status::kInvalidArgument));
    return nullptr;
  }
  return PyLong_FromLongLong(as_fr(self)->runs->take_after(block, n));
}

PyObject* run_list(const tagma::FreeRuns::Run* runs, size_t k) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(k));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < k; ++i) {
    const uint32_t v[2] = {runs[i].first, runs[i].second};
    PyObject* t = int_tuple(v, 2);
    if (t == nullptr || PyList_SetItem(list, static_cast<Py_ssize_t>(i), t)) {
      Py_DECREF(list);
      return nullptr;
    }
  }
  return list;
}

PyObject* FreeRuns_take(PyObject* self, PyObject* const* args,
                        Py_ssize_t nargs) {
  const char* name = "FreeRuns.take";
  if (!check_nargs(name, nargs, 1, 2)) return nullptr;
  int64_t n = 0, max_ranges = 256;
  if (!to_i64(args[0], name, "n", &n)) return nullptr;
  if (nargs > 1 && !to_i64(args[1], name, "max_ranges", &max_ranges)) {
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    tagma::FreeRuns& fr = *as_fr(self)->runs;
    std::vector<tagma::FreeRuns::Run> out;
    const Status s = fr.take(n, max_ranges, &out);
    if (s != Status::kOk) {
      char where[128];
      std::snprintf(
          where, sizeof(where), "FreeRuns.take(n=%lld, max_ranges=%lld)",
          static_cast<long long>(n), static_cast<long long>(max_ranges));
      if (s == Status::kInvalidArgument) {
        return set_error(s, where,
                         n < 0 ? "n must be >= 0" : "max_ranges must be >= 1");
      }
      if (s == Status::kTooManyRanges) {
        return set_error(
            s, where,
            fmt("%lld blocks need more than %lld ranges "
                "(largest run %u)",
                static_cast<long long>(n), static_cast<long long>(max_ranges),
                fr.largest_run()));
      }
      return FreeRuns_raise(fr, s, where, -1);
    }
    return run_list(out.data(), out.size());
  });
}

PyObject* FreeRuns_runs(PyObject* self, PyObject*) {
  return guarded([&]() -> PyObject* {
    const auto runs = as_fr(self)->runs->runs();
    return run_list(runs.data(), runs.size());
  });
}

PyObject* FreeRuns_validate(PyObject* self, PyObject*) {
  return PyBool_FromLong(as_fr(self)->runs->validate());
}

// `x in obj` is a membership test, never a type check: an object that is
// not an int (nor has __index__) is simply not a member, nor is an int out
// of range. An error raised by an __index__ itself propagates.
int FreeRuns_contains(PyObject* self, PyObject* key) {
  if (!PyIndex_Check(key)) return 0;
  int overflow = 0;
  const long long b = PyLong_AsLongLongAndOverflow(key, &overflow);
  if (b == -1 && PyErr_Occurred()) return -1;
  if (overflow != 0) return 0;
  return as_fr(self)->runs->contains(b) ? 1 : 0;
}

PyObject* FreeRuns_repr(PyObject* self) {
  const tagma::FreeRuns& fr = *as_fr(self)->runs;
  return PyUnicode_FromFormat(
      "FreeRuns(num_blocks=%u, alignment=%u, num_free=%llu, num_runs=%zu)",
      fr.num_blocks(), fr.alignment(),
      static_cast<unsigned long long>(fr.num_free()), fr.num_runs());
}

PyObject* FreeRuns_get(PyObject* self, void* which) {
  const tagma::FreeRuns& fr = *as_fr(self)->runs;
  switch (reinterpret_cast<intptr_t>(which)) {
    case 0:
      return u64(fr.num_free());
    case 1:
      return u64(fr.largest_run());
    case 2:
      return u64(fr.num_runs());
    case 3:
      return u64(fr.num_blocks());
    default:
      return u64(fr.alignment());
  }
}

PyMethodDef FreeRuns_methods[] = {
    {"add", fast(FreeRuns_add_remove<true>), METH_FASTCALL,
     "add(ids, /) -> None\n--\n\nMarks the blocks free (ints, or a "
     "uint32/int32/int64 buffer), coalescing runs. ValueError, nothing "
     "changed, if one is out of range, already free or given twice."},
    {"remove", fast(FreeRuns_add_remove<false>), METH_FASTCALL,
     "remove(ids, /) -> None\n--\n\nMarks free blocks not free, splitting "
     "runs. ValueError, nothing changed, if one is not free."},
    {"add_range", fast(FreeRuns_range<true>), METH_FASTCALL,
     "add_range(start, length, /) -> None\n--\n\nMarks [start, start + "
     "length) free."},
    {"remove_range", fast(FreeRuns_range<false>), METH_FASTCALL,
     "remove_range(start, length, /) -> None\n--\n\nMarks [start, start + "
     "length) not free; all of it must be free."},
    {"take_after", fast(FreeRuns_take_after), METH_FASTCALL,
     "take_after(block, n, /) -> int\n--\n\nTakes up to n free blocks from "
     "block + 1 on, as far as they are free (rounded down to the "
     "alignment); returns how many. ValueError, nothing changed, if block "
     "is not in [-1, num_blocks) or n < 0."},
    {"take", fast(FreeRuns_take), METH_FASTCALL,
     "take(n, max_ranges=256, /) -> list[tuple[int, int]]\n--\n\nTakes n "
     "blocks: one best-fit range if any run holds n, else the largest runs "
     "first. Returns (start, length) ranges. MemoryError if fewer than n are "
     "free, ValueError if more than max_ranges ranges are needed."},
    {"runs", FreeRuns_runs, METH_NOARGS,
     "runs() -> list[tuple[int, int]]\n--\n\nThe free runs (start, length) "
     "by address."},
    {"validate", FreeRuns_validate, METH_NOARGS,
     "validate() -> bool\n--\n\nRecomputes the invariants."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef FreeRuns_getset[] = {
    {"num_free", FreeRuns_get, nullptr, "Free blocks.",
     reinterpret_cast<void*>(0)},
    {"largest_run", FreeRuns_get, nullptr,
     "The most blocks one range can take (aligned).",
     reinterpret_cast<void*>(1)},
    {"num_runs", FreeRuns_get, nullptr, "Number of free runs.",
     reinterpret_cast<void*>(2)},
    {"num_blocks", FreeRuns_get, nullptr, "Blocks managed.",
     reinterpret_cast<void*>(3)},
    {"alignment", FreeRuns_get, nullptr, "Range alignment in blocks.",
     reinterpret_cast<void*>(4)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot FreeRuns_slots[] = {
    {Py_tp_doc, const_cast<char*>(
                    "FreeRuns(num_blocks, alignment=1)\n--\n\n"
                    "The free blocks of [0, num_blocks) as coalesced runs, "
                    "for contiguous placement. Starts empty (no block free).")},
    {Py_tp_new, reinterpret_cast<void*>(FreeRuns_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(FreeRuns_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(FreeRuns_repr)},
    {Py_tp_methods, FreeRuns_methods},
    {Py_tp_getset, FreeRuns_getset},
    {Py_sq_contains, reinterpret_cast<void*>(FreeRuns_contains)},
    {0, nullptr},
};

PyType_Spec FreeRuns_spec = {
    "vllm._tagma_C.FreeRuns",
    sizeof(FreeRunsObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    FreeRuns_slots,
};

// ============================================================ KVAllocator

struct AllocatorScratch {
  std::vector<std::string> keys;
  std::vector<tagma::BlockRange> ranges;
  std::vector<uint32_t> blocks;
};

struct AllocatorObject {
  PyObject_HEAD tagma::KVAllocator* a;
  AllocatorScratch* scratch;
};

AllocatorObject* as_al(PyObject* self) {
  return reinterpret_cast<AllocatorObject*>(self);
}

PyObject* KVAllocator_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"num_blocks", "alignment", "max_ranges", nullptr};
  PyObject *on = nullptr, *oa = nullptr, *orr = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OO:KVAllocator",
                                   const_cast<char**>(kw), &on, &oa, &orr)) {
    return nullptr;
  }
  int64_t n = 0, a = 1, r = 256;
  if (!to_i64(on, "KVAllocator()", "num_blocks", &n) ||
      (oa != nullptr && !to_i64(oa, "KVAllocator()", "alignment", &a)) ||
      (orr != nullptr && !to_i64(orr, "KVAllocator()", "max_ranges", &r))) {
    return nullptr;
  }
  if (n < 1 || n > tagma::KVAllocator::kMaxBlocks || a < 1 || a > n || r < 1) {
    PyErr_Format(PyExc_ValueError,
                 "KVAllocator(num_blocks=%lld, alignment=%lld, "
                 "max_ranges=%lld): invalid configuration: num_blocks must be "
                 "in [1, %lld], alignment in [1, num_blocks], max_ranges >= 1",
                 static_cast<long long>(n), static_cast<long long>(a),
                 static_cast<long long>(r),
                 static_cast<long long>(tagma::KVAllocator::kMaxBlocks));
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    auto impl = std::make_unique<tagma::KVAllocator>(n, a, r);
    auto scratch = std::make_unique<AllocatorScratch>();
    auto alloc = reinterpret_cast<allocfunc>(PyType_GetSlot(type, Py_tp_alloc));
    PyObject* self = alloc(type, 0);
    if (self == nullptr) return nullptr;
    as_al(self)->a = impl.release();
    as_al(self)->scratch = scratch.release();
    return self;
  });
}

void KVAllocator_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete as_al(self)->a;
  delete as_al(self)->scratch;
  auto tp_free = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  tp_free(self);
  Py_DECREF(type);
}

// The error of a KVAllocator call, with the numbers that explain it.
PyObject* KVAllocator_raise(const tagma::KVAllocator& a, Status s,
                            const char* where, uint64_t req) {
  const auto st = a.stats();
  switch (s) {
    case Status::kOutOfMemory:
      return set_error(s, where,
                       fmt("%llu free blocks, %llu cached-only",
                           static_cast<unsigned long long>(st.free),
                           static_cast<unsigned long long>(st.cached_only)));
    case Status::kMisaligned:
      return set_error(s, where, fmt("alignment %u", a.alignment()));
    case Status::kDuplicateRequest:
      return set_error(s, where, "use grow()");
    case Status::kTooManyRanges: {
      size_t k = 0;
      a.ranges_data(req, &k);
      return set_error(
          s, where,
          fmt("max_ranges=%u, the request holds %zu", a.max_ranges(), k));
    }
    case Status::kRequestNotEmpty:
      return set_error(
          s, where,
          fmt("%lld blocks", static_cast<long long>(a.request_blocks(req))));
    case Status::kOutOfRange:
      return set_error(s, where,
                       fmt("the request holds %lld blocks",
                           static_cast<long long>(a.request_blocks(req))));
    case Status::kCacheInUse:
      return set_error(
          s, where,
          fmt("%llu blocks in use", static_cast<unsigned long long>(st.used)));
    case Status::kInvalidArgument:
      return set_error(s, where, "counts must be >= 0");
    default:
      return set_error(s, where);
  }
}

// allocate(req, count) / grow(req, count).
template <bool kGrow>
PyObject* KVAllocator_take(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  const char* name = kGrow ? "KVAllocator.grow" : "KVAllocator.allocate";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  uint64_t req = 0;
  int64_t count = 0;
  if (!to_req(args[0], name, &req) || !to_i64(args[1], name, "count", &count)) {
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    tagma::KVAllocator& a = *as_al(self)->a;
    const Status s = kGrow ? a.grow(req, count) : a.allocate(req, count);
    if (s != Status::kOk) {
      char where[128];
      std::snprintf(where, sizeof(where), "%s(req=%llu, count=%lld)", name,
                    static_cast<unsigned long long>(req),
                    static_cast<long long>(count));
      return KVAllocator_raise(a, s, where, req);
    }
    Py_RETURN_NONE;
  });
}

PyObject* KVAllocator_release(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs) {
  const char* name = "KVAllocator.release";
  if (!check_nargs(name, nargs, 1, 1)) return nullptr;
  uint64_t req = 0;
  if (!to_req(args[0], name, &req)) return nullptr;
  return guarded([&]() -> PyObject* {
    tagma::KVAllocator& a = *as_al(self)->a;
    const Status s = a.release(req);
    if (s != Status::kOk) {
      char where[96];
      std::snprintf(where, sizeof(where), "KVAllocator.release(req=%llu)",
                    static_cast<unsigned long long>(req));
      return KVAllocator_raise(a, s, where, req);
    }
    Py_RETURN_NONE;
  });
}

PyObject* KVAllocator_acquire_cached(PyObject* self, PyObject* const* args,
                                     Py_ssize_t nargs) {
  const char* name = "KVAllocator.acquire_cached";
  if (!check_nargs(name, nargs, 2, 3)) return nullptr;
  uint64_t req = 0;
  int64_t n = -1;
  if (!to_req(args[0], name, &req)) return nullptr;
  if (nargs > 2 && args[2] != Py_None) {
    if (!to_i64(args[2], name, "n", &n)) return nullptr;
    if (n < 0) {
      PyErr_Format(PyExc_ValueError,
                   "%s(req=%llu, n=%lld): invalid argument: n must be >= 0",
                   name, static_cast<unsigned long long>(req),
                   static_cast<long long>(n));
      return nullptr;
    }
  }
  return guarded([&]() -> PyObject* {
    AllocatorObject* o = as_al(self);
    std::vector<std::string>& keys = o->scratch->keys;
    Py_ssize_t size = 0;
    if (!read_keys(args[1], name, static_cast<Py_ssize_t>(n), &keys, &size)) {
      return nullptr;
    }
    const Py_ssize_t used = n < 0 ? size : static_cast<Py_ssize_t>(n);
    const Status s =
        o->a->acquire_cached(req, keys.data(), static_cast<size_t>(used));
    if (s != Status::kOk) {
      char where[128];
      std::snprintf(where, sizeof(where), "%s(req=%llu, n=%zd)", name,
                    static_cast<unsigned long long>(req), used);
      if (s == Status::kCacheMiss) {
        const size_t hit = o->a->lookup(keys.data(), static_cast<size_t>(used));
        return set_error(s, where, fmt("keys[%zu] is not cached", hit));
      }
      if (s == Status::kDuplicateKey) {
        return set_error(s, where,
                         repeat_detail(keys, static_cast<size_t>(used)));
      }
      return KVAllocator_raise(*o->a, s, where, req);
    }
    Py_RETURN_NONE;
  });
}

PyObject* KVAllocator_cache(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs) {
  const char* name = "KVAllocator.cache";
  if (!check_nargs(name, nargs, 3, 3)) return nullptr;
  uint64_t req = 0;
  int64_t first = 0;
  if (!to_req(args[0], name, &req) || !to_i64(args[1], name, "first", &first)) {
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    AllocatorObject* o = as_al(self);
    std::vector<std::string>& keys = o->scratch->keys;
    Py_ssize_t size = 0;
    if (!read_keys(args[2], name, -1, &keys, &size)) return nullptr;
    const Status s =
        o->a->cache(req, first, keys.data(), static_cast<size_t>(size));
    if (s != Status::kOk) {
      char where[128];
      std::snprintf(where, sizeof(where),
                    "%s(req=%llu, first=%lld, <%zd keys>)", name,
                    static_cast<unsigned long long>(req),
                    static_cast<long long>(first), size);
      if (s == Status::kInvalidArgument) {
        return set_error(s, where, "first must be >= 0");
      }
      if (s == Status::kDuplicateKey) {
        return set_error(s, where,
                         repeat_detail(keys, static_cast<size_t>(size)));
      }
      return KVAllocator_raise(*o->a, s, where, req);
    }
    Py_RETURN_NONE;
  });
}

PyObject* KVAllocator_lookup(PyObject* self, PyObject* keys_obj) {
  const char* name = "KVAllocator.lookup";
  return guarded([&]() -> PyObject* {
    AllocatorObject* o = as_al(self);
    Items items;
    if (!items.init(keys_obj, name, "keys")) return nullptr;
    // Key by key: stops at the first miss without converting the rest.
    std::vector<std::string>& keys = o->scratch->keys;
    if (keys.empty()) keys.resize(1);
    Py_ssize_t i = 0;
    for (; i < items.size(); ++i) {
      PyObject* it = items.get(i);
      if (it == nullptr) return nullptr;
      if (!PyBytes_Check(it)) {
        PyErr_Format(PyExc_TypeError, "%s: keys[%zd] must be bytes, not %R",
                     name, i, reinterpret_cast<PyObject*>(Py_TYPE(it)));
        return nullptr;
      }
      char* p = nullptr;
      Py_ssize_t len = 0;
      if (PyBytes_AsStringAndSize(it, &p, &len) != 0) return nullptr;
      keys[0].assign(p, static_cast<size_t>(len));
      if (o->a->lookup(keys.data(), 1) == 0) break;
    }
    return PyLong_FromSsize_t(i);
  });
}

PyObject* KVAllocator_evict(PyObject* self, PyObject* arg) {
  const char* name = "KVAllocator.evict";
  int64_t n = 0;
  if (!to_i64(arg, name, "n", &n)) return nullptr;
  return guarded([&]() -> PyObject* {
    size_t evicted = 0;
    const Status s = as_al(self)->a->evict(n, &evicted);
    if (s != Status::kOk) {
      char where[64];
      std::snprintf(where, sizeof(where), "%s(n=%lld)", name,
                    static_cast<long long>(n));
      return set_error(s, where, "n must be >= 0");
    }
    return PyLong_FromSize_t(evicted);
  });
}

PyObject* KVAllocator_reset_cache(PyObject* self, PyObject*) {
  return guarded([&]() -> PyObject* {
    tagma::KVAllocator& a = *as_al(self)->a;
    const Status s = a.reset_cache();
    if (s != Status::kOk) {
      return KVAllocator_raise(a, s, "KVAllocator.reset_cache()", 0);
    }
    Py_RETURN_NONE;
  });
}

// Looks the request up for the read-only methods; KeyError if unknown.
const tagma::BlockRange* request_ranges(const tagma::KVAllocator& a,
                                        uint64_t req, const char* name,
                                        size_t* k) {
  if (!a.contains(req)) {
    char where[96];
    std::snprintf(where, sizeof(where), "%s(req=%llu)", name,
                  static_cast<unsigned long long>(req));
    set_error(Status::kUnknownRequest, where);
    return nullptr;
  }
  static const tagma::BlockRange kNone{};
  const tagma::BlockRange* r = a.ranges_data(req, k);
  return r != nullptr ? r : &kNone;  // an empty request: *k == 0
}

PyObject* KVAllocator_ranges(PyObject* self, PyObject* arg) {
  const char* name = "KVAllocator.ranges";
  uint64_t req = 0;
  if (!to_req(arg, name, &req)) return nullptr;
  size_t k = 0;
  const tagma::BlockRange* r = request_ranges(*as_al(self)->a, req, name, &k);
  if (r == nullptr) return nullptr;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(k));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < k; ++i) {
    const uint32_t v[3] = {r[i].start, r[i].length, r[i].logical_start};
    PyObject* t = int_tuple(v, 3);
    if (t == nullptr || PyList_SetItem(list, static_cast<Py_ssize_t>(i), t)) {
      Py_DECREF(list);
      return nullptr;
    }
  }
  return list;
}

PyObject* KVAllocator_ranges_bytes(PyObject* self, PyObject* arg) {
  const char* name = "KVAllocator.ranges_bytes";
  uint64_t req = 0;
  if (!to_req(arg, name, &req)) return nullptr;
  size_t k = 0;
  const tagma::BlockRange* r = request_ranges(*as_al(self)->a, req, name, &k);
  if (r == nullptr) return nullptr;
  static_assert(sizeof(tagma::BlockRange) == 3 * sizeof(uint32_t),
                "BlockRange is three packed uint32");
  return PyBytes_FromStringAndSize(
      k == 0 ? "" : reinterpret_cast<const char*>(r),
      static_cast<Py_ssize_t>(k * sizeof(tagma::BlockRange)));
}

PyObject* KVAllocator_blocks(PyObject* self, PyObject* arg) {
  const char* name = "KVAllocator.blocks";
  uint64_t req = 0;
  if (!to_req(arg, name, &req)) return nullptr;
  size_t k = 0;
  const tagma::BlockRange* r = request_ranges(*as_al(self)->a, req, name, &k);
  if (r == nullptr) return nullptr;
  const int64_t nb = as_al(self)->a->request_blocks(req);
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(nb));
  if (list == nullptr) return nullptr;
  Py_ssize_t j = 0;
  for (size_t i = 0; i < k; ++i) {
    for (uint32_t b = r[i].start; b < r[i].start + r[i].length; ++b) {
      PyObject* v = PyLong_FromUnsignedLong(b);
      if (v == nullptr || PyList_SetItem(list, j++, v) != 0) {
        Py_DECREF(list);
        return nullptr;
      }
    }
  }
  return list;
}

PyObject* KVAllocator_request_blocks(PyObject* self, PyObject* arg) {
  const char* name = "KVAllocator.request_blocks";
  uint64_t req = 0;
  if (!to_req(arg, name, &req)) return nullptr;
  size_t k = 0;
  if (request_ranges(*as_al(self)->a, req, name, &k) == nullptr) return nullptr;
  return PyLong_FromLongLong(as_al(self)->a->request_blocks(req));
}

PyObject* KVAllocator_physical_block(PyObject* self, PyObject* const* args,
                                     Py_ssize_t nargs) {
  const char* name = "KVAllocator.physical_block";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  uint64_t req = 0;
  int64_t logical = 0;
  if (!to_req(args[0], name, &req) ||
      !to_i64(args[1], name, "logical", &logical)) {
    return nullptr;
  }
  const tagma::KVAllocator& a = *as_al(self)->a;
  uint32_t b = 0;
  const Status s = a.physical_block(req, logical, &b);
  if (s != Status::kOk) {
    char where[128];
    std::snprintf(where, sizeof(where), "%s(req=%llu, logical=%lld)", name,
                  static_cast<unsigned long long>(req),
                  static_cast<long long>(logical));
    return KVAllocator_raise(a, s, where, req);
  }
  return PyLong_FromUnsignedLong(b);
}

int dict_set(PyObject* d, const char* key, uint64_t v) {
  PyObject* o = u64(v);
  if (o == nullptr) return -1;
  const int r = PyDict_SetItemString(d, key, o);
  Py_DECREF(o);
  return r;
}

PyObject* KVAllocator_stats(PyObject* self, PyObject*) {
  const auto st = as_al(self)->a->stats();
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  if (dict_set(d, "total", st.total) || dict_set(d, "free", st.free) ||
      dict_set(d, "used", st.used) ||
      dict_set(d, "cached_only", st.cached_only) ||
      dict_set(d, "largest_free_run", st.largest_free_run) ||
      dict_set(d, "num_free_runs", st.num_free_runs) ||
      dict_set(d, "num_requests", st.num_requests) ||
      dict_set(d, "ranges_total", st.ranges_total) ||
      dict_set(d, "max_ranges_per_request", st.max_ranges_per_request) ||
      dict_set(d, "fallback_allocations", st.fallback_allocations) ||
      dict_set(d, "evictions", st.evictions)) {
    Py_DECREF(d);
    return nullptr;
  }
  return d;
}

PyObject* KVAllocator_validate(PyObject* self, PyObject*) {
  return guarded([&]() -> PyObject* {
    return PyBool_FromLong(as_al(self)->a->validate());
  });
}

// As FreeRuns_contains: a non-int, or an int outside [0, 2**64), is not a
// request.
int KVAllocator_contains(PyObject* self, PyObject* key) {
  if (!PyIndex_Check(key)) return 0;
  PyObject* i = PyNumber_Index(key);
  if (i == nullptr) return -1;
  uint64_t req = 0;
  const bool in_range = int_to_u64(i, &req);
  Py_DECREF(i);
  return in_range && as_al(self)->a->contains(req) ? 1 : 0;
}

PyObject* KVAllocator_repr(PyObject* self) {
  const tagma::KVAllocator& a = *as_al(self)->a;
  const auto st = a.stats();
  return PyUnicode_FromFormat(
      "KVAllocator(num_blocks=%u, alignment=%u, max_ranges=%u, free=%llu, "
      "used=%llu, cached_only=%llu, requests=%llu)",
      a.num_blocks(), a.alignment(), a.max_ranges(),
      static_cast<unsigned long long>(st.free),
      static_cast<unsigned long long>(st.used),
      static_cast<unsigned long long>(st.cached_only),
      static_cast<unsigned long long>(st.num_requests));
}

PyObject* KVAllocator_get(PyObject* self, void* which) {
  const tagma::KVAllocator& a = *as_al(self)->a;
  switch (reinterpret_cast<intptr_t>(which)) {
    case 0:
      return u64(a.num_blocks());
    case 1:
      return u64(a.alignment());
    case 2:
      return u64(a.max_ranges());
    default:
      return u64(a.num_requests());
  }
}

PyMethodDef KVAllocator_methods[] = {
    {"allocate", fast(KVAllocator_take<false>), METH_FASTCALL,
     "allocate(req, count, /) -> None\n--\n\nA new request with count "
     "blocks: one best-fit range if any fits (evicting cache-only blocks if "
     "needed), else several. MemoryError if they are not there."},
    {"grow", fast(KVAllocator_take<true>), METH_FASTCALL,
     "grow(req, count, /) -> None\n--\n\nAdds count blocks at the request's "
     "logical end, in place when the next blocks are free."},
    {"release", fast(KVAllocator_release), METH_FASTCALL,
     "release(req, /) -> None\n--\n\nDrops the request; its cached blocks "
     "become evictable (tail first)."},
    {"acquire_cached", fast(KVAllocator_acquire_cached), METH_FASTCALL,
     "acquire_cached(req, keys, n=None, /) -> None\n--\n\nMakes a new (or "
     "empty) request reference the blocks of the first n keys (default all). "
     "KeyError on a cache miss."},
    {"cache", fast(KVAllocator_cache), METH_FASTCALL,
     "cache(req, first, keys, /) -> None\n--\n\nRegisters keys for the "
     "request's logical blocks [first, first + len(keys)). ValueError, "
     "nothing changed, if a key is given twice (acquire_cached could not "
     "take it back) or a block already carries another key."},
    {"lookup", KVAllocator_lookup, METH_O,
     "lookup(keys, /) -> int\n--\n\nNumber of leading keys that are cached."},
    {"evict", KVAllocator_evict, METH_O,
     "evict(n, /) -> int\n--\n\nEvicts up to n cache-only blocks, LRU first; "
     "returns how many."},
    {"reset_cache", KVAllocator_reset_cache, METH_NOARGS,
     "reset_cache() -> None\n--\n\nDrops every cache key; ValueError while "
     "any block is in use."},
    {"ranges", KVAllocator_ranges, METH_O,
     "ranges(req, /) -> list[tuple[int, int, int]]\n--\n\nThe request's "
     "(start, length, logical_start) ranges in logical order."},
    {"ranges_bytes", KVAllocator_ranges_bytes, METH_O,
     "ranges_bytes(req, /) -> bytes\n--\n\nThe ranges as native uint32 "
     "triples (start, length, logical_start), for a range table."},
    {"blocks", KVAllocator_blocks, METH_O,
     "blocks(req, /) -> list[int]\n--\n\nThe request's physical blocks in "
     "logical order (the block table row)."},
    {"request_blocks", KVAllocator_request_blocks, METH_O,
     "request_blocks(req, /) -> int\n--\n\nBlocks the request holds."},
    {"physical_block", fast(KVAllocator_physical_block), METH_FASTCALL,
     "physical_block(req, logical, /) -> int\n--\n\nThe physical block of "
     "a logical block."},
    {"stats", KVAllocator_stats, METH_NOARGS,
     "stats() -> dict[str, int]\n--\n\nCounters (O(1))."},
    {"validate", KVAllocator_validate, METH_NOARGS,
     "validate() -> bool\n--\n\nRecomputes every invariant, O(blocks)."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef KVAllocator_getset[] = {
    {"num_blocks", KVAllocator_get, nullptr, "Blocks managed.",
     reinterpret_cast<void*>(0)},
    {"alignment", KVAllocator_get, nullptr, "Range alignment in blocks.",
     reinterpret_cast<void*>(1)},
    {"max_ranges", KVAllocator_get, nullptr, "Most ranges one request holds.",
     reinterpret_cast<void*>(2)},
    {"num_requests", KVAllocator_get, nullptr, "Live requests.",
     reinterpret_cast<void*>(3)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot KVAllocator_slots[] = {
    {Py_tp_doc,
     const_cast<char*>(
         "KVAllocator(num_blocks, alignment=1, max_ranges=256)\n--\n\n"
         "KV-cache blocks handed to requests as a few contiguous ranges, "
         "with prefix sharing and LRU eviction of cache-only blocks.")},
    {Py_tp_new, reinterpret_cast<void*>(KVAllocator_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(KVAllocator_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(KVAllocator_repr)},
    {Py_tp_methods, KVAllocator_methods},
    {Py_tp_getset, KVAllocator_getset},
    {Py_sq_contains, reinterpret_cast<void*>(KVAllocator_contains)},
    {0, nullptr},
};

PyType_Spec KVAllocator_spec = {
    "vllm._tagma_C.KVAllocator",
    sizeof(AllocatorObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    KVAllocator_slots,
};

// ============================================================= KVCoordMap

struct CoordMapObject {
  PyObject_HEAD tagma::KVCoordMap map;  // trivially destructible
};

CoordMapObject* as_cm(PyObject* self) {
  return reinterpret_cast<CoordMapObject*>(self);
}

PyObject* raise_coord(tagma::CoordStatus s, const char* where) {
  PyErr_Format(PyExc_ValueError, "%s: %s", where, tagma::coord_status_str(s));
  return nullptr;
}

PyObject* KVCoordMap_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"num_layers", "num_blocks", "tokens_per_block",
                             "bytes_per_token", nullptr};
  PyObject* o[4] = {};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:KVCoordMap",
                                   const_cast<char**>(kw), &o[0], &o[1], &o[2],
                                   &o[3])) {
    return nullptr;
  }
  int64_t v[4] = {};
  for (int i = 0; i < 4; ++i) {
    if (!to_i64(o[i], "KVCoordMap()", kw[i], &v[i])) return nullptr;
  }
  tagma::KVCoordMap map;
  char where[192];
  std::snprintf(where, sizeof(where),
                "KVCoordMap(num_layers=%lld, num_blocks=%lld, "
                "tokens_per_block=%lld, bytes_per_token=%lld)",
                static_cast<long long>(v[0]), static_cast<long long>(v[1]),
                static_cast<long long>(v[2]), static_cast<long long>(v[3]));
  for (int i = 0; i < 4; ++i) {
    if (v[i] < 1) {
      PyErr_Format(PyExc_ValueError, "%s: %s must be >= 1", where, kw[i]);
      return nullptr;
    }
  }
  const tagma::KVLayout layout{
      static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1]),
      static_cast<uint64_t>(v[2]), static_cast<uint64_t>(v[3])};
  const tagma::CoordStatus s = tagma::KVCoordMap::create(layout, &map);
  if (s != tagma::CoordStatus::kOk) return raise_coord(s, where);
  auto alloc = reinterpret_cast<allocfunc>(PyType_GetSlot(type, Py_tp_alloc));
  PyObject* self = alloc(type, 0);
  if (self == nullptr) return nullptr;
  as_cm(self)->map = map;
  return self;
}

void KVCoordMap_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  auto tp_free = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  tp_free(self);
  Py_DECREF(type);
}

PyObject* KVCoordMap_offset(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs) {
  const char* name = "KVCoordMap.offset";
  if (!check_nargs(name, nargs, 3, 3)) return nullptr;
  uint64_t layer = 0, block = 0, token = 0;
  // Any uint64 goes to the map, which names the coordinate out of range.
  const char* range = "coordinates are in [0, 2**64)";
  if (!to_u64(args[0], name, "layer", range, &layer) ||
      !to_u64(args[1], name, "block", range, &block) ||
      !to_u64(args[2], name, "token", range, &token)) {
    return nullptr;
  }
  uint64_t off = 0;
  const tagma::CoordStatus s =
      as_cm(self)->map.offset(layer, block, token, &off);
  if (s != tagma::CoordStatus::kOk) {
    const tagma::KVLayout& l = as_cm(self)->map.layout();
    PyErr_Format(PyExc_ValueError,
                 "%s(layer=%llu, block=%llu, token=%llu): %s (layout %llu "
                 "layers x %llu blocks x %llu tokens)",
                 name, static_cast<unsigned long long>(layer),
                 static_cast<unsigned long long>(block),
                 static_cast<unsigned long long>(token),
                 tagma::coord_status_str(s),
                 static_cast<unsigned long long>(l.num_layers),
                 static_cast<unsigned long long>(l.num_blocks),
                 static_cast<unsigned long long>(l.tokens_per_block));
    return nullptr;
  }
  return u64(off);
}

PyObject* KVCoordMap_coord(PyObject* self, PyObject* arg) {
  const char* name = "KVCoordMap.coord";
  PyObject* index = as_int(arg, name, "offset");
  if (index == nullptr) return nullptr;
  uint64_t off = 0;
  if (!int_to_u64(index, &off)) {
    PyErr_Format(PyExc_ValueError, "%s(offset=%R): offset out of range", name,
                 index);
    Py_DECREF(index);
    return nullptr;
  }
  Py_DECREF(index);
  tagma::KVCoord c;
  const tagma::CoordStatus s = as_cm(self)->map.coord(off, &c);
  if (s != tagma::CoordStatus::kOk) {
    PyErr_Format(
        PyExc_ValueError, "%s(offset=%llu): %s (total_bytes %llu)", name,
        static_cast<unsigned long long>(off), tagma::coord_status_str(s),
        static_cast<unsigned long long>(as_cm(self)->map.total_bytes()));
    return nullptr;
  }
  const uint64_t v[4] = {c.layer, c.block, c.token, c.byte_in_token};
  return int_tuple(v, 4);
}

PyObject* KVCoordMap_get(PyObject* self, void* which) {
  const tagma::KVCoordMap& m = as_cm(self)->map;
  switch (reinterpret_cast<intptr_t>(which)) {
    case 0:
      return u64(m.layout().num_layers);
    case 1:
      return u64(m.layout().num_blocks);
    case 2:
      return u64(m.layout().tokens_per_block);
    case 3:
      return u64(m.layout().bytes_per_token);
    default:
      return u64(m.total_bytes());
  }
}

PyObject* KVCoordMap_repr(PyObject* self) {
  const tagma::KVLayout& l = as_cm(self)->map.layout();
  return PyUnicode_FromFormat(
      "KVCoordMap(num_layers=%llu, num_blocks=%llu, tokens_per_block=%llu, "
      "bytes_per_token=%llu)",
      static_cast<unsigned long long>(l.num_layers),
      static_cast<unsigned long long>(l.num_blocks),
      static_cast<unsigned long long>(l.tokens_per_block),
      static_cast<unsigned long long>(l.bytes_per_token));
}

PyMethodDef KVCoordMap_methods[] = {
    {"offset", fast(KVCoordMap_offset), METH_FASTCALL,
     "offset(layer, block, token, /) -> int\n--\n\nByte offset of a token's "
     "KV: ((layer * B + block) * T + token) * bytes_per_token."},
    {"coord", KVCoordMap_coord, METH_O,
     "coord(offset, /) -> tuple[int, int, int, int]\n--\n\n(layer, block, "
     "token, byte_in_token) of a byte offset."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef KVCoordMap_getset[] = {
    {"num_layers", KVCoordMap_get, nullptr, "L", reinterpret_cast<void*>(0)},
    {"num_blocks", KVCoordMap_get, nullptr, "B", reinterpret_cast<void*>(1)},
    {"tokens_per_block", KVCoordMap_get, nullptr, "T",
     reinterpret_cast<void*>(2)},
    {"bytes_per_token", KVCoordMap_get, nullptr,
     "Bytes of one token, one layer.", reinterpret_cast<void*>(3)},
    {"total_bytes", KVCoordMap_get, nullptr, "L * B * T * bytes_per_token.",
     reinterpret_cast<void*>(4)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot KVCoordMap_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("KVCoordMap(num_layers, num_blocks, tokens_per_block, "
                       "bytes_per_token)\n--\n\n"
                       "The closed-form coordinate map of the KV cache.")},
    {Py_tp_new, reinterpret_cast<void*>(KVCoordMap_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(KVCoordMap_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(KVCoordMap_repr)},
    {Py_tp_methods, KVCoordMap_methods},
    {Py_tp_getset, KVCoordMap_getset},
    {0, nullptr},
};

PyType_Spec KVCoordMap_spec = {
    "vllm._tagma_C.KVCoordMap",
    sizeof(CoordMapObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    KVCoordMap_slots,
};

// ================================================================= module

ModuleState* state(PyObject* module) {
  return static_cast<ModuleState*>(PyModule_GetState(module));
}

int add_type(PyObject* module, PyType_Spec* spec, const char* name,
             PyObject** slot) {
  *slot = PyType_FromModuleAndSpec(module, spec, nullptr);
  if (*slot == nullptr) return -1;
  return PyModule_AddObjectRef(module, name, *slot);
}

int module_exec(PyObject* module) {
  ModuleState* st = state(module);
  if (add_type(module, &FreeRuns_spec, "FreeRuns", &st->free_runs_type) ||
      add_type(module, &KVAllocator_spec, "KVAllocator", &st->allocator_type) ||
      add_type(module, &KVCoordMap_spec, "KVCoordMap", &st->coord_map_type)) {
    return -1;
  }
  if (PyModule_AddIntConstant(module, "MAX_BLOCKS",
                              static_cast<long>(tagma::FreeRuns::kMaxBlocks))) {
    return -1;
  }
  return 0;
}

int module_traverse(PyObject* module, visitproc visit, void* arg) {
  ModuleState* st = state(module);
  if (st == nullptr) return 0;
  Py_VISIT(st->free_runs_type);
  Py_VISIT(st->allocator_type);
  Py_VISIT(st->coord_map_type);
  return 0;
}

int module_clear(PyObject* module) {
  ModuleState* st = state(module);
  if (st == nullptr) return 0;
  Py_CLEAR(st->free_runs_type);
  Py_CLEAR(st->allocator_type);
  Py_CLEAR(st->coord_map_type);
  return 0;
}

void module_free(void* module) { module_clear(static_cast<PyObject*>(module)); }

PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, reinterpret_cast<void*>(module_exec)},
    {0, nullptr},
};

PyModuleDef tagma_module = {
    PyModuleDef_HEAD_INIT,
    "_tagma_C",
    "The tagma KV-cache engine (FreeRuns, KVAllocator, KVCoordMap) on the "
    "Python limited API 3.11.",
    sizeof(ModuleState),
    nullptr,  // methods
    module_slots,
    module_traverse,
    module_clear,
    module_free,
};

}  // namespace

PyMODINIT_FUNC PyInit__tagma_C(void) { return PyModuleDef_Init(&tagma_module); }
