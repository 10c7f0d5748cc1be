// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project

#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../kv_free_runs.h"

using tagma::FreeRuns;
using tagma::Status;

namespace {

using Runs = std::vector<FreeRuns::Run>;

// Everything observable, to show that a failing call changed nothing.
struct Snapshot {
  Runs runs;
  uint64_t num_free;
  uint32_t largest;
  bool operator==(const Snapshot& o) const {
    return runs == o.runs && num_free == o.num_free && largest == o.largest;
  }
};

Snapshot snap(const FreeRuns& f) {
  return {f.runs(), f.num_free(), f.largest_run()};
}

// Free runs at the given (start, length) pairs.
FreeRuns make(int64_t n, const Runs& runs) {
  FreeRuns f(n);
  REQUIRE(f.config_status() == Status::kOk);
  for (const auto& r : runs) {
    REQUIRE(f.add_range(r.first, r.second) == Status::kOk);
  }
  REQUIRE(f.validate(true));
  return f;
}

}  // namespace

TEST_CASE("test_status_str") {
  std::set<std::string> seen;
  for (int s = 0; s <= static_cast<int>(Status::kLast); ++s) {
    seen.insert(tagma::status_str(static_cast<Status>(s)));
  }
  CHECK(seen.size() == static_cast<size_t>(Status::kLast) + 1);
  CHECK(std::string(tagma::status_str(static_cast<Status>(1000))) ==
        "unknown status");
}

TEST_CASE("test_free_runs_starts_empty") {
  FreeRuns f(16);
  CHECK(f.config_status() == Status::kOk);
  CHECK(f.num_blocks() == 16);
  CHECK(f.num_free() == 0);
  CHECK(f.num_runs() == 0);
  CHECK(f.largest_run() == 0);
  CHECK(f.runs().empty());
  for (int64_t b = -1; b <= 16; ++b) CHECK_FALSE(f.contains(b));
  CHECK(f.take_after(-1, 4) == 0);
  std::vector<FreeRuns::Run> out;
  CHECK(f.take(1, 8, &out) == Status::kOutOfMemory);
  CHECK(f.validate(true));
}

TEST_CASE("test_free_runs_bad_config") {
  for (int64_t n : {int64_t{0}, int64_t{-3}, FreeRuns::kMaxBlocks + 1}) {
    FreeRuns f(n);
    CHECK(f.config_status() == Status::kBadConfig);
    CHECK(f.num_blocks() == 0);
    const uint32_t id = 0;
    std::vector<FreeRuns::Run> out;
    CHECK(f.add(&id, 1) == Status::kBadConfig);
    CHECK(f.add_range(0, 1) == Status::kBadConfig);
    CHECK(f.take(1, 1, &out) == Status::kBadConfig);
    CHECK(f.take_after(-1, 1) == 0);
    CHECK_FALSE(f.contains(0));
    CHECK(f.validate(true));
  }
  FreeRuns d;
  CHECK(d.config_status() == Status::kBadConfig);
  CHECK(d.validate(true));
  CHECK(FreeRuns(FreeRuns::kMaxBlocks).config_status() == Status::kOk);
}

TEST_CASE("test_free_runs_add_coalesces") {
  FreeRuns f(16);
  CHECK(f.add(std::vector<uint32_t>{3, 1, 2}) == Status::kOk);
  CHECK(f.runs() == Runs{{1, 3}});
  CHECK(f.add(std::vector<uint32_t>{5, 9, 8}) == Status::kOk);
  CHECK(f.runs() == Runs{{1, 3}, {5, 1}, {8, 2}});
  CHECK(f.add(std::vector<uint32_t>{4}) == Status::kOk);  // joins both sides
  CHECK(f.runs() == Runs{{1, 5}, {8, 2}});
  CHECK(f.add_range(0, 1) == Status::kOk);   // joins the next run
  CHECK(f.add_range(10, 6) == Status::kOk);  // joins the previous run
  CHECK(f.runs() == Runs{{0, 6}, {8, 8}});
  CHECK(f.add_range(6, 2) == Status::kOk);
  CHECK(f.runs() == Runs{{0, 16}});
  CHECK(f.num_free() == 16);
  CHECK(f.largest_run() == 16);
  CHECK(f.num_runs() == 1);
  CHECK(f.add(nullptr, 0) == Status::kOk);  // nothing to add
  CHECK(f.validate(true));
}

