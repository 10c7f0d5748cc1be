// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// Host benchmark of the tagma engine: the seed report's 11 scenarios plus a
// fragmentation trace. Steady-clock harness: each scenario runs `iterations`
// calls per round over `rounds` rounds (x `runs` repetitions of the suite),
// one warm-up call per round; a sample is one round's ns per op.
//
//   bench_kv_engine --json out.json [--runs 1] [--rounds 20]
//                   [--iterations 100000] [--seed 1] [--quick]

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kv_allocator.h"
#include "kv_coord_map.h"

#ifndef TAGMA_BENCH_CXX_FLAGS
  #define TAGMA_BENCH_CXX_FLAGS "unknown"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using tagma::KVAllocator;
using tagma::Status;

// The seed's coordinate layout.
constexpr uint64_t kLayers = 32;
constexpr uint64_t kBlocks = 65536;
constexpr uint64_t kTokensPerBlock = 32;
constexpr uint64_t kBytesPerToken = 2048;

volatile uint64_t g_sink = 0;  // keeps results alive

double elapsed_ns(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "bench_kv_engine: check failed: %s\n", what);
    std::exit(1);
  }
}

void check_ok(Status s, const char* what) {
  if (s != Status::kOk) {
    std::fprintf(stderr, "bench_kv_engine: %s: %s\n", what,
                 tagma::status_str(s));
    std::exit(1);
  }
}

// ------------------------------------------------------------ statistics

struct Metric {
  std::string name, unit, note;
  std::vector<double> samples;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// Appends one sample to the named metric, creating it on first use.
void add_sample(std::vector<Metric>* out, const std::string& name,
                const char* unit, const char* note, double v) {
  for (Metric& m : *out) {
    if (m.name == name) {
      m.samples.push_back(v);
      return;
    }
  }
  out->push_back(Metric{name, unit, note, {v}});
}

// ---------------------------------------------------------------- harness

struct Options {
  int runs = 1;
  int rounds = 20;
  int64_t iterations = 100000;
  uint64_t seed = 1;
  std::string json;
};

// `body(iters)` runs `iters` calls and returns the timed ns (each scenario
// times only its op, not its setup). ops_per_call turns that into ns/op.
void measure(std::vector<Metric>* out, const Options& o, const char* name,
             const char* unit, double ops_per_call,
             const std::function<double(int64_t)>& body, int64_t iters = 0,
             const char* note = "") {
  Metric* m = nullptr;
  for (Metric& x : *out) {
    if (x.name == name) m = &x;
  }
  if (m == nullptr) {
    out->push_back(Metric{name, unit, note, {}});
    m = &out->back();
  }
  const int64_t n = iters > 0 ? iters : o.iterations;
  for (int r = 0; r < o.rounds; ++r) {
    body(1);  // warm-up call
    const double ns = body(n);
    m->samples.push_back(ns / (static_cast<double>(n) * ops_per_call));
  }
}

// ------------------------------------------------------------- map / offset

void bench_map(std::vector<Metric>* out, const Options& o) {
  tagma::KVLayout layout{kLayers, kBlocks, kTokensPerBlock, kBytesPerToken};
  // Read the layout through a volatile so the compiler cannot fold it.
  volatile uint64_t vb = kBlocks;
  layout.num_blocks = vb;
  tagma::KVCoordMap map;
  check(tagma::KVCoordMap::create(layout, &map) == tagma::CoordStatus::kOk,
        "layout");

  measure(out, o, "map/offset single", "ns/op", 1, [&](int64_t n) {
    uint64_t acc = 0, off = 0;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t u = static_cast<uint64_t>(i);
      map.offset(u & 31, (u * 40503u) & 65535, (u >> 5) & 31, &off);
      acc += off;
    }
    const double ns = elapsed_ns(t0);
    g_sink = acc;
    return ns;
  });

