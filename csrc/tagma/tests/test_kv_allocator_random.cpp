// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// Randomized invariant test: long random op sequences, after every op
// KVAllocator::validate() AND a comparison with an independent reference
// model that keeps plain per-block state arrays. The model predicts every
// error status, the best-fit placement, in-place growth and the LRU order;
// where the allocator has a choice the model accepts (multi-range fallback
// placement), the model checks the outcome instead: exactly the requested
// number of blocks, all of them free before the call (or evicted in LRU
// order by it), range list == physical adjacency of the block list.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <list>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../kv_allocator.h"
#include "random_ops.h"

using tagma::BlockRange;
using tagma::KVAllocator;
using tagma::Status;

namespace {

struct Model {
  uint32_t n, align, max_ranges;
  std::vector<uint32_t> ref;
  std::vector<std::string> key;  // empty = no key
  std::map<std::string, uint32_t> keymap;
  std::list<uint32_t> lru;  // front = least recently used
  std::map<uint64_t, std::vector<uint32_t>> reqs;
  uint64_t evictions = 0;

  Model(uint32_t n_, uint32_t a, uint32_t r)
      : n(n_), align(a), max_ranges(r), ref(n_, 0), key(n_) {}

  bool is_free(uint32_t b) const { return ref[b] == 0 && key[b].empty(); }
  uint64_t free_count() const {
    uint64_t c = 0;
    for (uint32_t b = 0; b < n; ++b) c += is_free(b);
    return c;
  }
  uint64_t usable(uint64_t s, uint64_t l) const {
    const uint64_t a = (s + align - 1) / align * align;
    if (a >= s + l) return 0;
    return (s + l - a) / align * align;
  }
  // Best fit over the current free runs: smallest usable >= count, lowest
  // start on ties. Returns the aligned start, or -1.
  int64_t best_fit(uint64_t count, uint64_t* largest) const {
    int64_t best = -1;
    uint64_t best_u = ~uint64_t{0};
    *largest = 0;
    for (uint32_t b = 0; b < n;) {
      if (!is_free(b)) {
        ++b;
        continue;
      }
      uint32_t e = b;
      while (e < n && is_free(e)) ++e;
      const uint64_t u = usable(b, e - b);
      *largest = std::max(*largest, u);
      if (u >= count && u < best_u) {
        best_u = u;
        best = static_cast<int64_t>((b + align - 1) / align * align);
      }
      b = e;
    }
    return best;
  }
  void evict_front() {
    const uint32_t b = lru.front();
    lru.pop_front();
    keymap.erase(key[b]);
    key[b].clear();
    ++evictions;
  }
  void release(uint64_t id) {
    const std::vector<uint32_t>& v = reqs[id];
    for (size_t i = v.size(); i-- > 0;) {
      const uint32_t b = v[i];
      if (--ref[b] == 0 && !key[b].empty()) lru.push_back(b);
    }
    reqs.erase(id);
  }
};

struct Checker {
  KVAllocator& a;
  Model& m;
  uint64_t ops = 0;

  // Compares the whole allocator with the model.
  void compare() {
    REQUIRE(a.validate(true));
    uint64_t used = 0, cached_only = 0, fr = 0;
    for (uint32_t b = 0; b < m.n; ++b) {
      REQUIRE(a.block_ref(b) == m.ref[b]);
      REQUIRE(a.block_cached(b) == !m.key[b].empty());
      if (!m.key[b].empty()) REQUIRE(*a.block_key(b) == m.key[b]);
      used += m.ref[b] > 0;
      cached_only += m.ref[b] == 0 && !m.key[b].empty();
      fr += m.is_free(b);
    }
    const auto st = a.stats();
    REQUIRE(st.used == used);
    REQUIRE(st.cached_only == cached_only);
    REQUIRE(st.free == fr);
    REQUIRE(fr + used + cached_only == m.n);
    REQUIRE(st.num_requests == m.reqs.size());
    REQUIRE(st.evictions == m.evictions);
    const std::vector<uint32_t> lru(m.lru.begin(), m.lru.end());
    REQUIRE(a.lru_order() == lru);
    std::vector<uint32_t> blocks;
    for (const auto& kv : m.reqs) {
      REQUIRE(a.blocks(kv.first, &blocks) == Status::kOk);
      REQUIRE(blocks == kv.second);
      // Ranges are exactly the physical adjacency of the block list.
      size_t n = 0;
      const BlockRange* r = a.ranges_data(kv.first, &n);
      size_t expect = 0;
      for (size_t i = 0; i < kv.second.size(); ++i) {
        if (i == 0 || kv.second[i] != kv.second[i - 1] + 1) ++expect;
      }
      REQUIRE(n == expect);
      REQUIRE(n <= m.max_ranges);
      if (n > 0) REQUIRE(r != nullptr);
    }
  }

