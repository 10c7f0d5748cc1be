# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Per-call cost from Python: the _tagma_C binding vs vLLM's BlockPool.

The same work, in one process, rounds alternating which side goes first:

  case                  tagma (_tagma_C.FreeRuns)         vLLM BlockPool
  take(1)+add           f.take(1); f.add([b])             get_new_blocks(1);
                                                          free_blocks

BlockPool runs with enable_caching=True, as the scheduler has it. A sample
is one round: ns per call over `iterations` calls; each metric has
`rounds` samples per run (median, p10, p90). Writes one JSON per backend
and run, summary.json (both, merged over runs, plus the ratios) and a PNG
drawn from summary.json, under build/results/bench_binding/, and prints the
ratio table (tagma / BlockPool; < 1 means tagma is cheaper).

Usage:
  python csrc/tagma/bench/bench_binding.py [--runs 1] [--rounds 15]
      [--scale 1.0] [--out build/results/bench_binding]
  python csrc/tagma/bench/bench_binding.py --plot summary.json

The extension comes from vllm._tagma_C if installed, else from
$TAGMA_EXT_DIR (default build/tagma-ext); vLLM must be importable.
"""

import argparse
import gc
import importlib
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

from plot_bench import quantile  # same folder: one percentile definition

ROOT = pathlib.Path(__file__).resolve().parents[3]
NUM_BLOCKS = 65536


def load_tagma():
    try:
        return importlib.import_module("vllm._tagma_C")
    except ImportError:
        ext = os.environ.get("TAGMA_EXT_DIR", str(ROOT / "build/tagma-ext"))
        sys.path.insert(0, ext)
        return importlib.import_module("_tagma_C")


def metric(samples, unit="ns/call"):
    return {
        "unit": unit,
        "samples": [round(s, 2) for s in samples],
        "median": statistics.median(samples),
        "p10": quantile(samples, 0.1),
        "p90": quantile(samples, 0.9),
    }


# ------------------------------------------------------------------ cases
# Each case makes a pair of round functions: f(iterations) -> ns per call.


def pool_get_free(BP):
    pool = BP(NUM_BLOCKS, enable_caching=True, hash_block_size=16)

    def run(n):
        get, free = pool.get_new_blocks, pool.free_blocks
        t0 = time.perf_counter_ns()
        for _ in range(n):
            blocks = get(1)
            free(reversed(blocks))
        return (time.perf_counter_ns() - t0) / n

    return run


def tagma_free_runs(T):
    f = T.FreeRuns(NUM_BLOCKS)
    f.add_range(0, NUM_BLOCKS)

    def run(n):
        take, add = f.take, f.add
        t0 = time.perf_counter_ns()
        for _ in range(n):
            r = take(1)
            add([r[0][0]])
        return (time.perf_counter_ns() - t0) / n

    return run


def cases(T, BP, scale):
    """(metric name, iterations, tagma round fn, BlockPool round fn)."""
    return [
        (
            "FreeRuns take(1)+add / get_new_blocks(1)+free",
            max(50, int(40000 * scale)),
            tagma_free_runs(T),
            pool_get_free(BP),
        )
    ]


# ------------------------------------------------------------- bookkeeping


def git_info():
    def git(*args):
        try:
            return subprocess.run(
                ["git", "-C", str(ROOT), *args],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--", "csrc/tagma")),
    }


def upstream_info():
    pin = ROOT / "upstream"
    for p in sorted(pin.glob("*")) if pin.is_dir() else []:
        for line in p.read_text().splitlines():
            if line.startswith("version"):
                return {"vllm": line.split("=", 1)[1].strip().strip('"')}
    return {}


def env_info(T):
    import vllm

    cpu = ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        torch_v = torch.__version__
    except ImportError:
        torch_v = None
    return {
        "python": platform.python_version(),
        "cpu": cpu,
        "machine": platform.machine(),
        "vllm": vllm.__version__,
        "torch": torch_v,
        "gpu": None,
        "driver": None,
        "extension": T.__file__,
    }


def run_suite(T, BP, rounds, scale):
    """One run: {backend: {metric: [ns per call, one per round]}}."""
    res = {"tagma": {}, "blockpool": {}}
    for name, iters, ft, fb in cases(T, BP, scale):
        ft(max(10, iters // 10))  # warm-up
        fb(max(10, iters // 10))
        st, sb = [], []
        for r in range(rounds):
            gc.collect()
            order = ((ft, st), (fb, sb)) if r % 2 == 0 else ((fb, sb), (ft, st))
            for fn, acc in order:
                acc.append(fn(iters))
        res["tagma"][name] = st
        res["blockpool"][name] = sb
        print(
            f"  {name}: tagma {statistics.median(st):8.1f} ns, "
            f"BlockPool {statistics.median(sb):8.1f} ns",
            flush=True,
        )
    return res


def doc(backend, run, base, samples, params):
    d = dict(base)
    d["backend"] = backend
    d["params"] = dict(params, run=run)
    d["metrics"] = {n: metric(s) for n, s in samples.items()}
    return d


# --------------------------------------------------------------- plotting


def plot(summary_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = json.loads(pathlib.Path(summary_path).read_text())
    names = list(s["metrics"]["tagma"])
    fig, ax = plt.subplots(figsize=(10, 0.8 * len(names) + 1.8))
    h = 0.38
    for j, (backend, label, color) in enumerate(
        (
            ("tagma", "tagma (_tagma_C)", "#55a868"),
            ("blockpool", "vLLM BlockPool", "#4c72b0"),
        )
    ):
        ms = [s["metrics"][backend][n] for n in names]
        med = [m["median"] for m in ms]
        err = [
            [m["median"] - m["p10"] for m in ms],
            [m["p90"] - m["median"] for m in ms],
        ]
        y = [i + (j - 0.5) * h for i in range(len(names))]
        ax.barh(y, med, h, xerr=err, capsize=3, color=color, label=label)
        for yy, m in zip(y, ms, strict=True):
            ax.text(m["p90"] * 1.04, yy, f"{m['median']:.0f}", va="center", fontsize=7)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(
        [f"{n}\n(ratio {s['ratios'][n]:.2f})" for n in names], fontsize=8
    )
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(
        "ns per call from Python (log); bar = median, whisker = p10..p90 over rounds"
    )
    ax.set_title(
        "Binding cost per call: tagma vs vLLM BlockPool, same work, one process"
    )
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = pathlib.Path(summary_path).with_name("bench_binding-ns_per_call.png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def print_table(summary):
    ms = summary["metrics"]
    w = max(len(n) for n in ms["tagma"])
    print(
        f"\n{'case':<{w}}  {'tagma ns (p10..p90)':>24}  "
        f"{'BlockPool ns (p10..p90)':>26}  {'tagma/BlockPool':>15}"
    )
    for n in ms["tagma"]:
        t, b = ms["tagma"][n], ms["blockpool"][n]
        print(
            f"{n:<{w}}  {t['median']:8.1f} ({t['p10']:6.1f}..{t['p90']:6.1f})"
            f"  {b['median']:10.1f} ({b['p10']:6.1f}..{b['p90']:7.1f})"
            f"  {summary['ratios'][n]:15.3f}"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument(
        "--scale", type=float, default=1.0, help="multiplies the iterations per round"
    )
    ap.add_argument("--out", default=str(ROOT / "build/results/bench_binding"))
    ap.add_argument(
        "--plot",
        metavar="SUMMARY_JSON",
        help="only draw the PNG from an existing summary.json",
    )
    args = ap.parse_args()
    if args.plot:
        print(plot(args.plot))
        print_table(json.loads(pathlib.Path(args.plot).read_text()))
        return 0

    T = load_tagma()
    from vllm.v1.core.block_pool import BlockPool

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params = {
        "rounds": args.rounds,
        "scale": args.scale,
        "runs": args.runs,
        "num_blocks": NUM_BLOCKS,
        "blockpool_enable_caching": True,
        "unit": "ns per call, one sample per round",
    }
    base = {
        "schema": "tagma-bench/1",
        "bench": "bench_binding",
        "git": git_info(),
        "upstream": upstream_info(),
        "env": env_info(T),
    }
    merged = {"tagma": {}, "blockpool": {}}
    for run in range(1, args.runs + 1):
        print(f"run {run}/{args.runs}", flush=True)
        res = run_suite(T, BlockPool, args.rounds, args.scale)
        for backend, samples in res.items():
            path = out / f"{backend}-run={run}.json"
            path.write_text(
                json.dumps(doc(backend, run, base, samples, params), indent=1) + "\n"
            )
            for n, s in samples.items():
                merged[backend].setdefault(n, []).extend(s)
    summary = dict(base)
    summary["params"] = params
    summary["metrics"] = {
        b: {n: metric(s) for n, s in m.items()} for b, m in merged.items()
    }
    summary["ratios"] = {
        n: summary["metrics"]["tagma"][n]["median"]
        / summary["metrics"]["blockpool"][n]["median"]
        for n in merged["tagma"]
    }
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    png = plot(path)
    print_table(summary)
    print(f"\nwrote {path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
