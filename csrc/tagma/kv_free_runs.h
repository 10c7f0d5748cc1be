// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#pragma once

// FreeRuns: which blocks of [0, num_blocks) are free, as an always-coalesced
// set of runs indexed by address and by size, so that contiguous placement
// (best fit, growth in place, the multi-range fallback) is O(log runs).
//
//   block     0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
//   free      . . # # # . . # . . #  #  #  #  .  .      # = free
//             \_ 3 at 2 _/  1 at 7    \_ 4 at 10 _/
//
//   runs_   : start -> length       {2: 3, 7: 1, 10: 4}   neighbours,
//   coalescing by_fit_ : (length, start)       {(1, 7), (3, 2), (4, 10)}   best
//   fit
//
// by_fit_.lower_bound({k, 0}) is the smallest run that holds k, lowest
// address on ties.
//
// Why best fit: in a serving trace (64K blocks, prompts of 1..256 blocks,
// decode growth) it had the smallest tail of ranges per request (p99, max)
// and fallback share of best, first and worst fit and half-gap placement,
// at 97 % occupancy and saturated; first fit's mean was 5 % lower at 97 %
// (measured on the since-removed allocator engine; git history has it).
// No placement keeps one range per request near full occupancy: growth
// finds its neighbour taken and opens a new range, and some requests reach
// the range cap (kTooManyRanges), which the caller must handle.
//
// Invariants (validate() recomputes each from the runs):
//   1. Runs are non-empty, inside [0, num_blocks), ordered, and coalesced:
//      two runs never touch (there is a non-free block between any two).
//   2. by_fit_ holds (length, start) for exactly the runs.
//   3. num_free() == the sum of the run lengths.
//
// Two layers:
//   * checked (add, add_range, take_after, take):
//     every argument is checked; a Status; a failing call changes nothing.
//   * unchecked primitives (put, cut, pick, plan), which the checked layer
//     is built from: preconditions are the caller's (the tests break them
//     on purpose to show that validate() notices).
// A tree node is re-keyed rather than reallocated when a run shrinks or
// grows, so the steady state does not allocate.
// Standard library only; header-only; C++17.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "kv_status.h"

namespace tagma {

class FreeRuns {
 public:
  using Run = std::pair<uint32_t, uint32_t>;  // (start, length)

  // Block ids stay below 2^31 - 1 so that they fit int32 (torch, Triton).
  static constexpr int64_t kMaxBlocks = std::numeric_limits<int32_t>::max() - 1;

  // No blocks; every call returns kBadConfig.
  FreeRuns() = default;

  // Starts EMPTY: no block is free until add() or add_range(). num_blocks
  // outside [1, kMaxBlocks] gives the default object; check
  // config_status().
  explicit FreeRuns(int64_t num_blocks) {
    if (num_blocks < 1 || num_blocks > kMaxBlocks) return;
    config_ = Status::kOk;
    n_ = static_cast<uint32_t>(num_blocks);
  }

  Status config_status() const { return config_; }
  uint32_t num_blocks() const { return n_; }

  // ----------------------------------------------------------------- checked

  // Marks blocks free, coalescing with their neighbours; any order. Fails
  // with nothing changed if an id is >= num_blocks (kOutOfRange), already
  // free (kAlreadyFree) or given twice (kDuplicateBlock); *bad (if given)
  // is then the offending id. O(n log n + n log runs).
  Status add(const uint32_t* ids, size_t n, int64_t* bad = nullptr) {
    Status s = sort_ids(ids, n, bad);
    if (s != Status::kOk) return s;
    // All checks before the first change.
    s = for_each_group([&](uint32_t g, uint32_t l) {
      const int64_t f = first_free(g, g + l);
      return f >= 0 ? fail(Status::kAlreadyFree, f, bad) : Status::kOk;
    });
    if (s != Status::kOk) return s;
    return for_each_group([&](uint32_t g, uint32_t l) {
      put(g, l);
      return Status::kOk;
    });
  }
  Status add(const std::vector<uint32_t>& ids) {
    return add(ids.data(), ids.size());
  }

