// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// Host benchmark of the tagma engine, FreeRuns: the calls the tagma block
// pool makes (take + add, growth in place through take_after, the
// multi-range fallback) and a fragmentation trace. Steady-clock harness:
// each scenario runs `iterations` calls per round over `rounds` rounds (x
// `runs` repetitions of the suite), one warm-up call per round; a sample is
// one round's ns per op.
//
//   bench_kv_engine --json out.json [--runs 1] [--rounds 20]
//                   [--iterations 100000] [--seed 1] [--quick]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kv_free_runs.h"

#ifndef TAGMA_BENCH_CXX_FLAGS
  #define TAGMA_BENCH_CXX_FLAGS "unknown"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using tagma::FreeRuns;
using tagma::Status;
using Run = FreeRuns::Run;

constexpr int64_t kBlocks = 65536;
constexpr int64_t kMaxRanges = 256;  // the manager's cap per request

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

// ------------------------------------------------------------- free runs

// All blocks free, then a realistic background: 256 requests of 16..240
// blocks placed, one in three of them freed again, so the index holds a
// few hundred runs rather than one.
FreeRuns populated(uint64_t seed) {
  FreeRuns f(kBlocks);
  check_ok(f.add_range(0, kBlocks), "populate");
  std::mt19937_64 rng(seed);
  std::vector<Run> out;
  for (int r = 0; r < 256; ++r) {
    check_ok(f.take(16 + static_cast<int64_t>(rng() % 225), 1, &out), "take");
    if (r % 3 == 0) check_ok(f.add_range(out[0].first, out[0].second), "add");
  }
  return f;
}

// A request's blocks back into the index, as free_blocks does: by id.
void add_ids(FreeRuns* f, const std::vector<Run>& ranges,
             std::vector<uint32_t>* ids) {
  ids->clear();
  for (const Run& r : ranges) {
    for (uint32_t b = r.first; b < r.first + r.second; ++b) ids->push_back(b);
  }
  check_ok(f->add(*ids), "add ids");
}

void bench_free_runs(std::vector<Metric>* out, const Options& o) {
  std::vector<Run> got;
  std::vector<uint32_t> ids;
  for (const int64_t k : {1, 16}) {
    FreeRuns f = populated(o.seed);
    const std::string name = "free_runs/take add " + std::to_string(k);
    measure(out, o, name.c_str(), "ns/cycle", 1, [&](int64_t n) {
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < n; ++i) {
        f.take(k, kMaxRanges, &got);
        add_ids(&f, got, &ids);
      }
      return elapsed_ns(t0);
    });
    check(f.validate(true), "take add");
  }
  {
    // Decode growth: one block per step right after the request's last
    // one; every 32 steps the request finishes and a new one starts.
    FreeRuns f = populated(o.seed);
    measure(out, o, "free_runs/take_after grow", "ns/step", 1, [&](int64_t n) {
      std::vector<Run> held;
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < n; ++i) {
        if (i % 32 == 0) {
          for (const Run& r : held) f.add_range(r.first, r.second);
          f.take(1, kMaxRanges, &held);
        } else if (f.take_after(held.back().first + held.back().second - 1,
                                1) == 1) {
          ++held.back().second;
        } else {  // the neighbour is taken: a new range
          f.take(1, kMaxRanges, &got);
          held.push_back(got[0]);
        }
      }
      for (const Run& r : held) f.add_range(r.first, r.second);
      return elapsed_ns(t0);
    });
    check(f.validate(true), "take_after grow");
  }
  {
    // The multi-range fallback: free space only in runs of 8 blocks, so a
    // take of 32 is four ranges.
    FreeRuns f(kBlocks);
    for (int64_t s = 0; s < kBlocks; s += 16) {
      check_ok(f.add_range(s, 8), "setup");
    }
    measure(
        out, o, "free_runs/take fallback 4 ranges", "ns/cycle", 1,
        [&](int64_t n) {
          const auto t0 = Clock::now();
          for (int64_t i = 0; i < n; ++i) {
            f.take(32, kMaxRanges, &got);
            for (const Run& r : got) f.add_range(r.first, r.second);
          }
          g_sink = got.size();
          return elapsed_ns(t0);
        },
        0, "take(32), then add_range of each range");
    check(got.size() == 4 && f.validate(true), "fallback");
  }
}

// ------------------------------------------------------- fragmentation
//
// A serving trace in block units (32 tokens/block), on the free-run index
// alone (no growth headroom, no prefix cache: the manager adds those):
// arrivals admitted while memory allows (like vLLM's scheduler, which fills
// the KV cache), prompts of 1..256 blocks placed by take(), decode growth of
// one token per step (take_after(last block, 1) every 32 steps, else a new
// range from take(1)), outputs of 1..1024 tokens, and preemption of the
// newest request when a growth fails (vLLM's recompute policy).

struct FragResult {
  double ranges_mean = 0, ranges_p99 = 0, ranges_max = 0;
  double fallback_share = 0, peak_occupancy = 0, mean_occupancy = 0;
  double preemptions = 0;
};

