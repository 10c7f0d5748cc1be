// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// vllm._tagma_C: the tagma engine for Python, on the limited API 3.11 (one
// *.abi3.so for every CPython from 3.11 on). Pure C++: no torch, no CUDA.
//
// The module's Python equivalent (types and signatures; see _tagma_C.pyi):
//
//   class FreeRuns:
//       def __init__(self, num_blocks: int): ...
//       def add(self, ids, /) -> None: ...  # ints or an int buffer
//       def add_range(self, start, length, /) -> None: ...
//       def take_after(self, block, n, /) -> int: ...
//       def take(self, n, max_ranges=256, /) -> list[tuple[int, int]]: ...
//       def runs(self) -> list[tuple[int, int]]: ...
//       def validate(self) -> bool: ...
//       num_free, largest_run: int
//       def __contains__(self, block) -> bool: ...
//
//   class Blocks(Sequence[Block]):  # BlockPool.make_blocks
//       def __init__(self, num_blocks: int, pool: object = None): ...
//       def hand_out(self, start, length, /) -> list[Block]: ...
//       def cache_full(self, entries, blocks, hashes, start, end,
//                      block_size, suffix, /) -> int: ...
//       def evict(self, entries, blocks, /) -> list[int]: ...
//       def release(self, blocks, watch, /)
//           -> tuple[list[int], list[Block], list[int], list]: ...
//       def allocate_batched(self, steps, start, req_to_blocks, headroom,
//                            num_cached_block, held_slots, batched_slots,
//                            new_block_ids, new_blocks, make_new, entries,
//                            suffix, block_size, max_model_len, /)
//           -> tuple[int, int]: ...
//
//   class Block:  # vLLM's KVCacheBlock fields, made by Blocks only
//       block_id: int  # read-only
//       pool: object | None  # read-only: Blocks' pool (held weakly)
//       ref_cnt: int
//       is_null: bool
//       block_hash: object | None  # read-only; set_block_hash, reset_hash
//       block_hash_num_tokens: int | None  # read-only
//       prev_free_block, next_free_block: object | None
//       def set_block_hash(self, block_hash, num_tokens=None, /): ...
//       def reset_hash(self): ...
//
// Errors: out of memory -> MemoryError; anything else the caller got wrong
// -> ValueError (a wrong type -> TypeError; an int argument is an int or has
// __index__, as numpy's ints). Messages name the method, its arguments and
// the numbers, values as the caller passed them. `x in obj` raises nothing
// of its own: a non-int, or an int out of range, is not a member.
// A failing call leaves the object as it was. No C++ exception crosses into
// Python: std::bad_alloc becomes MemoryError.
//
// The hot methods are METH_FASTCALL with positional arguments only. No type
// is tracked by the cyclic GC; the GIL guards them. FreeRuns holds no Python
// references. Blocks holds its views and the blocks' hashes; a view holds
// its two queue links, the only references that can form a cycle, and
// Blocks drops them when it goes away.

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

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "kv_free_runs.h"