  // Marks [start, start + length) free; kZeroCount for length 0,
  // kInvalidArgument for a negative one, kOutOfRange past num_blocks,
  // kAlreadyFree if any of it is free (*bad = the first such block).
  Status add_range(int64_t start, int64_t length, int64_t* bad = nullptr) {
    Status s = check_range(start, length);
    if (s != Status::kOk) return s;
    const uint32_t g = static_cast<uint32_t>(start);
    const uint32_t l = static_cast<uint32_t>(length);
    const int64_t f = first_free(g, g + l);
    if (f >= 0) return fail(Status::kAlreadyFree, f, bad);
    put(g, l);
    return Status::kOk;
  }

  // Takes up to n free blocks from block + 1 on, as far as they are free:
  // a range growing in place. Returns how many were taken; 0 when block + 1
  // is not free or not a block, or n <= 0.
  int64_t take_after(int64_t block, int64_t n) {
    if (config_ != Status::kOk || n <= 0 || block < -1 ||
        block + 1 >= static_cast<int64_t>(n_)) {
      return 0;
    }
    const uint32_t b = static_cast<uint32_t>(block + 1);
    auto it = runs_.upper_bound(b);
    if (it == runs_.begin()) return 0;
    --it;
    const uint32_t end = it->first + it->second;
    if (end <= b) return 0;
    const uint32_t k = static_cast<uint32_t>(
        std::min<int64_t>(n, static_cast<int64_t>(end - b)));
    carve(it, b, k);
    return k;
  }

  // Takes n blocks as few ranges as it can: one best-fit range (smallest
  // run that holds n, lowest address on ties) if any run holds n; else the
  // largest runs first, the last piece the best fit for what is left.
  // *out = the ranges (start, length) in that order. Errors, nothing
  // changed and *out untouched: kZeroCount, kInvalidArgument (n < 0,
  // max_ranges < 1, null out), kOutOfMemory (fewer than n
  // blocks can be taken), kTooManyRanges (more than max_ranges needed).
  Status take(int64_t n, int64_t max_ranges, std::vector<Run>* out) {
    if (config_ != Status::kOk) return config_;
    if (out == nullptr || n < 0 || max_ranges < 1) {
      return Status::kInvalidArgument;
    }
    if (n == 0) return Status::kZeroCount;
    if (n > static_cast<int64_t>(free_)) return Status::kOutOfMemory;
    const uint32_t k = static_cast<uint32_t>(n);
    if (largest_run() >= k) {
      const uint32_t at = pick(k);
      cut(at, k);
      out->assign(1, Run{at, k});
      return Status::kOk;
    }
    if (!plan(k, &plan_)) return Status::kOutOfMemory;
    if (static_cast<int64_t>(plan_.size()) > max_ranges) {
      return Status::kTooManyRanges;
    }
    for (const Run& p : plan_) cut(p.first, p.second);
    out->assign(plan_.begin(), plan_.end());
    return Status::kOk;
  }

  // ------------------------------------------------------------- inspection

  uint64_t num_free() const { return free_; }
  // The most blocks one range can take: the longest run.
  uint32_t largest_run() const {
    return by_fit_.empty() ? 0 : by_fit_.rbegin()->first;
  }
  size_t num_runs() const { return runs_.size(); }
  // (start, length) by address. O(runs).
  std::vector<Run> runs() const { return {runs_.begin(), runs_.end()}; }
  bool contains(int64_t block) const {
    if (block < 0 || block >= static_cast<int64_t>(n_)) return false;
    auto it = runs_.upper_bound(static_cast<uint32_t>(block));
    if (it == runs_.begin()) return false;
    --it;
    return static_cast<int64_t>(it->first) + it->second > block;
  }

