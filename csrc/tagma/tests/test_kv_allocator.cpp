// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../kv_allocator.h"

using tagma::BlockRange;
using tagma::KVAllocator;
using tagma::Status;

namespace {

using Runs = std::vector<std::pair<uint32_t, uint32_t>>;

// (start, length) pairs of a request, in logical order.
Runs ranges_of(const KVAllocator& a, uint64_t req) {
  std::vector<BlockRange> v;
  Runs out;
  if (a.ranges(req, &v) != Status::kOk) return out;
  for (const BlockRange& e : v) out.emplace_back(e.start, e.length);
  return out;
}

std::vector<std::string> keys(const std::string& prefix, int n) {
  std::vector<std::string> k;
  for (int i = 0; i < n; ++i) k.push_back(prefix + std::to_string(i));
  return k;
}

// Everything observable, to show that a failing call changed nothing.
struct Snapshot {
  tagma::KVAllocatorStats stats;
  Runs free_runs;
  std::vector<uint32_t> lru;
  std::vector<Runs> reqs;
  bool operator==(const Snapshot& o) const {
    return stats == o.stats && free_runs == o.free_runs && lru == o.lru &&
           reqs == o.reqs;
  }
};

Snapshot snap(const KVAllocator& a, const std::vector<uint64_t>& ids) {
  Snapshot s{a.stats(), a.free_runs(), a.lru_order(), {}};
  for (uint64_t id : ids) s.reqs.push_back(ranges_of(a, id));
  return s;
}

// Makes a free-run pattern: allocates `sizes` back to back as requests
// 1000.., then releases those whose index is in `drop`.
void carve_pattern(KVAllocator* a, const std::vector<int>& sizes,
                   const std::set<int>& drop) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    REQUIRE(a->allocate(1000 + i, sizes[i]) == Status::kOk);
  }
  for (int i : drop) REQUIRE(a->release(1000 + i) == Status::kOk);
  REQUIRE(a->validate(true));
}

}  // namespace

TEST_CASE("test_kv_allocator_status_str") {
  std::set<std::string> seen;
  for (int s = 0; s <= static_cast<int>(Status::kLast); ++s) {
    seen.insert(tagma::status_str(static_cast<Status>(s)));
  }
  CHECK(seen.size() == static_cast<size_t>(Status::kLast) + 1);
  CHECK(std::string(tagma::status_str(static_cast<Status>(1000))) ==
        "unknown status");
}

TEST_CASE("test_kv_allocator_bad_config") {
  for (auto cfg :
       std::vector<std::vector<int64_t>>{{0, 1, 1},
                                         {-5, 1, 1},
                                         {8, 0, 1},
                                         {8, 16, 1},
                                         {8, 1, 0},
                                         {KVAllocator::kMaxBlocks + 1, 1, 1}}) {
    KVAllocator a(cfg[0], cfg[1], cfg[2]);
    CHECK(a.config_status() == Status::kBadConfig);
    CHECK(a.allocate(1, 1) == Status::kBadConfig);
    CHECK(a.grow(1, 1) == Status::kBadConfig);
    CHECK(a.release(1) == Status::kBadConfig);
    CHECK(a.acquire_cached(1, nullptr, 0) == Status::kBadConfig);
    CHECK(a.cache(1, 0, nullptr, 0) == Status::kBadConfig);
    CHECK(a.evict(1, nullptr) == Status::kBadConfig);
    CHECK(a.reset_cache() == Status::kBadConfig);
    CHECK(a.stats().total == 0);
    CHECK(a.validate(true));
  }
  KVAllocator ok(8, 8, 1);
  CHECK(ok.config_status() == Status::kOk);
}