  // Decode: one request appends one token a step; the block changes every
  // 32 steps (the request's blocks are one range starting at 1000).
  measure(out, o, "map/offset decode walk", "ns/step", 1, [&](int64_t n) {
    uint64_t acc = 0, off = 0;
    uint64_t block = 1000, token = 0;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      map.offset(static_cast<uint64_t>(i) & 31, block, token, &off);
      acc += off;
      if (++token == kTokensPerBlock) {
        token = 0;
        block = block + 1 < kBlocks ? block + 1 : 1000;
      }
    }
    const double ns = elapsed_ns(t0);
    g_sink = acc;
    return ns;
  });

  // Prefill: every token of a 4K context, one layer; reported per token.
  constexpr int64_t kCtx = 4096;
  measure(
      out, o, "map/offset context walk 4k", "ns/token", kCtx,
      [&](int64_t n) {
        uint64_t acc = 0, off = 0;
        const auto t0 = Clock::now();
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t layer = static_cast<uint64_t>(i) & 31;
          for (uint64_t p = 0; p < kCtx; ++p) {
            map.offset(layer, 2000 + p / kTokensPerBlock, p % kTokensPerBlock,
                       &off);
            acc += off;
          }
        }
        const double ns = elapsed_ns(t0);
        g_sink = acc;
        return ns;
      },
      std::max<int64_t>(1, o.iterations / kCtx));
}

// -------------------------------------------------------------- allocator

// An allocator of the seed's size with a realistic background: 256 live
// requests of 16..240 blocks, some released, so the maps are not trivial.
void populate(KVAllocator* a, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t id = 1; id <= 256; ++id) {
    check_ok(a->allocate(id, 16 + static_cast<int64_t>(rng() % 225)),
             "populate");
  }
  for (uint64_t id = 1; id <= 256; id += 3) check_ok(a->release(id), "pop");
}

void bench_alloc(std::vector<Metric>* out, const Options& o) {
  const uint64_t kReq = uint64_t{1} << 40;  // ids above the background's
  {
    KVAllocator a(kBlocks);
    populate(&a, o.seed);
    measure(out, o, "alloc/allocate release", "ns/cycle", 1, [&](int64_t n) {
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < n; ++i) {
        a.allocate(kReq, 16);
        a.release(kReq);
      }
      return elapsed_ns(t0);
    });
    check(a.validate(true), "allocate release");
  }
  {
    KVAllocator a(kBlocks);
    populate(&a, o.seed);
    measure(out, o, "alloc/grow in place", "ns/step", 1, [&](int64_t n) {
      const auto t0 = Clock::now();
      a.allocate(kReq, 1);
      for (int64_t i = 1; i < n; ++i) {
        if (i % 32 == 0) {  // rollover: the request finishes, a new one
          a.release(kReq);
          a.allocate(kReq, 1);
        } else {
          a.grow(kReq, 1);
        }
      }
      a.release(kReq);
      return elapsed_ns(t0);
    });
    check(a.validate(true), "grow");
  }
  constexpr int kPrefix = 4;  // a 128-token shared prefix
  {
    KVAllocator a(kBlocks);
    populate(&a, o.seed);
    std::vector<std::string> keys;
    for (int i = 0; i < kPrefix; ++i) {
      keys.push_back("system-prompt-block-" + std::to_string(i));
    }
    check_ok(a.allocate(kReq + 1, kPrefix), "prefix");
    check_ok(a.cache(kReq + 1, 0, keys), "prefix cache");
    check_ok(a.release(kReq + 1), "prefix release");
    measure(
        out, o, "alloc/prefix acquire release", "ns/cycle", 1,
        [&](int64_t n) {
          const auto t0 = Clock::now();
          for (int64_t i = 0; i < n; ++i) {
            a.acquire_cached(kReq, keys, kPrefix);
            a.release(kReq);
          }
          return elapsed_ns(t0);
        },
        0, "4 cached blocks per cycle");
    check(a.validate(true), "prefix");
  }
  {
    KVAllocator a(kBlocks);
    const int64_t kBatch = 4096;  // cache-only blocks per refill
    std::vector<std::string> keys(kBatch);
    uint64_t gen = 0;
    measure(out, o, "alloc/evict cache only", "ns/evict", 1, [&](int64_t n) {
      double ns = 0;
      for (int64_t done = 0; done < n;) {
        const int64_t k = std::min(kBatch, n - done);
        for (int64_t i = 0; i < k; ++i) keys[i] = "g" + std::to_string(gen++);
        a.allocate(kReq, k);  // setup, untimed
        a.cache(kReq, 0, keys.data(), static_cast<size_t>(k));
        a.release(kReq);
        size_t ev = 0;
        const auto t0 = Clock::now();
        for (int64_t i = 0; i < k; ++i) a.evict(1, &ev);
        ns += elapsed_ns(t0);
        done += k;
      }
      return ns;
    });
    check(a.validate(true), "evict");
  }
}

