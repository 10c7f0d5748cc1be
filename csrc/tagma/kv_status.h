// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#pragma once

// Status: the error vocabulary of the engine (FreeRuns).
//
// No engine call throws; each returns a Status (or a sentinel), and a call
// that fails leaves its object exactly as it was. The Python binding turns
// a Status into an exception:
//
//   kOutOfMemory                         -> MemoryError
//   everything else                      -> ValueError

#include <cstdint>

namespace tagma {

enum class Status : int32_t {
  kOk = 0,
  kOutOfMemory,      // fewer free blocks than asked for
  kZeroCount,        // count == 0
  kTooManyRanges,    // take(): more than max_ranges ranges needed
  kInvalidArgument,  // negative count, null pointer with n > 0, ...
  kOutOfRange,       // block beyond num_blocks
  kBadConfig,        // the constructor arguments were invalid
  kAlreadyFree,      // add(): the block is free already
  kDuplicateBlock,   // add(): the same block twice
  kLast = kDuplicateBlock,
};

inline const char* status_str(Status s) {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kOutOfMemory:
      return "out of memory";
    case Status::kZeroCount:
      return "zero count";
    case Status::kTooManyRanges:
      return "too many ranges";
    case Status::kInvalidArgument:
      return "invalid argument";
    case Status::kOutOfRange:
      return "block out of range";
    case Status::kBadConfig:
      return "invalid configuration";
    case Status::kAlreadyFree:
      return "block already free";
    case Status::kDuplicateBlock:
      return "the same block twice";
  }
  return "unknown status";
}

}  // namespace tagma
