// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#pragma once

// KVAllocator: KV-cache blocks handed to requests as a few contiguous ranges.
//
// A request's blocks are a list of physical ranges in logical order, so the
// physical block of logical block i is range.start + (i - range.logical_start)
// for the range that holds i; no per-block table is needed on the write path.
//
//   request 7, 11 logical blocks, 2 ranges:
//
//   logical   0 1 2 3 4 5 6 | 7 8 9 10
//             +-------------+ +-------+
//   physical  40 ....... 46   12 ... 15
//
//   ranges = [{start 40, length 7, logical_start 0},
//             {start 12, length 4, logical_start 7}]
//
//   physical blocks 0..N-1, three states:
//   |FREE FREE|USED USED USED|CACHED|FREE|USED|CACHED CACHED|FREE FREE FREE|
//    \_ run _/                       \run/                   \____ run ___/
//
// Block states (request refs and cache refs are kept apart):
//   FREE         req_ref == 0 and no cache key; in exactly one free run.
//   USED         req_ref > 0 (a cache key may be attached as well).
//   CACHED-ONLY  req_ref == 0 with a cache key; in the LRU list, evictable.
//
// Invariants (validate() recomputes every one from scratch):
//   1. req_ref[b] == number of request ranges that contain b.
//   2. The free runs cover exactly the FREE blocks, do not overlap and are
//      coalesced: no two runs touch (always coalesced, never a lazy merge).
//   3. The LRU list holds exactly the CACHED-ONLY blocks, linked both ways.
//   4. key -> block is a bijection onto the blocks that carry a key.
//   5. free + used + cached_only == num_blocks; all counters match.
//   6. A request's ranges are non-empty, in logical order, and two
//      consecutive ranges are never physically adjacent (merge on append),
//      and there are at most max_ranges of them.
//
// The FREE blocks are a FreeRuns (kv_free_runs.h): this class owns the block
// states and calls its unchecked layer (put/cut/pick/plan/take_after).
// Errors are Status codes (kv_status.h), never exceptions; a call that fails
// leaves the allocator exactly as it was (evictions done on the way are
// rolled back).
// Standard library only; header-only; C++17.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv_free_runs.h"

#ifdef TAGMA_HEAVY_CHECKS
  #include <cassert>
  // O(num_blocks) per mutating call: for tests and debugging only.
  #define TAGMA_HEAVY_ASSERT(expr) assert(expr)
#else
  #define TAGMA_HEAVY_ASSERT(expr) ((void)0)
#endif

namespace tagma {

// One contiguous physical range of a request. logical_start is the logical
// index of its first block (the kernel's "cum"), so
//   physical = start + (logical - logical_start).
struct BlockRange {
  uint32_t start = 0;
  uint32_t length = 0;
  uint32_t logical_start = 0;
};

struct KVAllocatorStats {
  uint64_t total = 0;
  uint64_t free = 0;
  uint64_t used = 0;
  uint64_t cached_only = 0;
  uint64_t largest_free_run = 0;  // largest aligned run one range can take
  uint64_t num_free_runs = 0;
  uint64_t num_requests = 0;
  uint64_t ranges_total = 0;
  uint64_t max_ranges_per_request = 0;
  uint64_t fallback_allocations = 0;  // calls that needed >1 new range
  uint64_t evictions = 0;             // cache-only blocks evicted, ever

  bool operator==(const KVAllocatorStats& o) const {
    return total == o.total && free == o.free && used == o.used &&
           cached_only == o.cached_only &&
           largest_free_run == o.largest_free_run &&
           num_free_runs == o.num_free_runs && num_requests == o.num_requests &&
           ranges_total == o.ranges_total &&
           max_ranges_per_request == o.max_ranges_per_request &&
           fallback_allocations == o.fallback_allocations &&
           evictions == o.evictions;
  }
  bool operator!=(const KVAllocatorStats& o) const { return !(*this == o); }
};

class KVAllocator {
 public:
  using RequestId = uint64_t;
  using Key = std::string;  // opaque: the caller's block hash bytes

  // Block ids stay below 2^31 - 1 so that they fit int32 (torch, Triton)
  // and int32 links can use num_blocks as the LRU sentinel.
  static constexpr int64_t kMaxBlocks = std::numeric_limits<int32_t>::max() - 1;

