// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#pragma once

// The closed-form coordinate map of the KV cache: no table, no hash, no scan.
//
//   n(layer, block, token) = (layer * B + block) * T + token
//   offset                 = n * bytes_per_token
//
// over a layout {L layers, B blocks, T tokens per block, bytes_per_token}:
//
//   offset 0                                              L*B*T*bpt
//   | layer 0                      | layer 1          ...  |
//   | block 0 | block 1 | ... B-1   | block 0 | ...         |
//   | t0 t1 .. tT-1 |                                      |
//   each token is bytes_per_token bytes
//
// Three forms:
//   * kv_token_index / kv_offset: constexpr, unchecked (the caller knows the
//     coordinate is in bounds; this is what a kernel computes).
//   * kv_offset_checked (free function): checks the layout, the bounds and
//     64-bit overflow on every call; status plus out-parameter, no exceptions.
//   * KVCoordMap: validates the layout once (KVCoordMap::create), after which
//     the checked offset needs only the three bound compares: an in-bounds
//     coordinate of a layout whose total size fits in 64 bits cannot overflow.
//     Its inverse maps an offset back to (layer, block, token, byte_in_token).
//
// Invariant of a valid layout: every field > 0 and L*B*T*bpt <= 2^64 - 1.

#include <cstdint>

namespace tagma {

struct KVLayout {
  uint64_t num_layers = 0;        // L
  uint64_t num_blocks = 0;        // B
  uint64_t tokens_per_block = 0;  // T
  uint64_t bytes_per_token = 0;   // KV bytes of one token in one layer
};

struct KVCoord {
  uint64_t layer = 0;
  uint64_t block = 0;
  uint64_t token = 0;
  uint64_t byte_in_token = 0;
};

enum class CoordStatus : int32_t {
  kOk = 0,
  kInvalidLayout,  // a zero field, or the total size overflows 64 bits
  kLayerOutOfRange,
  kBlockOutOfRange,
  kTokenOutOfRange,
  kOffsetOutOfRange,
  kOverflow,      // the offset itself does not fit in 64 bits
  kNullArgument,  // out-parameter is null
};

inline const char* coord_status_str(CoordStatus s) {
  switch (s) {
    case CoordStatus::kOk:
      return "ok";
    case CoordStatus::kInvalidLayout:
      return "invalid layout (zero field or size overflows 64 bits)";
    case CoordStatus::kLayerOutOfRange:
      return "layer out of range";
    case CoordStatus::kBlockOutOfRange:
      return "block out of range";
    case CoordStatus::kTokenOutOfRange:
      return "token out of range";
    case CoordStatus::kOffsetOutOfRange:
      return "offset out of range";
    case CoordStatus::kOverflow:
      return "64-bit overflow";
    case CoordStatus::kNullArgument:
      return "null out-parameter";
  }
  return "unknown status";
}

// Returned by the sentinel forms when the coordinate is not valid.
constexpr uint64_t kInvalidOffset = ~uint64_t{0};

namespace detail {
// a * b without wrapping; false if the product does not fit in 64 bits.
constexpr bool mul_u64(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > ~uint64_t{0} / a) return false;
  *out = a * b;
  return true;
}
constexpr bool add_u64(uint64_t a, uint64_t b, uint64_t* out) {
  if (b > ~uint64_t{0} - a) return false;
  *out = a + b;
  return true;
}
}  // namespace detail

// Unchecked closed form. Bounds and overflow are the caller's business.
constexpr uint64_t kv_token_index(const KVLayout& l, uint64_t layer,
                                  uint64_t block, uint64_t token) {
  return (layer * l.num_blocks + block) * l.tokens_per_block + token;
}

constexpr uint64_t kv_offset(const KVLayout& l, uint64_t layer, uint64_t block,
                             uint64_t token) {
  return kv_token_index(l, layer, block, token) * l.bytes_per_token;
}

// Total bytes of the layout, or kInvalidLayout.
constexpr CoordStatus kv_layout_bytes(const KVLayout& l, uint64_t* out) {
  if (out == nullptr) return CoordStatus::kNullArgument;
  if (l.num_layers == 0 || l.num_blocks == 0 || l.tokens_per_block == 0 ||
      l.bytes_per_token == 0) {
    return CoordStatus::kInvalidLayout;
  }
  uint64_t x = 0;
  if (!detail::mul_u64(l.num_layers, l.num_blocks, &x) ||
      !detail::mul_u64(x, l.tokens_per_block, &x) ||
      !detail::mul_u64(x, l.bytes_per_token, &x)) {
    return CoordStatus::kInvalidLayout;
  }
  *out = x;
  return CoordStatus::kOk;
}