// ------------------------------------------------------ slot-mapping model
//
// Host model of the two Triton write-path kernels over the same physical
// layout (requests allocated by KVAllocator):
//   paged: slot = block_table[req][pos / bs] * bs + pos % bs, one table load
//          per position.
//   tagma: the range descriptor (start, logical_start, length) is loaded once
//          per position block; slot = (start + (pos / bs - logical_start)) *
//          bs + pos % bs.

struct SlotModel {
  int32_t bs = static_cast<int32_t>(kTokensPerBlock);
  int32_t max_blocks = 0;        // block-table row stride
  int32_t max_ranges = 0;        // range-table row stride
  std::vector<int32_t> table;    // [req][max_blocks]
  std::vector<int32_t> rstart;   // [req][max_ranges]
  std::vector<int32_t> rcum;     // [req][max_ranges]
  std::vector<int32_t> rlen;     // [req][max_ranges]
  std::vector<int32_t> nranges;  // [req]
  std::vector<int32_t> req_of;   // [token]
  std::vector<int32_t> pos_of;   // [token]

  void build(const KVAllocator& a, const std::vector<uint64_t>& ids,
             int32_t max_blocks_, int32_t max_ranges_) {
    max_blocks = max_blocks_;
    max_ranges = max_ranges_;
    const size_t r = ids.size();
    table.assign(r * max_blocks, -1);
    rstart.assign(r * max_ranges, 0);
    rcum.assign(r * max_ranges, 0);
    rlen.assign(r * max_ranges, 0);
    nranges.assign(r, 0);
    std::vector<uint32_t> blocks;
    for (size_t i = 0; i < r; ++i) {
      check_ok(a.blocks(ids[i], &blocks), "blocks");
      check(blocks.size() <= static_cast<size_t>(max_blocks), "row");
      for (size_t j = 0; j < blocks.size(); ++j) {
        table[i * max_blocks + j] = static_cast<int32_t>(blocks[j]);
      }
      size_t n = 0;
      const tagma::BlockRange* rg = a.ranges_data(ids[i], &n);
      check(n <= static_cast<size_t>(max_ranges), "ranges");
      nranges[i] = static_cast<int32_t>(n);
      for (size_t j = 0; j < n; ++j) {
        rstart[i * max_ranges + j] = static_cast<int32_t>(rg[j].start);
        rcum[i * max_ranges + j] = static_cast<int32_t>(rg[j].logical_start);
        rlen[i * max_ranges + j] = static_cast<int32_t>(rg[j].length);
      }
    }
  }

  // One slot per token; returns table loads issued.
  int64_t paged(int64_t* slots) const {
    const size_t n = req_of.size();
    for (size_t t = 0; t < n; ++t) {
      const int32_t req = req_of[t], pos = pos_of[t];
      const int32_t blk = table[static_cast<size_t>(req) * max_blocks +
                                pos / bs];  // the per-position load
      slots[t] = static_cast<int64_t>(blk) * bs + pos % bs;
    }
    return static_cast<int64_t>(n);
  }

  // Tokens of one request are consecutive positions; the descriptor is
  // reloaded only when the position block changes (and the scan moves on
  // only when it leaves the current range). Returns descriptor loads.
  int64_t tagma(int64_t* slots) const {
    const size_t n = req_of.size();
    int64_t loads = 0;
    int32_t cur_req = -1, cur_lb = -1, base = 0;
    int32_t ri = 0;
    for (size_t t = 0; t < n; ++t) {
      const int32_t req = req_of[t], pos = pos_of[t];
      const int32_t lb = pos / bs;
      if (req != cur_req || lb != cur_lb) {
        const size_t row = static_cast<size_t>(req) * max_ranges;
        if (req != cur_req) ri = 0;
        while (ri + 1 < nranges[req] && rcum[row + ri + 1] <= lb) ++ri;
        ++loads;
        base = rstart[row + ri] - rcum[row + ri];  // one descriptor load
        cur_req = req;
        cur_lb = lb;
      }
      slots[t] = static_cast<int64_t>(base + lb) * bs + pos % bs;
    }
    return loads;
  }
};