  // Invalid arguments (num_blocks outside [1, kMaxBlocks], alignment or
  // max_ranges < 1, alignment > num_blocks) give an allocator with no blocks
  // whose every call returns kBadConfig; check config_status().
  explicit KVAllocator(int64_t num_blocks, int64_t alignment = 1,
                       int64_t max_ranges = 256) {
    if (num_blocks < 1 || num_blocks > kMaxBlocks || alignment < 1 ||
        alignment > num_blocks || max_ranges < 1) {
      config_ = Status::kBadConfig;
      return;
    }
    n_ = static_cast<uint32_t>(num_blocks);
    align_ = static_cast<uint32_t>(alignment);
    // More ranges than blocks can never happen; the clamp bounds hist_.
    max_ranges_ = static_cast<uint32_t>(std::min(max_ranges, num_blocks));
    ref_.assign(n_, 0);
    cached_.assign(n_, 0);
    key_.resize(n_);
    mark_.assign(n_, 0);
    lru_prev_.assign(n_ + 1, 0);
    lru_next_.assign(n_ + 1, 0);
    lru_prev_[n_] = lru_next_[n_] = static_cast<int32_t>(n_);
    hist_.assign(max_ranges_ + 1, 0);
    free_ = FreeRuns(n_, align_);
    free_.put(0, n_);
  }

  Status config_status() const { return config_; }
  void set_fit_policy(FitPolicy p) { policy_ = p; }
  FitPolicy fit_policy() const { return policy_; }
  uint32_t num_blocks() const { return n_; }
  uint32_t alignment() const { return align_; }
  uint32_t max_ranges() const { return max_ranges_; }

  // ---------------------------------------------------------------- requests

  // A new request with `count` blocks. One contiguous run if any fits (best
  // fit); else evict cache-only blocks in LRU order until one fits; else
  // several ranges, largest runs first. Existing requests use grow().
  Status allocate(RequestId req, int64_t count) {
    Status s = check_count(count);
    if (s != Status::kOk) return s;
    if (reqs_.count(req) != 0) return Status::kDuplicateRequest;
    // Before narrowing to uint32_t: more than everything never fits.
    if (count > static_cast<int64_t>(n_)) return Status::kOutOfMemory;
    if (spare_.empty()) {
      Request r;
      s = take(&r, static_cast<uint32_t>(count));
      if (s != Status::kOk) return s;
      hist_add(r.ranges.size());
      reqs_.emplace(req, std::move(r));
    } else {
      // A recycled map node: no allocation for the node or its range list.
      RequestNode node = std::move(spare_.back());
      spare_.pop_back();
      node.key() = req;
      Request& r = node.mapped();
      s = take(&r, static_cast<uint32_t>(count));
      if (s != Status::kOk) {
        spare_.push_back(std::move(node));
        return s;
      }
      hist_add(r.ranges.size());
      reqs_.insert(std::move(node));
    }
    TAGMA_HEAVY_ASSERT(validate(true));
    return Status::kOk;
  }

  // Adds `count` blocks at the request's logical end: in place after the last
  // range when the blocks there are free, the rest as in allocate(). A new
  // range that touches the last one merges into it. O(log n) in the number of
  // free runs, independent of how many blocks the request holds.
  Status grow(RequestId req, int64_t count) {
    Status s = check_count(count);
    if (s != Status::kOk) return s;
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return Status::kUnknownRequest;
    if (count > static_cast<int64_t>(n_)) return Status::kOutOfMemory;
    Request& r = it->second;
    const size_t before = r.ranges.size();
    s = take(&r, static_cast<uint32_t>(count));
    if (s != Status::kOk) return s;
    hist_move(before, r.ranges.size());
    TAGMA_HEAVY_ASSERT(validate(true));
    return Status::kOk;
  }

