# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""report.md and plots from bench-gpu results folders.

    python3 scripts/gpu/report.py DIR
    python3 scripts/gpu/report.py --out OUT DIR1 DIR2 ...

Reads DIR/<suite>/run<i>-<backend>/run.json (+ sched-*.tsv[.xz] where they came
back), writes report.md, summary.json and <suite>.png into DIR, or into OUT
when several folders (passes of the same stack, e.g. ABBA then BAAB) are
pooled; a pooled run is named pass.run. Every metric is the median over a
backend's repeats with the range (min-max) beside it; the ratio is tagma's
median over paged's.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import statistics
from pathlib import Path

import hostcpu

# (key in vllm bench serve's result, label, higher is better)
METRICS = [
    ("total_token_throughput", "total tok/s", True),
    ("output_throughput", "output tok/s", True),
    ("request_throughput", "requests/s", True),
    ("p50_ttft_ms", "TTFT p50 ms", False),
    ("p99_ttft_ms", "TTFT p99 ms", False),
    ("p50_tpot_ms", "TPOT p50 ms", False),
    ("p99_tpot_ms", "TPOT p99 ms", False),
    ("p50_itl_ms", "ITL p50 ms", False),
    ("p99_itl_ms", "ITL p99 ms", False),
]
# sched_stats() keys shown per workload.
SCHED_ROWS = [
    ("engine_tok_s", "engine output tok/s (main run)"),
    ("sched_us_tok", "scheduler µs per output token"),
    ("kv_us_tok", "KV manager µs per output token"),
    ("sched_us", "scheduler µs/step"),
    ("sched_p99_us", "scheduler µs/step p99"),
    ("kv_us", "KV manager µs/step"),
    ("kv_p99_us", "KV manager µs/step p99"),
    ("gc_ms", "engine-core GC ms (main run total)"),
    ("runs_mean", "block runs/request (mean)"),
    ("runs_max", "block runs/request (max)"),
    ("ranges_mean", "tagma ranges/request (mean)"),
    ("ranges_max", "tagma ranges/request (max)"),
]
PLOTTED_SCHED = ("engine_tok_s", "sched_us_tok", "kv_us_tok")
# hostcpu.cores() keys: CPU time over the main run, in cores, and the time
# spent runnable without a CPU, per second.
HOST_ROWS = [
    ("client_cores", "bench client CPU, cores (main run)"),
    ("api_cores", "API servers CPU, cores (together)"),
    ("api_max_cores", "busiest API server CPU, cores"),
    ("engine_cores", "engine core CPU, cores"),
    ("client_wait", "bench client waiting for a CPU, s per s"),
    ("api_max_wait", "most-waiting API server, s per s"),
    ("engine_wait", "engine core waiting for a CPU, s per s"),
]
# The bar: throughput >= 1.00, p99 TTFT and TPOT <= 1.00.
GOALS = {"total_token_throughput": 1.0, "p99_ttft_ms": 1.0, "p99_tpot_ms": 1.0}


def _p99(xs: list[float]) -> float:
    """Nearest-rank 99th percentile (the tail the ITL p99 would feel)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


# vllm bench serve's default --num-warmups, for results that predate
# run.json's own record of it.
DEFAULT_WARMUPS = 8


def main_run(rows: list[list[str]], result: dict) -> tuple[int, int] | None:
    """The main run's span (ns) in a workload's trace rows, or None if idle.

    result["window"] is the `vllm bench serve` process's lifetime, which also
    holds its start-up, single-prompt test and warm-up requests (hundreds of
    steps with a handful running). The main run starts where the harness saw
    the bench say so (result["main_window"]); in results from before that
    mark, at the first step with more requests than the warm-up sends. It
    ends at the last step with requests running: the front end may deliver
    the last tokens well after that (1b-host: 6-12 s).
    """
    steps = [(int(f[1]), int(f[5]), int(f[6])) for f in rows if f[0] == "S"]
    busy = [t for t, running, _ in steps if running > 0]
    if not busy:
        return None
    if "main_window" in result:
        start = int(result["main_window"][0] * 1e9)
    else:
        warmups = result.get("warmups", DEFAULT_WARMUPS)
        crowded = [t for t, running, waiting in steps if running + waiting > warmups]
        start = min(crowded) if crowded else min(t for t, _, _ in steps)
    return start, max(busy)


def trace_files(run_dir: Path) -> list[Path]:
    """A run's scheduler traces, one per engine process: sched-<pid>.tsv as
    the hook writes them, or .tsv.xz as results/ keeps them (10x smaller)."""
    return sorted(run_dir.glob("sched-*.tsv")) + sorted(run_dir.glob("sched-*.tsv.xz"))


def read_text(path: Path) -> str:
    """A file as written, or its .xz as results/ keeps it."""
    if path.suffix == ".xz":
        return lzma.decompress(path.read_bytes()).decode()
    return path.read_text()


def trace_lines(path: Path) -> list[str]:
    return read_text(path).splitlines()


def read_trace(run_dir: Path) -> list[list[str]]:
    """A run's scheduler-trace rows (all engine processes), read once a run."""
    return [
        f
        for tsv in trace_files(run_dir)
        for line in trace_lines(tsv)
        if len(f := line.split("\t")) >= 7
    ]