void bench_slots(std::vector<Metric>* out, const Options& o) {
  std::mt19937_64 rng(o.seed);
  // Prefill: one 4K-context request in a fragmented allocator (so the
  // request has several ranges: the tagma scan is exercised, not only the
  // one-range steady state).
  {
    KVAllocator a(kBlocks);
    populate(&a, o.seed);
    const uint64_t id = 1u << 30;
    check_ok(a.allocate(id, 64), "prefill");
    check_ok(a.grow(id, 64), "prefill grow");
    SlotModel m;
    m.build(a, {id}, 128, 256);
    for (int32_t p = 0; p < 4096; ++p) {
      m.req_of.push_back(0);
      m.pos_of.push_back(p);
    }
    std::vector<int64_t> s1(4096), s2(4096);
    const int64_t l1 = m.paged(s1.data()), l2 = m.tagma(s2.data());
    check(s1 == s2, "prefill slot ids differ");
    add_sample(out, "slots/prefill 4k loads paged", "loads/position",
               "by construction", double(l1) / 4096);
    add_sample(out, "slots/prefill 4k loads tagma", "loads/position",
               "by construction", double(l2) / 4096);
    const int64_t it = std::max<int64_t>(1, o.iterations / 4096);
    measure(
        out, o, "slots/prefill 4k paged gather", "ns/position", 4096,
        [&](int64_t n) {
          const auto t0 = Clock::now();
          for (int64_t i = 0; i < n; ++i) m.paged(s1.data());
          const double ns = elapsed_ns(t0);
          g_sink = static_cast<uint64_t>(s1[4095]);
          return ns;
        },
        it);
    measure(
        out, o, "slots/prefill 4k tagma range", "ns/position", 4096,
        [&](int64_t n) {
          const auto t0 = Clock::now();
          for (int64_t i = 0; i < n; ++i) m.tagma(s2.data());
          const double ns = elapsed_ns(t0);
          g_sink = static_cast<uint64_t>(s2[4095]);
          return ns;
        },
        it);
  }
  // Decode: 512 requests, context 128..4096 tokens, one position each.
  {
    KVAllocator a(kBlocks);
    std::vector<uint64_t> ids;
    SlotModel m;
    for (int32_t r = 0; r < 512; ++r) {
      const int32_t ctx = 128 + static_cast<int32_t>(rng() % 3969);
      const int32_t nb = (ctx + 31) / 32;
      check_ok(a.allocate(static_cast<uint64_t>(r), nb), "decode");
      ids.push_back(static_cast<uint64_t>(r));
      m.req_of.push_back(r);
      m.pos_of.push_back(ctx - 1);
    }
    m.build(a, ids, 128, 256);
    std::vector<int64_t> s1(512), s2(512);
    const int64_t l1 = m.paged(s1.data()), l2 = m.tagma(s2.data());
    check(s1 == s2, "decode slot ids differ");
    add_sample(out, "slots/decode 512 loads paged", "loads/position",
               "by construction", double(l1) / 512);
    add_sample(out, "slots/decode 512 loads tagma", "loads/position",
               "by construction", double(l2) / 512);
    const int64_t it = std::max<int64_t>(1, o.iterations / 512);
    measure(
        out, o, "slots/decode 512 paged gather", "ns/position", 512,
        [&](int64_t n) {
          const auto t0 = Clock::now();
          for (int64_t i = 0; i < n; ++i) m.paged(s1.data());
          const double ns = elapsed_ns(t0);
          g_sink = static_cast<uint64_t>(s1[511]);
          return ns;
        },
        it);
    measure(
        out, o, "slots/decode 512 tagma range", "ns/position", 512,
        [&](int64_t n) {
          const auto t0 = Clock::now();
          for (int64_t i = 0; i < n; ++i) m.tagma(s2.data());
          const double ns = elapsed_ns(t0);
          g_sink = static_cast<uint64_t>(s2[511]);
          return ns;
        },
        it);
  }
}