struct Live {
  std::vector<Run> ranges;
  int64_t tokens;  // context so far
  int64_t left;    // output tokens still to produce
};

void release(FreeRuns* f, const Live& r) {
  for (const Run& x : r.ranges) {
    check_ok(f->add_range(x.first, x.second), "release");
  }
}

// One more block for r: in place if the block after its last is free,
// else a new range (within the range cap).
bool grow(FreeRuns* f, Live* r, std::vector<Run>* got) {
  const Run& last = r->ranges.back();
  if (f->take_after(static_cast<int64_t>(last.first) + last.second - 1, 1)) {
    ++r->ranges.back().second;
    return true;
  }
  const int64_t room = kMaxRanges - static_cast<int64_t>(r->ranges.size());
  if (room < 1 || f->take(1, room, got) != Status::kOk) return false;
  r->ranges.push_back((*got)[0]);
  return true;
}

FragResult run_trace(uint64_t seed, int steps, double watermark) {
  std::mt19937_64 rng(seed);
  FreeRuns f(kBlocks);
  check_ok(f.add_range(0, kBlocks), "trace");
  std::vector<Live> live;
  std::vector<Run> got;
  uint64_t allocs = 0, fallbacks = 0, preempt = 0;
  std::vector<double> samples;
  double peak = 0, occ_sum = 0;
  int occ_n = 0;
  for (int step = 0; step < steps; ++step) {
    // Running requests first (as vLLM's scheduler): one token each.
    for (size_t i = 0; i < live.size();) {
      bool drop = false;
      if (live[i].tokens % 32 == 0) {
        ++allocs;
        if (!grow(&f, &live[i], &got)) {
          // Preempt the newest request and retry once.
          release(&f, live.back());
          ++preempt;
          live.pop_back();
          if (i == live.size()) break;  // it was the victim
          drop = !grow(&f, &live[i], &got);
        }
      }
      if (drop || --live[i].left == 0) {
        release(&f, live[i]);
        live[i] = std::move(live.back());
        live.pop_back();
        continue;
      }
      ++live[i].tokens;
      ++i;
    }
    // Then admit up to 8 arrivals while placement succeeds, keeping
    // `watermark` of the blocks free (0 = until memory is full).
    for (int k = 0; k < 8; ++k) {
      const int64_t prompt = 1 + static_cast<int64_t>(rng() % 256);
      if (static_cast<double>(f.num_free()) - static_cast<double>(prompt) <
          watermark * kBlocks) {
        break;
      }
      if (f.take(prompt, kMaxRanges, &got) != Status::kOk) break;
      ++allocs;
      if (got.size() > 1) ++fallbacks;
      live.push_back(
          Live{got, prompt * 32, 1 + static_cast<int64_t>(rng() % 1024)});
    }
    const double occ =
        static_cast<double>(kBlocks - static_cast<int64_t>(f.num_free())) /
        kBlocks;
    peak = std::max(peak, occ);
    if (step >= steps / 4) {  // steady state only
      occ_sum += occ;
      ++occ_n;
      if (step % 16 == 0) {
        for (const Live& r : live) {
          samples.push_back(static_cast<double>(r.ranges.size()));
        }
      }
    }
  }
  check(f.validate(true), "trace");
  FragResult r;
  r.ranges_mean = mean(samples);
  r.ranges_p99 = quantile(samples, 0.99);
  r.ranges_max =
      samples.empty() ? 0 : *std::max_element(samples.begin(), samples.end());
  r.fallback_share = allocs ? static_cast<double>(fallbacks) / allocs : 0;
  r.peak_occupancy = peak;
  r.mean_occupancy = occ_n ? occ_sum / occ_n : 0;
  r.preemptions = static_cast<double>(preempt);
  return r;
}

void bench_frag(std::vector<Metric>* out, const Options& o, int steps) {
  struct W {
    double w;
    const char* name;
  };
  const W marks[] = {{0.0, "saturated"}, {0.03, "watermark 3%"}};
  for (const W& w : marks) {
    const std::string pre = std::string("frag/") + w.name + "/";
    auto add = [&](const std::string& name, const char* unit, double v) {
      add_sample(out, pre + name, unit, "one sample per seed", v);
    };
    // One trace per seed: min(rounds, 5) seeds.
    for (int r = 0; r < std::min(o.rounds, 5); ++r) {
      const FragResult f = run_trace(o.seed * 1000 + r, steps, w.w);
      add("ranges per request mean", "ranges", f.ranges_mean);
      add("ranges per request p99", "ranges", f.ranges_p99);
      add("ranges per request max", "ranges", f.ranges_max);
      add("fallback share", "fraction", f.fallback_share);
      add("peak occupancy", "fraction", f.peak_occupancy);
      add("mean occupancy", "fraction", f.mean_occupancy);
      add("preemptions", "count", f.preemptions);
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
    << ", \"blocks\": " << kBlocks << ", \"max_ranges\": " << kMaxRanges
    << ", \"frag_steps\": " << frag_steps << "},\n";
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
  for (int r = 0; r < o.runs; ++r) bench_free_runs(&ms, o);
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