TEST_CASE("test_kv_allocator_allocate_contiguous") {
  KVAllocator a(64);
  REQUIRE(a.allocate(1, 10) == Status::kOk);
  REQUIRE(a.allocate(2, 5) == Status::kOk);
  CHECK(ranges_of(a, 1) == Runs{{0, 10}});
  CHECK(ranges_of(a, 2) == Runs{{10, 5}});
  CHECK(a.request_blocks(1) == 10);
  CHECK(a.request_blocks(99) == -1);
  const auto st = a.stats();
  CHECK(st.used == 15);
  CHECK(st.free == 49);
  CHECK(st.num_requests == 2);
  CHECK(st.ranges_total == 2);
  CHECK(st.max_ranges_per_request == 1);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_best_fit_lowest_address") {
  // Holes of 4 at [0,4) and 6 at [7,13), then 50 free from 14.
  KVAllocator a(64);
  carve_pattern(&a, {4, 3, 6, 1, 4}, {0, 2, 4});
  CHECK(a.free_runs() == Runs{{0, 4}, {7, 6}, {14, 50}});
  REQUIRE(a.allocate(1, 4) == Status::kOk);  // exact fit
  CHECK(ranges_of(a, 1) == Runs{{0, 4}});
  REQUIRE(a.allocate(2, 5) == Status::kOk);  // 6 fits best
  CHECK(ranges_of(a, 2) == Runs{{7, 5}});
  REQUIRE(a.allocate(3, 7) == Status::kOk);  // only the tail fits
  CHECK(ranges_of(a, 3) == Runs{{14, 7}});
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_allocate_errors_leave_state_unchanged") {
  KVAllocator a(16, 2, 4);
  REQUIRE(a.allocate(1, 6) == Status::kOk);
  const Snapshot before = snap(a, {1, 2});
  CHECK(a.allocate(2, 0) == Status::kZeroCount);
  CHECK(a.allocate(2, -2) == Status::kInvalidArgument);
  CHECK(a.allocate(2, 3) == Status::kMisaligned);
  CHECK(a.allocate(1, 2) == Status::kDuplicateRequest);
  CHECK(a.allocate(2, 12) == Status::kOutOfMemory);
  CHECK(a.allocate(2, int64_t{1} << 40) == Status::kOutOfMemory);
  CHECK(snap(a, {1, 2}) == before);
  CHECK(!a.contains(2));
  CHECK(a.validate(true));
  REQUIRE(a.allocate(2, 10) == Status::kOk);  // still usable: exactly full
  CHECK(a.stats().free == 0);
}