def sched_stats(trace: list[list[str]], result: dict) -> dict:
    """Scheduler-thread numbers of the steps of a workload's main run."""
    t0, t1 = (int(t * 1e9) for t in result["window"])
    rows = [f for f in trace if t0 <= int(f[1]) <= t1]
    span = main_run(rows, result)
    if span is None:
        return {}
    t0, t1 = span
    steps, samples = [], []
    for f in rows:
        if not (t0 <= int(f[1]) <= t1):
            continue
        if f[0] == "S":
            # gc_ns (column 8) is in traces from 2026-11-30 on.
            steps.append([int(x) for x in f[2:8]])
        elif f[0] == "R":
            samples.append(f[2:])
    out: dict = {}
    tokens = result.get("bench", {}).get("total_output_tokens")
    if tokens and t1 > t0:
        # What the engine generated per second, whatever the front end made
        # of it: the main run's output tokens over its span on the engine.
        out["engine_tok_s"] = tokens / ((t1 - t0) / 1e9)
    busy = [s for s in steps if s[3] > 0]  # steps with running requests
    if busy:
        out["steps"] = len(busy)
        sched = [(s[0] + s[1]) / 1e3 for s in busy]
        kv = [s[2] / 1e3 for s in busy]
        out["sched_us"] = statistics.median(sched)
        out["sched_p99_us"] = _p99(sched)
        out["kv_us"] = statistics.median(kv)
        out["kv_p99_us"] = _p99(kv)
        if len(busy[0]) > 5:
            out["gc_ms"] = sum(s[5] for s in steps) / 1e6
        out["running"] = statistics.median(s[3] for s in busy)
        if tokens:
            # Per token, not per step: batches differ between runs (the
            # median step held 190-670 requests in 1b-host), work per token
            # does not.
            out["sched_us_tok"] = sum(s[0] + s[1] for s in steps) / 1e3 / tokens
            out["kv_us_tok"] = sum(s[2] for s in steps) / 1e3 / tokens
    if samples:
        out["runs_mean"] = statistics.mean(float(s[1]) for s in samples)
        out["runs_max"] = max(int(s[2]) for s in samples)
        if samples[0][3] != "-":
            out["ranges_mean"] = statistics.mean(float(s[3]) for s in samples)
            out["ranges_max"] = max(int(s[4]) for s in samples)
    return out


def load(folders: list[Path]) -> dict:
    """suite -> backend -> list of run summaries (sched stats attached)."""
    suites: dict = {}
    for n, folder in enumerate(folders, 1):
        for run_json in sorted(folder.glob("*/run*-*/run.json")):
            run = json.loads(run_json.read_text())
            run["label"] = str(run["run"]) if len(folders) == 1 else f"{n}.{run['run']}"
            # The traces win where present; else what the harness stored.
            trace = read_trace(run_json.parent)
            for r in run["results"]:
                if trace or "sched" not in r:
                    r["sched"] = sched_stats(trace, r)
            by_backend = suites.setdefault(run["suite"], {})
            key = "warmup" if run.get("warmup") else run["backend"]
            by_backend.setdefault(key, []).append(run)
    return suites


def _baseline(meta: dict) -> str:
    if meta.get("baseline") == "paged-stock":
        return "paged with vLLM's KV manager as released (--baseline paged-stock)"
    return "paged"


