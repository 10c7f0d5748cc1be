# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Plot bench_kv_engine results, from the JSON files only.

Given one or more run files of bench_kv_engine (`--json`), draws beside the
first file:

  bench_kv_engine-per-op.png         per-op cost of FreeRuns, log scale; bar =
                                     median over runs, error bar = p10..p90 of
                                     all per-round samples
  bench_kv_engine-fragmentation.png  ranges per request in the fragmentation
                                     trace, per admission regime

and prints a table: median over runs and spread.

Usage: python3 plot_bench.py RUN.json [RUN.json ...]
"""

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TIMED_UNITS = ("ns/step", "ns/cycle")


def load(paths):
    runs = [json.loads(Path(p).read_text()) for p in paths]
    merged = {}
    for run in runs:
        for name, m in run["metrics"].items():
            e = merged.setdefault(
                name, {"unit": m["unit"], "medians": [], "samples": []}
            )
            e["medians"].append(m["median"])
            e["samples"].extend(m["samples"])
    return runs, merged


def quantile(xs, q):
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    i = int(pos)
    f = pos - i
    return xs[i] * (1 - f) + xs[i + 1] * f if i + 1 < len(xs) else xs[i]


def summary(merged):
    rows = {}
    for name, e in merged.items():
        rows[name] = {
            "unit": e["unit"],
            "median": statistics.median(e["medians"]),
            "p10": quantile(e["samples"], 0.1),
            "p90": quantile(e["samples"], 0.9),
            "runs": len(e["medians"]),
        }
    return rows


def plot_per_op(rows, out):
    names = [n for n, r in rows.items() if r["unit"] in TIMED_UNITS]
    med = [rows[n]["median"] for n in names]
    lo = [max(0.0, rows[n]["median"] - rows[n]["p10"]) for n in names]
    hi = [max(0.0, rows[n]["p90"] - rows[n]["median"]) for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.5))
    y = range(len(names))
    ax.barh(
        y,
        med,
        xerr=[lo, hi],
        capsize=3,
        color="#4c72b0",
        label="median over runs, p10..p90",
    )
    ax.set_yticks(list(y))
    ax.set_yticklabels([f"{n} [{rows[n]['unit']}]" for n in names])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ns per op (log)")
    ax.set_title("tagma engine (FreeRuns): per-op cost")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_frag(rows, out):
    # Names: frag/<regime>/<metric>.
    names = [n.split("/") for n in rows if n.startswith("frag/")]
    regimes = list(dict.fromkeys(n[1] for n in names if len(n) == 3))
    if not regimes:
        return
    stats = ("mean", "p99", "max")
    fig, ax = plt.subplots(figsize=(7, 3.8))
    w = 0.8 / len(regimes)
    for j, regime in enumerate(regimes):
        vals, lo, hi = [], [], []
        for s in stats:
            r = rows[f"frag/{regime}/ranges per request {s}"]
            vals.append(r["median"])
            # max(0, ...): interpolating equal samples can overshoot by an ulp.
            lo.append(max(0.0, r["median"] - r["p10"]))
            hi.append(max(0.0, r["p90"] - r["median"]))
        occ = rows[f"frag/{regime}/mean occupancy"]["median"]
        xs = [i + (j - (len(regimes) - 1) / 2) * w for i in range(len(stats))]
        ax.bar(
            xs,
            vals,
            w,
            yerr=[lo, hi],
            capsize=2,
            label=f"{regime} (mean occupancy {occ:.1%})",
        )
    ax.set_xticks(range(len(stats)))
    ax.set_xticklabels([f"ranges/request {s}" for s in stats])
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(
        "Fragmentation trace, FreeRuns alone (median over seeds and runs, p10..p90)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    runs, merged = load(argv[1:])
    rows = summary(merged)
    out_dir = Path(argv[1]).resolve().parent
    bench = runs[0]["bench"]
    plot_per_op(rows, out_dir / f"{bench}-per-op.png")
    plot_frag(rows, out_dir / f"{bench}-fragmentation.png")
    print(f"| metric | unit | median ({len(runs)} runs) | p10 | p90 |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['unit']} | {r['median']:.4g} | {r['p10']:.4g} "
            f"| {r['p90']:.4g} |"
        )
    print(f"plots in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
