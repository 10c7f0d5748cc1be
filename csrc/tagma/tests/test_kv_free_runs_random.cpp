// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// Randomized invariant test of FreeRuns: random add / add_range / take_after
// / take, after every op FreeRuns::validate() AND a comparison with a
// reference that keeps one bool per block. The reference predicts every
// status, the offending block of every error, take_after's count and the
// best-fit placement; for the multi-range fallback it checks the outcome:
// exactly n blocks, all free before, and the fewest ranges any choice could
// give (largest runs first is optimal).

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "../kv_free_runs.h"
#include "random_ops.h"

using tagma::FreeRuns;
using tagma::Status;

namespace {

struct Ref {
  uint32_t n;
  std::vector<char> free;

  explicit Ref(uint32_t n_) : n(n_), free(n_, 0) {}

  std::vector<FreeRuns::Run> runs() const {
    std::vector<FreeRuns::Run> out;
    for (uint32_t b = 0; b < n;) {
      if (!free[b]) {
        ++b;
        continue;
      }
      uint32_t e = b;
      while (e < n && free[e]) ++e;
      out.emplace_back(b, e - b);
      b = e;
    }
    return out;
  }
  uint64_t num_free() const {
    return static_cast<uint64_t>(std::count(free.begin(), free.end(), 1));
  }
  // Run lengths, largest first.
  std::vector<uint64_t> lengths() const {
    std::vector<uint64_t> u;
    for (const auto& r : runs()) u.push_back(r.second);
    std::sort(u.begin(), u.end(), std::greater<uint64_t>());
    return u;
  }
};

// Non-free ids with an error planted at random: out of range, a repeat, or
// a block that is free already.
std::vector<uint32_t> random_ids(const Ref& m, std::mt19937_64& rng) {
  auto pick = [&](uint64_t hi) { return rng() % hi; };
  std::vector<uint32_t> ids;
  const uint64_t count = pick(pick(5) == 0 ? m.n / 2 + 1 : 5);
  if (pick(3) == 0) {  // a consecutive stretch: exercises coalescing
    const uint32_t s = static_cast<uint32_t>(pick(m.n));
    for (uint32_t b = s; b < m.n && ids.size() < count; ++b) {
      if (m.free[b] != 0) break;
      ids.push_back(b);
    }
  } else {
    for (uint64_t tries = 0; ids.size() < count && tries < 4 * count; ++tries) {
      const uint32_t b = static_cast<uint32_t>(pick(m.n));
      if (m.free[b] != 0) continue;
      if (std::find(ids.begin(), ids.end(), b) != ids.end()) continue;
      ids.push_back(b);
    }
  }
  std::shuffle(ids.begin(), ids.end(), rng);
  switch (pick(24)) {
    case 0:
      ids.insert(ids.begin() + pick(ids.size() + 1),
                 m.n + static_cast<uint32_t>(pick(3)));
      break;
    case 1:
      if (!ids.empty()) ids.push_back(ids[pick(ids.size())]);
      break;
    case 2:
      ids.push_back(static_cast<uint32_t>(pick(m.n)));  // maybe wrong state
      break;
    default:
      break;
  }
  return ids;
}

// The status and offending block the reference expects of add.
Status expect_ids(const Ref& m, const std::vector<uint32_t>& ids,
                  int64_t* bad) {
  for (uint32_t b : ids) {
    if (b >= m.n) {
      *bad = b;
      return Status::kOutOfRange;
    }
  }
  std::vector<uint32_t> s(ids);
  std::sort(s.begin(), s.end());
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i] == s[i - 1]) {
      *bad = s[i];
      return Status::kDuplicateBlock;
    }
  }
  for (uint32_t b : s) {  // the lowest block free already
    if (m.free[b] != 0) {
      *bad = b;
      return Status::kAlreadyFree;
    }
  }
  return Status::kOk;
}

void compare(const FreeRuns& f, const Ref& m, std::mt19937_64& rng) {
  REQUIRE(f.validate(true));
  const auto runs = m.runs();
  REQUIRE(f.runs() == runs);
  REQUIRE(f.num_runs() == runs.size());
  REQUIRE(f.num_free() == m.num_free());
  const auto u = m.lengths();
  REQUIRE(f.largest_run() == (u.empty() ? 0 : u.front()));
  for (int i = 0; i < 4; ++i) {
    const int64_t b = static_cast<int64_t>(rng() % (m.n + 2)) - 1;
    REQUIRE(f.contains(b) == (b >= 0 && b < m.n && m.free[b] != 0));
  }
}