  // After a successful allocate/grow of `count` blocks for `id`: the model
  // learns which blocks were taken (and which were evicted on the way).
  void absorb_take(uint64_t id, const std::vector<uint32_t>& old_blocks,
                   uint64_t count) {
    std::vector<uint32_t> now;
    REQUIRE(a.blocks(id, &now) == Status::kOk);
    REQUIRE(now.size() == old_blocks.size() + count);
    REQUIRE(std::equal(old_blocks.begin(), old_blocks.end(), now.begin()));
    // Evicted = cache-only blocks that lost their key: an LRU prefix.
    size_t evicted = 0;
    for (uint32_t b : m.lru) {
      if (a.block_cached(b)) break;
      ++evicted;
    }
    for (size_t i = 0; i < evicted; ++i) m.evict_front();
    for (uint32_t b : m.lru) REQUIRE(a.block_cached(b));  // only a prefix
    for (size_t i = old_blocks.size(); i < now.size(); ++i) {
      REQUIRE(now[i] < m.n);
      REQUIRE(m.is_free(now[i]));
      m.ref[now[i]] = 1;
    }
    m.reqs[id] = now;
  }
};

std::string key_name(uint64_t k) { return "k" + std::to_string(k); }

void run_random(uint32_t n, uint32_t align, uint32_t max_ranges,
                uint64_t num_ops, uint64_t seed,
                tagma::FitPolicy policy = tagma::FitPolicy::kBestFit) {
  KVAllocator a(n, align, max_ranges);
  REQUIRE(a.config_status() == Status::kOk);
  a.set_fit_policy(policy);
  const bool best_fit = policy == tagma::FitPolicy::kBestFit;
  Model m(n, align, max_ranges);
  Checker c{a, m};
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t hi) { return rng() % hi; };  // [0, hi)
  const uint64_t kIds = 12;
  const uint64_t kKeys = 3 * n;  // key universe: hits and misses both
  std::vector<std::string> keys;
  uint64_t outcome[8] = {};

