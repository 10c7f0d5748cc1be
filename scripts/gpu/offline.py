# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Offline engine throughput on the GPU host: KV-manager variants side by side.

    python3 scripts/gpu/offline.py --bundle build/bundle --out DIR \
        [--variants paged-stock,paged,tagma] [--repeats 2]

Runs `vllm bench throughput` (no API server, so the engine's host thread is
what is measured) on the host-bound workload: Llama-3.2-1B shape with dummy
weights, random 128 tokens in / 256 out, 3,072 prompts (`--num-prompts`),
`--max-num-seqs 1024`. The variants run in mirrored order (v1..vk vk..v1,
`--repeats` times), one engine per run, one compile cache shared by all
runs. Variants:

- `paged`: `--kv-cache-backend paged` (the series' paged, with the
  held-slots answer in `allocate_slots`);
- `paged-stock`: paged with `--kv-cache-manager-cls
  ablation.StockKVCacheManager`, vLLM's `allocate_slots` as released;
- `tagma`: `--kv-cache-backend tagma`.

Writes `<variant>-<i>.json` (the bench's own output), `summary.json`
(tokens/s per run, medians and ratios to the first variant with their
pairwise range) and `offline.png`. With `--trace`, the engine runs with the
scheduler hook (scripts/gpu/hook): each run's per-step trace goes to
`steps-<variant>-<i>/`, and its record in `summary.json` gets `host`, where
the engine thread's time went over the run (schedule, update, the KV manager
inside them, the runner's execute_model and sample_tokens, the wait for
sampled tokens, the rest of the loop), in µs per step and per output token.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bundle as bundle_mod  # noqa: E402
import report  # noqa: E402
from tail import HOST_PARTS  # noqa: E402 (S-row columns of the step's parts)

VARIANTS = {
    "paged": ["--kv-cache-backend", "paged"],
    "paged-stock": [
        "--kv-cache-backend",
        "paged",
        "--kv-cache-manager-cls",
        "ablation.StockKVCacheManager",
    ],
    "tagma": ["--kv-cache-backend", "tagma"],
}
WORKLOAD = [
    "--dataset-name",
    "random",
    "--random-input-len",
    "128",
    "--random-output-len",
    "256",
    "--random-range-ratio",
    "0",
    "--max-num-seqs",
    "1024",
    "--max-model-len",
    "4096",
    "--load-format",
    "dummy",
    "--seed",
    "0",
]


def host_split(trace_dir: Path, output_tokens: int) -> dict:
    """Where the engine thread's time went over a run, from its S rows:
    totals (s), per step and per output token (µs). `rest` is the loop's
    time outside the parts (new requests, outputs to the front end)."""
    rows = [r for r in report.read_trace(trace_dir) if r[0] == "S"]
    rows = [r for r in rows if len(r) > HOST_PARTS["wait"]]
    if len(rows) < 2:
        return {}
    wall = (int(rows[-1][1]) - int(rows[0][1])) / 1e9
    # The first row's parts ran before the first interval began.
    tot = {k: sum(int(r[i]) for r in rows[1:]) / 1e9 for k, i in HOST_PARTS.items()}
    parts = ("schedule", "update", "exec", "sample", "wait")
    tot["rest"] = wall - sum(tot[k] for k in parts)
    steps = len(rows) - 1
    return {
        "steps": steps,
        "wall_s": round(wall, 3),
        "total_s": {k: round(v, 3) for k, v in tot.items()},
        "per_step_us": {k: round(v / steps * 1e6, 1) for k, v in tot.items()},
        "per_token_us": {
            k: round(v / max(output_tokens, 1) * 1e6, 3) for k, v in tot.items()
        },
    }


# vLLM's periodic stats line (every 10 s): the generation rate and the batch.
STATS = re.compile(r"Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs")


def steady_rates(log_text: str) -> dict | None:
    """The 10-second generation rates a run's engine logged with its batch
    full (running at 95 % of the largest batch it logged or more): their
    spread within one run is the host's drift, which no backend causes, and
    the first thing to read when two runs of one variant disagree."""
    lines = [(float(r), int(n)) for r, n in STATS.findall(log_text)]
    if not lines:
        return None
    full = max(n for _, n in lines) * 0.95
    rates = [r for r, n in lines if n >= full]
    return {
        "n": len(rates),
        "min": min(rates),
        "median": statistics.median(rates),
        "max": max(rates),
    }