  // Drops the request's references. Blocks nobody references become FREE, or
  // CACHED-ONLY when they carry a key; those enter the LRU list in reverse
  // logical order so that the request's tail is evicted first (as vLLM).
  Status release(RequestId req) {
    if (config_ != Status::kOk) return config_;
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return Status::kUnknownRequest;
    std::vector<BlockRange>& ranges = it->second.ranges;
    for (size_t i = ranges.size(); i-- > 0;) {
      const BlockRange& e = ranges[i];
      // Walk down; consecutive freed blocks go back as one run [lo, hi).
      uint32_t lo = 0, hi = 0;
      for (uint32_t b = e.start + e.length; b-- > e.start;) {
        if (--ref_[b] != 0) continue;
        --used_;
        if (cached_[b]) {
          if (lo != hi) free_.put(lo, hi - lo);
          lo = hi = 0;
          lru_push_back(b);
          ++cached_only_;
        } else if (lo != hi && lo == b + 1) {
          lo = b;
        } else {
          if (lo != hi) free_.put(lo, hi - lo);
          lo = b;
          hi = b + 1;
        }
      }
      if (lo != hi) free_.put(lo, hi - lo);
    }
    hist_remove(ranges.size());
    recycle(it);
    TAGMA_HEAVY_ASSERT(validate(true));
    return Status::kOk;
  }

  bool contains(RequestId req) const { return reqs_.count(req) != 0; }
  size_t num_requests() const { return reqs_.size(); }

  // Blocks held by the request, or -1 if unknown.
  int64_t request_blocks(RequestId req) const {
    auto it = reqs_.find(req);
    return it == reqs_.end() ? -1 : static_cast<int64_t>(it->second.num_blocks);
  }

  // The request's ranges in logical order, without copying; nullptr (and
  // *n = 0) if unknown. Valid until the next mutating call.
  const BlockRange* ranges_data(RequestId req, size_t* n) const {
    auto it = reqs_.find(req);
    if (it == reqs_.end()) {
      if (n != nullptr) *n = 0;
      return nullptr;
    }
    if (n != nullptr) *n = it->second.ranges.size();
    return it->second.ranges.data();
  }

  Status ranges(RequestId req, std::vector<BlockRange>* out) const {
    if (out == nullptr) return Status::kInvalidArgument;
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return Status::kUnknownRequest;
    *out = it->second.ranges;
    return Status::kOk;
  }

  // The materialized block table row (logical -> physical), for the read
  // path that still consumes one.
  Status blocks(RequestId req, std::vector<uint32_t>* out) const {
    if (out == nullptr) return Status::kInvalidArgument;
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return Status::kUnknownRequest;
    out->clear();
    out->reserve(it->second.num_blocks);
    for (const BlockRange& e : it->second.ranges) {
      for (uint32_t i = 0; i < e.length; ++i) out->push_back(e.start + i);
    }
    return Status::kOk;
  }

  // Logical -> physical block, O(log ranges).
  Status physical_block(RequestId req, int64_t logical, uint32_t* out) const {
    if (out == nullptr) return Status::kInvalidArgument;
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return Status::kUnknownRequest;
    const Request& r = it->second;
    if (logical < 0 || logical >= static_cast<int64_t>(r.num_blocks)) {
      return Status::kOutOfRange;
    }
    const BlockRange& e = range_of(r, static_cast<uint32_t>(logical));
    *out = e.start + (static_cast<uint32_t>(logical) - e.logical_start);
    return Status::kOk;
  }

  // ------------------------------------------------------------ prefix cache

  // Number of leading keys that are cached (in use or cache-only).
  size_t lookup(const Key* keys, size_t n) const {
    if (keys == nullptr) return 0;
    size_t i = 0;
    while (i < n && key_map_.count(keys[i]) != 0) ++i;
    return i;
  }
  size_t lookup(const std::vector<Key>& keys) const {
    return lookup(keys.data(), keys.size());
  }