TEST_CASE("test_free_runs_add_errors_leave_state_unchanged") {
  FreeRuns f = make(16, {{2, 3}, {10, 2}});
  const Snapshot s0 = snap(f);
  int64_t bad = -7;
  CHECK(f.add(std::vector<uint32_t>{0, 16}) == Status::kOutOfRange);
  CHECK(f.add(std::vector<uint32_t>{0, 1}.data(), 2, &bad) == Status::kOk);
  CHECK(f.take_after(-1, 2) == 2);  // 0 and 1 taken again
  const uint32_t oor[] = {6, 99, 7};
  CHECK(f.add(oor, 3, &bad) == Status::kOutOfRange);
  CHECK(bad == 99);
  const uint32_t twice[] = {7, 6, 7};
  CHECK(f.add(twice, 3, &bad) == Status::kDuplicateBlock);
  CHECK(bad == 7);
  const uint32_t already[] = {0, 1, 9, 10};  // 9 not free, 10 free
  CHECK(f.add(already, 4, &bad) == Status::kAlreadyFree);
  CHECK(bad == 10);
  const uint32_t inside[] = {1, 2};
  CHECK(f.add(inside, 2, &bad) == Status::kAlreadyFree);
  CHECK(bad == 2);
  CHECK(f.add(nullptr, 1) == Status::kInvalidArgument);
  CHECK(snap(f) == s0);
  CHECK(f.validate(true));

  CHECK(f.add_range(0, 0) == Status::kZeroCount);
  CHECK(f.add_range(0, -1) == Status::kInvalidArgument);
  CHECK(f.add_range(-1, 2) == Status::kOutOfRange);
  CHECK(f.add_range(16, 1) == Status::kOutOfRange);
  CHECK(f.add_range(15, 2) == Status::kOutOfRange);
  CHECK(f.add_range(0, INT64_MAX) == Status::kOutOfRange);
  CHECK(f.add_range(0, 3, &bad) == Status::kAlreadyFree);
  CHECK(bad == 2);
  CHECK(f.add_range(5, 10, &bad) == Status::kAlreadyFree);  // spans 10..11
  CHECK(bad == 10);
  CHECK(f.add_range(3, 1, &bad) == Status::kAlreadyFree);
  CHECK(bad == 3);
  CHECK(snap(f) == s0);
  CHECK(f.validate(true));
  // Still usable.
  CHECK(f.add_range(5, 5) == Status::kOk);
  CHECK(f.runs() == Runs{{2, 10}});
}

TEST_CASE("test_free_runs_take_after") {
  FreeRuns f = make(16, {{4, 4}, {10, 6}});
  CHECK(f.take_after(4, 2) == 2);  // from inside a run: splits it
  CHECK(f.runs() == Runs{{4, 1}, {7, 1}, {10, 6}});
  CHECK(f.contains(4));
  CHECK_FALSE(f.contains(5));
  CHECK_FALSE(f.contains(6));
  CHECK(f.contains(7));
  CHECK(f.contains(15));
  CHECK_FALSE(f.contains(16));
  CHECK(f.add_range(5, 2) == Status::kOk);
  CHECK(f.take_after(3, 2) == 2);  // grows a range that ends at 3
  CHECK(f.runs() == Runs{{6, 2}, {10, 6}});
  CHECK(f.take_after(5, 9) == 2);  // as far as the run goes
  CHECK(f.runs() == Runs{{10, 6}});
  CHECK(f.take_after(7, 1) == 0);   // block 8 is not free
  CHECK(f.take_after(10, 2) == 2);  // from inside a run: 11, 12
  CHECK(f.runs() == Runs{{10, 1}, {13, 3}});
  CHECK(f.take_after(15, 1) == 0);  // block 16 does not exist
  CHECK(f.take_after(99, 1) == 0);
  CHECK(f.take_after(-5, 1) == 0);
  CHECK(f.take_after(12, 0) == 0);
  CHECK(f.take_after(12, -1) == 0);
  CHECK(f.runs() == Runs{{10, 1}, {13, 3}});
  CHECK(f.take_after(12, INT64_MAX) == 3);
  CHECK(f.num_free() == 1);
  CHECK(f.add_range(0, 2) == Status::kOk);
  CHECK(f.take_after(-1, 5) == 2);  // -1: from block 0
  CHECK(f.runs() == Runs{{10, 1}});
  CHECK(f.validate(true));
}

TEST_CASE("test_free_runs_take_best_fit_lowest_address") {
  FreeRuns f = make(64, {{0, 4}, {7, 6}, {20, 6}, {30, 34}});
  std::vector<FreeRuns::Run> out;
  CHECK(f.take(5, 256, &out) == Status::kOk);
  CHECK(out == Runs{{7, 5}});  // smallest run >= 5; 7 before 20
  CHECK(f.take(6, 256, &out) == Status::kOk);
  CHECK(out == Runs{{20, 6}});
  CHECK(f.take(4, 1, &out) == Status::kOk);
  CHECK(out == Runs{{0, 4}});
  CHECK(f.take(1, 1, &out) == Status::kOk);
  CHECK(out == Runs{{12, 1}});
  CHECK(f.runs() == Runs{{30, 34}});
  CHECK(f.take(34, 1, &out) == Status::kOk);
  CHECK(out == Runs{{30, 34}});
  CHECK(f.num_free() == 0);
  CHECK(f.validate(true));
}