// ------------------------------------------------------- fragmentation
//
// A serving trace in block units (32 tokens/block): Poisson-ish arrivals
// admitted while memory allows (like vLLM's scheduler, which fills the KV
// cache), prompts of 1..256 blocks, half of them behind one of 16 shared
// system prompts of 4..64 blocks (prefix hits via lookup + acquire_cached,
// full prompt blocks cached after prefill), decode growth of one token per
// step (grow(1) every 32 steps), outputs of 1..1024 tokens, and preemption
// of the newest request when a grow fails (vLLM's recompute policy).

struct FragResult {
  double ranges_mean = 0, ranges_p99 = 0, ranges_max = 0;
  double fallback_share = 0, peak_occupancy = 0, mean_occupancy = 0;
  double prefix_hit_share = 0, evictions_per_alloc = 0, preemptions = 0;
};

FragResult run_trace(uint64_t seed, tagma::FitPolicy policy, int steps,
                     double watermark) {
  std::mt19937_64 rng(seed);
  const uint32_t n = 65536;
  KVAllocator a(n);
  a.set_fit_policy(policy);
  struct Live {
    uint64_t id;
    int64_t tokens;  // context so far
    int64_t left;    // output tokens still to produce
  };
  std::vector<Live> live;
  std::vector<std::vector<std::string>> sys(16);
  for (size_t s = 0; s < sys.size(); ++s) {
    const int len = 4 + static_cast<int>(rng() % 61);
    for (int i = 0; i < len; ++i) {
      sys[s].push_back("sys" + std::to_string(s) + "/" + std::to_string(i));
    }
  }
  uint64_t next_id = 1, allocs = 0, hit_blocks = 0, prompt_blocks = 0;
  uint64_t preempt = 0;
  std::vector<double> samples;
  double peak = 0, occ_sum = 0;
  int occ_n = 0;
  std::vector<std::string> keys;
  for (int step = 0; step < steps; ++step) {
    // Running requests first (as vLLM's scheduler): one token each.
    for (size_t i = 0; i < live.size();) {
      Live& r = live[i];
      bool drop = false;
      if (r.tokens % 32 == 0) {
        ++allocs;
        if (a.grow(r.id, 1) != Status::kOk) {
          // Preempt the newest request and retry once.
          const Live victim = live.back();
          check_ok(a.release(victim.id), "preempt");
          ++preempt;
          live.pop_back();
          if (i == live.size()) break;  // r was the victim
          if (a.grow(live[i].id, 1) != Status::kOk) drop = true;
        }
      }
      if (drop || --live[i].left == 0) {
        check_ok(a.release(live[i].id), "finish");
        live[i] = live.back();
        live.pop_back();
        continue;
      }
      ++live[i].tokens;
      ++i;
    }
    // Then admit up to 8 arrivals while allocation succeeds.
    for (int k = 0; k < 8; ++k) {
      const uint64_t id = next_id++;
      const int64_t prompt = 1 + static_cast<int64_t>(rng() % 256);
      keys.clear();
      if (rng() % 2 == 0) {
        const auto& p = sys[rng() % sys.size()];
        keys.assign(p.begin(), p.begin() + std::min<size_t>(p.size(), prompt));
      }
      for (int64_t i = static_cast<int64_t>(keys.size()); i < prompt; ++i) {
        keys.push_back("u" + std::to_string(id) + "/" + std::to_string(i));
      }
      const size_t hits = a.lookup(keys);
      {
        // Admission watermark: keep this share of blocks free or evictable
        // after the prompt (0 = admit until memory is full).
        const auto st = a.stats();
        if (static_cast<double>(st.free + st.cached_only) -
                static_cast<double>(prompt) <
            watermark * n) {
          break;
        }
      }
      check_ok(a.acquire_cached(id, keys, hits), "acquire");
      Status s = Status::kOk;
      if (static_cast<int64_t>(hits) < prompt) {
        s = a.grow(id, prompt - static_cast<int64_t>(hits));
        ++allocs;
      }
      if (s != Status::kOk) {  // no room: the request waits (dropped here)
        check_ok(a.release(id), "release");
        break;
      }
      check_ok(a.cache(id, 0, keys), "cache");
      hit_blocks += hits;
      prompt_blocks += static_cast<uint64_t>(prompt);
      live.push_back(
          Live{id, prompt * 32, 1 + static_cast<int64_t>(rng() % 1024)});
    }
    const auto st = a.stats();
    const double occ = static_cast<double>(st.used) / n;
    peak = std::max(peak, occ);
    if (step >= steps / 4) {  // steady state only
      occ_sum += occ;
      ++occ_n;
      if (step % 16 == 0) {
        for (const Live& r : live) {
          size_t nr = 0;
          a.ranges_data(r.id, &nr);
          samples.push_back(static_cast<double>(nr));
        }
      }
    }
  }
  check(a.validate(true), "trace");
  const auto st = a.stats();
  FragResult f;
  f.ranges_mean = mean(samples);
  f.ranges_p99 = quantile(samples, 0.99);
  f.ranges_max =
      samples.empty() ? 0 : *std::max_element(samples.begin(), samples.end());
  f.fallback_share =
      allocs ? static_cast<double>(st.fallback_allocations) / allocs : 0;
  f.peak_occupancy = peak;
  f.mean_occupancy = occ_n ? occ_sum / occ_n : 0;
  f.prefix_hit_share =
      prompt_blocks ? static_cast<double>(hit_blocks) / prompt_blocks : 0;
  f.evictions_per_alloc =
      allocs ? static_cast<double>(st.evictions) / allocs : 0;
  f.preemptions = static_cast<double>(preempt);
  return f;
}