  // Makes a new (or existing, empty) request reference the blocks of the
  // first n keys, in that logical order. Cache-only blocks leave the LRU
  // list. n == 0 creates an empty request (grow() then adds blocks).
  Status acquire_cached(RequestId req, const Key* keys, size_t n) {
    if (config_ != Status::kOk) return config_;
    if (n > 0 && keys == nullptr) return Status::kInvalidArgument;
    // No shortcut for n > num_blocks: the loop below meets a miss or a
    // repeated block within num_blocks + 1 keys anyway, and so reports the
    // right one of the two.
    auto it = reqs_.find(req);
    if (it != reqs_.end() && it->second.num_blocks != 0) {
      return Status::kRequestNotEmpty;
    }
    // Check everything before touching anything.
    scratch_.clear();
    const uint32_t epoch = next_epoch();
    size_t nranges = 0;
    for (size_t i = 0; i < n; ++i) {
      auto f = key_map_.find(keys[i]);
      if (f == key_map_.end()) return Status::kCacheMiss;
      const uint32_t b = f->second;
      if (mark_[b] == epoch) return Status::kDuplicateKey;
      mark_[b] = epoch;
      if (i == 0 || b != scratch_.back() + 1) ++nranges;
      scratch_.push_back(b);
    }
    if (nranges > max_ranges_) return Status::kTooManyRanges;
    if (it == reqs_.end()) {
      if (spare_.empty()) {
        it = reqs_.emplace(req, Request{}).first;
      } else {
        RequestNode node = std::move(spare_.back());
        spare_.pop_back();
        node.key() = req;
        it = reqs_.insert(std::move(node)).position;
      }
      hist_add(0);
    }
    Request& r = it->second;
    for (uint32_t b : scratch_) {
      if (ref_[b]++ == 0) {
        lru_remove(b);
        --cached_only_;
        ++used_;
      }
      append(&r, b, 1);
    }
    hist_move(0, r.ranges.size());
    TAGMA_HEAVY_ASSERT(validate(true));
    return Status::kOk;
  }
  Status acquire_cached(RequestId req, const std::vector<Key>& keys, size_t n) {
    if (n > keys.size()) return Status::kInvalidArgument;
    return acquire_cached(req, keys.data(), n);
  }

  // Registers keys for the request's logical blocks [first, first + n). A key
  // already cached by another block keeps its mapping (the duplicate is not
  // cached, as in vLLM); a block that already has the same key is a no-op.
  // The same key twice among the n is kDuplicateKey (nothing changed), as in
  // acquire_cached(): it would name two blocks of one request, and the
  // second could never be cached nor the key list be acquired back.
  Status cache(RequestId req, int64_t first, const Key* keys, size_t n) {
    if (config_ != Status::kOk) return config_;
    if (first < 0 || (n > 0 && keys == nullptr)) {
      return Status::kInvalidArgument;
    }
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return Status::kUnknownRequest;
    const Request& r = it->second;
    if (static_cast<uint64_t>(first) > r.num_blocks ||
        n > r.num_blocks - static_cast<uint64_t>(first)) {
      return Status::kOutOfRange;
    }
    if (n == 0) return Status::kOk;
    if (has_duplicate(keys, n)) return Status::kDuplicateKey;
    // Collect the physical blocks and check for conflicts first.
    scratch_.clear();
    const BlockRange* e = &range_of(r, static_cast<uint32_t>(first));
    uint32_t b = e->start + (static_cast<uint32_t>(first) - e->logical_start);
    for (size_t i = 0; i < n; ++i) {
      if (b == e->start + e->length) {
        ++e;
        b = e->start;
      }
      if (cached_[b] && key_[b] != keys[i]) return Status::kKeyConflict;
      scratch_.push_back(b++);
    }
    for (size_t i = 0; i < n; ++i) {
      const uint32_t pb = scratch_[i];
      if (cached_[pb]) continue;
      if (!key_map_.emplace(keys[i], pb).second) continue;  // keep existing
      cached_[pb] = 1;
      key_[pb] = keys[i];
    }
    TAGMA_HEAVY_ASSERT(validate(true));
    return Status::kOk;
  }
  Status cache(RequestId req, int64_t first, const std::vector<Key>& keys) {
    return cache(req, first, keys.data(), keys.size());
  }

  // Evicts up to n cache-only blocks, least recently used first.
  Status evict(int64_t n, size_t* evicted) {
    if (config_ != Status::kOk) return config_;
    if (n < 0) return Status::kInvalidArgument;
    size_t done = 0;
    while (static_cast<int64_t>(done) < n && cached_only_ > 0) {
      evict_one(false);
      ++done;
    }
    if (evicted != nullptr) *evicted = done;
    TAGMA_HEAVY_ASSERT(validate(true));
    return Status::kOk;
  }

