// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#pragma once

// Status: the one error vocabulary of the engine (FreeRuns, KVAllocator).
//
// No engine call throws; each returns a Status (or a sentinel), and a call
// that fails leaves its object exactly as it was. The Python binding turns
// a Status into an exception:
//
//   kOutOfMemory                         -> MemoryError
//   kUnknownRequest, kCacheMiss          -> KeyError
//   everything else                      -> ValueError

#include <cstdint>

namespace tagma {

enum class Status : int32_t {
  kOk = 0,
  kOutOfMemory,       // not enough free + cache-only blocks
  kUnknownRequest,    // no such request (or already released)
  kDuplicateRequest,  // allocate() on an existing request: use grow()
  kZeroCount,         // count == 0
  kMisaligned,        // count is not a multiple of the alignment
  kTooManyRanges,     // would exceed max_ranges ranges for the request
  kInvalidArgument,   // negative count, null pointer with n > 0, ...
  kOutOfRange,        // block (logical or physical) beyond the valid ones
  kCacheMiss,         // acquire_cached(): a key is not cached
  kDuplicateKey,      // acquire_cached(), cache(): the same key twice
  kKeyConflict,       // cache(): the block already carries another key
  kRequestNotEmpty,   // acquire_cached() on a request that holds blocks
  kCacheInUse,        // reset_cache() while some block is in use
  kBadConfig,         // the constructor arguments were invalid
  kAlreadyFree,       // FreeRuns::add(): the block is free already
  kNotFree,           // FreeRuns::remove(): the block is not free
  kDuplicateBlock,    // FreeRuns::add()/remove(): the same block twice
  kLast = kDuplicateBlock,
};

inline const char* status_str(Status s) {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kOutOfMemory:
      return "out of memory";
    case Status::kUnknownRequest:
      return "unknown request";
    case Status::kDuplicateRequest:
      return "duplicate request";
    case Status::kZeroCount:
      return "zero count";
    case Status::kMisaligned:
      return "count not a multiple of the alignment";
    case Status::kTooManyRanges:
      return "too many ranges";
    case Status::kInvalidArgument:
      return "invalid argument";
    case Status::kOutOfRange:
      return "block out of range";
    case Status::kCacheMiss:
      return "cache miss";
    case Status::kDuplicateKey:
      return "duplicate cache key";
    case Status::kKeyConflict:
      return "block already cached under another key";
    case Status::kRequestNotEmpty:
      return "request already holds blocks";
    case Status::kCacheInUse:
      return "cache blocks in use";
    case Status::kBadConfig:
      return "invalid configuration";
    case Status::kAlreadyFree:
      return "block already free";
    case Status::kNotFree:
      return "block not free";
    case Status::kDuplicateBlock:
      return "the same block twice";
  }
  return "unknown status";
}

}  // namespace tagma