  // Recomputes the invariants, O(runs log runs); false at the first failure
  // (printed to stderr when verbose).
  bool validate(bool verbose = false) const {
#define TAGMA_CHECK(cond)                                                 \
  do {                                                                    \
    if (!(cond)) {                                                        \
      if (verbose) {                                                      \
        std::fprintf(stderr, "FreeRuns::validate: %s (line %d)\n", #cond, \
                     __LINE__);                                           \
      }                                                                   \
      return false;                                                       \
    }                                                                     \
  } while (0)
    if (config_ != Status::kOk) {
      TAGMA_CHECK(n_ == 0 && runs_.empty() && by_fit_.empty() && free_ == 0);
      return true;
    }
    uint64_t in_runs = 0;
    int64_t prev_end = -1;
    for (const auto& run : runs_) {
      const uint32_t s = run.first, l = run.second;
      TAGMA_CHECK(l > 0);                               // 1
      TAGMA_CHECK(static_cast<uint64_t>(s) + l <= n_);  // 1
      TAGMA_CHECK(static_cast<int64_t>(s) > prev_end);  // 1: ordered, apart
      TAGMA_CHECK(by_fit_.count({l, s}) == 1);          // 2
      in_runs += l;
      prev_end = static_cast<int64_t>(s) + l;
    }
    TAGMA_CHECK(runs_.size() == by_fit_.size());  // 2: nothing else
    TAGMA_CHECK(in_runs == free_);                // 3
    return true;
#undef TAGMA_CHECK
  }

  // ------------------------------------------------------ unchecked layer
  // O(log runs) each. Preconditions are the caller's; breaking one breaks
  // the invariants (validate() finds it).

  // [s, s + l), l > 0, no block of it free: becomes free, coalescing.
  void put(uint32_t s, uint32_t l) {
    auto next = runs_.lower_bound(s);
    const bool to_next = next != runs_.end() && next->first == s + l;
    auto prev = next;
    const bool to_prev =
        next != runs_.begin() && (--prev, prev->first + prev->second == s);
    if (to_prev && to_next) {
      const uint32_t nl = prev->second + l + next->second;
      run_erase(next);
      run_move(prev, prev->first, nl);
    } else if (to_prev) {
      run_move(prev, prev->first, prev->second + l);
    } else if (to_next) {
      run_move(next, s, l + next->second);
    } else {
      run_insert(s, l);
    }
    free_ += l;
  }

  // [at, at + l), l > 0, inside one free run: becomes not free.
  void cut(uint32_t at, uint32_t l) {
    carve(std::prev(runs_.upper_bound(at)), at, l);
  }

  // Start of the best-fit range of k blocks (the smallest run that holds
  // k, lowest address on ties); requires largest_run() >= k.
  uint32_t pick(uint32_t k) const {
    return by_fit_.lower_bound({k, 0})->second;
  }

  // The multi-range placement of k blocks into *out (replaced): the largest
  // runs first, which keeps the range count minimal, and the last piece
  // the best fit for what is left (the greedy choice would split a large
  // run for it). false (and *out partial) if fewer than k can be taken.
  bool plan(uint32_t k, std::vector<Run>* out) const {
    out->clear();
    uint32_t left = k;
    for (auto f = by_fit_.rbegin(); f != by_fit_.rend() && left > 0; ++f) {
      if (f->first >= left) {
        const uint32_t s = by_fit_.lower_bound({left, 0})->second;
        out->emplace_back(s, left);
        return true;
      }
      out->emplace_back(f->second, f->first);
      left -= f->first;
    }
    return left == 0;
  }

 private:
  using RunMap = std::map<uint32_t, uint32_t>;

  static Status fail(Status s, int64_t block, int64_t* bad) {
    if (bad != nullptr) *bad = block;
    return s;
  }

