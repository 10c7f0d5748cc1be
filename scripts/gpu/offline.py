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

`--resident` keeps one engine per variant up for the whole set instead
(`offline_worker.py`: the bench's engine, from the same engine flags, all of
them on the GPU at once, each with an equal share of its memory), and the mirrored
runs take turns between them, each one `LLM.generate` of the same prompts
from an emptied prefix cache: no engine start between runs, so runs of
different variants are seconds apart on the same host, and a host whose
speed drifts over minutes (as some H200 hosts did) shifts both sides of a
pair alike. `--warmup` then runs every variant once first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bundle as bundle_mod  # noqa: E402
import offline_worker  # noqa: E402
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
INPUT_LEN, OUTPUT_LEN = "128", "256"
DATASET = [
    "--dataset-name",
    "random",
    "--random-input-len",
    INPUT_LEN,
    "--random-output-len",
    OUTPUT_LEN,
    "--random-range-ratio",
    "0",
]
ENGINE = [
    "--max-num-seqs",
    "1024",
    "--max-model-len",
    "4096",
    "--load-format",
    "dummy",
    "--seed",
    "0",
]
WORKLOAD = DATASET + ENGINE


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


# The resident engines share the GPU's memory, as bench_serve.py --resident.
RESIDENT_MEMORY = 0.88


class Worker:
    """A resident engine for one variant (offline_worker.py), its output
    copied to `log_path`."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in close())
        # The engine's output since the last command: a run's stats lines.
        self.text = ""
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )

    def _until(self, marker: str) -> str | None:
        """The rest of the first line that starts with `marker`, or None
        once the worker has exited without one; the lines read before it
        are kept in `self.text`."""
        assert self.proc.stdout is not None
        lines: list[str] = []
        for line in self.proc.stdout:
            self.log.write(line)
            if line.startswith(marker):
                self.text = "".join(lines)
                return line[len(marker) :].strip()
            lines.append(line)
        self.log.flush()
        self.text = "".join(lines)
        return None

    def ready(self) -> bool:
        return self._until(offline_worker.READY) is not None

    def run(self) -> dict | None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("run\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        line = self._until(offline_worker.RESULT)
        return json.loads(line) if line is not None else None

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        # The engine's shutdown lines, read aside: a process it left behind
        # could hold the pipe open past the worker's exit.
        stdout = self.proc.stdout
        drain = threading.Thread(
            target=lambda: self.log.writelines(stdout), daemon=True
        )
        drain.start()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        drain.join(timeout=10)
        if not drain.is_alive():
            self.log.close()


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
    how = "resident engines" if summary.get("resident") else "vllm bench throughput"
    ax.set_title(f"{how}, 1B shape, 128/256, {prompts} prompts")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_record(variant: str, i: int, tok_s: float, elapsed_s: float, t0: float) -> dict:
    """A measured run as summary.json keeps it (t0: when it began, monotonic)."""
    return {
        "variant": variant,
        "run": i,
        "output_tok_s": tok_s,
        "elapsed_s": elapsed_s,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def resident_runs(
    args: argparse.Namespace,
    variants: list[str],
    plan: list[str],
    model: Path,
    env: dict[str, str],
    out: Path,
) -> list[dict] | None:
    """`--resident`: the plan's runs on one engine per variant, all up at
    once; None (and the log's tail printed) if an engine fails."""
    share = round(min(0.44, RESIDENT_MEMORY / len(variants)), 2)
    workers: dict[str, Worker] = {}
    runs: list[dict] = []
    seen: dict[str, int] = {}
    try:
        for variant in variants:
            log(f"starting the {variant} engine (memory share {share})")
            t0 = time.monotonic()
            cmd = [
                sys.executable,
                str(HERE / "offline_worker.py"),
                "--num-prompts",
                str(args.num_prompts),
                "--input-len",
                INPUT_LEN,
                "--output-len",
                OUTPUT_LEN,
                "--model",
                str(model),
                *ENGINE,
                "--gpu-memory-utilization",
                str(share),
                *VARIANTS[variant],
            ]
            worker = workers[variant] = Worker(cmd, env, out / f"engine-{variant}.log")
            if not worker.ready():
                _failed(worker.log_path, f"{variant} engine")
                return None
            log(f"{variant} engine ready in {time.monotonic() - t0:.0f} s")
        for n, name in enumerate(plan, 1):
            variant = name.removesuffix("-warmup")
            i = seen[name] = seen.get(name, 0) + 1
            t0 = time.monotonic()
            result = workers[variant].run()
            if result is None:
                _failed(workers[variant].log_path, f"{name} #{i}")
                return None
            tok_s = result["output_tok_s"]
            steady = steady_rates(workers[variant].text)
            rates = _rates(steady)
            log(f"run {n}/{len(plan)}: {name} #{i}: {tok_s:,.0f} output tok/s{rates}")
            (out / f"{name}-{i}.json").write_text(json.dumps(result, indent=1))
            if name != variant:
                continue
            runs.append(
                run_record(variant, i, tok_s, result["elapsed_s"], t0)
                | ({"steady_gen_tok_s": steady} if steady else {})
            )
    finally:
        for worker in workers.values():
            worker.close()
    return runs


def _rates(steady: dict | None) -> str:
    if not steady:
        return ""
    return f"; full-batch 10-s rates {steady['min']:,.0f}–{steady['max']:,.0f}"


def _failed(log_path: Path, what: str) -> None:
    tail = log_path.read_text().splitlines()[-25:] if log_path.exists() else []
    print("\n".join(tail), file=sys.stderr)
    log(f"{what} failed; its log: {log_path}")


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
        "--resident",
        action="store_true",
        help="one engine per variant, all up at once; the runs take turns",
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
    if args.resident and args.trace:
        parser.error("--trace times one engine a run: not with --resident")
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
    plan = order(variants, args.repeats)
    if args.resident:
        # Each engine warms on its own: every variant once first.
        warm = [f"{v}-warmup" for v in variants] if args.warmup else []
        resident = resident_runs(args, variants, warm + plan, model, env, out)
        if resident is None:
            return 1
        return finish(resident, variants, args, out)
    runs: list[dict] = []
    seen: dict[str, int] = {}
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
        log(f"{name} #{i}: {tok_s:,.0f} output tok/s{_rates(steady)}")
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
            run_record(variant, i, tok_s, data["elapsed_time"], t0)
            | ({"steady_gen_tok_s": steady} if steady else {})
            | ({"host": host} if host else {})
        )
    return finish(runs, variants, args, out)


def finish(
    runs: list[dict], variants: list[str], args: argparse.Namespace, out: Path
) -> int:
    """summary.json, offline.png and the medians, for either way of running."""
    summary = summarize(runs, variants)
    summary["command"] = " ".join(sys.argv)
    summary["workload"] = [*WORKLOAD, "--num-prompts", str(args.num_prompts)]
    summary["resident"] = args.resident
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
