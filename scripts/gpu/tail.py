# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Where a serve run's inter-token-latency tail comes from, step by step.

    python3 scripts/gpu/tail.py DIR [--workload prefix] [--out OUT]

Reads the engine's per-step trace of every run under DIR/<suite>/run*/
(sched-*.tsv[.xz] with C rows, see hook/sitecustomize.py) and, for the workload's
main run, pairs each step's composition (requests admitted, prefix-hit
tokens, prefill tokens, decodes) with its duration: the time from the
previous step's output to this one's, which is what each decoding request in
the step waited for its token. Repeating a step's duration once per decode
gives the engine-side ITL distribution, whose p99 the client's ITL p99
follows as long as the front end keeps up; where it falls behind, it sends
several tokens in one chunk, which the client counts as one long gap (the
`tokens per client chunk` row, from <workload>.bench.json[.xz] where it is
kept).
For each backend it reports that distribution, what the steps in
its tail carried, and a least-squares model of step time from composition
fitted on the other backend, so a step that is slower than its work explains
stands out (a GPU-side cost), apart from a step that carried more work (a
scheduling difference). For time to first token it sets the client's TTFTs
against what the engine can account for: where no step left a request
waiting, the longest two consecutive steps bound a request's time inside
the engine, and TTFT above that was spent in the front end. For the
request-level p99s (TTFT, TPOT) it gives their sampling spread: the ratio's
95 % interval with the requests resampled (paired across runs that sent the
same requests), beside paged's own AA, since a p99 over 900 requests is
about one request. Writes tail.md, tail.json and tail.png into OUT (default
DIR).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import main_run, read_text, trace_files, trace_lines  # noqa: E402

FIELDS = ("admitted", "hit_tokens", "prefill_tokens", "decodes")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else math.nan


def steps_of(run_dir: Path, result: dict) -> list[dict]:
    """The main run's steps of one workload: duration and composition."""
    steps: list[dict] = []
    for tsv in trace_files(run_dir):
        rows = [line.split("\t") for line in trace_lines(tsv)]
        comps = [r for r in rows if r[0] == "C"]
        ends = [r for r in rows if r[0] == "S"]
        if not comps:
            continue
        t0, t1 = (int(t * 1e9) for t in result["window"])
        span = main_run([r for r in ends if t0 <= int(r[1]) <= t1], result)
        if span is None:
            continue
        prev = None
        for c, s in zip(comps, ends, strict=False):
            end = int(s[1])
            if prev is not None and span[0] <= end <= span[1]:
                steps.append(
                    {
                        "end_ns": end,
                        "ms": (end - prev) / 1e6,
                        "sched_ms": (int(s[2]) + int(s[3])) / 1e6,
                        "running": int(s[5]),
                        "waiting": int(s[6]),
                        **dict(zip(FIELDS, map(int, c[2:6]), strict=True)),
                        **_host_parts(s),
                    }
                )
            prev = end
    return steps


# Host-side parts of a step interval, in S-row columns (µs): schedule and
# update, the KV manager inside them, and (traces from 2026-12-03 on) the
# runner's execute_model, sample_tokens and the wait for sampled tokens.
HOST_PARTS = {"schedule": 2, "update": 3, "kv": 4, "exec": 10, "sample": 11, "wait": 12}


def _host_parts(s: list[str]) -> dict:
    if len(s) <= HOST_PARTS["wait"]:
        return {}
    return {f"{k}_us": int(s[i]) / 1e3 for k, i in HOST_PARTS.items()}


# Decode-only steps are compared in bins of this many running requests.
BIN = 20
MIN_BIN_STEPS = 30