def log(msg: str) -> None:
    print(f"[offline {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def order(variants: list[str], repeats: int) -> list[str]:
    return (variants + variants[::-1]) * repeats


def summarize(runs: list[dict], variants: list[str]) -> dict:
    """Medians per variant; ratios to variants[0] per mirrored pair."""
    by: dict[str, list[float]] = {v: [] for v in variants}
    for r in runs:
        by[r["variant"]].append(r["output_tok_s"])
    base = variants[0]
    out: dict = {"runs": runs, "variants": {}}
    for v in variants:
        pairs = [a / b for a, b in zip(by[v], by[base], strict=True) if b]
        out["variants"][v] = {
            "output_tok_s": by[v],
            "median": statistics.median(by[v]) if by[v] else None,
            f"ratio_to_{base}": statistics.median(pairs) if pairs else None,
            "pair_range": [min(pairs), max(pairs)] if pairs else None,
        }
    return out


def plot(summary: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib here: plot later with --plot-only")
        return

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(summary["variants"])
    for i, v in enumerate(names):
        vals = summary["variants"][v]["output_tok_s"]
        ax.scatter([i] * len(vals), [x / 1e3 for x in vals], color="C0")
        # Beside each run, the range of its full-batch 10-s generation rates.
        runs = [r for r in summary["runs"] if r["variant"] == v]
        for k, r in enumerate(runs):
            if st := r.get("steady_gen_tok_s"):
                x = i + 0.1 + 0.06 * k
                ax.vlines(x, st["min"] / 1e3, st["max"] / 1e3, color="C2", lw=1)
        med = summary["variants"][v]["median"]
        if med:
            ax.hlines(med / 1e3, i - 0.25, i + 0.25, color="C1")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("output K tok/s (lines: a run's 10-s rates)")
    workload = summary.get("workload", [])
    prompts = "?"
    if "--num-prompts" in workload:
        prompts = f"{int(workload[workload.index('--num-prompts') + 1]):,}"
    ax.set_title(f"vllm bench throughput, 1B shape, 128/256, {prompts} prompts")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default="build/bundle")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dest", default="/tmp/tagma-bench")
    parser.add_argument("--variants", default="paged-stock,paged,tagma")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=3072,
        help="more prompts make longer runs: 3,072 take ~25 s on an H200",
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="one run of the first variant first, left out of the summary",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="time the engine thread's parts per step (scripts/gpu/hook)",
    )
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw OUT's plot from its summary"
    )
    args = parser.parse_args()
    if args.plot_only:
        out = Path(args.out)
        plot(json.loads((out / "summary.json").read_text()), out / "offline.png")
        return 0

    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or args.repeats < 1:
        parser.error(f"--variants of {list(VARIANTS)}, --repeats >= 1")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    paths = bundle_mod.install(Path(args.bundle), Path(args.dest))
    model = paths["data"] / "models" / args.model
    env = {
        **os.environ,
        # ablation.py (the stock manager) sits beside the benchmarks.
        "PYTHONPATH": f"{HERE.parent / 'bench'}:{paths['site']}",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "VLLM_CACHE_ROOT": str(Path(args.dest) / "vllm-cache" / "offline"),
    }
    if args.trace:
        env["PYTHONPATH"] = f"{HERE / 'hook'}:{env['PYTHONPATH']}"
    runs: list[dict] = []
    seen: dict[str, int] = {}
    plan = order(variants, args.repeats)
    if args.warmup:
        plan.insert(0, f"{variants[0]}-warmup")
    for n, name in enumerate(plan, 1):
        variant = name.removesuffix("-warmup")
        i = seen[name] = seen.get(name, 0) + 1
        result = out / f"{name}-{i}.json"
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "bench",
            "throughput",
            "--model",
            str(model),
            *WORKLOAD,
            "--num-prompts",
            str(args.num_prompts),
            *VARIANTS[variant],
            "--output-json",
            str(result),
        ]
        log(f"run {n}/{len(plan)}: {name} #{i}")
        steps_dir = out / f"steps-{name}-{i}"
        run_env = {**env, "TAGMA_SCHED_TRACE": str(steps_dir)} if args.trace else env
        t0 = time.monotonic()
        with open(out / f"{name}-{i}.log", "w") as f:
            rc = subprocess.run(
                cmd, env=run_env, stdout=f, stderr=subprocess.STDOUT
            ).returncode
        if rc != 0 or not result.exists():
            tail = (out / f"{name}-{i}.log").read_text().splitlines()[-25:]
            print("\n".join(tail), file=sys.stderr)
            log(f"{name} #{i} failed (exit code {rc})")
            return 1
        data = json.loads(result.read_text())
        text = (out / f"{name}-{i}.log").read_text()
        # The bench prints output tokens/s (counted from the outputs) but
        # writes only total tokens/s to its JSON.
        m = re.search(r"([\d.]+) output tokens/s", text)
        if m is None:
            log(f"{name} #{i}: no 'output tokens/s' in its log")
            return 1
        tok_s = float(m.group(1))
        steady = steady_rates(text)
        log(
            f"{name} #{i}: {tok_s:,.0f} output tok/s"
            + (
                f"; full-batch 10-s rates {steady['min']:,.0f}–{steady['max']:,.0f}"
                if steady
                else ""
            )
        )
        host = {}
        if args.trace:
            host = host_split(steps_dir, round(tok_s * data["elapsed_time"]))
            us = host.get("per_step_us", {})
            log(
                f"{name} #{i}: {host.get('steps', 0)} steps, µs a step: "
                + ", ".join(f"{k} {v:,.0f}" for k, v in us.items())
            )
        if name != variant:
            continue
        runs.append(
            {
                "variant": variant,
                "run": i,
                "output_tok_s": tok_s,
                "elapsed_s": data["elapsed_time"],
                "wall_s": round(time.monotonic() - t0, 1),
            }
            | ({"steady_gen_tok_s": steady} if steady else {})
            | ({"host": host} if host else {})
        )
    summary = summarize(runs, variants)
    summary["command"] = " ".join(sys.argv)
    summary["workload"] = [*WORKLOAD, "--num-prompts", str(args.num_prompts)]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, out / "offline.png")
    for v, s in summary["variants"].items():
        log(
            f"{v}: median {s['median']:,.0f} output tok/s, "
            f"x{s[f'ratio_to_{variants[0]}']:.3f} (pairs {s['pair_range']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