TEST_CASE("test_free_runs_take_everything_from_offset_zero") {
  FreeRuns f = make(1000, {{0, 1000}});
  std::vector<FreeRuns::Run> out;
  CHECK(f.take(1000, 1, &out) == Status::kOk);
  CHECK(out == Runs{{0, 1000}});
  CHECK(f.num_runs() == 0);
  CHECK(f.validate(true));
}

TEST_CASE("test_free_runs_take_multi_range") {
  // Runs of 3, 5, 2, 4: 12 blocks need the 5 and the 4, then the best fit
  // for the last 3 (the run of 3, not a piece of a larger run).
  FreeRuns f = make(20, {{0, 3}, {4, 5}, {10, 2}, {13, 4}});
  std::vector<FreeRuns::Run> out;
  CHECK(f.take(12, 3, &out) == Status::kOk);
  CHECK(out == Runs{{4, 5}, {13, 4}, {0, 3}});
  CHECK(f.runs() == Runs{{10, 2}});
  CHECK(f.validate(true));
  // Two equal runs: the lower address is the last piece.
  FreeRuns g = make(20, {{0, 5}, {10, 5}});
  CHECK(g.take(9, 2, &out) == Status::kOk);
  CHECK(out == Runs{{10, 5}, {0, 4}});
  CHECK(g.runs() == Runs{{4, 1}});
  CHECK(g.validate(true));
}

TEST_CASE("test_free_runs_take_errors_leave_state_unchanged") {
  FreeRuns f = make(20, {{0, 3}, {4, 5}, {10, 2}, {13, 4}});
  const Snapshot s0 = snap(f);
  std::vector<FreeRuns::Run> out{{99, 99}};
  const Runs untouched = out;
  CHECK(f.take(0, 8, &out) == Status::kZeroCount);
  CHECK(f.take(-1, 8, &out) == Status::kInvalidArgument);
  CHECK(f.take(1, 0, &out) == Status::kInvalidArgument);
  CHECK(f.take(1, -1, &out) == Status::kInvalidArgument);
  CHECK(f.take(1, 8, nullptr) == Status::kInvalidArgument);
  CHECK(f.take(15, 8, &out) == Status::kOutOfMemory);  // 14 free
  CHECK(f.take(INT64_MAX, 8, &out) == Status::kOutOfMemory);
  CHECK(f.take(12, 2, &out) == Status::kTooManyRanges);  // needs 3
  CHECK(f.take(14, 3, &out) == Status::kTooManyRanges);  // needs 4
  CHECK(out == untouched);
  CHECK(snap(f) == s0);
  CHECK(f.validate(true));
  CHECK(f.take(14, 4, &out) == Status::kOk);  // still usable
  CHECK(out.size() == 4);
  CHECK(f.num_free() == 0);
}

TEST_CASE("test_free_runs_unchecked_layer") {
  FreeRuns f(40);
  f.put(10, 5);
  f.put(0, 2);
  f.put(20, 20);
  f.put(15, 1);  // coalesces with 10..14
  CHECK(f.runs() == Runs{{0, 2}, {10, 6}, {20, 20}});
  CHECK(f.pick(2) == 0);
  CHECK(f.pick(3) == 10);
  CHECK(f.pick(7) == 20);
  std::vector<FreeRuns::Run> plan;
  CHECK(f.plan(27, &plan));
  CHECK(plan == Runs{{20, 20}, {10, 6}, {0, 1}});
  CHECK_FALSE(f.plan(29, &plan));
  CHECK(f.runs() == Runs{{0, 2}, {10, 6}, {20, 20}});  // plan is const
  f.cut(12, 2);
  f.cut(20, 20);
  CHECK(f.runs() == Runs{{0, 2}, {10, 2}, {14, 2}});
  CHECK(f.num_free() == 6);
  CHECK(f.validate(true));
}

TEST_CASE("test_free_runs_validate_catches_misuse") {
  // Breaking a precondition of the unchecked layer breaks an invariant,
  // and validate() says so.
  FreeRuns f = make(16, {{0, 4}});
  f.put(2, 1);  // already free: two overlapping runs
  CHECK_FALSE(f.validate());
  FreeRuns g = make(16, {{0, 4}});
  g.put(5, 1);
  g.put(4, 1);  // fine: coalesces all three
  CHECK(g.runs() == Runs{{0, 6}});
  CHECK(g.validate(true));
}