// Fully checked: works for any layout, including ones whose total size does
// not fit in 64 bits (an in-bounds coordinate may still overflow there).
constexpr CoordStatus kv_offset_checked(const KVLayout& l, uint64_t layer,
                                        uint64_t block, uint64_t token,
                                        uint64_t* out) {
  if (out == nullptr) return CoordStatus::kNullArgument;
  if (l.num_layers == 0 || l.num_blocks == 0 || l.tokens_per_block == 0 ||
      l.bytes_per_token == 0) {
    return CoordStatus::kInvalidLayout;
  }
  if (layer >= l.num_layers) return CoordStatus::kLayerOutOfRange;
  if (block >= l.num_blocks) return CoordStatus::kBlockOutOfRange;
  if (token >= l.tokens_per_block) return CoordStatus::kTokenOutOfRange;
  uint64_t x = 0;
  if (!detail::mul_u64(layer, l.num_blocks, &x) ||
      !detail::add_u64(x, block, &x) ||
      !detail::mul_u64(x, l.tokens_per_block, &x) ||
      !detail::add_u64(x, token, &x) ||
      !detail::mul_u64(x, l.bytes_per_token, &x)) {
    return CoordStatus::kOverflow;
  }
  *out = x;
  return CoordStatus::kOk;
}

// A layout validated once. Default-constructed maps are empty (every
// coordinate out of range), so a failed create() leaves nothing usable by
// accident.
class KVCoordMap {
 public:
  constexpr KVCoordMap() = default;

  static constexpr CoordStatus create(const KVLayout& layout, KVCoordMap* out) {
    if (out == nullptr) return CoordStatus::kNullArgument;
    uint64_t total = 0;
    CoordStatus s = kv_layout_bytes(layout, &total);
    if (s != CoordStatus::kOk) return s;
    out->layout_ = layout;
    out->total_bytes_ = total;
    return CoordStatus::kOk;
  }

  constexpr const KVLayout& layout() const { return layout_; }
  constexpr uint64_t total_bytes() const { return total_bytes_; }

  // Bounds only: create() proved that no in-bounds offset overflows.
  constexpr CoordStatus offset(uint64_t layer, uint64_t block, uint64_t token,
                               uint64_t* out) const {
    if (out == nullptr) return CoordStatus::kNullArgument;
    if (layer >= layout_.num_layers) return CoordStatus::kLayerOutOfRange;
    if (block >= layout_.num_blocks) return CoordStatus::kBlockOutOfRange;
    if (token >= layout_.tokens_per_block) {
      return CoordStatus::kTokenOutOfRange;
    }
    *out = kv_offset(layout_, layer, block, token);
    return CoordStatus::kOk;
  }

  // Sentinel form: kInvalidOffset when out of bounds.
  constexpr uint64_t offset_or_invalid(uint64_t layer, uint64_t block,
                                       uint64_t token) const {
    return (layer < layout_.num_layers && block < layout_.num_blocks &&
            token < layout_.tokens_per_block)
               ? kv_offset(layout_, layer, block, token)
               : kInvalidOffset;
  }

  // Inverse: offset -> (layer, block, token, byte_in_token).
  constexpr CoordStatus coord(uint64_t offset, KVCoord* out) const {
    if (out == nullptr) return CoordStatus::kNullArgument;
    if (offset >= total_bytes_) return CoordStatus::kOffsetOutOfRange;
    const uint64_t n = offset / layout_.bytes_per_token;
    const uint64_t lb = n / layout_.tokens_per_block;
    out->byte_in_token = offset % layout_.bytes_per_token;
    out->token = n % layout_.tokens_per_block;
    out->block = lb % layout_.num_blocks;
    out->layer = lb / layout_.num_blocks;
    return CoordStatus::kOk;
  }

 private:
  KVLayout layout_{};
  uint64_t total_bytes_ = 0;  // 0 = not created: every offset is out of range
};

// Inverse over a raw layout, checked (layout and bounds).
constexpr CoordStatus kv_coord_from_offset(const KVLayout& l, uint64_t offset,
                                           KVCoord* out) {
  KVCoordMap m;
  CoordStatus s = KVCoordMap::create(l, &m);
  if (s != CoordStatus::kOk) return s;
  return m.coord(offset, out);
}

}  // namespace tagma