void run_random(uint32_t n, uint64_t num_ops, uint64_t seed) {
  FreeRuns f(n);
  REQUIRE(f.config_status() == Status::kOk);
  Ref m(n);
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t hi) { return rng() % hi; };  // [0, hi)
  uint64_t oks = 0, errors = 0, multi = 0, too_many = 0, oom = 0;
  std::vector<FreeRuns::Run> out;

  for (uint64_t op = 0; op < num_ops; ++op) {
    const auto before = f.runs();
    const uint64_t which = pick(100);
    Status s = Status::kOk, expect = Status::kOk;
    int64_t bad = -1, expect_bad = -1;

    if (which < 25) {  // add
      const auto ids = random_ids(m, rng);
      expect = expect_ids(m, ids, &expect_bad);
      s = f.add(ids.data(), ids.size(), &bad);
      if (s == Status::kOk) {
        for (uint32_t b : ids) m.free[b] = 1;
      }
    } else if (which < 40) {  // add_range
      int64_t start = static_cast<int64_t>(pick(n + 1)) - (pick(40) == 0);
      int64_t len = static_cast<int64_t>(pick(pick(4) == 0 ? n / 2 + 1 : 6));
      if (pick(40) == 0) len = -len - 1;
      if (len < 0) {
        expect = Status::kInvalidArgument;
      } else if (len == 0) {
        expect = Status::kZeroCount;
      } else if (start < 0 || start + len > n) {
        expect = Status::kOutOfRange;
      } else {
        for (int64_t b = start; b < start + len; ++b) {
          if (m.free[b]) {
            expect = Status::kAlreadyFree;
            expect_bad = b;
            break;
          }
        }
      }
      s = f.add_range(start, len, &bad);
      if (s == Status::kOk) {
        for (int64_t b = start; b < start + len; ++b) m.free[b] = 1;
      }
    } else if (which < 65) {  // take_after
      const int64_t block = static_cast<int64_t>(pick(n + 2)) - 2;  // -2..n-1
      const int64_t want = static_cast<int64_t>(pick(8)) - 1;
      int64_t prefix = 0;
      if (block >= -1 && want > 0) {
        for (int64_t b = block + 1; b < n && m.free[b] && prefix < want; ++b) {
          ++prefix;
        }
      }
      REQUIRE(f.take_after(block, want) == prefix);
      for (int64_t b = block + 1; b < block + 1 + prefix; ++b) m.free[b] = 0;
    } else {  // take
      int64_t count =
          static_cast<int64_t>(1 + pick(pick(3) == 0 ? n / 3 + 1 : 4));
      if (pick(40) == 0) count = -count;
      if (pick(40) == 0) count = 0;
      const int64_t max_ranges = 1 + static_cast<int64_t>(pick(4));
      const auto u = m.lengths();
      uint64_t total = 0;
      int64_t needed = 0;
      for (uint64_t x : u) {
        if (count <= 0 || total >= static_cast<uint64_t>(count)) break;
        total += x;
        ++needed;
      }
      const uint64_t largest = u.empty() ? 0 : u.front();
      if (count < 0) {
        expect = Status::kInvalidArgument;
      } else if (count == 0) {
        expect = Status::kZeroCount;
      } else if (total < static_cast<uint64_t>(count)) {
        expect = Status::kOutOfMemory;
      } else if (largest < static_cast<uint64_t>(count) &&
                 needed > max_ranges) {
        expect = Status::kTooManyRanges;
      }
      // The best fit, when one run holds it all.
      int64_t fit = -1;
      if (expect == Status::kOk && largest >= static_cast<uint64_t>(count)) {
        uint64_t best = ~uint64_t{0};
        for (const auto& r : m.runs()) {
          if (r.second >= static_cast<uint64_t>(count) && r.second < best) {
            best = r.second;
            fit = r.first;
          }
        }
      }
      out.assign(1, {7, 7});
      s = f.take(count, max_ranges, &out);
      if (s != Status::kOk) {
        REQUIRE(out == std::vector<FreeRuns::Run>{{7, 7}});
        oom += s == Status::kOutOfMemory;
        too_many += s == Status::kTooManyRanges;
      } else if (fit >= 0) {
        REQUIRE(out ==
                std::vector<FreeRuns::Run>{{static_cast<uint32_t>(fit),
                                            static_cast<uint32_t>(count)}});
      } else {
        REQUIRE(static_cast<int64_t>(out.size()) == needed);  // fewest
        ++multi;
      }
      if (s == Status::kOk) {
        uint64_t sum = 0;
        for (const auto& r : out) {
          REQUIRE(r.second > 0);
          for (uint32_t b = r.first; b < r.first + r.second; ++b) {
            REQUIRE(b < n);
            REQUIRE(m.free[b]);  // free before, and taken once
            m.free[b] = 0;
          }
          sum += r.second;
        }
        REQUIRE(sum == static_cast<uint64_t>(count));
      }
    }

    REQUIRE(s == expect);
    if (s != Status::kOk) {
      REQUIRE(f.runs() == before);  // unchanged
      if (expect_bad >= 0) REQUIRE(bad == expect_bad);
      ++errors;
    } else {
      ++oks;
    }
    compare(f, m, rng);
  }
  MESSAGE("n=" << n << " ops=" << num_ops << " ok=" << oks
               << " errors=" << errors << " multi=" << multi << " oom=" << oom
               << " too_many=" << too_many);
  if (num_ops >= 20000) {
    CHECK(multi > 0);
    CHECK(oom > 0);
    CHECK(too_many > 0);
  }
}

}  // namespace

TEST_CASE("test_free_runs_random_invariants") {
  const uint64_t total = std::max<uint64_t>(1, tagma_test::random_ops() / 2);
  run_random(96, total * 5 / 10 + 1, 101);
  run_random(90, total * 3 / 10 + 1, 102);
  run_random(64, total * 2 / 10 + 1, 103);
}