void bench_frag(std::vector<Metric>* out, const Options& o, int steps) {
  struct P {
    tagma::FitPolicy p;
    const char* name;
  };
  const P policies[] = {
      {tagma::FitPolicy::kBestFit, "best fit"},
      {tagma::FitPolicy::kFirstFit, "first fit"},
      {tagma::FitPolicy::kWorstFit, "worst fit"},
      {tagma::FitPolicy::kHalfGap, "half gap"},
      {tagma::FitPolicy::kBestFitGrowHalfGap, "best fit, grow half gap"}};
  struct W {
    double w;
    const char* name;
  };
  const W marks[] = {{0.0, "saturated"}, {0.03, "watermark 3%"}};
  for (const W& w : marks) {
    for (const P& p : policies) {
      const std::string pre =
          std::string("frag/") + w.name + "/" + p.name + "/";
      auto add = [&](const std::string& name, const char* unit, double v) {
        add_sample(out, pre + name, unit, "one sample per seed", v);
      };
      // One trace per seed: min(rounds, 5) seeds.
      for (int r = 0; r < std::min(o.rounds, 5); ++r) {
        const FragResult f = run_trace(o.seed * 1000 + r, p.p, steps, w.w);
        add("ranges per request mean", "ranges", f.ranges_mean);
        add("ranges per request p99", "ranges", f.ranges_p99);
        add("ranges per request max", "ranges", f.ranges_max);
        add("fallback share", "fraction", f.fallback_share);
        add("peak occupancy", "fraction", f.peak_occupancy);
        add("mean occupancy", "fraction", f.mean_occupancy);
        add("prefix hit share", "fraction", f.prefix_hit_share);
        add("evictions per allocation", "blocks", f.evictions_per_alloc);
        add("preemptions", "count", f.preemptions);
      }
    }
  }
}

// ------------------------------------------------------------------ JSON

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      o += buf;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(c + 2);
    }
  }
  return "unknown";
}

// The seed report's numbers: a different machine, for orientation only.
const char* kReference = R"({
    "machine": "Apple Silicon arm64 (M1 Max), macOS 15.7, clang++ -O2; seed report, a different machine",
    "metrics": {
      "map/offset single": {"unit": "ns/op", "mean": 1.85, "stddev": 0.02},
      "map/offset decode walk": {"unit": "ns/step", "mean": 1.85, "stddev": 0.05},
      "map/offset context walk 4k": {"unit": "ns/token", "mean": 1.71, "stddev": 0.03},
      "alloc/allocate release": {"unit": "ns/cycle", "mean": 66.6, "stddev": 0.48},
      "alloc/grow in place": {"unit": "ns/step", "mean": 25.8, "stddev": 0.11},
      "alloc/prefix acquire release": {"unit": "ns/cycle", "mean": 4.3, "stddev": 0.08},
      "alloc/evict cache only": {"unit": "ns/evict", "mean": 71.6, "stddev": 0.92},
      "slots/prefill 4k paged gather": {"unit": "ns/position", "mean": 0.115},
      "slots/prefill 4k tagma range": {"unit": "ns/position", "mean": 0.122},
      "slots/decode 512 paged gather": {"unit": "ns/position", "mean": 0.062},
      "slots/decode 512 tagma range": {"unit": "ns/position", "mean": 0.063}
    }
  })";