def host_split(by_backend: dict[str, list[tuple[str, list[dict]]]]) -> list[dict]:
    """Where a decode-only step's interval goes, at equal running counts.

    A step's interval depends on how many requests run; under arrivals over
    time that count differs between backends (a slower step keeps requests
    longer). Steps that admit nothing and prefill nothing are binned by
    running requests; for the bins every run has MIN_BIN_STEPS in, each run's
    mean interval and its parts (µs). `rest` is what the engine loop spent
    outside the parts (new requests, outputs to the front end).
    """
    runs = [
        (f"{b} {name}", steps) for b, rs in by_backend.items() for name, steps in rs
    ]
    bins: dict[str, dict[int, list[dict]]] = {}
    for label, steps in runs:
        for s in steps:
            decode_only = s["decodes"] and not (s["prefill_tokens"] or s["admitted"])
            if "exec_us" in s and decode_only:
                per = bins.setdefault(label, {})
                per.setdefault(s["running"] // BIN * BIN, []).append(s)
    if len(bins) < len(runs):
        return []
    common = set.intersection(
        *(
            {b for b, xs in per.items() if len(xs) >= MIN_BIN_STEPS}
            for per in bins.values()
        )
    )
    rows = []
    for lo in sorted(common):
        for label, _ in runs:
            xs = bins[label][lo]
            us = {"interval_us": statistics.fmean(s["ms"] * 1e3 for s in xs)}
            for k in HOST_PARTS:
                us[f"{k}_us"] = statistics.fmean(s[f"{k}_us"] for s in xs)
            parts = ("schedule", "update", "exec", "sample", "wait")
            us["rest_us"] = us["interval_us"] - sum(us[f"{k}_us"] for k in parts)
            rows.append(
                {"running": f"{lo}-{lo + BIN - 1}", "run": label, "steps": len(xs)} | us
            )
    return rows


# A run whose sampler host time is this much above the set's median is on a
# slow host: its latency ratios say more about the host than the backend.
SLOW_HOST = 0.10


def host_speed(split: list[dict]) -> dict[str, float]:
    """Each run's sampler host time over the set's median, at equal running
    counts (host_split's bins, weighted by steps), minus 1.

    The sampler (`sample_tokens`) is code neither backend changes and that
    scales with the running count, so its time against the other runs' at
    the same count measures the host the run drew: +0.25 is a run whose host
    was 25 % slower than the set's typical one.
    """
    by_bin: dict[str, list[dict]] = {}
    for r in split:
        by_bin.setdefault(r["running"], []).append(r)
    weighted: dict[str, list[tuple[float, int]]] = {}
    for rows in by_bin.values():
        median = statistics.median(r["sample_us"] for r in rows)
        if median <= 0:
            continue
        for r in rows:
            weighted.setdefault(r["run"], []).append(
                (r["sample_us"] / median, r["steps"])
            )
    return {
        run: sum(x * n for x, n in xs) / sum(n for _, n in xs) - 1
        for run, xs in weighted.items()
    }


def itl_dist(steps: list[dict]) -> list[float]:
    return [s["ms"] for s in steps for _ in range(s["decodes"])]


# Steps with prefix hits needed to fit a per-hit-token cost; with fewer (a
# workload without shared prefixes) the term would fit noise, so it is 0.
MIN_HIT_STEPS = 10


def fit(steps: list[dict]) -> list[float]:
    """Least squares: ms ~ a + b*prefill_tokens + c*decodes + d*hit_tokens."""
    import numpy as np

    with_hits = sum(s["hit_tokens"] > 0 for s in steps) >= MIN_HIT_STEPS
    x = np.array(
        [
            [1.0, s["prefill_tokens"], s["decodes"]]
            + ([s["hit_tokens"]] if with_hits else [])
            for s in steps
        ]
    )
    y = np.array([s["ms"] for s in steps])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return [float(c) for c in coef] + ([] if with_hits else [0.0])


def predict(coef: list[float], s: dict) -> float:
    return (
        coef[0]
        + coef[1] * s["prefill_tokens"]
        + coef[2] * s["decodes"]
        + coef[3] * s["hit_tokens"]
    )


def client_side(run_dir: Path, workload: str) -> dict:
    """Client ITL p99, output tokens per streamed chunk and the TTFTs (ms)
    from the bench's per-request lists, or NaNs where they were not kept."""
    # results/ keeps the per-request lists xz-compressed (5-8x smaller).
    paths = [run_dir / f"{workload}.bench.json{x}" for x in ("", ".xz")]
    found = [p for p in paths if p.exists()]
    bench = json.loads(read_text(found[0])) if found else {}
    itls = [x * 1e3 for per_req in bench.get("itls", []) for x in per_req]
    chunks = sum(1 + len(x) for x in bench.get("itls", []))
    tokens = sum(bench.get("output_lens", []))
    return {
        "client_itl_p99_ms": _pct(itls, 0.99) if itls else math.nan,
        "tokens_per_chunk": tokens / chunks if chunks else math.nan,
        "ttfts_ms": request_ttfts(bench),
        "tpots_ms": request_tpots(bench),
        "input_lens": bench.get("input_lens", []),
        "arrivals_s": arrivals(bench),
    }


def request_ttfts(bench: dict) -> list[float]:
    """Each request's TTFT (ms), NaN for a failed one (the bench lists it
    with a TTFT of 0 and leaves it out of its own percentiles)."""
    errors = bench.get("errors") or [""] * len(bench.get("ttfts", []))
    return [
        math.nan if err else x * 1e3
        for x, err in zip(bench.get("ttfts", []), errors, strict=True)
    ]


def request_tpots(bench: dict) -> list[float]:
    """Each request's time per output token after the first (ms), as `vllm
    bench serve` computes it; NaN for a request with one token or none."""
    out = []
    for itl, n in zip(bench.get("itls", []), bench.get("output_lens", []), strict=True):
        out.append(sum(itl) * 1e3 / (n - 1) if n > 1 and itl else math.nan)
    return out


def arrivals(bench: dict) -> list[float]:
    """When the client got each chunk, in seconds from its first request's
    send (bench_serve keeps the send times from 2026-12-06 on; empty for
    results without them)."""
    starts = bench.get("start_times") or []
    if not starts:
        return []
    t0 = min(starts)
    out = []
    for start, ttft, itl in zip(starts, bench["ttfts"], bench["itls"], strict=True):
        if not ttft:
            continue  # a failed request
        t = start - t0 + ttft
        out.append(t)
        for x in itl:
            t += x
            out.append(t)
    return sorted(out)


def front_end_lag(arrivals_s: list[float], engine_end_s: float) -> dict:
    """How far the front end (API servers and client) fell behind the
    engine: the client's last chunk after the engine's last step, and the
    chunks it got after that step (both clocks from the main run's start:
    the bench sends its first request as it prints the mark)."""
    if not arrivals_s:
        return {"client_lag_s": math.nan, "chunks_after_engine": math.nan}
    late = len(arrivals_s) - bisect.bisect_right(arrivals_s, engine_end_s)
    return {"client_lag_s": arrivals_s[-1] - engine_end_s, "chunks_after_engine": late}


def ttft_split(steps: list[dict], ttfts_ms: list[float]) -> dict:
    """How much of the client's TTFT tail the engine can account for.

    A request that reaches the engine while its waiting queue empties at
    every step is scheduled in the next step, so inside the engine it waits
    at most for the step in flight and then its own admitting step: the
    longest two consecutive steps bound its engine-side TTFT. Client TTFT
    above that bound was spent before the engine (the API server).
    """
    ttfts_ms = [t for t in ttfts_ms if not math.isnan(t)]  # failed requests
    pairs = [a["ms"] + b["ms"] for a, b in zip(steps, steps[1:], strict=False)]
    bound = max(pairs, default=math.nan)
    queued = sum(1 for s in steps if s["waiting"] > 0)
    return {
        "steps_with_waiting": queued,
        "engine_ttft_bound_ms": bound if not queued else math.nan,
        "client_ttft_p99_ms": _pct(ttfts_ms, 0.99) if ttfts_ms else math.nan,
        "client_ttft_above_bound": (
            sum(1 for t in ttfts_ms if t > bound) if not queued else math.nan
        ),
    }


# Request-level p99s whose sampling spread the report gives, and how often
# the requests are resampled for it.
SPREAD_METRICS = (("ttfts_ms", "TTFT p99"), ("tpots_ms", "TPOT p99"))
SPREAD_DRAWS = 1000


def p99_spread(
    paged: list[dict], tagma: list[dict], draws: int = SPREAD_DRAWS, seed: int = 0
) -> dict:
    """How far a p99 ratio moves with which requests happened to be slow.

    A p99 over 900 requests is about its ninth-slowest request, so two runs
    of one backend differ by more than the runs' ranges suggest. Resample
    the requests with replacement (`draws` times; the same request indices in
    every run where all runs sent the same prompts, as the suites do, so
    the comparison stays paired) and recompute, per metric, tagma / paged
    (median over runs of each run's p99, as report.md) and paged's own AA
    (its second main run over its first). Returns, per metric, the point
    ratio and the 2.5-97.5 % interval of each; NaN where a side is missing.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    runs = paged + tagma
    lens = {len(r[key]) for r in runs for key, _ in SPREAD_METRICS}
    # Pairing needs to know the runs sent the same prompts.
    prompts = [r.get("input_lens") or None for r in runs]
    same = (
        len(lens) == 1
        and prompts[0] is not None
        and prompts.count(prompts[0]) == len(runs)
    )
    out: dict = {"paired": same}
    nan = dict.fromkeys(("ratio", "lo", "hi", "aa", "aa_lo", "aa_hi"), math.nan)
    if not paged or not tagma or 0 in lens:
        return out | {label: nan for _, label in SPREAD_METRICS}
    # One [draws, n] index matrix per run; row 0 is the sample as measured.
    sizes = [len(r[SPREAD_METRICS[0][0]]) for r in runs]
    shared = rng.integers(0, sizes[0], (draws, sizes[0])) if same else None
    picks = [
        np.vstack(
            [
                np.arange(n),
                shared if shared is not None else rng.integers(0, n, (draws, n)),
            ]
        )
        for n in sizes
    ]
    k = len(paged)
    for key, label in SPREAD_METRICS:
        # [runs, 1 + draws] p99s, then per draw the ratios of medians over runs.
        p99 = np.array(
            [
                np.nanpercentile(np.asarray(r[key], dtype=float)[idx], 99, axis=1)
                for r, idx in zip(runs, picks, strict=True)
            ]
        )
        ratio = np.median(p99[k:], axis=0) / np.median(p99[:k], axis=0)
        aa = p99[1] / p99[0] if k > 1 else np.full(draws + 1, math.nan)
        lo, hi = np.percentile(ratio[1:], [2.5, 97.5])
        aa_lo, aa_hi = np.percentile(aa[1:], [2.5, 97.5])
        out[label] = {
            "ratio": float(ratio[0]),
            "lo": float(lo),
            "hi": float(hi),
            "aa": float(aa[0]),
            "aa_lo": float(aa_lo),
            "aa_hi": float(aa_hi),
        }
    return out


def spread_lines(spread: dict) -> list[str]:
    how = (
        "the same request indices in every run: same prompts and arrival schedule"
        if spread["paired"]
        else "each run on its own: the runs sent different requests"
    )
    lines = [
        (
            f"p99 sampling spread: the requests resampled {SPREAD_DRAWS:,} times "
            f"({how}); tagma / paged is the median over runs of each run's p99, "
            "paged AA its second main run over its first; 95 % intervals:"
        ),
        "",
        "| metric | tagma / paged | 95 % interval | paged AA | 95 % interval |",
        "|---|---|---|---|---|",
    ]

    def cell(x: float, lo: float, hi: float) -> str:
        if math.isnan(x):
            return "n/a | n/a"
        return f"{x:.3f} | {lo:.3f}–{hi:.3f}"

    for _, label in SPREAD_METRICS:
        m = spread[label]
        lines.append(
            f"| {label} | {cell(m['ratio'], m['lo'], m['hi'])} "
            f"| {cell(m['aa'], m['aa_lo'], m['aa_hi'])} |"
        )
    lines.append("")
    return lines


def summarize(steps: list[dict], model: list[float]) -> dict:
    itl = itl_dist(steps)
    p99 = _pct(itl, 0.99)
    tail = [s for s in steps if s["decodes"] and s["ms"] >= p99]
    heavy = [s for s in steps if s["prefill_tokens"] >= 2048]

    def mean(key: str, xs: list[dict]) -> float:
        return statistics.fmean(s[key] for s in xs) if xs else math.nan

    return {
        "steps": len(steps),
        "decode_tokens": len(itl),
        "itl_p50_ms": _pct(itl, 0.50),
        "itl_p90_ms": _pct(itl, 0.90),
        "itl_p99_ms": p99,
        "tail_steps": len(tail),
        "tail_decodes": sum(s["decodes"] for s in tail),
        "tail_ms_mean": mean("ms", tail),
        "tail_prefill_mean": mean("prefill_tokens", tail),
        "tail_admitted_mean": mean("admitted", tail),
        "tail_hits_mean": mean("hit_tokens", tail),
        # Step time the other backend's model expects for the same work.
        "tail_excess_ms_mean": (
            statistics.fmean(s["ms"] - predict(model, s) for s in tail)
            if tail
            else math.nan
        ),
        "heavy_steps": len(heavy),
        "decodes_in_heavy_steps": sum(s["decodes"] for s in heavy),
        "admitted": sum(s["admitted"] for s in steps),
        "hit_tokens": sum(s["hit_tokens"] for s in steps),
        "prefill_tokens": sum(s["prefill_tokens"] for s in steps),
    }


ROWS = [
    ("client_itl_p99_ms", "client ITL p99 ms", "{:.1f}"),
    ("tokens_per_chunk", "output tokens per client chunk", "{:.3f}"),
    ("steps", "steps", "{:.0f}"),
    ("itl_p50_ms", "engine ITL p50 ms", "{:.1f}"),
    ("itl_p90_ms", "engine ITL p90 ms", "{:.1f}"),
    ("itl_p99_ms", "engine ITL p99 ms", "{:.1f}"),
    ("tail_steps", "steps in the p99 tail", "{:.0f}"),
    ("tail_decodes", "decode tokens in those steps", "{:.0f}"),
    ("tail_ms_mean", "their mean duration ms", "{:.1f}"),
    ("tail_prefill_mean", "their mean prefill tokens", "{:.0f}"),
    ("tail_admitted_mean", "their mean admissions", "{:.1f}"),
    ("tail_hits_mean", "their mean prefix-hit tokens", "{:.0f}"),
    ("tail_excess_ms_mean", "their ms beyond the other backend's model", "{:.1f}"),
    ("heavy_steps", "prefill-heavy steps (>= 2048 tokens)", "{:.0f}"),
    ("decodes_in_heavy_steps", "decode tokens in prefill-heavy steps", "{:.0f}"),
    ("admitted", "admissions", "{:.0f}"),
    ("hit_tokens", "prefix-hit tokens at admission", "{:.0f}"),
    ("prefill_tokens", "prefill tokens computed", "{:.0f}"),
    ("client_ttft_p99_ms", "client TTFT p99 ms", "{:.1f}"),
    ("steps_with_waiting", "steps that left requests waiting", "{:.0f}"),
    ("engine_ttft_bound_ms", "engine-side TTFT bound ms (no queue)", "{:.1f}"),
    ("client_ttft_above_bound", "client TTFTs above that bound", "{:.0f}"),
    ("client_lag_s", "client's last chunk after the engine's last step, s", "{:.2f}"),
    ("chunks_after_engine", "chunks the client got after that step", "{:.0f}"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--workload", action="append", help="default: every one")
    parser.add_argument("--out")
    args = parser.parse_args()
    top = Path(args.dir)
    out = Path(args.out or top)
    out.mkdir(parents=True, exist_ok=True)
    # (suite, workload) -> backend -> [(run name, steps)]
    runs: dict[tuple[str, str], dict[str, list[tuple[str, list[dict]]]]] = {}
    clients: dict[tuple[str, str], dict] = {}
    engine_ends: dict[tuple[str, str], float] = {}  # s from the main run's start
    for run_json in sorted(top.glob("*/run*/run.json")):
        run = json.loads(run_json.read_text())
        if run.get("warmup"):
            continue
        for r in run["results"]:
            if args.workload and r["workload"] not in args.workload:
                continue
            steps = steps_of(run_json.parent, r)
            if steps:
                key = (run["suite"], r["workload"])
                runs.setdefault(key, {}).setdefault(run["backend"], []).append(
                    (run_json.parent.name, steps)
                )
                clients[(run_json.parent.name, r["workload"])] = client_side(
                    run_json.parent, r["workload"]
                )
                start = r.get("main_window", r["window"])[0]
                engine_ends[(run_json.parent.name, r["workload"])] = (
                    max(x["end_ns"] for x in steps) / 1e9 - start
                )
    if not runs:
        print(f"no runs with C rows under {top}", file=sys.stderr)
        return 1
    lines = ["# Where the ITL tail comes from (engine trace, main runs)", ""]
    summary: dict = {}
    for (suite, workload), by_backend in sorted(runs.items()):
        models = {
            b: fit([s for _, steps in rs for s in steps])
            for b, rs in by_backend.items()
        }
        other = {"paged": "tagma", "tagma": "paged"}
        cols = []
        requests: dict[str, list[dict]] = {"paged": [], "tagma": []}
        for backend in ("paged", "tagma"):
            for name, steps in by_backend.get(backend, []):
                model = models.get(other[backend], models[backend])
                row = summarize(steps, model)
                client = clients[(name, workload)]
                keys = ("ttfts_ms", "tpots_ms", "input_lens")
                per_request = {k: client.pop(k) for k in keys}
                requests[backend].append(per_request)
                ttfts = per_request["ttfts_ms"]
                got = client.pop("arrivals_s")
                row.update(client, **ttft_split(steps, ttfts))
                row.update(front_end_lag(got, engine_ends[(name, workload)]))
                cols.append((f"{backend} {name}", row))
        summary[f"{suite}/{workload}"] = {
            "runs": dict(cols),
            "models": {
                b: dict(
                    zip(
                        ("ms", "per_prefill_tok", "per_decode", "per_hit_tok"),
                        m,
                        strict=True,
                    )
                )
                for b, m in models.items()
            },
        }
        lines += [f"## {suite} / {workload}", ""]
        lines.append("| | " + " | ".join(c for c, _ in cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for row_key, label, fmt in ROWS:
            values = " | ".join(fmt.format(s[row_key]) for _, s in cols)
            lines.append(f"| {label} | {values} |")
        lines.append("")
        for b, m in models.items():
            lines.append(
                f"- {b} step model: {m[0]:.2f} ms + {m[1] * 1e3:.3f} ms per 1K "
                f"prefill tokens + {m[2]:.3f} ms per decode + {m[3] * 1e3:.3f} ms "
                "per 1K hit tokens"
            )
        lines.append("")
        spread = p99_spread(requests["paged"], requests["tagma"])
        summary[f"{suite}/{workload}"]["p99_spread"] = spread
        lines += spread_lines(spread)
        split = host_split(by_backend)
        summary[f"{suite}/{workload}"]["host_split"] = split
        if split:
            split_cols = ["running", "run", "steps", "interval_us"]
            split_cols += [f"{k}_us" for k in HOST_PARTS] + ["rest_us"]
            lines += [
                (
                    "Decode-only steps at equal running counts, mean µs per step "
                    "(kv is inside schedule + update; exec/sample: the runner's "
                    "host calls; wait: for sampled tokens; rest: the engine loop):"
                ),
                "",
                "| " + " | ".join(c.removesuffix("_us") for c in split_cols) + " |",
                "|---" * len(split_cols) + "|",
            ]
            for r in split:
                lines.append(
                    "| "
                    + " | ".join(
                        f"{r[c]:.0f}" if isinstance(r[c], float) else str(r[c])
                        for c in split_cols
                    )
                    + " |"
                )
            lines.append("")
            speed = host_speed(split)
            summary[f"{suite}/{workload}"]["host_speed"] = speed
            slow = [run for run, x in speed.items() if x > SLOW_HOST]
            lines += [
                "Host speed: each run's sampler host time (code neither backend "
                "changes) over the set's median at equal running counts: "
                + ", ".join(f"{run} {x:+.0%}" for run, x in speed.items())
                + ".",
                (
                    f"Slow host (> {SLOW_HOST:+.0%}): {', '.join(slow)}; its "
                    "latency ratios measure the host, compare without it."
                    if slow
                    else f"No run above {SLOW_HOST:+.0%}."
                ),
                "",
            ]
    (out / "tail.md").write_text("\n".join(lines))
    (out / "tail.json").write_text(json.dumps(summary, indent=1))
    _plot(runs, out / "tail.png")
    print("\n".join(lines))
    return 0


def _plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(runs)
    fig, axes = plt.subplots(len(keys), 2, figsize=(12, 3.6 * len(keys)), squeeze=False)
    colors = {"paged": "tab:blue", "tagma": "tab:orange"}
    for row, key in zip(axes, keys, strict=True):
        for backend, rs in runs[key].items():
            for i, (name, steps) in enumerate(rs):
                label = f"{backend} {name}"
                t0 = steps[0]["end_ns"]
                row[0].plot(
                    [(s["end_ns"] - t0) / 1e9 for s in steps],
                    [s["ms"] for s in steps],
                    ".",
                    ms=3,
                    color=colors[backend],
                    alpha=max(0.2, 0.8 - 0.2 * i),  # four runs or more stay visible
                    label=label,
                )
                row[1].scatter(
                    [s["prefill_tokens"] for s in steps],
                    [s["ms"] for s in steps],
                    s=[1 + s["decodes"] / 4 for s in steps],
                    color=colors[backend],
                    alpha=0.4,
                    label=label,
                )
        row[0].set(title=f"{key[0]} / {key[1]}: step duration over the run",
                   xlabel="s since the main run's first step", ylabel="ms")  # fmt: skip
        row[1].set(title="step duration vs prefill tokens (size: decodes)",
                   xlabel="prefill tokens in the step", ylabel="ms")  # fmt: skip
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