TEST_CASE("test_kv_allocator_alignment") {
  KVAllocator a(32, 4);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.acquire_cached(7, nullptr, 0) == Status::kOk);
  // Make an unaligned free run: cache block 1 only, hold it, free the rest.
  const auto k = keys("a", 4);
  REQUIRE(a.cache(1, 1, &k[1], 1) == Status::kOk);
  REQUIRE(a.acquire_cached(2, &k[1], 1) == Status::kOk);
  REQUIRE(a.release(1) == Status::kOk);
  // Free: [0,1) and [2,32). Usable aligned capacity of [2,32) is 28 (4..32).
  CHECK(a.free_runs() == Runs{{0, 1}, {2, 30}});
  CHECK(a.stats().largest_free_run == 28);
  REQUIRE(a.allocate(3, 8) == Status::kOk);
  CHECK(ranges_of(a, 3) == Runs{{4, 8}});  // start rounded up to 4
  CHECK(a.allocate(4, 28) == Status::kOutOfMemory);
  CHECK(a.validate(true));
  // Grow of the unaligned acquired range: takes aligned counts in place.
  REQUIRE(a.grow(2, 4) == Status::kOk);
  CHECK(ranges_of(a, 2) == Runs{{1, 1}, {12, 4}});
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_grow_in_place_and_merge") {
  KVAllocator a(64);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  for (int i = 0; i < 20; ++i) REQUIRE(a.grow(1, 1) == Status::kOk);
  CHECK(ranges_of(a, 1) == Runs{{0, 24}});
  CHECK(a.request_blocks(1) == 24);
  // Block the end; the next growth goes elsewhere, then merges on append
  // once it continues in place there.
  REQUIRE(a.allocate(2, 1) == Status::kOk);  // block 24
  REQUIRE(a.grow(1, 2) == Status::kOk);
  CHECK(ranges_of(a, 1) == Runs{{0, 24}, {25, 2}});
  REQUIRE(a.grow(1, 3) == Status::kOk);
  CHECK(ranges_of(a, 1) == Runs{{0, 24}, {25, 5}});
  CHECK(a.stats().max_ranges_per_request == 2);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_grow_partial_in_place") {
  KVAllocator a(32);
  // Request 1 at [0,4), a 2-block hole at [4,6), request 3 at [6,8).
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.allocate(2, 2) == Status::kOk);
  REQUIRE(a.allocate(3, 2) == Status::kOk);
  REQUIRE(a.release(2) == Status::kOk);
  REQUIRE(a.grow(1, 5) == Status::kOk);  // 2 in place, 3 after request 3
  CHECK(ranges_of(a, 1) == Runs{{0, 6}, {8, 3}});
  uint32_t pb = 0;
  REQUIRE(a.physical_block(1, 6, &pb) == Status::kOk);
  CHECK(pb == 8);
  CHECK(a.stats().fallback_allocations == 0);  // one new range, not fallback
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_grow_errors_leave_state_unchanged") {
  KVAllocator a(16, 1, 2);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.allocate(2, 10) == Status::kOk);
  const Snapshot before = snap(a, {1, 2, 3});
  CHECK(a.grow(3, 1) == Status::kUnknownRequest);
  CHECK(a.grow(1, 0) == Status::kZeroCount);
  CHECK(a.grow(1, -1) == Status::kInvalidArgument);
  CHECK(a.grow(1, 3) == Status::kOutOfMemory);
  CHECK(snap(a, {1, 2, 3}) == before);
  REQUIRE(a.grow(1, 2) == Status::kOk);
  CHECK(ranges_of(a, 1) == Runs{{0, 4}, {14, 2}});
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_release_coalesces") {
  KVAllocator a(64);
  for (int i = 0; i < 8; ++i) REQUIRE(a.allocate(i, 8) == Status::kOk);
  CHECK(a.stats().free == 0);
  for (int i : {1, 3, 5, 7, 0, 2, 6, 4}) {
    REQUIRE(a.release(i) == Status::kOk);
    REQUIRE(a.validate(true));
  }
  CHECK(a.free_runs() == Runs{{0, 64}});
  // OffsetAllocator's habit: once everything is back, all of it is one
  // range at offset 0.
  REQUIRE(a.allocate(9, 64) == Status::kOk);
  CHECK(ranges_of(a, 9) == Runs{{0, 64}});
}

TEST_CASE("test_kv_allocator_release_errors") {
  KVAllocator a(8);
  REQUIRE(a.allocate(1, 3) == Status::kOk);
  REQUIRE(a.release(1) == Status::kOk);
  const Snapshot before = snap(a, {1});
  CHECK(a.release(1) == Status::kUnknownRequest);  // double release
  CHECK(a.release(42) == Status::kUnknownRequest);
  CHECK(snap(a, {1}) == before);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_fallback_multi_range") {
  // Free runs of 3, 5, 2, 4 between 1-block requests; no cache to evict.
  KVAllocator a(20);
  carve_pattern(&a, {3, 1, 5, 1, 2, 1, 4, 3}, {0, 2, 4, 6});
  CHECK(a.free_runs() == Runs{{0, 3}, {4, 5}, {10, 2}, {13, 4}});
  REQUIRE(a.allocate(1, 11) == Status::kOk);
  // Largest first: 5, then 4; the last 2 blocks from the best fit (the
  // 2-hole, not the 3-hole).
  CHECK(ranges_of(a, 1) == Runs{{4, 5}, {13, 4}, {10, 2}});
  CHECK(a.free_runs() == Runs{{0, 3}});
  const auto st = a.stats();
  CHECK(st.fallback_allocations == 1);
  CHECK(st.max_ranges_per_request == 3);
  uint32_t pb = 0;
  REQUIRE(a.physical_block(1, 9, &pb) == Status::kOk);
  CHECK(pb == 10);
  std::vector<uint32_t> table;
  REQUIRE(a.blocks(1, &table) == Status::kOk);
  CHECK(table == std::vector<uint32_t>{4, 5, 6, 7, 8, 13, 14, 15, 16, 10, 11});
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_too_many_ranges_rolls_back") {
  // max 2 ranges; free runs 3, 5, 2, 4 and one cache-only block that an
  // eviction would use: the refused call must restore it too.
  KVAllocator a(21, 1, 2);
  carve_pattern(&a, {3, 1, 5, 1, 2, 1, 4, 3, 1}, {0, 2, 4, 6});
  const auto k = keys("c", 1);
  REQUIRE(a.cache(1008, 0, k) == Status::kOk);
  REQUIRE(a.release(1008) == Status::kOk);  // block 20 is cache-only
  const Snapshot before = snap(a, {1});
  CHECK(a.allocate(1, 12) == Status::kTooManyRanges);
  CHECK(snap(a, {1}) == before);
  CHECK(a.lookup(k) == 1);
  CHECK(a.validate(true));
  REQUIRE(a.allocate(1, 9) == Status::kOk);  // 5 + 4 fits in two
  CHECK(ranges_of(a, 1) == Runs{{4, 5}, {13, 4}});
  CHECK(a.stats().evictions == 1);  // evicted looking for one run of 9
}