  for (uint64_t op = 0; op < num_ops; ++op) {
    const auto before = a.stats();
    const uint64_t id = pick(kIds);
    const uint64_t which = pick(100);
    Status s = Status::kOk;
    Status expect = Status::kOk;
    bool predicted = true;  // false: the model accepts several outcomes

    if (which < 22) {  // allocate
      int64_t count = static_cast<int64_t>(pick(n / 3 + 2)) * align;
      if (pick(50) == 0) count = -static_cast<int64_t>(align);
      if (align > 1 && pick(20) == 0) count += 1;
      const bool exists = m.reqs.count(id) != 0;
      const uint64_t avail = m.free_count() + m.lru.size();
      uint64_t largest = 0;
      const int64_t fit =
          count > 0 ? m.best_fit(static_cast<uint64_t>(count), &largest) : -1;
      s = a.allocate(id, count);
      if (count < 0) {
        expect = Status::kInvalidArgument;
      } else if (count == 0) {
        expect = Status::kZeroCount;
      } else if (count % align != 0) {
        expect = Status::kMisaligned;
      } else if (exists) {
        expect = Status::kDuplicateRequest;
      } else if (static_cast<uint64_t>(count) > avail) {
        expect = Status::kOutOfMemory;
      } else if (fit >= 0) {
        expect = Status::kOk;  // one best-fit run, no eviction
        REQUIRE(s == Status::kOk);
        c.absorb_take(id, {}, count);
        REQUIRE(m.lru.size() == before.cached_only);  // nothing evicted
        if (best_fit) REQUIRE(m.reqs[id].front() == static_cast<uint32_t>(fit));
        REQUIRE(a.stats().ranges_total == before.ranges_total + 1);
      } else {
        predicted = false;
        if (align == 1) REQUIRE(s != Status::kOutOfMemory);
        REQUIRE((s == Status::kOk || s == Status::kOutOfMemory ||
                 s == Status::kTooManyRanges));
        if (s == Status::kOk) c.absorb_take(id, {}, count);
      }
      if (s == Status::kOk) {
        size_t nr = 0;
        const BlockRange* r = a.ranges_data(id, &nr);
        for (size_t i = 0; i < nr; ++i) REQUIRE(r[i].start % align == 0);
      }
    } else if (which < 50) {  // grow
      int64_t count =
          static_cast<int64_t>(1 + pick(pick(4) == 0 ? n / 4 + 1 : 3)) * align;
      if (pick(50) == 0) count = 0;
      const auto it = m.reqs.find(id);
      const uint64_t avail = m.free_count() + m.lru.size();
      if (count == 0) {  // argument checks come before the lookup
        expect = Status::kZeroCount;
        s = a.grow(id, count);
      } else if (it == m.reqs.end()) {
        expect = Status::kUnknownRequest;
        s = a.grow(id, count);
      } else if (static_cast<uint64_t>(count) > avail) {
        expect = Status::kOutOfMemory;
        s = a.grow(id, count);
      } else {
        // Predict the in-place part.
        const std::vector<uint32_t> old = it->second;
        uint64_t in_place = 0;
        if (!old.empty()) {
          uint32_t e = old.back() + 1;
          uint64_t run = 0;
          while (e + run < n && m.is_free(e + run)) ++run;
          in_place = std::min<uint64_t>(count, run) / align * align;
        }
        s = a.grow(id, count);
        predicted = in_place == static_cast<uint64_t>(count);  // must fit
        expect = Status::kOk;
        if (s == Status::kOk) {
          std::vector<uint32_t> now;
          REQUIRE(a.blocks(id, &now) == Status::kOk);
          for (uint64_t i = 0; i < in_place; ++i) {
            REQUIRE(now[old.size() + i] == old.back() + 1 + i);
          }
          c.absorb_take(id, old, count);
        } else {
          if (align == 1) REQUIRE(s != Status::kOutOfMemory);
          REQUIRE((s == Status::kOutOfMemory || s == Status::kTooManyRanges));
        }
      }
    } else if (which < 70) {  // release
      expect = m.reqs.count(id) ? Status::kOk : Status::kUnknownRequest;
      s = a.release(id);
      if (s == Status::kOk) m.release(id);
    } else if (which < 82) {  // acquire_cached
      // Mostly physically consecutive cached blocks (ranges merge),
      // sometimes shuffled, sometimes a miss or a duplicate.
      keys.clear();
      if (!m.keymap.empty()) {
        auto kit = m.keymap.begin();
        std::advance(kit, pick(m.keymap.size()));
        uint32_t b = kit->second;
        const uint64_t want = 1 + pick(8);
        while (keys.size() < want && b < n && !m.key[b].empty()) {
          keys.push_back(m.key[b++]);
        }
        if (pick(4) == 0) std::shuffle(keys.begin(), keys.end(), rng);
      }
      if (pick(10) == 0) keys.push_back(key_name(pick(kKeys)));
      if (pick(15) == 0 && !keys.empty()) keys.push_back(keys.front());
      const size_t cnt = keys.empty() ? 0 : pick(keys.size() + 1);
      size_t hits = 0;
      while (hits < keys.size() && m.keymap.count(keys[hits])) ++hits;
      REQUIRE(a.lookup(keys) == hits);
      const auto it = m.reqs.find(id);
      std::vector<uint32_t> blocks;
      if (it != m.reqs.end() && !it->second.empty()) {
        expect = Status::kRequestNotEmpty;
      } else {
        std::vector<char> seen(n, 0);
        size_t nr = 0;
        for (size_t i = 0; i < cnt; ++i) {
          const auto f = m.keymap.find(keys[i]);
          if (f == m.keymap.end()) {
            expect = Status::kCacheMiss;
            break;
          }
          if (seen[f->second]) {
            expect = Status::kDuplicateKey;
            break;
          }
          seen[f->second] = 1;
          if (i == 0 || f->second != blocks.back() + 1) ++nr;
          blocks.push_back(f->second);
        }
        if (expect == Status::kOk && nr > max_ranges) {
          expect = Status::kTooManyRanges;
        }
      }
      s = a.acquire_cached(id, keys, cnt);
      if (s == Status::kOk && expect == Status::kOk) {
        for (uint32_t b : blocks) {
          if (m.ref[b]++ == 0) m.lru.remove(b);
        }
        m.reqs[id] = blocks;
      }
    } else if (which < 94) {  // cache
      const auto it = m.reqs.find(id);
      const uint64_t nb = it == m.reqs.end() ? 0 : it->second.size();
      const int64_t first =
          pick(60) == 0 ? -1 : static_cast<int64_t>(pick(nb + 2));
      keys.clear();
      const uint64_t cnt = pick(6);
      for (uint64_t i = 0; i < cnt; ++i) {
        // Reuse a block's own key sometimes (no-op), else a random one.
        keys.push_back(key_name(pick(kKeys)));
        const int64_t lb = first + static_cast<int64_t>(i);
        if (lb >= 0 && static_cast<uint64_t>(lb) < nb && pick(3) == 0) {
          const uint32_t b = it->second[lb];
          if (!m.key[b].empty()) keys.back() = m.key[b];
        }
      }
      // Sometimes the same key twice: kDuplicateKey, nothing cached.
      if (keys.size() > 1 && pick(20) == 0) keys.back() = keys.front();
      if (first < 0) {
        expect = Status::kInvalidArgument;
      } else if (it == m.reqs.end()) {
        expect = Status::kUnknownRequest;
      } else if (static_cast<uint64_t>(first) + cnt > nb) {
        expect = Status::kOutOfRange;
      } else if (std::set<std::string>(keys.begin(), keys.end()).size() !=
                 keys.size()) {
        expect = Status::kDuplicateKey;
      } else {
        for (uint64_t i = 0; i < cnt; ++i) {
          const uint32_t b = it->second[first + i];
          if (!m.key[b].empty() && m.key[b] != keys[i]) {
            expect = Status::kKeyConflict;
          }
        }
      }
      s = a.cache(id, first, keys);
      if (s == Status::kOk && expect == Status::kOk) {
        for (uint64_t i = 0; i < cnt; ++i) {
          const uint32_t b = it->second[first + i];
          if (!m.key[b].empty() || m.keymap.count(keys[i])) continue;
          m.key[b] = keys[i];
          m.keymap[keys[i]] = b;
        }
      }
    } else if (which < 99) {  // evict
      const int64_t cnt = pick(40) == 0 ? -1 : static_cast<int64_t>(pick(5));
      size_t evicted = 0;
      s = a.evict(cnt, &evicted);
      if (cnt < 0) {
        expect = Status::kInvalidArgument;
      } else {
        const size_t k = std::min<size_t>(cnt, m.lru.size());
        REQUIRE(evicted == k);
        for (size_t i = 0; i < k; ++i) m.evict_front();
      }
    } else {  // reset_cache
      bool busy = false;
      for (uint32_t b = 0; b < n; ++b) busy |= m.ref[b] > 0;
      expect = busy ? Status::kCacheInUse : Status::kOk;
      s = a.reset_cache();
      if (s == Status::kOk) {
        while (!m.lru.empty()) {
          m.evict_front();
          --m.evictions;  // a reset is not counted as evictions
        }
      }
    }

    if (predicted) {
      if (s != expect) {
        std::fprintf(stderr, "op %llu: got '%s', model expected '%s'\n",
                     static_cast<unsigned long long>(op), tagma::status_str(s),
                     tagma::status_str(expect));
      }
      REQUIRE(s == expect);
    }
    if (s != Status::kOk) REQUIRE(a.stats() == before);  // unchanged
    ++outcome[std::min<int>(static_cast<int>(s), 7)];
    c.compare();
  }
  // The sequence must have exercised the interesting paths.
  const auto st = a.stats();
  MESSAGE("n=" << n << " align=" << align << " max_ranges=" << max_ranges
               << " ops=" << num_ops << " fallback=" << st.fallback_allocations
               << " evictions=" << st.evictions << " ok=" << outcome[0]
               << " oom=" << outcome[1] << " too_many="
               << outcome[static_cast<int>(Status::kTooManyRanges)]);
  if (num_ops >= 20000) {
    CHECK(st.fallback_allocations > 0);
    CHECK(st.evictions > 0);
    CHECK(outcome[static_cast<int>(Status::kOutOfMemory)] > 0);
  }
}

}  // namespace

TEST_CASE("test_kv_allocator_random_invariants") {
  const uint64_t total = tagma_test::random_ops();
  // Four shapes: plain, tight range cap, aligned, aligned with odd size.
  run_random(96, 1, 256, total * 4 / 10, 1);
  run_random(64, 1, 3, total * 2 / 10, 2);
  run_random(128, 2, 8, total * 2 / 10, 3);
  run_random(90, 4, 5, total * 2 / 10, 4);
}

TEST_CASE("test_kv_allocator_random_fit_policies") {
  // The measurement-only placements keep every invariant too.
  const uint64_t ops = std::max<uint64_t>(1, tagma_test::random_ops() / 50);
  for (auto p :
       {tagma::FitPolicy::kFirstFit, tagma::FitPolicy::kWorstFit,
        tagma::FitPolicy::kHalfGap, tagma::FitPolicy::kBestFitGrowHalfGap}) {
    run_random(96, 1, 8, ops, 10 + static_cast<uint64_t>(p), p);
    run_random(90, 3, 6, ops, 20 + static_cast<uint64_t>(p), p);
  }
}