def _meta_lines(folders: list[Path]) -> list[str]:
    metas = []
    for folder in folders:
        path = folder / "meta.json"
        metas.append(json.loads(path.read_text()) if path.exists() else {})
    stacks = {" ".join(m.get("stack", [])) for m in metas if m}
    if len(stacks) > 1:
        raise ValueError(
            "cannot pool runs of different stacks: " + "; ".join(sorted(stacks))
        )
    baselines = {m.get("baseline", "paged") for m in metas if m}
    if len(baselines) > 1:
        raise ValueError(
            "cannot pool runs of different baselines: " + ", ".join(sorted(baselines))
        )
    if len({bool(m.get("shared_socket")) for m in metas if m}) > 1:
        raise ValueError(
            "cannot pool runs with and without --shared-socket (the API servers' "
            "listening sockets differ)"
        )
    lines = []
    if stacks:
        lines.append(f"- stack: {stacks.pop()}")
    for n, (folder, meta) in enumerate(zip(folders, metas, strict=True), 1):
        if not meta:
            continue
        head = "- " if len(folders) == 1 else f"- pass {n} ({folder.name}): "
        lines += [
            f"{head}GPUs: {'; '.join(meta.get('gpus', []))}",
            (
                f"{head}order: {meta.get('order')} (A = {_baseline(meta)}, "
                "B = tagma), "
                f"started {meta.get('started')}, wall {meta.get('wall_s')} s"
            ),
        ]
        if meta.get("shared_socket"):
            lines.append(
                f"{head}API servers on one shared listening socket, as vLLM as "
                "released (--shared-socket)"
            )
        if meta.get("finished") is False:
            lines.append(
                f"{head}**the run did not finish**: runs without run.json are left out"
            )
        if meta.get("note"):
            lines.append(f"{head}note: {meta['note']}")
        for e in meta.get("errors", []):
            lines.append(f"{head}**stopped**: {e.splitlines()[0]}")
        for s in meta.get("skipped", []):
            lines.append(f"{head}skipped: {s} (not enough GPUs on this host)")
    return lines + [""] if lines else []


def _med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _cell(xs: list[float], digits: int) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = statistics.median(xs)
    if len(xs) == 1:
        return f"{m:,.{digits}f}"
    return f"{m:,.{digits}f} ({min(xs):,.{digits}f}–{max(xs):,.{digits}f})"


def _overlap(a: list[float], b: list[float]) -> bool:
    """Whether the two backends' min-max ranges over the repeats overlap."""
    a = [x for x in a if x is not None]
    b = [x for x in b if x is not None]
    return bool(a and b) and min(a) <= max(b) and min(b) <= max(a)


def _ratio_range(paged: list[float], tagma: list[float]) -> list[float] | None:
    """The widest tagma/paged ratio any pair of repeats gives (the spread)."""
    p = [x for x in paged if x]
    t = [x for x in tagma if x is not None]
    if not p or not t:
        return None
    return [min(t) / max(p), max(t) / min(p)]


def _ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a and b is not None else None


def busiest_share(per_server: dict[str, int] | None) -> float | None:
    """The largest share of a run's completion requests one API server took
    (of those whose server the log names); None with one API server or no
    record."""
    named = {k: n for k, n in (per_server or {}).items() if k != "?"}
    if len(named) < 2:
        return None
    return max(named.values()) / sum(named.values())


def workload_rows(paged: list[dict], tagma: list[dict], name: str) -> list[dict]:
    def values(runs: list[dict], get) -> list[float]:
        out = []
        for run in runs:
            for r in run["results"]:
                if r["workload"] == name:
                    out.append(get(r))
        return out

    # Bench-serve metrics always show; the harness's own only where measured.
    sources = (
        [
            (key, label, higher, lambda r, k=key: r["bench"].get(k), True)
            for key, label, higher in METRICS
        ]
        + [
            (key, label, None, get, False)
            for key, label, get in [
                ("peak_kv_usage", "peak KV usage", lambda r: r.get("peak_kv_usage")),
                ("preemptions", "preemptions", lambda r: r.get("preemptions")),
                (
                    "api_max_share",
                    "busiest API server's share of requests",
                    lambda r: busiest_share(r.get("api_server_requests")),
                ),
            ]
        ]
        + [
            (key, label, None, lambda r, k=key: r["sched"].get(k), False)
            for key, label in SCHED_ROWS
        ]
        + [
            (
                key,
                label,
                None,
                lambda r, k=key: hostcpu.cores(r.get("host_cpu")).get(k),
                False,
            )
            for key, label in HOST_ROWS
        ]
    )
    rows = []
    for key, label, higher, get, always in sources:
        p, t = values(paged, get), values(tagma, get)
        if always or any(x is not None for x in p + t):
            ratio = _ratio(_med(p), _med(t))
            rows.append({"key": key, "label": label, "paged": p, "tagma": t,
                         "ratio": ratio, "higher": higher})  # fmt: skip
    return rows