  // Drops every cache key and frees the cache-only blocks. Like vLLM's
  // reset_prefix_cache it refuses (kCacheInUse, nothing changed) while any
  // block is in use. Not counted as evictions.
  Status reset_cache() {
    if (config_ != Status::kOk) return config_;
    if (used_ != 0) return Status::kCacheInUse;
    while (cached_only_ > 0) {
      evict_one(false);
      --evictions_;
    }
    TAGMA_HEAVY_ASSERT(validate(true));
    return Status::kOk;
  }

  // ------------------------------------------------------------- inspection

  KVAllocatorStats stats() const {
    KVAllocatorStats s;
    s.total = n_;
    s.free = free_.num_free();
    s.used = used_;
    s.cached_only = cached_only_;
    s.largest_free_run = free_.largest_run();
    s.num_free_runs = free_.num_runs();
    s.num_requests = reqs_.size();
    s.ranges_total = ranges_total_;
    s.max_ranges_per_request = max_r_;
    s.fallback_allocations = fallback_;
    s.evictions = evictions_;
    return s;
  }

  // Per-block views, for tests and the binding; out-of-range ids give 0/false.
  uint32_t block_ref(int64_t b) const { return in(b) ? ref_[b] : 0; }
  bool block_cached(int64_t b) const { return in(b) && cached_[b] != 0; }
  const Key* block_key(int64_t b) const {
    return block_cached(b) ? &key_[b] : nullptr;
  }
  // Cache-only blocks, least recently used first. O(cached_only).
  std::vector<uint32_t> lru_order() const {
    std::vector<uint32_t> out;
    out.reserve(cached_only_);
    for (int32_t b = lru_next_[n_]; b != static_cast<int32_t>(n_);
         b = lru_next_[b]) {
      out.push_back(static_cast<uint32_t>(b));
    }
    return out;
  }
  // Free runs (start, length) by address. O(runs).
  std::vector<std::pair<uint32_t, uint32_t>> free_runs() const {
    return free_.runs();
  }

  // Recomputes every invariant from scratch, O(blocks + ranges + keys);
  // false at the first failure (printed to stderr when verbose).
  bool validate(bool verbose = false) const {
#define TAGMA_CHECK(cond)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      if (verbose) {                                                         \
        std::fprintf(stderr, "KVAllocator::validate: %s (line %d)\n", #cond, \
                     __LINE__);                                              \
      }                                                                      \
      return false;                                                          \
    }                                                                        \
  } while (0)
    if (config_ != Status::kOk) return n_ == 0 && reqs_.empty();
    TAGMA_CHECK(ref_.size() == n_ && cached_.size() == n_ &&
                key_.size() == n_ && lru_prev_.size() == n_ + 1u &&
                lru_next_.size() == n_ + 1u);
    // 1 + 6: refs and range lists.
    std::vector<uint32_t> ref(n_, 0);
    std::vector<uint64_t> hist(hist_.size(), 0);
    uint64_t ranges_total = 0;
    for (const auto& kv : reqs_) {
      const Request& r = kv.second;
      TAGMA_CHECK(r.ranges.size() <= max_ranges_);
      uint64_t cum = 0;
      for (size_t i = 0; i < r.ranges.size(); ++i) {
        const BlockRange& e = r.ranges[i];
        TAGMA_CHECK(e.length > 0);
        TAGMA_CHECK(static_cast<uint64_t>(e.start) + e.length <= n_);
        TAGMA_CHECK(e.logical_start == cum);
        if (i > 0) {
          const BlockRange& p = r.ranges[i - 1];
          TAGMA_CHECK(p.start + p.length != e.start);  // would have merged
        }
        for (uint32_t b = e.start; b < e.start + e.length; ++b) ++ref[b];
        cum += e.length;
      }
      TAGMA_CHECK(cum == r.num_blocks);
      ++hist[r.ranges.size()];
      ranges_total += r.ranges.size();
    }
    uint64_t used = 0, free_blocks = 0, cached_only = 0, keyed = 0;
    for (uint32_t b = 0; b < n_; ++b) {
      TAGMA_CHECK(ref[b] == ref_[b]);
      if (ref_[b] > 0) ++used;
      if (ref_[b] == 0 && !cached_[b]) ++free_blocks;
      if (ref_[b] == 0 && cached_[b]) ++cached_only;
      if (cached_[b]) {
        ++keyed;
        auto f = key_map_.find(key_[b]);
        TAGMA_CHECK(f != key_map_.end() && f->second == b);  // 4
      } else {
        TAGMA_CHECK(key_[b].empty());
      }
    }
    TAGMA_CHECK(keyed == key_map_.size());
    // 5
    TAGMA_CHECK(used == used_);
    TAGMA_CHECK(free_blocks == free_.num_free());
    TAGMA_CHECK(cached_only == cached_only_);
    TAGMA_CHECK(free_.num_free() + used_ + cached_only_ == n_);
    TAGMA_CHECK(ranges_total == ranges_total_);
    TAGMA_CHECK(hist == hist_);
    uint64_t max_r = 0;
    for (size_t k = 0; k < hist.size(); ++k) {
      if (hist[k] != 0) max_r = k;
    }
    TAGMA_CHECK(max_r == max_r_);
    // 2: free runs: their own invariants, and they cover exactly the FREE
    // blocks (free_blocks counted them above; each run holds only FREE ones).
    TAGMA_CHECK(free_.validate(verbose));
    TAGMA_CHECK(free_.num_blocks() == n_ && free_.alignment() == align_);
    for (const FreeRuns::Run& run : free_.runs()) {
      for (uint32_t b = run.first; b < run.first + run.second; ++b) {
        TAGMA_CHECK(ref_[b] == 0 && !cached_[b]);
      }
    }
    // 3: LRU list.
    uint64_t in_lru = 0;
    int32_t prev = static_cast<int32_t>(n_);
    for (int32_t b = lru_next_[n_]; b != static_cast<int32_t>(n_);
         b = lru_next_[b]) {
      TAGMA_CHECK(b >= 0 && static_cast<uint32_t>(b) < n_);
      TAGMA_CHECK(++in_lru <= n_);  // no cycle
      TAGMA_CHECK(lru_prev_[b] == prev);
      TAGMA_CHECK(ref_[b] == 0 && cached_[b]);
      prev = b;
    }
    TAGMA_CHECK(lru_prev_[n_] == prev);
    TAGMA_CHECK(in_lru == cached_only_);
    return true;