namespace {

using tagma::Status;

// ------------------------------------------------------------- helpers

struct ModuleState {
  PyObject* free_runs_type;
  PyObject* block_type;
  PyObject* blocks_type;
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

PyObject* exc_for(Status s) {
  return s == Status::kOutOfMemory ? PyExc_MemoryError : PyExc_ValueError;
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

// =============================================================== FreeRuns

struct FreeRunsObject {
  PyObject_HEAD tagma::FreeRuns* runs;
  std::vector<uint32_t>* ids;  // scratch for id conversion
  bool ids_busy;               // an add is reading ids into *ids
};

FreeRunsObject* as_fr(PyObject* self) {
  return reinterpret_cast<FreeRunsObject*>(self);
}

PyObject* FreeRuns_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"num_blocks", nullptr};
  PyObject* on = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:FreeRuns",
                                   const_cast<char**>(kw), &on)) {
    return nullptr;
  }
  int64_t n = 0;
  if (!to_i64(on, "FreeRuns()", "num_blocks", &n)) return nullptr;
  return guarded([&]() -> PyObject* {
    tagma::FreeRuns probe(n);
    if (probe.config_status() != Status::kOk) {
      PyErr_Format(PyExc_ValueError,
                   "FreeRuns(num_blocks=%lld): invalid configuration: "
                   "num_blocks must be in [1, %lld]",
                   static_cast<long long>(n),
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
    case Status::kDuplicateBlock:
      return set_error(s, where,
                       fmt("block %lld", static_cast<long long>(bad)));
    case Status::kOutOfMemory:
      return set_error(s, where,
                       fmt("%llu free blocks, largest run %u",
                           static_cast<unsigned long long>(fr.num_free()),
                           fr.largest_run()));
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

PyObject* FreeRuns_add(PyObject* self, PyObject* const* args,
                       Py_ssize_t nargs) {
  const char* name = "FreeRuns.add";
  if (!check_nargs(name, nargs, 1, 1)) return nullptr;
  return guarded([&]() -> PyObject* {
    FreeRunsObject* o = as_fr(self);
    Buffer buf;
    const uint32_t* data = nullptr;
    size_t count = 0;
    // An id's __index__ may call add on this object again: that call
    // converts into its own vector, not into the one being filled here.
    std::vector<uint32_t> own;
    const Busy busy(&o->ids_busy);
    if (!read_ids(args[0], name, o->runs->num_blocks(), &buf,
                  busy.nested ? &own : o->ids, &data, &count)) {
      return nullptr;
    }
    int64_t bad = -1;
    const Status s = o->runs->add(data, count, &bad);
    if (s != Status::kOk) {
      char where[96];
      std::snprintf(where, sizeof(where), "%s(<%zu ids>)", name, count);
      return FreeRuns_raise(*o->runs, s, where, bad);
    }
    Py_RETURN_NONE;
  });
}

PyObject* FreeRuns_add_range(PyObject* self, PyObject* const* args,
                             Py_ssize_t nargs) {
  const char* name = "FreeRuns.add_range";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  int64_t start = 0, length = 0;
  if (!to_i64(args[0], name, "start", &start) ||
      !to_i64(args[1], name, "length", &length)) {
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    tagma::FreeRuns& fr = *as_fr(self)->runs;
    int64_t bad = -1;
    const Status s = fr.add_range(start, length, &bad);
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
      "FreeRuns(num_blocks=%u, num_free=%llu, num_runs=%zu)", fr.num_blocks(),
      static_cast<unsigned long long>(fr.num_free()), fr.num_runs());
}

PyObject* FreeRuns_get(PyObject* self, void* which) {
  const tagma::FreeRuns& fr = *as_fr(self)->runs;
  return which == nullptr ? u64(fr.num_free()) : u64(fr.largest_run());
}

PyMethodDef FreeRuns_methods[] = {
    {"add", fast(FreeRuns_add), METH_FASTCALL,
     "add(ids, /) -> None\n--\n\nMarks the blocks free (ints, or a "
     "uint32/int32/int64 buffer), coalescing runs. ValueError, nothing "
     "changed, if one is out of range, already free or given twice."},
    {"add_range", fast(FreeRuns_add_range), METH_FASTCALL,
     "add_range(start, length, /) -> None\n--\n\nMarks [start, start + "
     "length) free."},
    {"take_after", fast(FreeRuns_take_after), METH_FASTCALL,
     "take_after(block, n, /) -> int\n--\n\nTakes up to n free blocks from "
     "block + 1 on, as far as they are free; returns how many. ValueError, "
     "nothing changed, if block is not in [-1, num_blocks) or n < 0."},
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
    {"num_free", FreeRuns_get, nullptr, "Free blocks.", nullptr},
    {"largest_run", FreeRuns_get, nullptr,
     "The most blocks one range can take: the longest run.",
     reinterpret_cast<void*>(1)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot FreeRuns_slots[] = {
    {Py_tp_doc, const_cast<char*>(
                    "FreeRuns(num_blocks)\n--\n\n"
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

// ================================================================= Blocks

ModuleState* state(PyObject* module);

// Python's allocator for the block state, so tracemalloc and Python's memory
// statistics count it (it is most of a pool's host memory). Blocks allocates
// and frees it only with the GIL held (construction, dealloc).
template <class T>
struct RawAllocator {
  using value_type = T;
  RawAllocator() = default;
  template <class U>
  explicit RawAllocator(const RawAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = n > SIZE_MAX / sizeof(T) ? nullptr : PyMem_Malloc(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { PyMem_Free(p); }
  bool operator==(const RawAllocator&) const { return true; }
  bool operator!=(const RawAllocator&) const { return false; }
};

template <class T>
using RawVector = std::vector<T, RawAllocator<T>>;

// The pool's per-block state, by block id: what upstream keeps on each
// KVCacheBlock, without a Python object per block. Views (Block) are made
// the first time a block is asked for and kept, so blocks[i] is the same
// object every time. 29 bytes a block, plus a view's 48 once it exists.
struct BlockState {
  static constexpr int64_t kNoTokens = INT64_MIN;  // block_hash_num_tokens None

  explicit BlockState(uint32_t n)
      : ref_cnt(n, 0),
        hash(n, nullptr),
        hash_tokens(n, kNoTokens),
        is_null(n, 0),
        view(n, nullptr) {}

  uint32_t size() const { return static_cast<uint32_t>(ref_cnt.size()); }

  // Drops block id's key (eviction): no hash, no token count.
  void drop_hash(uint32_t id) {
    PyObject* old = hash[id];
    hash[id] = nullptr;
    hash_tokens[id] = kNoTokens;
    Py_XDECREF(old);
  }

  RawVector<int32_t> ref_cnt;
  RawVector<PyObject*> hash;  // owned; nullptr: no hash
  RawVector<int64_t> hash_tokens;
  RawVector<uint8_t> is_null;
  RawVector<PyObject*> view;  // owned; nullptr: not made yet
  PyObject* pool = nullptr;   // owned weak reference to the pool, or none
};

// A view of one block. Its links (the free-block queue's) are object
// references held by the view itself; the Blocks object drops them, and
// detaches the view, when it goes away, so a view kept past its pool
// raises instead of reading freed state.
struct BlockObject {
  PyObject_HEAD BlockState* state;  // nullptr: the Blocks object is gone
  uint32_t id;
  PyObject* prev;  // owned; nullptr: None
  PyObject* next;
};

struct BlocksObject {
  PyObject_HEAD BlockState* state;
  PyObject* block_type;  // owned: the type of the views
};

BlockObject* as_block(PyObject* self) {
  return reinterpret_cast<BlockObject*>(self);
}

BlocksObject* as_blocks(PyObject* self) {
  return reinterpret_cast<BlocksObject*>(self);
}

// The view's state, or nullptr with RuntimeError if its pool is gone.
BlockState* live(PyObject* self) {
  BlockObject* b = as_block(self);
  if (b->state == nullptr) {
    PyErr_Format(PyExc_RuntimeError,
                 "Block %u: its Blocks object (the pool's block state) is "
                 "gone",
                 b->id);
  }
  return b->state;
}

// The view's state for a setter, or nullptr with an error: its pool is gone,
// or the attribute is being deleted (`field` names it).
BlockState* writable(PyObject* self, PyObject* value, const char* field) {
  if (value == nullptr) {
    PyErr_Format(PyExc_TypeError, "Block.%s cannot be deleted", field);
    return nullptr;
  }
  return live(self);
}

PyObject* Block_get_id(PyObject* self, void*) {
  return PyLong_FromUnsignedLong(as_block(self)->id);
}

PyObject* Block_get_ref_cnt(PyObject* self, void*) {
  BlockState* st = live(self);
  if (st == nullptr) return nullptr;
  return PyLong_FromLong(st->ref_cnt[as_block(self)->id]);
}

int Block_set_ref_cnt(PyObject* self, PyObject* value, void*) {
  BlockState* st = writable(self, value, "ref_cnt");
  if (st == nullptr) return -1;
  int64_t v = 0;
  if (!to_i64(value, "Block.ref_cnt", "value", &v)) return -1;
  if (v < INT32_MIN || v > INT32_MAX) {
    PyErr_Format(PyExc_ValueError,
                 "Block.ref_cnt: value=%lld does not fit in int32",
                 static_cast<long long>(v));
    return -1;
  }
  st->ref_cnt[as_block(self)->id] = static_cast<int32_t>(v);
  return 0;
}

PyObject* Block_get_is_null(PyObject* self, void*) {
  BlockState* st = live(self);
  if (st == nullptr) return nullptr;
  return PyBool_FromLong(st->is_null[as_block(self)->id]);
}

int Block_set_is_null(PyObject* self, PyObject* value, void*) {
  BlockState* st = writable(self, value, "is_null");
  if (st == nullptr) return -1;
  const int truth = PyObject_IsTrue(value);
  if (truth < 0) return -1;
  st->is_null[as_block(self)->id] = static_cast<uint8_t>(truth);
  return 0;
}

// The pool the block belongs to (vLLM 0.33's KVCacheBlock.pool), or None:
// Blocks holds it weakly, so a view does not keep its pool alive.
PyObject* Block_get_pool(PyObject* self, void*) {
  BlockState* st = live(self);
  if (st == nullptr) return nullptr;
  if (st->pool == nullptr) Py_RETURN_NONE;
  return PyObject_CallNoArgs(st->pool);
}

PyObject* Block_get_hash(PyObject* self, void*) {
  BlockState* st = live(self);
  if (st == nullptr) return nullptr;
  PyObject* h = st->hash[as_block(self)->id];
  return Py_NewRef(h == nullptr ? Py_None : h);
}

PyObject* Block_get_hash_tokens(PyObject* self, void*) {
  BlockState* st = live(self);
  if (st == nullptr) return nullptr;
  const int64_t t = st->hash_tokens[as_block(self)->id];
  if (t == BlockState::kNoTokens) Py_RETURN_NONE;
  return PyLong_FromLongLong(t);
}

// prev_free_block (which == nullptr) or next_free_block.
PyObject* Block_get_link(PyObject* self, void* which) {
  if (live(self) == nullptr) return nullptr;
  BlockObject* b = as_block(self);
  PyObject* link = which == nullptr ? b->prev : b->next;
  return Py_NewRef(link == nullptr ? Py_None : link);
}

int Block_set_link(PyObject* self, PyObject* value, void* which) {
  if (live(self) == nullptr) return -1;
  BlockObject* b = as_block(self);
  PyObject** slot = which == nullptr ? &b->prev : &b->next;
  PyObject* old = *slot;
  *slot = value == nullptr || value == Py_None ? nullptr : Py_NewRef(value);
  Py_XDECREF(old);  // last: it may run arbitrary code
  return 0;
}

// Keywords as upstream calls it: set_block_hash(h, num_tokens=n).
PyObject* Block_set_block_hash(PyObject* self, PyObject* args, PyObject* kwds) {
  const char* name = "Block.set_block_hash";
  static const char* kw[] = {"block_hash", "num_tokens", nullptr};
  PyObject* hash = nullptr;
  PyObject* num_tokens = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:set_block_hash",
                                   const_cast<char**>(kw), &hash,
                                   &num_tokens)) {
    return nullptr;
  }
  BlockState* st = live(self);
  if (st == nullptr) return nullptr;
  const uint32_t id = as_block(self)->id;
  int64_t tokens = BlockState::kNoTokens;
  if (num_tokens != Py_None) {
    if (!to_i64(num_tokens, name, "num_tokens", &tokens)) return nullptr;
    if (tokens < 0) {
      PyErr_Format(PyExc_ValueError, "%s: num_tokens=%lld must be >= 0", name,
                   static_cast<long long>(tokens));
      return nullptr;
    }
  }
  if (hash == Py_None) {
    PyErr_Format(PyExc_ValueError, "%s: block %u: the hash must not be None",
                 name, id);
    return nullptr;
  }
  if (st->hash[id] != nullptr || st->hash_tokens[id] != BlockState::kNoTokens) {
    PyErr_Format(PyExc_ValueError, "%s: block %u already has a hash", name, id);
    return nullptr;
  }
  st->hash[id] = Py_NewRef(hash);
  st->hash_tokens[id] = tokens;
  Py_RETURN_NONE;
}

PyObject* Block_reset_hash(PyObject* self, PyObject*) {
  BlockState* st = live(self);
  if (st == nullptr) return nullptr;
  st->drop_hash(as_block(self)->id);
  Py_RETURN_NONE;
}

// A link for repr: None, its block_id (no recursion into linked blocks),
// or the object itself if it has none.
PyObject* link_id(PyObject* link) {
  if (link == nullptr) Py_RETURN_NONE;
  PyObject* id = PyObject_GetAttrString(link, "block_id");
  if (id == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
    return Py_NewRef(link);
  }
  return id;
}

PyObject* Block_repr(PyObject* self) {
  BlockObject* b = as_block(self);
  if (b->state == nullptr) {
    return PyUnicode_FromFormat("Block(block_id=%u, detached)", b->id);
  }
  const BlockState& st = *b->state;
  PyObject* prev = link_id(b->prev);
  PyObject* next = prev == nullptr ? nullptr : link_id(b->next);
  PyObject* hash = st.hash[b->id] == nullptr ? Py_None : st.hash[b->id];
  PyObject* out = nullptr;
  if (next != nullptr) {
    const int64_t t = st.hash_tokens[b->id];
    PyObject* tokens = t == BlockState::kNoTokens ? Py_NewRef(Py_None)
                                                  : PyLong_FromLongLong(t);
    if (tokens != nullptr) {
      out = PyUnicode_FromFormat(
          "Block(block_id=%u, ref_cnt=%d, block_hash=%R, "
          "block_hash_num_tokens=%R, is_null=%s, prev_free_block=%R, "
          "next_free_block=%R)",
          b->id, st.ref_cnt[b->id], hash, tokens,
          st.is_null[b->id] ? "True" : "False", prev, next);
      Py_DECREF(tokens);
    }
  }
  Py_XDECREF(prev);
  Py_XDECREF(next);
  return out;
}

void Block_dealloc(PyObject* self) {
  // Only after its Blocks object, which owns a reference to every view.
  PyTypeObject* type = Py_TYPE(self);
  BlockObject* b = as_block(self);
  Py_CLEAR(b->prev);
  Py_CLEAR(b->next);
  auto tp_free = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  tp_free(self);
  Py_DECREF(type);
}

PyMethodDef Block_methods[] = {
    {"set_block_hash",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)(void)>(Block_set_block_hash)),
     METH_VARARGS | METH_KEYWORDS,
     "set_block_hash(block_hash, num_tokens=None) -> None\n--\n\n"
     "Sets the block's prefix-cache key. ValueError if it has one."},
    {"reset_hash", Block_reset_hash, METH_NOARGS,
     "reset_hash() -> None\n--\n\nDrops the key (eviction)."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef Block_getset[] = {
    {"block_id", Block_get_id, nullptr, "The block id.", nullptr},
    {"ref_cnt", Block_get_ref_cnt, Block_set_ref_cnt,
     "Requests (and other holders) using the block.", nullptr},
    {"is_null", Block_get_is_null, Block_set_is_null,
     "The placeholder block that is never cached.", nullptr},
    {"pool", Block_get_pool, nullptr,
     "The pool given to Blocks, or None (also once it is gone).", nullptr},
    {"block_hash", Block_get_hash, nullptr, "The prefix-cache key, or None.",
     nullptr},
    {"block_hash_num_tokens", Block_get_hash_tokens, nullptr,
     "Prefix tokens the key covers, or None.", nullptr},
    {"prev_free_block", Block_get_link, Block_set_link,
     "The free-block queue's link.", nullptr},
    {"next_free_block", Block_get_link, Block_set_link,
     "The free-block queue's link.", reinterpret_cast<void*>(1)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot Block_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("A view of one block of a Blocks object: the fields of "
                       "vLLM's KVCacheBlock, read from and written to the "
                       "engine's per-block state. Made by Blocks only.")},
    {Py_tp_dealloc, reinterpret_cast<void*>(Block_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(Block_repr)},
    {Py_tp_methods, Block_methods},
    {Py_tp_getset, Block_getset},
    {0, nullptr},
};

// No Py_TPFLAGS_HAVE_GC: the collector never walks a view. No tp_new: only
// Blocks makes them.
PyType_Spec Block_spec = {
    "vllm._tagma_C.Block",
    sizeof(BlockObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE |
        Py_TPFLAGS_DISALLOW_INSTANTIATION,
    Block_slots,
};

// The view of block id (a new reference), made on first use.
PyObject* view_of(BlocksObject* o, uint32_t id) {
  PyObject*& slot = o->state->view[id];
  if (slot == nullptr) {
    auto type = reinterpret_cast<PyTypeObject*>(o->block_type);
    auto alloc = reinterpret_cast<allocfunc>(PyType_GetSlot(type, Py_tp_alloc));
    PyObject* v = alloc(type, 0);
    if (v == nullptr) return nullptr;
    BlockObject* b = as_block(v);
    b->state = o->state;
    b->id = id;
    b->prev = nullptr;
    b->next = nullptr;
    slot = v;
  }
  return Py_NewRef(slot);
}

PyObject* Blocks_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"num_blocks", "pool", nullptr};
  PyObject* on = nullptr;
  PyObject* pool = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:Blocks",
                                   const_cast<char**>(kw), &on, &pool)) {
    return nullptr;
  }
  int64_t n = 0;
  if (!to_i64(on, "Blocks()", "num_blocks", &n)) return nullptr;
  if (n < 1 || n > static_cast<int64_t>(tagma::FreeRuns::kMaxBlocks)) {
    PyErr_Format(PyExc_ValueError,
                 "Blocks(num_blocks=%lld): num_blocks must be in [1, %lld]",
                 static_cast<long long>(n),
                 static_cast<long long>(tagma::FreeRuns::kMaxBlocks));
    return nullptr;
  }
  PyObject* module = PyType_GetModule(type);
  if (module == nullptr) return nullptr;
  PyObject* block_type = state(module)->block_type;
  return guarded([&]() -> PyObject* {
    auto st = std::make_unique<BlockState>(static_cast<uint32_t>(n));
    if (pool != Py_None) {
      st->pool = PyWeakref_NewRef(pool, nullptr);  // TypeError if it cannot
      if (st->pool == nullptr) return nullptr;
    }
    auto alloc = reinterpret_cast<allocfunc>(PyType_GetSlot(type, Py_tp_alloc));
    PyObject* self = alloc(type, 0);
    if (self == nullptr) {
      Py_CLEAR(st->pool);
      return nullptr;
    }
    as_blocks(self)->state = st.release();
    as_blocks(self)->block_type = Py_NewRef(block_type);
    return self;
  });
}

void Blocks_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  BlocksObject* o = as_blocks(self);
  BlockState* st = o->state;
  o->state = nullptr;
  if (st != nullptr) {
    // Detach every view and drop its links first: links between views (and
    // to objects that link back) are the only cycles, and nothing else
    // breaks them. Releasing a link may run arbitrary code, which finds the
    // views already detached.
    for (PyObject* v : st->view) {
      if (v != nullptr) as_block(v)->state = nullptr;
    }
    // A view stays owned here until its own turn, so releasing another's
    // links cannot free it.
    for (PyObject*& v : st->view) {
      if (v == nullptr) continue;
      Py_CLEAR(as_block(v)->prev);
      Py_CLEAR(as_block(v)->next);
      Py_CLEAR(v);
    }
    for (PyObject*& h : st->hash) Py_CLEAR(h);
    Py_CLEAR(st->pool);
    delete st;
  }
  Py_XDECREF(o->block_type);
  auto tp_free = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  tp_free(self);
  Py_DECREF(type);
}

Py_ssize_t Blocks_len(PyObject* self) {
  return static_cast<Py_ssize_t>(as_blocks(self)->state->size());
}

// blocks[i] for the sequence protocol (iteration, negative i already
// adjusted by the caller).
PyObject* Blocks_item(PyObject* self, Py_ssize_t i) {
  BlocksObject* o = as_blocks(self);
  if (i < 0 || i >= static_cast<Py_ssize_t>(o->state->size())) {
    PyErr_Format(PyExc_IndexError, "Blocks index %zd out of range [0, %u)", i,
                 o->state->size());
    return nullptr;
  }
  return view_of(o, static_cast<uint32_t>(i));
}

// blocks[i] (negative from the end) or blocks[a:b:c] (a list of views).
PyObject* Blocks_subscript(PyObject* self, PyObject* key) {
  BlocksObject* o = as_blocks(self);
  const Py_ssize_t n = static_cast<Py_ssize_t>(o->state->size());
  if (PySlice_Check(key)) {
    Py_ssize_t start = 0, stop = 0, step = 0;
    if (PySlice_Unpack(key, &start, &stop, &step) < 0) return nullptr;
    const Py_ssize_t k = PySlice_AdjustIndices(n, &start, &stop, step);
    PyObject* list = PyList_New(k);
    if (list == nullptr) return nullptr;
    for (Py_ssize_t j = 0, i = start; j < k; ++j, i += step) {
      PyObject* v = view_of(o, static_cast<uint32_t>(i));
      if (v == nullptr || PyList_SetItem(list, j, v) != 0) {  // steals v
        Py_DECREF(list);
        return nullptr;
      }
    }
    return list;
  }
  if (!PyIndex_Check(key)) {
    PyErr_Format(PyExc_TypeError,
                 "Blocks indices must be integers or slices, not %R",
                 reinterpret_cast<PyObject*>(Py_TYPE(key)));
    return nullptr;
  }
  const Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
  if (i == -1 && PyErr_Occurred()) return nullptr;
  return Blocks_item(self, i < 0 ? i + n : i);
}

// hand_out(start, length): blocks [start, start + length), each free and
// clean (ref_cnt 0, no hash, not the null block), get ref_cnt 1; returns
// their views. The tagma pool's hand-out of a placed range in one call.
PyObject* Blocks_hand_out(PyObject* self, PyObject* const* args,
                          Py_ssize_t nargs) {
  const char* name = "Blocks.hand_out";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  int64_t start = 0, length = 0;
  if (!to_i64(args[0], name, "start", &start) ||
      !to_i64(args[1], name, "length", &length)) {
    return nullptr;
  }
  BlocksObject* o = as_blocks(self);
  BlockState& st = *o->state;
  const int64_t n = st.size();
  if (start < 0 || length < 0 || start > n || length > n - start) {
    PyErr_Format(PyExc_ValueError,
                 "%s(start=%lld, length=%lld): not a range of [0, %lld)", name,
                 static_cast<long long>(start), static_cast<long long>(length),
                 static_cast<long long>(n));
    return nullptr;
  }
  const auto first = static_cast<uint32_t>(start);
  const auto end = static_cast<uint32_t>(start + length);
  // Check all before changing any: a failing call changes nothing.
  for (uint32_t i = first; i < end; ++i) {
    if (st.ref_cnt[i] != 0 || st.hash[i] != nullptr || st.is_null[i]) {
      PyErr_Format(PyExc_ValueError,
                   "%s(start=%lld, length=%lld): block %u is not free and "
                   "clean (ref_cnt=%d, %s)",
                   name, static_cast<long long>(start),
                   static_cast<long long>(length), i, st.ref_cnt[i],
                   st.is_null[i]           ? "the null block"
                   : st.hash[i] != nullptr ? "cached"
                                           : "no hash");
      return nullptr;
    }
  }
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(length));
  if (list == nullptr) return nullptr;
  for (uint32_t i = first; i < end; ++i) {
    PyObject* v = view_of(o, i);
    if (v == nullptr || PyList_SetItem(list, i - first, v) != 0) {
      Py_DECREF(list);  // no ref_cnt changed yet
      return nullptr;
    }
  }
  for (uint32_t i = first; i < end; ++i) st.ref_cnt[i] = 1;
  return list;
}

// Whether `item` is one of this Blocks object's views.
bool is_view_of(BlocksObject* o, PyObject* item) {
  return Py_TYPE(item) == reinterpret_cast<PyTypeObject*>(o->block_type) &&
         as_block(item)->state == o->state;
}

// The view of `item` if it is one of this Blocks object's views, else
// nullptr with TypeError naming the argument and the index.
BlockObject* own_view(BlocksObject* o, PyObject* item, const char* name,
                      Py_ssize_t i) {
  if (!is_view_of(o, item)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: blocks[%zd] is %R, not a Block of this pool", name, i,
                 reinterpret_cast<PyObject*>(Py_TYPE(item)));
    return nullptr;
  }
  return as_block(item);
}

// entries[key] gets view v as upstream's BlockHashToBlockMap.insert does:
// the view alone, or {block_id: view} once a key has several blocks.
bool insert_entry(PyObject* entries, PyObject* key, PyObject* existing,
                  PyObject* v) {
  if (existing == nullptr) return PyDict_SetItem(entries, key, v) == 0;
  PyObject* id = PyLong_FromUnsignedLong(as_block(v)->id);
  if (id == nullptr) return false;
  bool ok = false;
  if (PyDict_Check(existing)) {
    ok = PyDict_SetItem(existing, id, v) == 0;
  } else {
    PyObject* both = PyDict_New();
    PyObject* old_id = both == nullptr
                           ? nullptr
                           : PyLong_FromUnsignedLong(as_block(existing)->id);
    ok = old_id != nullptr && PyDict_SetItem(both, old_id, existing) == 0 &&
         PyDict_SetItem(both, id, v) == 0 &&
         PyDict_SetItem(entries, key, both) == 0;
    Py_XDECREF(old_id);
    Py_XDECREF(both);
  }
  Py_DECREF(id);
  return ok;
}

// Prefix-caches view v, block i of a request (not the null block, no key
// yet), under the key hash + suffix with (i + 1) * block_size tokens, as
// upstream's BlockHashToBlockMap.insert and KVCacheBlock.block_hash do it;
// a key that already holds the block leaves it as it is. False with an
// exception set on failure.
bool cache_block(BlocksObject* o, PyObject* entries, PyObject* hash,
                 PyObject* suffix, PyObject* v, Py_ssize_t i,
                 int64_t block_size, const char* name) {
  BlockState& st = *o->state;
  const uint32_t id = as_block(v)->id;
  PyObject* key = Py_NewRef(hash);
  PyBytes_Concat(&key, suffix);  // a new object: hashes stay as they are
  if (key == nullptr) return false;
  PyObject* existing = PyDict_GetItemWithError(entries, key);  // borrowed
  if (existing == nullptr && PyErr_Occurred()) {
    Py_DECREF(key);
    return false;
  }
  if (existing == v) {  // the key holds this block already
    Py_DECREF(key);
    return true;
  }
  if (existing != nullptr && !PyDict_Check(existing) &&
      own_view(o, existing, name, i) == nullptr) {
    Py_DECREF(key);
    return false;
  }
  if (existing != nullptr && PyDict_Check(existing)) {
    PyObject* id_obj = PyLong_FromUnsignedLong(id);
    const int has = id_obj == nullptr ? -1 : PyDict_Contains(existing, id_obj);
    Py_XDECREF(id_obj);
    if (has != 0) {
      Py_DECREF(key);
      return has > 0;
    }
  }
  Py_INCREF(existing == nullptr ? Py_None : existing);  // kept across SetItem
  const bool ok = insert_entry(entries, key, existing, v);
  Py_DECREF(existing == nullptr ? Py_None : existing);
  if (!ok) {
    Py_DECREF(key);
    return false;
  }
  st.hash[id] = key;  // owns the new key
  st.hash_tokens[id] = (static_cast<int64_t>(i) + 1) * block_size;
  return true;
}

// cache_full(entries, blocks, hashes, start, end, block_size, suffix): the
// prefix caching of blocks[start:end], a request's newly full blocks, as
// upstream's BlockPool.cache_full_blocks does it without KV events, masks or
// a hash block size of its own: block i (not the null block) gets the key
// hashes[i] + suffix (the group id's 4 bytes), with (i + 1) * block_size
// tokens, and `entries` (the map's dict) gets the block under that key.
// Stops at the first block that already has a key (upstream's promotion
// path, left to the caller) and returns its index, else `end`.
PyObject* Blocks_cache_full(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs) {
  const char* name = "Blocks.cache_full";
  if (!check_nargs(name, nargs, 7, 7)) return nullptr;
  PyObject* entries = args[0];
  PyObject* blocks = args[1];
  PyObject* hashes = args[2];
  PyObject* suffix = args[6];
  int64_t start = 0, end = 0, block_size = 0;
  if (!to_i64(args[3], name, "start", &start) ||
      !to_i64(args[4], name, "end", &end) ||
      !to_i64(args[5], name, "block_size", &block_size)) {
    return nullptr;
  }
  if (!PyDict_Check(entries) || !PyList_Check(blocks) ||
      !PyList_Check(hashes) || !PyBytes_Check(suffix)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: entries must be a dict, blocks and hashes lists, suffix "
                 "bytes; got %R, %R, %R, %R",
                 name, reinterpret_cast<PyObject*>(Py_TYPE(entries)),
                 reinterpret_cast<PyObject*>(Py_TYPE(blocks)),
                 reinterpret_cast<PyObject*>(Py_TYPE(hashes)),
                 reinterpret_cast<PyObject*>(Py_TYPE(suffix)));
    return nullptr;
  }
  const Py_ssize_t num_blocks = PyList_Size(blocks);
  const Py_ssize_t num_hashes = PyList_Size(hashes);
  if (start < 0 || start > end || end > num_blocks || end > num_hashes ||
      block_size < 1) {
    PyErr_Format(PyExc_ValueError,
                 "%s(start=%lld, end=%lld, block_size=%lld): needs 0 <= start "
                 "<= end <= %zd blocks and %zd hashes, block_size >= 1",
                 name, static_cast<long long>(start),
                 static_cast<long long>(end),
                 static_cast<long long>(block_size), num_blocks, num_hashes);
    return nullptr;
  }
  BlocksObject* o = as_blocks(self);
  BlockState& st = *o->state;
  // Check every argument before changing anything.
  for (Py_ssize_t i = start; i < end; ++i) {
    if (own_view(o, PyList_GetItem(blocks, i), name, i) == nullptr) {
      return nullptr;
    }
    if (!PyBytes_Check(PyList_GetItem(hashes, i))) {
      PyErr_Format(
          PyExc_TypeError, "%s: hashes[%zd] is %R, not bytes", name, i,
          reinterpret_cast<PyObject*>(Py_TYPE(PyList_GetItem(hashes, i))));
      return nullptr;
    }
  }
  Py_ssize_t i = start;
  for (; i < end; ++i) {
    PyObject* v = PyList_GetItem(blocks, i);  // borrowed, checked above
    const uint32_t id = as_block(v)->id;
    if (st.is_null[id]) continue;
    if (st.hash[id] != nullptr) break;  // promotion: the caller's
    if (!cache_block(o, entries, PyList_GetItem(hashes, i), suffix, v, i,
                     block_size, name)) {
      return nullptr;
    }
  }
  return PyLong_FromSsize_t(i);
}

// evict(entries, blocks): upstream's BlockPool.evict_blocks for a batch of
// this pool's blocks, without KV events, the metrics collector or partial
// prefix entries (the caller takes upstream's path when any is on). Each
// block (a view in the list `blocks`; the null block is skipped) that has a
// key loses it, and `entries` (the prefix map's dict) loses the block under
// that key as BlockHashToBlockMap.pop(key, block_id) does it: a key holding
// the block alone goes, a key holding {block_id: block} drops it (and goes
// once empty), a key holding another block stays. Returns the blocks' ids,
// in order, for the run index. Every argument is checked before anything
// changes.
PyObject* Blocks_evict(PyObject* self, PyObject* const* args,
                       Py_ssize_t nargs) {
  const char* name = "Blocks.evict";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  PyObject* entries = args[0];
  PyObject* blocks = args[1];
  if (!PyDict_Check(entries) || !PyList_Check(blocks)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: entries must be a dict and blocks a list; got %R, %R",
                 name, reinterpret_cast<PyObject*>(Py_TYPE(entries)),
                 reinterpret_cast<PyObject*>(Py_TYPE(blocks)));
    return nullptr;
  }
  BlocksObject* o = as_blocks(self);
  BlockState& st = *o->state;
  const Py_ssize_t n = PyList_Size(blocks);
  // First every block checked and its id made: the ids are also the keys of
  // {block_id: block} entries, so nothing below allocates or fails.
  PyObject* ids = PyList_New(n);
  if (ids == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    BlockObject* b = own_view(o, PyList_GetItem(blocks, i), name, i);
    PyObject* id = b == nullptr ? nullptr : PyLong_FromUnsignedLong(b->id);
    if (id == nullptr) {
      Py_DECREF(ids);
      return nullptr;
    }
    PyList_SetItem(ids, i, id);  // steals
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    const uint32_t id = as_block(PyList_GetItem(blocks, i))->id;
    PyObject* key = st.hash[id];
    // No key, or a block listed twice whose key went already.
    if (key == nullptr || st.is_null[id]) continue;
    // Bytes keys and int ids hash and compare without raising, and a dict
    // deletes a key it holds, so these calls cannot fail.
    PyObject* entry = PyDict_GetItemWithError(entries, key);  // borrowed
    if (entry != nullptr && entry == st.view[id]) {
      PyDict_DelItem(entries, key);
    } else if (entry != nullptr && PyDict_Check(entry)) {
      PyObject* id_obj = PyList_GetItem(ids, i);  // borrowed
      if (PyDict_Contains(entry, id_obj) > 0) PyDict_DelItem(entry, id_obj);
      if (PyDict_Size(entry) == 0) PyDict_DelItem(entries, key);
    }
    st.drop_hash(id);
  }
  return ids;
}

// release(blocks, watch): the reference drop of BlockPool.free_blocks.
// Every item of the iterable `blocks` that is a view of this table and not
// the null block loses one reference; items that are not views of this
// table are returned untouched (`others`, in order) for the caller to route.
// Returns (clean, cached, watched, others): the ids of the blocks that
// became free without a key, the views of those that became free with one
// (both in the given order), and the ids among them that are keys of the
// dict `watch` (None: none). A reference count that would drop below 0
// raises ValueError with every count restored.
PyObject* Blocks_release(PyObject* self, PyObject* const* args,
                         Py_ssize_t nargs) {
  const char* name = "Blocks.release";
  if (!check_nargs(name, nargs, 2, 2)) return nullptr;
  PyObject* watch = args[1];
  if (watch != Py_None && !PyDict_Check(watch)) {
    PyErr_Format(PyExc_TypeError, "%s: watch must be a dict or None, not %R",
                 name, reinterpret_cast<PyObject*>(Py_TYPE(watch)));
    return nullptr;
  }
  BlocksObject* o = as_blocks(self);
  BlockState& st = *o->state;
  PyObject* it = PyObject_GetIter(args[0]);
  if (it == nullptr) return nullptr;
  PyObject* others = PyList_New(0);
  if (others == nullptr) {
    Py_DECREF(it);
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    RawVector<uint32_t> ids;
    bool failed = false;
    while (PyObject* item = PyIter_Next(it)) {
      if (is_view_of(o, item)) {
        if (!st.is_null[as_block(item)->id]) ids.push_back(as_block(item)->id);
      } else if (PyList_Append(others, item) != 0) {
        failed = true;
      }
      Py_DECREF(item);
      if (failed) break;
    }
    Py_DECREF(it);
    if (failed || PyErr_Occurred()) {
      Py_DECREF(others);
      return nullptr;
    }
    // Drop the references; a block listed twice reaches 0 at most once.
    RawVector<uint8_t> freed(ids.size(), 0);
    for (size_t k = 0; k < ids.size(); ++k) {
      const uint32_t id = ids[k];
      if (st.ref_cnt[id] <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s: block %u is freed with ref_cnt %d (freed more "
                     "often than held)",
                     name, id, st.ref_cnt[id]);
        for (size_t j = 0; j < k; ++j) ++st.ref_cnt[ids[j]];
        Py_DECREF(others);
        return nullptr;
      }
      freed[k] = --st.ref_cnt[id] == 0;
    }
    PyObject* clean = PyList_New(0);
    PyObject* cached = PyList_New(0);
    PyObject* watched = PyList_New(0);
    bool ok = clean != nullptr && cached != nullptr && watched != nullptr;
    for (size_t k = 0; ok && k < ids.size(); ++k) {
      if (!freed[k]) continue;
      const uint32_t id = ids[k];
      PyObject* id_obj = PyLong_FromUnsignedLong(id);
      if (id_obj == nullptr) {
        ok = false;
        break;
      }
      if (st.hash[id] == nullptr) {
        ok = PyList_Append(clean, id_obj) == 0;
      } else {
        PyObject* v = view_of(o, id);
        ok = v != nullptr && PyList_Append(cached, v) == 0;
        Py_XDECREF(v);
      }
      if (ok && watch != Py_None) {
        const int has = PyDict_Contains(watch, id_obj);
        ok = has >= 0 && (has == 0 || PyList_Append(watched, id_obj) == 0);
      }
      Py_DECREF(id_obj);
    }
    if (!ok) {  // out of memory: the counts stay dropped, as upstream's loop
      Py_XDECREF(clean);
      Py_XDECREF(cached);
      Py_XDECREF(watched);
      Py_DECREF(others);
      return nullptr;
    }
    PyObject* out = PyTuple_Pack(4, clean, cached, watched, others);
    Py_DECREF(clean);
    Py_DECREF(cached);
    Py_DECREF(watched);
    Py_DECREF(others);
    return out;
  });
}

// An attribute of o as int64 (new reference dropped); false with an
// exception set.
bool attr_i64(PyObject* o, PyObject* attr, const char* where, int64_t* out) {
  PyObject* v = PyObject_GetAttr(o, attr);
  if (v == nullptr) return false;
  const bool ok = to_i64(v, where, "request attribute", out);
  Py_DECREF(v);
  return ok;
}

// d[key] as int64 with `fallback` where d has no key; false with an
// exception set.
bool dict_i64(PyObject* d, PyObject* key, int64_t fallback, const char* where,
              int64_t* out) {
  PyObject* v = PyDict_GetItemWithError(d, key);  // borrowed
  if (v == nullptr) {
    *out = fallback;
    return !PyErr_Occurred();
  }
  return to_i64(v, where, "dict value", out);
}

// d[key] = v for an int v; false with an exception set.
bool dict_set_i64(PyObject* d, PyObject* key, int64_t v) {
  PyObject* obj = PyLong_FromLongLong(v);
  if (obj == nullptr) return false;
  const int rc = PyDict_SetItem(d, key, obj);
  Py_DECREF(obj);
  return rc == 0;
}

struct RequestAttrs {
  PyObject* request_id;
  PyObject* num_computed_tokens;
  PyObject* num_tokens;
  PyObject* block_hashes;
};

// Interned once; never freed (four strings for the process's life).
const RequestAttrs* request_attrs() {
  static RequestAttrs attrs{};
  if (attrs.block_hashes == nullptr) {
    PyObject* a = PyUnicode_InternFromString("request_id");
    PyObject* b = PyUnicode_InternFromString("num_computed_tokens");
    PyObject* c = PyUnicode_InternFromString("num_tokens");
    PyObject* d = PyUnicode_InternFromString("block_hashes");
    if (a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
      Py_XDECREF(a);
      Py_XDECREF(b);
      Py_XDECREF(c);
      Py_XDECREF(d);
      return nullptr;
    }
    attrs = {a, b, c, d};
  }
  return &attrs;
}

// What one promised step needs, worked out before anything changes.
struct StepPlan {
  PyObject* blocks;  // borrowed: the request's list of views
  Py_ssize_t num_blocks;
  uint32_t last;       // its last block
  bool grow;           // takes block last + 1 from the headroom after last
  int64_t held;        // that headroom (grow only)
  int64_t num_cached;  // its blocks already cached (caching on)
  int64_t num_full;    // its full blocks after the step (> num_cached: cache)
  PyObject* hashes;    // new reference when caching, else nullptr
};

// allocate_batched(steps, start, req_to_blocks, headroom, num_cached_block,
// held_slots, batched_slots, new_block_ids, new_blocks, make_new, entries,
// suffix, block_size, max_model_len): the decoding steps the tagma manager
// promised in batched_slots (KVCacheManager.allocate_batched), from
// steps[start] on, in one call. See the method's doc below.
PyObject* Blocks_allocate_batched(PyObject* self, PyObject* const* args,
                                  Py_ssize_t nargs) {
  const char* name = "Blocks.allocate_batched";
  if (!check_nargs(name, nargs, 14, 14)) return nullptr;
  PyObject* steps = args[0];
  PyObject* req_to_blocks = args[2];
  PyObject* headroom = args[3];
  PyObject* num_cached_block = args[4];
  PyObject* held_slots = args[5];
  PyObject* batched_slots = args[6];
  PyObject* new_block_ids = args[7];
  PyObject* new_blocks = args[8];
  PyObject* make_new = args[9];
  PyObject* entries = args[10];
  PyObject* suffix = args[11];
  int64_t start = 0, block_size = 0, max_model_len = 0;
  if (!to_i64(args[1], name, "start", &start) ||
      !to_i64(args[12], name, "block_size", &block_size) ||
      !to_i64(args[13], name, "max_model_len", &max_model_len)) {
    return nullptr;
  }
  const bool caching = num_cached_block != Py_None;
  if (!PyList_Check(steps) || !PyDict_Check(req_to_blocks) ||
      !PyDict_Check(headroom) || (caching && !PyDict_Check(num_cached_block)) ||
      !PyDict_Check(held_slots) || !PyDict_Check(batched_slots) ||
      (new_block_ids != Py_None && !PyList_Check(new_block_ids)) ||
      !PyDict_Check(new_blocks) || !PyCallable_Check(make_new) ||
      (entries != Py_None && !PyDict_Check(entries)) ||
      (entries != Py_None && !PyBytes_Check(suffix))) {
    PyErr_Format(PyExc_TypeError,
                 "%s: needs steps a list; req_to_blocks, headroom, held_slots, "
                 "batched_slots and new_blocks dicts; num_cached_block a dict "
                 "or None; new_block_ids a list or None; make_new callable; "
                 "entries a dict or None, with suffix bytes",
                 name);
    return nullptr;
  }
  const Py_ssize_t num_steps = PyList_Size(steps);
  if (start < 0 || start > num_steps || block_size < 1 || max_model_len < 1) {
    PyErr_Format(PyExc_ValueError,
                 "%s(start=%lld, block_size=%lld, max_model_len=%lld): needs "
                 "0 <= start <= %zd steps, block_size and max_model_len >= 1",
                 name, static_cast<long long>(start),
                 static_cast<long long>(block_size),
                 static_cast<long long>(max_model_len), num_steps);
    return nullptr;
  }
  const RequestAttrs* attrs = request_attrs();
  if (attrs == nullptr) return nullptr;
  BlocksObject* o = as_blocks(self);
  BlockState& st = *o->state;
  int64_t taken = 0;
  Py_ssize_t k = start;
  for (; k < num_steps; ++k) {
    PyObject* step = PyList_GetItem(steps, k);  // borrowed
    if (!PyTuple_Check(step) || PyTuple_Size(step) != 2) break;
    PyObject* request = PyTuple_GetItem(step, 0);
    int64_t num_new = 0, num_computed = 0;
    if (!to_i64(PyTuple_GetItem(step, 1), name, "num_new_tokens", &num_new)) {
      return nullptr;
    }
    PyObject* rid = PyObject_GetAttr(request, attrs->request_id);
    if (rid == nullptr) return nullptr;
    // Every exit below drops rid (and the plan's hashes): `done` says
    // whether the step was taken, `failed` whether an exception is set.
    StepPlan plan{};
    bool failed = false;
    bool done = false;
    do {
      if (!attr_i64(request, attrs->num_computed_tokens, name, &num_computed)) {
        failed = true;
        break;
      }
      plan.blocks = PyDict_GetItemWithError(req_to_blocks, rid);
      if (plan.blocks == nullptr) {
        failed = PyErr_Occurred() != nullptr;
        break;
      }
      if (!PyList_Check(plan.blocks)) break;
      plan.num_blocks = PyList_Size(plan.blocks);
      if (plan.num_blocks == 0) break;
      PyObject* last = PyList_GetItem(plan.blocks, plan.num_blocks - 1);
      if (!is_view_of(o, last)) break;
      plan.last = as_block(last)->id;
      const int64_t num_tokens = num_computed + num_new;
      const int64_t want =
          (std::min(num_tokens, max_model_len) + block_size - 1) / block_size;
      if (want > plan.num_blocks + 1) break;  // more than the headroom's one
      plan.grow = want > plan.num_blocks;
      if (plan.grow) {
        PyObject* key = PyLong_FromUnsignedLong(plan.last);
        const bool ok =
            key != nullptr && dict_i64(headroom, key, 0, name, &plan.held);
        Py_XDECREF(key);
        if (!ok) {
          failed = true;
          break;
        }
        const uint32_t next = plan.last + 1;
        if (plan.held < 1 || next >= st.size() || st.ref_cnt[next] != 0 ||
            st.hash[next] != nullptr || st.is_null[next]) {
          break;  // the caller's path raises or copes
        }
      }
      const Py_ssize_t num_after = plan.num_blocks + (plan.grow ? 1 : 0);
      if (caching) {
        if (!dict_i64(num_cached_block, rid, 0, name, &plan.num_cached)) {
          failed = true;
          break;
        }
        plan.num_full = plan.num_cached;
        if (num_tokens / block_size > plan.num_cached) {
          if (entries == Py_None) break;  // the caller caches
          int64_t known = 0;
          if (!attr_i64(request, attrs->num_tokens, name, &known)) {
            failed = true;
            break;
          }
          plan.num_full = std::min(num_tokens, known) / block_size;
        }
        if (plan.num_full > plan.num_cached) {
          plan.hashes = PyObject_GetAttr(request, attrs->block_hashes);
          if (plan.hashes == nullptr) {
            failed = true;
            break;
          }
          const int64_t end = std::min<int64_t>(plan.num_full, num_after);
          if (!PyList_Check(plan.hashes) || end > PyList_Size(plan.hashes)) {
            break;
          }
          bool ready = true;
          for (int64_t j = plan.num_cached; ready && j < end; ++j) {
            ready = PyBytes_Check(PyList_GetItem(plan.hashes, j));
            if (!ready || j >= plan.num_blocks) continue;  // new: clean
            PyObject* v = PyList_GetItem(plan.blocks, j);
            ready = is_view_of(o, v) && (st.is_null[as_block(v)->id] ||
                                         st.hash[as_block(v)->id] == nullptr);
          }
          if (!ready) break;  // a promotion, or not the engine's blocks
          plan.num_full = end;
        }
      }
      // Checked: now the step, in the order the Python loop takes it.
      if (plan.grow) {
        const uint32_t next = plan.last + 1;
        PyObject* view = view_of(o, next);
        PyObject* list = view == nullptr ? nullptr : PyList_New(1);
        PyObject* tuple = nullptr;
        PyObject* made = nullptr;
        if (list != nullptr) {
          PyList_SetItem(list, 0, Py_NewRef(view));  // steals the new ref
          tuple = PyTuple_Pack(1, list);
        }
        if (tuple != nullptr) {
          made = PyObject_CallFunctionObjArgs(make_new, tuple, nullptr);
        }
        PyObject* last_key = PyLong_FromUnsignedLong(plan.last);
        PyObject* next_key = PyLong_FromUnsignedLong(next);
        bool ok = made != nullptr && last_key != nullptr && next_key != nullptr;
        if (ok) {
          st.ref_cnt[next] = 1;
          ++taken;
          ok = PyList_Append(plan.blocks, view) == 0 &&
               PyDict_DelItem(headroom, last_key) == 0 &&
               (plan.held < 2 ||
                dict_set_i64(headroom, next_key, plan.held - 1)) &&
               (new_block_ids == Py_None ||
                PyList_Append(new_block_ids, next_key) == 0) &&
               PyDict_SetItem(new_blocks, rid, made) == 0;
        }
        Py_XDECREF(view);
        Py_XDECREF(list);
        Py_XDECREF(tuple);
        Py_XDECREF(made);
        Py_XDECREF(last_key);
        Py_XDECREF(next_key);
        if (!ok) {
          failed = true;
          break;
        }
      }
      if (plan.hashes != nullptr) {
        for (int64_t j = plan.num_cached; j < plan.num_full; ++j) {
          PyObject* v = PyList_GetItem(plan.blocks, j);
          if (st.is_null[as_block(v)->id]) continue;
          if (!cache_block(o, entries, PyList_GetItem(plan.hashes, j), suffix,
                           v, j, block_size, name)) {
            failed = true;
            break;
          }
        }
        if (failed || !dict_set_i64(num_cached_block, rid, plan.num_full)) {
          failed = true;
          break;
        }
        plan.num_cached = plan.num_full;
      }
      // _note_held_slots, and the promise of the step after this one.
      int64_t slots = static_cast<int64_t>(num_after) * block_size;
      const int64_t held_to =
          caching ? std::min(slots, (plan.num_cached + 1) * block_size - 1)
                  : slots;
      PyObject* tail =
          PyLong_FromUnsignedLong(plan.grow ? plan.last + 1 : plan.last);
      int64_t room = 0;
      if (tail == nullptr || !dict_i64(headroom, tail, 0, name, &room)) {
        Py_XDECREF(tail);
        failed = true;
        break;
      }
      Py_DECREF(tail);
      if (room > 0) slots += block_size;
      if (!dict_set_i64(held_slots, rid, held_to) ||
          !dict_set_i64(batched_slots, rid, slots)) {
        failed = true;
        break;
      }
      done = true;
    } while (false);
    Py_XDECREF(plan.hashes);
    Py_DECREF(rid);
    if (failed) return nullptr;
    if (!done) break;
  }
  PyObject* out_k = PyLong_FromSsize_t(k);
  PyObject* out_taken = PyLong_FromLongLong(taken);
  PyObject* out = out_k == nullptr || out_taken == nullptr
                      ? nullptr
                      : PyTuple_Pack(2, out_k, out_taken);
  Py_XDECREF(out_k);
  Py_XDECREF(out_taken);
  return out;
}

PyMethodDef Blocks_methods[] = {
    {"hand_out", fast(Blocks_hand_out), METH_FASTCALL,
     "hand_out(start, length, /) -> list[Block]\n--\n\nBlocks [start, "
     "start + length), each free and clean (ref_cnt 0, no hash, not null), "
     "get ref_cnt 1; returns their views. ValueError, nothing changed, if "
     "the range is not in the pool or a block is not free and clean."},
    {"cache_full", fast(Blocks_cache_full), METH_FASTCALL,
     "cache_full(entries, blocks, hashes, start, end, block_size, suffix, /) "
     "-> int\n--\n\nPrefix-caches blocks[start:end] (Block views of this "
     "pool): each block that is not the null block gets the key hashes[i] + "
     "suffix with (i + 1) * block_size tokens, and the dict `entries` gets "
     "it under that key (the block, or {block_id: block} for several). "
     "Stops at the first block that already has a key and returns its index, "
     "else end. TypeError or ValueError, nothing changed, on bad arguments."},
    {"evict", fast(Blocks_evict), METH_FASTCALL,
     "evict(entries, blocks, /) -> list[int]\n--\n\nDrops the prefix-cache "
     "key of each block in the list (views of this pool; the null block is "
     "skipped) and the block from the dict `entries` under that key, as "
     "BlockPool.evict_blocks does without KV events: a key holding the block "
     "goes, a {block_id: block} key drops it (and goes once empty), a key "
     "holding another block stays. Returns the blocks' ids in order. "
     "TypeError, nothing changed, on bad arguments."},
    {"allocate_batched", fast(Blocks_allocate_batched), METH_FASTCALL,
     "allocate_batched(steps, start, req_to_blocks, headroom, "
     "num_cached_block, held_slots, batched_slots, new_block_ids, "
     "new_blocks, make_new, entries, suffix, block_size, max_model_len, /) "
     "-> tuple[int, int]\n--\n\nThe tagma manager's promised decoding "
     "steps (KVCacheManager.allocate_batched) from steps[start] on, each a "
     "(request, num_new_tokens) tuple, taken in order: a step that needs a "
     "new block gets block last + 1 from the headroom dict {last block id: "
     "count} (ref_cnt 1, appended to req_to_blocks[request_id], its id to "
     "new_block_ids unless None, new_blocks[request_id] = make_new(([view],)"
     ")); with num_cached_block a dict, the blocks it completes are "
     "prefix-cached as cache_full does (entries and suffix) and "
     "num_cached_block updated; held_slots and batched_slots get the "
     "request's next promises. Stops at the first step it cannot take as "
     "promised (more than one new block, no headroom, a block that already "
     "has a key, blocks or hashes not this pool's, or, with entries None, a "
     "block to cache), that step untouched, and returns (its index, blocks "
     "taken from the headroom); the caller's own path takes it. TypeError "
     "or ValueError, nothing changed, on bad arguments."},
    {"release", fast(Blocks_release), METH_FASTCALL,
     "release(blocks, watch, /) -> tuple[list[int], list[Block], list[int], "
     "list]\n--\n\nDrops one reference of each block in the iterable "
     "(views of this table; the null block is skipped) and returns (clean "
     "ids, cached views, watched ids, others): the blocks that became free "
     "without and with a key, in order, the ids among them that are keys of "
     "the dict `watch` (None: none), and the items that are not views of "
     "this table, untouched. ValueError, every count restored, if a count "
     "would drop below 0."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* Blocks_repr(PyObject* self) {
  return PyUnicode_FromFormat("Blocks(num_blocks=%u)",
                              as_blocks(self)->state->size());
}

PyType_Slot Blocks_slots[] = {
    {Py_tp_doc,
     const_cast<char*>(
         "Blocks(num_blocks, pool=None)\n--\n\n"
         "The KV-cache pool's blocks [0, num_blocks) as a sequence of Block "
         "views, for BlockPool.make_blocks: reference counts, prefix-cache "
         "keys and null flags live in the engine (29 bytes a block), and a "
         "block's view is made the first time it is asked for, then kept "
         "(blocks[i] is blocks[i]). A view's pool is `pool`, held weakly. "
         "Neither type is tracked by the cyclic garbage collector.")},
    {Py_tp_new, reinterpret_cast<void*>(Blocks_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(Blocks_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(Blocks_repr)},
    {Py_sq_length, reinterpret_cast<void*>(Blocks_len)},
    {Py_sq_item, reinterpret_cast<void*>(Blocks_item)},
    {Py_mp_length, reinterpret_cast<void*>(Blocks_len)},
    {Py_mp_subscript, reinterpret_cast<void*>(Blocks_subscript)},
    {Py_tp_methods, Blocks_methods},
    {0, nullptr},
};

PyType_Spec Blocks_spec = {
    "vllm._tagma_C.Blocks",
    sizeof(BlocksObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    Blocks_slots,
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
      add_type(module, &Block_spec, "Block", &st->block_type) ||
      add_type(module, &Blocks_spec, "Blocks", &st->blocks_type)) {
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
  Py_VISIT(st->block_type);
  Py_VISIT(st->blocks_type);
  return 0;
}

int module_clear(PyObject* module) {
  ModuleState* st = state(module);
  if (st == nullptr) return 0;
  Py_CLEAR(st->free_runs_type);
  Py_CLEAR(st->block_type);
  Py_CLEAR(st->blocks_type);
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
    "The tagma KV-cache engine (FreeRuns, Blocks) on the Python limited API "
    "3.11.",
    sizeof(ModuleState),
    nullptr,  // methods
    module_slots,
    module_traverse,
    module_clear,
    module_free,
};

}  // namespace

PyMODINIT_FUNC PyInit__tagma_C(void) { return PyModuleDef_Init(&tagma_module); }