def _digits(key: str) -> int:
    return (
        0
        if "throughput" in key
        or key in ("engine_tok_s", "preemptions", "runs_max", "ranges_max")
        else 2
    )


def write(folders: list[Path], out: Path) -> dict:
    """Report the runs of one folder, or pool several passes into out."""
    suites = load(folders)
    lines = ["# bench-gpu: paged vs tagma under vllm serve", ""]
    lines += _meta_lines(folders)  # raises before anything is written
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    for suite, by_backend in sorted(suites.items()):
        paged, tagma = by_backend.get("paged", []), by_backend.get("tagma", [])
        lines += [f"## {suite}", ""]
        warm = by_backend.get("warmup", [])
        lines.append(
            f"Runs: paged [{', '.join(r['label'] for r in paged)}], "
            f"tagma [{', '.join(r['label'] for r in tagma)}]"
            + (
                f", warm-up (left out) [{', '.join(r['label'] for r in warm)}]. "
                if warm
                else ". "
            )
            + "Cells: median (min–max) over the repeats; ratio = tagma / paged. "
            "Goal: tagma >= paged in throughput, <= in p99 TTFT and TPOT; "
            "'within spread' where the two ranges overlap."
        )
        gates = [r["gate"] for r in paged + tagma if r["gate"] is not None]
        if gates:
            lines.append(
                "Correctness gate (greedy token ids equal to its pass's run 1): "
                f"{'passed' if all(gates) else 'FAILED'} in {sum(gates)} "
                f"of {len(gates)} later runs."
            )
        lines += ["", "| | paged | tagma | ratio |", "|---|---|---|---|"]
        for key, label, digits in (
            ("kv_cache_tokens", "KV cache tokens", 0),
            ("max_concurrency", "max concurrency (x max-model-len)", 2),
        ):
            p = [r["capacity"].get(key) for r in paged]
            t = [r["capacity"].get(key) for r in tagma]
            ratio = _ratio(_med(p), _med(t))
            lines.append(
                f"| {label} | {_cell(p, digits)} | {_cell(t, digits)} | "
                f"{'-' if ratio is None else f'{ratio:.3f}'} |"
            )
        p = [r["startup_s"] for r in paged]
        t = [r["startup_s"] for r in tagma]
        lines.append(f"| server start-up s | {_cell(p, 0)} | {_cell(t, 0)} | |")
        lines.append("")
        summary[suite] = {}
        names = (
            [r["workload"] for r in (paged or tagma)[0]["results"]]
            if paged or tagma
            else []
        )
        for name in names:
            rows = workload_rows(paged, tagma, name)
            summary[suite][name] = {
                r["key"]: {
                    "paged": _med(r["paged"]),
                    "tagma": _med(r["tagma"]),
                    "ratio": r["ratio"],
                    "ratio_range": _ratio_range(r["paged"], r["tagma"]),
                }
                for r in rows
            }
            lines += [
                f"### {suite} / {name}",
                "",
                "| metric | paged | tagma | ratio | goal |",
                "|---|---|---|---|---|",
            ]
            for r in rows:
                goal = ""
                if r["key"] in GOALS and r["ratio"] is not None:
                    ok = r["ratio"] >= 1.0 if r["higher"] else r["ratio"] <= 1.0
                    goal = "met" if ok else "missed"
                    if _overlap(r["paged"], r["tagma"]):
                        goal += " (within spread)"
                shown = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
                d = _digits(r["key"])
                lines.append(
                    f"| {r['label']} | {_cell(r['paged'], d)} | "
                    f"{_cell(r['tagma'], d)} | "
                    f"{shown} | {goal} |"
                )
            lines.append("")
        profs = [
            (r["backend"], r["label"], r["profile"])
            for r in paged + tagma
            if r.get("profile")
        ]
        if profs:
            lines += [
                f"### {suite} / per decode step on the GPU (torch.profiler)",
                "",
                (
                    "| backend | run | steps | step period µs | materialize µs | "
                    "slot mapping µs | fused µs | write path µs | share of step |"
                ),
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for backend, label, p in profs:
                if not p.get("steps"):
                    lines.append(
                        f"| {backend} | {label} | 0 | {p.get('error')} | | | | | |"
                    )
                    continue
                lines.append(
                    f"| {backend} | {label} | {p['steps']} | "
                    f"{p['step_period_us']:,.0f} | "
                    f"{p['materialize_us']:.1f} | {p['slot_mapping_us']:.1f} | "
                    f"{p['fused_us']:.1f} | {p['write_path_us']:.1f} | "
                    f"{100 * p['write_path_share']:.3f} % |"
                )
            lines.append("")
            lines += by_prefill_lines(suite, profs)
            # One profile a backend in the summary: its first run's.
            summary[suite]["profile"] = {}
            for b, _, p in profs:
                summary[suite]["profile"].setdefault(b, p)
        _plot(out, suite, summary[suite])
        lines += [f"![{suite}]({suite}.png)", ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def by_prefill_lines(suite: str, profs: list[tuple[str, str, dict]]) -> list[str]:
    """The profiled steps by prefill tokens, GPU time by part (medians, µs)."""
    rows = [
        (backend, label, bucket, r)
        for backend, label, p in profs
        for bucket, r in (p.get("by_prefill") or {}).get("buckets", {}).items()
    ]
    if not rows:
        return []
    lines = [
        f"### {suite} / GPU time per step by prefill tokens (torch.profiler)",
        "",
        (
            "Profiled steps matched to the scheduler trace's step composition; "
            "medians in µs."
        ),
        "",
        (
            "| backend | run | prefill tokens | steps | mean prefill | "
            "mean decodes | GPU busy | attention | GEMM | KV write | "
            "write path | other | step period |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for backend, label, bucket, r in rows:
        lines.append(
            f"| {backend} | {label} | {bucket} | {r['steps']} | "
            f"{r['prefill_mean']:,.0f} | {r['decodes_mean']:.0f} | "
            f"{r['busy_us']:,.0f} | {r['attention_us']:,.0f} | "
            f"{r['gemm_us']:,.0f} | {r['kv_write_us']:.1f} | "
            f"{r['write_path_us']:.1f} | {r['other_us']:,.0f} | "
            f"{r['period_us']:,.0f} |"
        )
    unmatched = [
        f"{backend} {label}: {p['by_prefill']['unmatched']}"
        for backend, label, p in profs
        if (p.get("by_prefill") or {}).get("unmatched")
    ]
    if unmatched:
        lines.append("")
        lines.append("Steps not matched to a scheduler step: " + ", ".join(unmatched))
    return [*lines, ""]


def _plot(folder: Path, suite: str, summary: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    workloads = [w for w in summary if w != "profile"]
    keys = [k for k, _, _ in METRICS]
    labels = [label for _, label, _ in METRICS]
    # The engine-side rows, where the trace measured them: what the client's
    # numbers cannot show when the front end is the bottleneck.
    for key, label in SCHED_ROWS:
        if key in PLOTTED_SCHED and any(
            summary[w].get(key, {}).get("ratio") for w in workloads
        ):
            keys.append(key)
            labels.append(label)
    fig, ax = plt.subplots(figsize=(12 if len(keys) > 9 else 10, 4))
    width = 0.8 / max(1, len(workloads))
    for i, w in enumerate(workloads):
        ys = [summary[w].get(k, {}).get("ratio") or 0 for k in keys]
        spans = [
            summary[w].get(k, {}).get("ratio_range") or [y, y]
            for k, y in zip(keys, ys, strict=True)
        ]
        err = [
            [max(y - lo, 0) for y, (lo, _) in zip(ys, spans, strict=True)],
            [max(hi - y, 0) for y, (_, hi) in zip(ys, spans, strict=True)],
        ]
        ax.bar(
            [x + i * width for x in range(len(keys))],
            ys,
            width,
            yerr=err,
            capsize=2,
            label=w,
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(workloads) - 1) / 2 for x in range(len(keys))])
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel("tagma / paged\n(median; bars: pairwise range)")
    ax.set_title(f"{suite}: tagma over paged (1.0 = parity)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / f"{suite}.png", dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="required to pool several folders")
    args = parser.parse_args()
    if args.out is None and len(args.folders) > 1:
        parser.error("pooling several folders needs --out")
    for folder in args.folders:
        if not any(folder.glob("*/run*-*/run.json")):
            parser.error(f"{folder}: no <suite>/run<i>-<backend>/run.json in it")
    out = args.out or args.folders[0]
    try:
        write(args.folders, out)
    except ValueError as e:
        parser.error(str(e))
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