#undef TAGMA_CHECK
  }

 private:
  struct Request {
    std::vector<BlockRange> ranges;
    uint32_t num_blocks = 0;
  };
  using RequestMap = std::unordered_map<RequestId, Request>;
  using RequestNode = RequestMap::node_type;

  bool in(int64_t b) const { return b >= 0 && b < static_cast<int64_t>(n_); }

  // Whether two of keys[0, n) are equal. O(n log n); the pointer scratch
  // keeps its capacity, so the steady state does not allocate.
  bool has_duplicate(const Key* keys, size_t n) {
    if (n < 2) return false;
    if (n == 2) return keys[0] == keys[1];
    key_ptrs_.clear();
    for (size_t i = 0; i < n; ++i) key_ptrs_.push_back(&keys[i]);
    std::sort(key_ptrs_.begin(), key_ptrs_.end(),
              [](const Key* x, const Key* y) { return *x < *y; });
    return std::adjacent_find(key_ptrs_.begin(), key_ptrs_.end(),
                              [](const Key* x, const Key* y) {
                                return *x == *y;
                              }) != key_ptrs_.end();
  }

  Status check_count(int64_t count) const {
    if (config_ != Status::kOk) return config_;
    if (count < 0) return Status::kInvalidArgument;
    if (count == 0) return Status::kZeroCount;
    if (count % align_ != 0) return Status::kMisaligned;
    return Status::kOk;
  }

  // ------------------------------------------------------------- LRU list
  // Intrusive, circular, over int32 index arrays; index n_ is the sentinel,
  // so insert and remove have no branches and never allocate.

  void lru_push_back(uint32_t b) {
    const int32_t s = static_cast<int32_t>(n_), last = lru_prev_[n_];
    lru_prev_[b] = last;
    lru_next_[b] = s;
    lru_next_[last] = static_cast<int32_t>(b);
    lru_prev_[n_] = static_cast<int32_t>(b);
  }
  void lru_push_front(uint32_t b) {
    const int32_t s = static_cast<int32_t>(n_), first = lru_next_[n_];
    lru_next_[b] = first;
    lru_prev_[b] = s;
    lru_prev_[first] = static_cast<int32_t>(b);
    lru_next_[n_] = static_cast<int32_t>(b);
  }
  void lru_remove(uint32_t b) {
    lru_next_[lru_prev_[b]] = lru_next_[b];
    lru_prev_[lru_next_[b]] = lru_prev_[b];
  }

  // Evicts the LRU head. With `log`, the key is kept for unevict().
  void evict_one(bool log) {
    const uint32_t b = static_cast<uint32_t>(lru_next_[n_]);
    lru_remove(b);
    --cached_only_;
    key_map_.erase(key_[b]);
    if (log) {
      evict_log_.emplace_back(b, std::move(key_[b]));
    }
    key_[b].clear();
    cached_[b] = 0;
    free_.put(b, 1);
    ++evictions_;
  }

  // Exact inverse of evict_one(true) when undone in reverse order.
  void unevict(uint32_t b, Key* key) {
    free_.cut(b, 1);
    cached_[b] = 1;
    key_[b] = std::move(*key);
    key_map_.emplace(key_[b], b);
    lru_push_front(b);
    ++cached_only_;
    --evictions_;
  }

  // --------------------------------------------------------- taking blocks

  // Appends physical [start, start + k) at the request's logical end,
  // merging into the last range when they touch.
  static void append(Request* r, uint32_t start, uint32_t k) {
    if (!r->ranges.empty()) {
      BlockRange& last = r->ranges.back();
      if (last.start + last.length == start) {
        last.length += k;
        r->num_blocks += k;
        return;
      }
    }
    r->ranges.push_back(BlockRange{start, k, r->num_blocks});
    r->num_blocks += k;
  }

  static const BlockRange& range_of(const Request& r, uint32_t logical) {
    // Last range whose logical_start <= logical; steady state is one range.
    auto it = std::upper_bound(
        r.ranges.begin(), r.ranges.end(), logical,
        [](uint32_t x, const BlockRange& e) { return x < e.logical_start; });
    return *std::prev(it);
  }

  // Gives `count` (aligned, > 0) blocks to r: in place, then one best-fit
  // run (evicting LRU cache-only blocks if needed), then the multi-range
  // fallback. On failure r and the allocator are exactly as before.
  Status take(Request* r, uint32_t count) {
    // Fast refusal before touching anything: evicting every cache-only
    // block would still not make room.
    if (free_.num_free() + cached_only_ < count) {
      return Status::kOutOfMemory;
    }
    evict_log_.clear();
    uint32_t in_place = 0;
    if (!r->ranges.empty()) {
      const BlockRange& last = r->ranges.back();
      const uint32_t end = last.start + last.length;
      // The free run touching the last range, rounded to the alignment.
      in_place = static_cast<uint32_t>(
          free_.take_after(static_cast<int64_t>(end) - 1, count));
      if (in_place > 0) append(r, end, in_place);
    }
    const uint32_t rest = count - in_place;
    if (rest == 0) {
      mark_refs(r, count);
      return Status::kOk;
    }

    const size_t have = r->ranges.size();
    auto fail = [&](Status s) {
      undo(r, in_place);
      return s;
    };
    if (have >= max_ranges_ && !touches_end(*r)) {
      return fail(Status::kTooManyRanges);
    }
    while (free_.largest_run() < rest && cached_only_ > 0) evict_one(true);

    if (free_.largest_run() >= rest) {
      plan_.assign(1, FreeRuns::Run{free_.pick(rest, policy_, have > 0), rest});
    } else if (!free_.plan(rest, &plan_)) {
      return fail(Status::kOutOfMemory);
    }
    // Count the ranges this would create before creating them.
    size_t new_ranges = 0;
    uint32_t end = r->ranges.empty()
                       ? n_ + 1  // nothing to touch
                       : r->ranges.back().start + r->ranges.back().length;
    for (const FreeRuns::Run& p : plan_) {
      if (p.first != end) ++new_ranges;
      end = p.first + p.second;
    }
    if (have + new_ranges > max_ranges_) return fail(Status::kTooManyRanges);

    for (const FreeRuns::Run& p : plan_) {
      free_.cut(p.first, p.second);
      append(r, p.first, p.second);
    }
    mark_refs(r, count);
    if (plan_.size() > 1) ++fallback_;
    evict_log_.clear();
    return Status::kOk;
  }

  // true when a free run starts right after the request's last range.
  bool touches_end(const Request& r) const {
    if (r.ranges.empty()) return false;
    return free_.run_at(r.ranges.back().start + r.ranges.back().length) != 0;
  }

  // Sets ref 0 -> 1 on the last `count` logical blocks (all freshly taken).
  void mark_refs(Request* r, uint32_t count) {
    uint32_t left = count;
    for (size_t i = r->ranges.size(); i-- > 0 && left > 0;) {
      const BlockRange& e = r->ranges[i];
      const uint32_t k = std::min(left, e.length);
      for (uint32_t b = e.start + e.length - k; b < e.start + e.length; ++b) {
        ref_[b] = 1;
      }
      left -= k;
    }
    used_ += count;
  }

  // Rolls back take(): the in-place blocks, then the evictions.
  void undo(Request* r, uint32_t in_place) {
    if (in_place > 0) {
      BlockRange& last = r->ranges.back();
      last.length -= in_place;
      r->num_blocks -= in_place;
      const uint32_t s = last.start + last.length;
      if (last.length == 0) r->ranges.pop_back();
      free_.put(s, in_place);
    }
    for (size_t i = evict_log_.size(); i-- > 0;) {
      unevict(evict_log_[i].first, &evict_log_[i].second);
    }
    evict_log_.clear();
  }

  // --------------------------------------------------------- bookkeeping

  uint32_t next_epoch() {
    if (++epoch_ == 0) {  // wrapped: old marks could alias
      std::fill(mark_.begin(), mark_.end(), 0);
      epoch_ = 1;
    }
    return epoch_;
  }

  void hist_add(size_t k) {
    ++hist_[k];
    ranges_total_ += k;
    if (k > max_r_) max_r_ = k;
  }
  void hist_remove(size_t k) {
    --hist_[k];
    ranges_total_ -= k;
    while (max_r_ > 0 && hist_[max_r_] == 0) --max_r_;
  }
  void hist_move(size_t from, size_t to) {
    if (from == to) return;
    hist_remove(from);
    hist_add(to);
  }

  // Released requests keep their map node (and range list capacity) for
  // the next request, so a steady stream of requests does not allocate.
  void recycle(RequestMap::iterator it) {
    if (spare_.size() >= 1024) {
      reqs_.erase(it);
      return;
    }
    RequestNode node = reqs_.extract(it);
    node.mapped().ranges.clear();
    node.mapped().num_blocks = 0;
    spare_.push_back(std::move(node));
  }

  Status config_ = Status::kOk;
  FitPolicy policy_ = FitPolicy::kBestFit;
  uint32_t n_ = 0;
  uint32_t align_ = 1;
  uint32_t max_ranges_ = 0;

  std::vector<uint32_t> ref_;    // per block: request references
  std::vector<uint8_t> cached_;  // per block: carries a cache key
  std::vector<Key> key_;         // per block: its key, empty if none
  std::vector<int32_t> lru_prev_, lru_next_;  // n_ + 1 entries, n_ = sentinel
  std::unordered_map<Key, uint32_t> key_map_;

  FreeRuns free_;  // the FREE blocks

  RequestMap reqs_;
  std::vector<uint64_t> hist_;  // hist_[k] = requests holding k ranges

  uint64_t used_ = 0, cached_only_ = 0;
  uint64_t ranges_total_ = 0, max_r_ = 0;
  uint64_t fallback_ = 0, evictions_ = 0;

  // Scratch, reused across calls.
  std::vector<uint32_t> mark_;  // per block: epoch stamp for duplicate checks
  uint32_t epoch_ = 0;
  std::vector<uint32_t> scratch_;
  std::vector<const Key*> key_ptrs_;  // cache(): keys sorted, for duplicates
  std::vector<FreeRuns::Run> plan_;   // (start, length) pieces of a take
  std::vector<std::pair<uint32_t, Key>> evict_log_;
  std::vector<RequestNode> spare_;  // recycled request nodes
};

}  // namespace tagma