  Status check_range(int64_t start, int64_t length) const {
    if (config_ != Status::kOk) return config_;
    if (length < 0) return Status::kInvalidArgument;
    if (length == 0) return Status::kZeroCount;
    if (start < 0 || start >= static_cast<int64_t>(n_) ||
        length > static_cast<int64_t>(n_) - start) {
      return Status::kOutOfRange;
    }
    return Status::kOk;
  }

  // The lowest free block in [g, e), or -1.
  int64_t first_free(uint32_t g, uint32_t e) const {
    auto it = runs_.upper_bound(g);  // first run starting after g
    if (it != runs_.begin()) {
      auto p = std::prev(it);
      if (p->first + p->second > g) return g;
    }
    if (it != runs_.end() && it->first < e) return it->first;
    return -1;
  }

  // scratch_ = the ids, sorted; checks the range and duplicates.
  Status sort_ids(const uint32_t* ids, size_t n, int64_t* bad) {
    if (config_ != Status::kOk) return config_;
    scratch_.clear();
    if (n == 0) return Status::kOk;
    if (ids == nullptr) return Status::kInvalidArgument;
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] >= n_) return fail(Status::kOutOfRange, ids[i], bad);
    }
    scratch_.assign(ids, ids + n);
    if (!std::is_sorted(scratch_.begin(), scratch_.end())) {
      std::sort(scratch_.begin(), scratch_.end());
    }
    auto d = std::adjacent_find(scratch_.begin(), scratch_.end());
    if (d != scratch_.end()) {
      const uint32_t b = *d;
      scratch_.clear();
      return fail(Status::kDuplicateBlock, b, bad);
    }
    return Status::kOk;
  }

  // End of the group of consecutive ids that starts at scratch_[i].
  // Calls f(first, length) for each run of consecutive ids in the sorted
  // scratch_, stopping at the first status that is not kOk.
  template <class F>
  Status for_each_group(F f) {
    for (size_t i = 0; i < scratch_.size();) {
      size_t j = i + 1;
      while (j < scratch_.size() && scratch_[j] == scratch_[j - 1] + 1) ++j;
      const Status s = f(scratch_[i], static_cast<uint32_t>(j - i));
      if (s != Status::kOk) return s;
      i = j;
    }
    return Status::kOk;
  }

  void run_insert(uint32_t s, uint32_t l) {
    runs_.emplace(s, l);
    by_fit_.emplace(l, s);
  }
  RunMap::iterator run_erase(RunMap::iterator it) {
    by_fit_.erase({it->second, it->first});
    return runs_.erase(it);
  }

  // Gives a run a new extent. The tree nodes are re-keyed through
  // extract/insert, so shrinking or growing a run never allocates.
  void run_move(RunMap::iterator it, uint32_t ns, uint32_t nl) {
    const uint32_t os = it->first, ol = it->second;
    if (ol != nl || os != ns) {
      auto node = by_fit_.extract({ol, os});
      node.value() = {nl, ns};
      by_fit_.insert(std::move(node));
    }
    if (ns == os) {
      it->second = nl;
      return;
    }
    auto node = runs_.extract(it);
    node.key() = ns;
    node.mapped() = nl;
    runs_.insert(std::move(node));
  }

  // Takes [t, t + k) out of the run `it`, which contains it.
  void carve(RunMap::iterator it, uint32_t t, uint32_t k) {
    const uint32_t s = it->first, e = it->first + it->second;
    if (t > s) {
      run_move(it, s, t - s);
      if (t + k < e) run_insert(t + k, e - (t + k));
    } else if (t + k < e) {
      run_move(it, t + k, e - (t + k));
    } else {
      run_erase(it);
    }
    free_ -= k;
  }

  Status config_ = Status::kBadConfig;
  uint32_t n_ = 0;
  uint64_t free_ = 0;
  RunMap runs_;
  std::set<std::pair<uint32_t, uint32_t>> by_fit_;
  // Scratch, reused across calls.
  std::vector<uint32_t> scratch_;
  std::vector<Run> plan_;
};

}  // namespace tagma