TEST_CASE("test_kv_allocator_evict_for_contiguity") {
  KVAllocator a(16);
  REQUIRE(a.allocate(1, 8) == Status::kOk);
  REQUIRE(a.allocate(2, 8) == Status::kOk);
  const auto k = keys("p", 8);
  REQUIRE(a.cache(1, 0, k) == Status::kOk);
  REQUIRE(a.release(1) == Status::kOk);  // 8 cache-only blocks
  REQUIRE(a.release(2) == Status::kOk);  // 8 free
  CHECK(a.free_runs() == Runs{{8, 8}});
  // 10 blocks: no run fits; LRU evicts tail first (blocks 7, 6), which
  // joins the free run at 8 and makes [6, 16) a run of 10.
  REQUIRE(a.allocate(3, 10) == Status::kOk);
  CHECK(ranges_of(a, 3) == Runs{{6, 10}});
  CHECK(a.stats().evictions == 2);
  CHECK(a.lookup(k) == 6);
  CHECK(a.stats().fallback_allocations == 0);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_oom_after_evictions_rolls_back") {
  // Alignment 2: single free blocks cannot hold an aligned pair even after
  // every cache-only block is evicted; the call must undo its evictions.
  KVAllocator a(8, 2);
  REQUIRE(a.allocate(1, 8) == Status::kOk);
  const auto k = keys("x", 8);
  REQUIRE(a.cache(1, 0, k) == Status::kOk);
  for (int b : {1, 3, 5, 7}) {
    REQUIRE(a.acquire_cached(10 + b, &k[b], 1) == Status::kOk);
  }
  REQUIRE(a.release(1) == Status::kOk);
  size_t ev = 0;
  REQUIRE(a.evict(2, &ev) == Status::kOk);  // tail first: 6, then 4
  CHECK(ev == 2);
  CHECK(a.lru_order() == std::vector<uint32_t>{2, 0});
  const Snapshot before = snap(a, {1, 99});
  CHECK(a.allocate(99, 2) == Status::kOutOfMemory);
  CHECK(snap(a, {1, 99}) == before);
  CHECK(a.lookup(k) == 4);  // keys x0..x3: blocks 0, 1, 2, 3 still cached
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_prefix_acquire_and_grow") {
  KVAllocator a(32);
  REQUIRE(a.allocate(1, 6) == Status::kOk);  // [0, 6)
  const auto k = keys("h", 6);
  REQUIRE(a.cache(1, 0, k) == Status::kOk);
  CHECK(a.lookup(k) == 6);
  auto k2 = k;
  k2[3] = "other";
  CHECK(a.lookup(k2) == 3);
  CHECK(a.lookup(nullptr, 3) == 0);
  // A second request shares the first 4 blocks while request 1 lives.
  REQUIRE(a.acquire_cached(2, k, 4) == Status::kOk);
  CHECK(ranges_of(a, 2) == Runs{{0, 4}});
  CHECK(a.block_ref(0) == 2);
  CHECK(a.block_ref(5) == 1);
  REQUIRE(a.grow(2, 3) == Status::kOk);  // block 4 is used: a new range
  CHECK(ranges_of(a, 2) == Runs{{0, 4}, {6, 3}});
  REQUIRE(a.release(1) == Status::kOk);
  // Blocks 4, 5 are cache-only now; 0..3 still held by request 2.
  CHECK(a.lru_order() == std::vector<uint32_t>{5, 4});
  CHECK(a.stats().cached_only == 2);
  // Scattered cached blocks: the range list follows physical adjacency.
  const std::vector<std::string> mix{k[4], k[5], k[0], k[1]};
  REQUIRE(a.acquire_cached(3, mix, 4) == Status::kOk);
  CHECK(ranges_of(a, 3) == Runs{{4, 2}, {0, 2}});
  CHECK(a.lru_order().empty());
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_acquire_errors_leave_state_unchanged") {
  KVAllocator a(16, 1, 2);
  REQUIRE(a.allocate(1, 8) == Status::kOk);
  const auto k = keys("q", 8);
  REQUIRE(a.cache(1, 0, k) == Status::kOk);
  REQUIRE(a.release(1) == Status::kOk);
  REQUIRE(a.allocate(2, 2) == Status::kOk);
  const Snapshot before = snap(a, {2, 3});
  const std::vector<std::string> miss{k[0], "nope"};
  const std::vector<std::string> dup{k[0], k[1], k[0]};
  const std::vector<std::string> three{k[0], k[2], k[4]};  // 3 ranges > 2
  CHECK(a.acquire_cached(3, miss, 2) == Status::kCacheMiss);
  CHECK(a.acquire_cached(3, dup, 3) == Status::kDuplicateKey);
  CHECK(a.acquire_cached(3, three, 3) == Status::kTooManyRanges);
  CHECK(a.acquire_cached(2, k, 1) == Status::kRequestNotEmpty);
  CHECK(a.acquire_cached(3, k, 9) == Status::kInvalidArgument);
  CHECK(a.acquire_cached(3, nullptr, 1) == Status::kInvalidArgument);
  CHECK(snap(a, {2, 3}) == before);
  CHECK(a.validate(true));
  // An empty request can still acquire.
  REQUIRE(a.acquire_cached(3, nullptr, 0) == Status::kOk);
  CHECK(a.request_blocks(3) == 0);
  REQUIRE(a.acquire_cached(3, k, 2) == Status::kOk);
  CHECK(ranges_of(a, 3) == Runs{{0, 2}});
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_cache_keeps_existing_mapping") {
  KVAllocator a(16);
  REQUIRE(a.allocate(1, 2) == Status::kOk);
  REQUIRE(a.allocate(2, 2) == Status::kOk);
  REQUIRE(a.cache(1, 0, keys("k", 2)) == Status::kOk);
  // Request 2 computed the same content: its duplicate is not cached.
  REQUIRE(a.cache(2, 0, keys("k", 2)) == Status::kOk);
  CHECK(a.block_cached(0));
  CHECK(!a.block_cached(2));
  CHECK(*a.block_key(1) == "k1");
  CHECK(a.block_key(3) == nullptr);
  // Re-caching the same key on the same block is a no-op.
  REQUIRE(a.cache(1, 1, keys("k", 2).data() + 1, 1) == Status::kOk);
  REQUIRE(a.release(2) == Status::kOk);
  CHECK(a.stats().cached_only == 0);  // the duplicate blocks went free
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_cache_errors_leave_state_unchanged") {
  KVAllocator a(16);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.cache(1, 0, keys("z", 2)) == Status::kOk);
  const Snapshot before = snap(a, {1});
  const auto k = keys("w", 3);
  CHECK(a.cache(9, 0, k) == Status::kUnknownRequest);
  CHECK(a.cache(1, -1, k) == Status::kInvalidArgument);
  CHECK(a.cache(1, 2, k) == Status::kOutOfRange);  // 2 + 3 > 4
  CHECK(a.cache(1, 5, nullptr, 0) == Status::kOutOfRange);
  CHECK(a.cache(1, 0, nullptr, 2) == Status::kInvalidArgument);
  // Block 1 has key z1; w1 conflicts, and the w0/w2 parts must not stick.
  CHECK(a.cache(1, 1, k) == Status::kKeyConflict);
  CHECK(snap(a, {1}) == before);
  CHECK(a.lookup(k) == 0);
  CHECK(a.cache(1, 4, nullptr, 0) == Status::kOk);  // empty is fine
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_cache_duplicate_keys_rejected") {
  // acquire_cached() rejects the same key twice; cache() must not accept a
  // key list that could then not be acquired back.
  KVAllocator a(16);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.cache(1, 0, keys("z", 1)) == Status::kOk);
  const Snapshot before = snap(a, {1});
  const std::vector<std::string> two{"d", "d"};
  const std::vector<std::string> later{"z0", "x", "y", "x"};  // x twice
  const std::vector<std::string> own{"z0", "z0"};  // block 0's own key, twice
  CHECK(a.cache(1, 1, two) == Status::kDuplicateKey);
  CHECK(a.cache(1, 2, two) == Status::kDuplicateKey);
  CHECK(a.cache(1, 0, later) == Status::kDuplicateKey);
  CHECK(a.cache(1, 0, own) == Status::kDuplicateKey);
  CHECK(snap(a, {1}) == before);
  CHECK(a.lookup(std::vector<std::string>{"d"}) == 0);
  CHECK(a.lookup(std::vector<std::string>{"x"}) == 0);
  CHECK(*a.block_key(0) == "z0");
  CHECK(!a.block_cached(1));
  // Argument errors come first, then duplicates, then conflicts (block 0
  // carries z0, not d).
  CHECK(a.cache(1, 3, two) == Status::kOutOfRange);
  CHECK(a.cache(2, 0, two) == Status::kUnknownRequest);
  CHECK(a.cache(1, 0, two) == Status::kDuplicateKey);
  CHECK(a.cache(1, 0, std::vector<std::string>{"d", "e"}) ==
        Status::kKeyConflict);
  // Distinct keys: what was cached can be acquired back.
  const std::vector<std::string> ok{"z0", "y", "x"};
  REQUIRE(a.cache(1, 0, ok) == Status::kOk);
  REQUIRE(a.acquire_cached(2, ok, 3) == Status::kOk);
  CHECK(ranges_of(a, 2) == Runs{{0, 3}});
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_acquire_more_keys_than_blocks") {
  // More keys than blocks: a repeated key is kDuplicateKey, a missing one
  // kCacheMiss, whichever comes first (not always kCacheMiss).
  KVAllocator a(2);
  REQUIRE(a.allocate(1, 2) == Status::kOk);
  const auto k = keys("m", 2);
  REQUIRE(a.cache(1, 0, k) == Status::kOk);
  const Snapshot before = snap(a, {1, 2});
  const std::vector<std::string> dup{k[0], k[1], k[0]};
  const std::vector<std::string> miss{k[0], k[1], "nope"};
  CHECK(a.acquire_cached(2, dup, 3) == Status::kDuplicateKey);
  CHECK(a.acquire_cached(2, miss, 3) == Status::kCacheMiss);
  CHECK(snap(a, {1, 2}) == before);
  REQUIRE(a.acquire_cached(2, dup, 2) == Status::kOk);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_release_lru_tail_first") {
  KVAllocator a(16);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.allocate(2, 2) == Status::kOk);
  REQUIRE(a.cache(1, 0, keys("a", 4)) == Status::kOk);
  REQUIRE(a.cache(2, 0, keys("b", 2)) == Status::kOk);
  REQUIRE(a.release(1) == Status::kOk);
  REQUIRE(a.release(2) == Status::kOk);
  // Older request first; within one, its tail first.
  CHECK(a.lru_order() == std::vector<uint32_t>{3, 2, 1, 0, 5, 4});
  size_t ev = 0;
  REQUIRE(a.evict(3, &ev) == Status::kOk);
  CHECK(ev == 3);
  CHECK(a.lru_order() == std::vector<uint32_t>{0, 5, 4});
  CHECK(a.lookup(keys("a", 4)) == 1);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_evict") {
  KVAllocator a(8);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.cache(1, 0, keys("e", 4)) == Status::kOk);
  size_t ev = 99;
  REQUIRE(a.evict(10, &ev) == Status::kOk);
  CHECK(ev == 0);  // in use: nothing is evictable
  REQUIRE(a.release(1) == Status::kOk);
  const Snapshot before = snap(a, {});
  CHECK(a.evict(-1, &ev) == Status::kInvalidArgument);
  CHECK(snap(a, {}) == before);
  REQUIRE(a.evict(0, &ev) == Status::kOk);
  CHECK(ev == 0);
  REQUIRE(a.evict(10, nullptr) == Status::kOk);
  const auto st = a.stats();
  CHECK(st.evictions == 4);
  CHECK(st.free == 8);
  CHECK(st.num_free_runs == 1);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_reset_cache") {
  KVAllocator a(8);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  REQUIRE(a.cache(1, 0, keys("r", 4)) == Status::kOk);
  REQUIRE(a.allocate(2, 2) == Status::kOk);
  REQUIRE(a.release(1) == Status::kOk);
  const Snapshot before = snap(a, {2});
  CHECK(a.reset_cache() == Status::kCacheInUse);  // request 2 is running
  CHECK(snap(a, {2}) == before);
  REQUIRE(a.release(2) == Status::kOk);
  REQUIRE(a.reset_cache() == Status::kOk);
  const auto st = a.stats();
  CHECK(st.free == 8);
  CHECK(st.cached_only == 0);
  CHECK(st.evictions == 0);  // a reset is not an eviction
  CHECK(a.lookup(keys("r", 4)) == 0);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_shared_refcount") {
  KVAllocator a(16);
  REQUIRE(a.allocate(1, 4) == Status::kOk);
  const auto k = keys("s", 4);
  REQUIRE(a.cache(1, 0, k) == Status::kOk);
  REQUIRE(a.acquire_cached(2, k, 4) == Status::kOk);
  REQUIRE(a.acquire_cached(3, k, 2) == Status::kOk);
  CHECK(a.block_ref(0) == 3);
  CHECK(a.block_ref(3) == 2);
  REQUIRE(a.release(1) == Status::kOk);
  REQUIRE(a.release(2) == Status::kOk);
  CHECK(a.stats().used == 2);
  CHECK(a.lru_order() == std::vector<uint32_t>{3, 2});
  REQUIRE(a.release(3) == Status::kOk);
  CHECK(a.lru_order() == std::vector<uint32_t>{3, 2, 1, 0});
  CHECK(a.block_ref(-1) == 0);
  CHECK(a.block_ref(16) == 0);
  CHECK(a.validate(true));
}

