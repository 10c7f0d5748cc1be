# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Plot bench_kv_engine results, from the JSON files only.

Given one or more run files of bench_kv_engine (`--json`), draws beside the
first file:

  bench_kv_engine-per-op.png             per-op cost, log scale; bar = median
                                         over runs, error bar = p10..p90 of
                                         all per-round samples
  bench_kv_engine-loads-per-position.png table/descriptor loads per position
                                         by construction (not a timing)
  bench_kv_engine-fragmentation.png      ranges per request by fit policy,
                                         per admission regime

and prints a table: median over runs, spread, and the seed report's number
(a different machine, for orientation only).

Usage: python3 plot_bench.py RUN.json [RUN.json ...]
"""

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TIMED_UNITS = ("ns/op", "ns/step", "ns/token", "ns/cycle", "ns/evict", "ns/position")


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


def plot_per_op(rows, ref, out):
    names = [n for n, r in rows.items() if r["unit"] in TIMED_UNITS]
    med = [rows[n]["median"] for n in names]
    lo = [rows[n]["median"] - rows[n]["p10"] for n in names]
    hi = [rows[n]["p90"] - rows[n]["median"] for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.5))
    y = range(len(names))
    ax.barh(
        y,
        med,
        xerr=[lo, hi],
        capsize=3,
        color="#4c72b0",
        label="this machine: median over runs, p10..p90",
    )
    refx = [ref.get(n, {}).get("mean") for n in names]
    ax.scatter(
        [x for x in refx if x is not None],
        [i for i, x in zip(y, refx, strict=True) if x is not None],
        marker="x",
        color="#c44e52",
        zorder=3,
        label="seed report (different machine)",
    )
    ax.set_yticks(list(y))
    ax.set_yticklabels([f"{n} [{rows[n]['unit']}]" for n in names])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ns per op (log)")
    ax.set_title("tagma engine: per-op cost")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_loads(rows, out):
    cases = [
        ("prefill 4k", "slots/prefill 4k loads"),
        ("decode 512", "slots/decode 512 loads"),
    ]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    w = 0.38
    for i, (_label, key) in enumerate(cases):
        for j, (kind, color) in enumerate((("paged", "#4c72b0"), ("tagma", "#55a868"))):
            r = rows.get(f"{key} {kind}")
            if r is None:
                continue
            ax.bar(
                i + (j - 0.5) * w,
                r["median"],
                w,
                color=color,
                label=kind if i == 0 else None,
            )
            ax.text(
                i + (j - 0.5) * w,
                r["median"],
                f"{r['median']:.3g}",
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([c[0] for c in cases])
    ax.set_ylabel("table / descriptor loads per position")
    ax.set_title("Loads per position, by construction (not a timing)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_frag(rows, out):
    # Names: frag/<regime>/<policy>/<metric>.
    names = [n.split("/") for n in rows if n.startswith("frag/")]
    regimes = list(dict.fromkeys(n[1] for n in names if len(n) == 4))
    policies = list(dict.fromkeys(n[2] for n in names if len(n) == 4))
    if not regimes:
        return
    stats = ("mean", "p99", "max")
    fig, axes = plt.subplots(
        1, len(regimes), figsize=(6 * len(regimes), 3.8), squeeze=False
    )
    w = 0.8 / len(policies)
    for ax, regime in zip(axes[0], regimes, strict=False):
        for j, p in enumerate(policies):
            vals, lo, hi = [], [], []
            for s in stats:
                r = rows[f"frag/{regime}/{p}/ranges per request {s}"]
                vals.append(r["median"])
                lo.append(r["median"] - r["p10"])
                hi.append(r["p90"] - r["median"])
            xs = [i + (j - (len(policies) - 1) / 2) * w for i in range(3)]
            ax.bar(xs, vals, w, yerr=[lo, hi], capsize=2, label=p)
        occ = rows[f"frag/{regime}/{policies[0]}/mean occupancy"]["median"]
        ax.set_xticks(range(3))
        ax.set_xticklabels([f"ranges/request {s}" for s in stats])
        ax.set_yscale("log")
        ax.set_title(f"{regime}: mean occupancy {occ:.1%}")
        ax.legend(fontsize=7)
    fig.suptitle(
        "Fragmentation trace, by fit policy (median over seeds and runs, p10..p90)"
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
    ref = runs[0].get("reference", {}).get("metrics", {})
    out_dir = Path(argv[1]).resolve().parent
    bench = runs[0]["bench"]
    plot_per_op(rows, ref, out_dir / f"{bench}-per-op.png")
    plot_loads(rows, out_dir / f"{bench}-loads-per-position.png")
    plot_frag(rows, out_dir / f"{bench}-fragmentation.png")
    print(
        f"| metric | unit | median ({len(runs)} runs) | p10 | p90 "
        "| seed ref. (other machine) |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        refv = ref.get(name, {}).get("mean")
        print(
            f"| {name} | {r['unit']} | {r['median']:.4g} | {r['p10']:.4g} "
            f"| {r['p90']:.4g} | {'' if refv is None else refv} |"
        )
    print(f"plots in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