void write_json(const std::string& path, const Options& o,
                const std::vector<Metric>& ms, int frag_steps) {
  std::ostringstream j;
  j << "{\n  \"schema\": \"tagma-bench/1\",\n";
  j << "  \"bench\": \"bench_kv_engine\",\n";
  j << "  \"env\": {\"compiler\": " << json_str(__VERSION__)
    << ", \"flags\": " << json_str(TAGMA_BENCH_CXX_FLAGS)
    << ", \"cpu\": " << json_str(cpu_name())
    << ", \"hardware_threads\": " << std::thread::hardware_concurrency()
    << "},\n";
  j << "  \"params\": {\"runs\": " << o.runs << ", \"rounds\": " << o.rounds
    << ", \"iterations\": " << o.iterations << ", \"seed\": " << o.seed
    << ", \"layers\": " << kLayers << ", \"blocks\": " << kBlocks
    << ", \"tokens_per_block\": " << kTokensPerBlock
    << ", \"bytes_per_token\": " << kBytesPerToken
    << ", \"frag_steps\": " << frag_steps << "},\n";
  j << "  \"reference\": " << kReference << ",\n";
  j << "  \"metrics\": {";
  for (size_t i = 0; i < ms.size(); ++i) {
    const Metric& m = ms[i];
    const auto& v = m.samples;
    j << (i ? ",\n" : "\n") << "    " << json_str(m.name) << ": {"
      << "\"unit\": " << json_str(m.unit);
    if (!m.note.empty()) j << ", \"note\": " << json_str(m.note);
    j << ", \"samples\": [";
    for (size_t k = 0; k < v.size(); ++k) j << (k ? ", " : "") << num(v[k]);
    j << "], \"median\": " << num(quantile(v, 0.5))
      << ", \"p10\": " << num(quantile(v, 0.1))
      << ", \"p90\": " << num(quantile(v, 0.9))
      << ", \"mean\": " << num(mean(v)) << ", \"stddev\": " << num(stddev(v))
      << ", \"min\": " << num(*std::min_element(v.begin(), v.end()))
      << ", \"max\": " << num(*std::max_element(v.begin(), v.end())) << "}";
  }
  j << "\n  }\n}\n";
  std::ofstream f(path);
  f << j.str();
  check(static_cast<bool>(f), "writing the JSON");
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_kv_engine [--json PATH] [--runs N] [--rounds N] "
               "[--iterations N] [--seed N] [--frag-steps N] [--quick]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int frag_steps = 6000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--json") {
      o.json = val();
    } else if (a == "--runs") {
      o.runs = std::atoi(val());
    } else if (a == "--rounds") {
      o.rounds = std::atoi(val());
    } else if (a == "--iterations") {
      o.iterations = std::atoll(val());
    } else if (a == "--seed") {
      o.seed = std::strtoull(val(), nullptr, 10);
    } else if (a == "--frag-steps") {
      frag_steps = std::atoi(val());
    } else if (a == "--quick") {
      o.rounds = 3;
      o.iterations = 10000;
      frag_steps = 1500;
    } else {
      return usage();
    }
  }
  if (o.runs < 1 || o.rounds < 1 || o.iterations < 1 || frag_steps < 4) {
    return usage();
  }
  std::vector<Metric> ms;
  for (int r = 0; r < o.runs; ++r) {
    bench_map(&ms, o);
    bench_alloc(&ms, o);
    bench_slots(&ms, o);
  }
  bench_frag(&ms, o, frag_steps);
  std::printf("%-44s %12s %10s %10s  %s\n", "metric", "median", "p10", "p90",
              "unit");
  for (const Metric& m : ms) {
    std::printf("%-44s %12.4g %10.4g %10.4g  %s\n", m.name.c_str(),
                quantile(m.samples, 0.5), quantile(m.samples, 0.1),
                quantile(m.samples, 0.9), m.unit.c_str());
  }
  if (!o.json.empty()) write_json(o.json, o, ms, frag_steps);
  return 0;
}