TEST_CASE("test_kv_allocator_accessors_and_stats") {
  KVAllocator a(32, 1, 8);
  carve_pattern(&a, {2, 1, 2, 1, 2, 1}, {0, 2, 4});
  REQUIRE(a.allocate(1, 6) == Status::kOk);
  size_t n = 0;
  const BlockRange* r = a.ranges_data(1, &n);
  REQUIRE(r != nullptr);
  CHECK(n == 1);  // the 23-block tail fits in one run
  CHECK((r[0].start == 9 && r[0].length == 6 && r[0].logical_start == 0));
  CHECK(a.ranges_data(77, &n) == nullptr);
  CHECK(n == 0);
  uint32_t pb = 0;
  CHECK(a.physical_block(1, 6, &pb) == Status::kOutOfRange);
  CHECK(a.physical_block(1, -1, &pb) == Status::kOutOfRange);
  CHECK(a.physical_block(77, 0, &pb) == Status::kUnknownRequest);
  CHECK(a.physical_block(1, 0, nullptr) == Status::kInvalidArgument);
  CHECK(a.ranges(1, nullptr) == Status::kInvalidArgument);
  CHECK(a.blocks(77, nullptr) == Status::kInvalidArgument);
  REQUIRE(a.allocate(2, 23) == Status::kOk);  // 17 + 2 + 2 + 2: fallback
  CHECK(ranges_of(a, 2) == Runs{{15, 17}, {6, 2}, {3, 2}, {0, 2}});
  auto st = a.stats();
  CHECK(st.max_ranges_per_request == 4);
  CHECK(st.fallback_allocations == 1);
  CHECK(st.free == 0);
  REQUIRE(a.release(2) == Status::kOk);
  st = a.stats();
  CHECK(st.max_ranges_per_request == 1);  // recomputed on release
  CHECK(st.ranges_total == 4);            // 1 + three 1-block requests
  CHECK(st.num_requests == 4);
  CHECK(a.validate(true));
}
