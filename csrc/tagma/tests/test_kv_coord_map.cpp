// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project

#include <doctest/doctest.h>

#include <cstdint>
#include <random>

#include "../kv_coord_map.h"

using tagma::CoordStatus;
using tagma::KVCoord;
using tagma::KVCoordMap;
using tagma::KVLayout;

namespace {
constexpr KVLayout kSeedLayout{32, 65536, 32, 2048};  // the seed's layout
}  // namespace

TEST_CASE("test_kv_coord_map_closed_form") {
  // Compile-time: the unchecked form is constexpr.
  static_assert(tagma::kv_token_index(kSeedLayout, 0, 0, 0) == 0, "");
  static_assert(tagma::kv_token_index(kSeedLayout, 0, 0, 1) == 1, "");
  static_assert(tagma::kv_token_index(kSeedLayout, 0, 1, 0) == 32, "");
  static_assert(tagma::kv_token_index(kSeedLayout, 1, 0, 0) == 65536u * 32u,
                "");
  static_assert(tagma::kv_offset(kSeedLayout, 1, 2, 3) ==
                    ((1ull * 65536 + 2) * 32 + 3) * 2048,
                "");
  uint64_t total = 0;
  REQUIRE(tagma::kv_layout_bytes(kSeedLayout, &total) == CoordStatus::kOk);
  CHECK(total == 32ull * 65536 * 32 * 2048);
  // The last byte of the last token is total - 1.
  CHECK(tagma::kv_offset(kSeedLayout, 31, 65535, 31) + 2047 == total - 1);
}

TEST_CASE("test_kv_coord_map_checked_bounds") {
  KVCoordMap m;
  uint64_t off = 0;
  // A default map has no coordinates.
  CHECK(m.offset(0, 0, 0, &off) == CoordStatus::kLayerOutOfRange);
  CHECK(m.offset_or_invalid(0, 0, 0) == tagma::kInvalidOffset);
  REQUIRE(KVCoordMap::create(kSeedLayout, &m) == CoordStatus::kOk);
  CHECK(m.offset(32, 0, 0, &off) == CoordStatus::kLayerOutOfRange);
  CHECK(m.offset(0, 65536, 0, &off) == CoordStatus::kBlockOutOfRange);
  CHECK(m.offset(0, 0, 32, &off) == CoordStatus::kTokenOutOfRange);
  CHECK(m.offset(0, 0, 0, nullptr) == CoordStatus::kNullArgument);
  CHECK(m.offset_or_invalid(0, 0, 32) == tagma::kInvalidOffset);
  REQUIRE(m.offset(3, 4, 5, &off) == CoordStatus::kOk);
  CHECK(off == tagma::kv_offset(kSeedLayout, 3, 4, 5));
  CHECK(m.offset_or_invalid(3, 4, 5) == off);
  uint64_t off2 = 0;
  CHECK(tagma::kv_offset_checked(kSeedLayout, 3, 4, 5, &off2) ==
        CoordStatus::kOk);
  CHECK(off2 == off);
  CHECK(tagma::kv_offset_checked(kSeedLayout, 0, 0, 32, &off2) ==
        CoordStatus::kTokenOutOfRange);
  CHECK(KVCoordMap::create(kSeedLayout, nullptr) == CoordStatus::kNullArgument);
  for (const char* s :
       {tagma::coord_status_str(CoordStatus::kOk),
        tagma::coord_status_str(CoordStatus::kOverflow),
        tagma::coord_status_str(static_cast<CoordStatus>(99))}) {
    CHECK(s != nullptr);
  }
}

TEST_CASE("test_kv_coord_map_overflow") {
  const KVLayout zero{0, 1, 1, 1};
  const KVLayout huge{1ull << 20, 1ull << 20, 1ull << 20, 1ull << 10};
  KVCoordMap m;
  uint64_t x = 0;
  CHECK(KVCoordMap::create(zero, &m) == CoordStatus::kInvalidLayout);
  CHECK(KVCoordMap::create(huge, &m) == CoordStatus::kInvalidLayout);
  CHECK(m.total_bytes() == 0);  // failed create leaves the map empty
  CHECK(tagma::kv_offset_checked(zero, 0, 0, 0, &x) ==
        CoordStatus::kInvalidLayout);
  // The free function still serves a huge layout: small coordinates fit,
  // large ones report the overflow instead of wrapping.
  CHECK(tagma::kv_offset_checked(huge, 1, 1, 1, &x) == CoordStatus::kOk);
  CHECK(x == tagma::kv_offset(huge, 1, 1, 1));
  CHECK(tagma::kv_offset_checked(huge, (1ull << 20) - 1, 0, 0, &x) ==
        CoordStatus::kOverflow);
  // Exactly 2^64 - 1 bytes is allowed: 3 * 5 * 17 * 257 * 641 * 65537 *
  // 6700417.
  const KVLayout edge{3 * 5 * 17, 257 * 641, 65537, 6700417};
  CHECK(KVCoordMap::create(edge, &m) == CoordStatus::kOk);
  CHECK(m.total_bytes() == ~uint64_t{0});
}

TEST_CASE("test_kv_coord_map_inverse_roundtrip") {
  KVCoordMap m;
  REQUIRE(KVCoordMap::create(kSeedLayout, &m) == CoordStatus::kOk);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t l = rng() % 32, b = rng() % 65536, t = rng() % 32,
                   byte = rng() % 2048;
    uint64_t off = 0;
    REQUIRE(m.offset(l, b, t, &off) == CoordStatus::kOk);
    KVCoord c;
    REQUIRE(m.coord(off + byte, &c) == CoordStatus::kOk);
    CHECK(c.layer == l);
    CHECK(c.block == b);
    CHECK(c.token == t);
    CHECK(c.byte_in_token == byte);
  }
  KVCoord c;
  CHECK(m.coord(m.total_bytes(), &c) == CoordStatus::kOffsetOutOfRange);
  CHECK(m.coord(0, nullptr) == CoordStatus::kNullArgument);
  CHECK(tagma::kv_coord_from_offset(kSeedLayout, m.total_bytes() - 1, &c) ==
        CoordStatus::kOk);
  CHECK((c.layer == 31 && c.block == 65535 && c.token == 31 &&
         c.byte_in_token == 2047));
  CHECK(tagma::kv_coord_from_offset(KVLayout{}, 0, &c) ==
        CoordStatus::kInvalidLayout);
}
