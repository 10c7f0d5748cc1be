# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Scheduler-thread benchmark: paged vs tagma, the real Scheduler, no model.

    build/vllm-<v>/venv/bin/python scripts/bench/sched.py [--quick] [--out DIR]

Drives vLLM's Scheduler (from the patched tree, CPU) through many steps with
N requests running, fakes the model's output (one token per request per
step), and times each step's `schedule()` + `update_from_output()`, and
within it the KV manager's own calls. Backends run in ABBA order inside one
process, so their ratio is measured side by side. Also reports how many
contiguous runs each running request's block ids form.

Workloads: `decode` (short prompts, long outputs), `prefill` (long prompts,
short outputs, steady arrivals), each with or without prefix hits (half the
prompts share one of 8 system prompts). N = 64, 256, 1024. `offline` is the
shape of `make bench-offline` (128 tokens in, 256 out, every request the
same length, so N requests are admitted, decode and finish together) on the
KV cache that run had on an H100 (OFFLINE_NUM_BLOCKS), timed after the
cache has cycled (at least OFFLINE_WARMUP steps), so that the free pool is
cached blocks and every admission evicts; prefix `off` only. `--prefix
pressure` (prefill only) puts the prefix cache under pressure: 128 system
prompts and a KV cache of PRESSURE_NUM_BLOCKS, so cached prefixes are
evicted before they come back, and the free pool is cached blocks, as in a
server that has run for a while.

`--variants` adds ablation variants (ablation.py), plugged in through the
KV-cache manager plug-in point. Order v1..vk vk..v1 per repeat, rotated by
one variant each repeat (common.mirrored_order: balanced when `--repeats` is
a multiple of k).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    env_info,
    metric,
    mirrored_order,
    write_result,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
if "VLLM_MODEL_REDIRECT_PATH" not in os.environ:
    # Test model names -> the config-only folders, as the conformance run does.
    sys.path.insert(0, str(ROOT / "tests/conformance"))
    from run import redirect_file  # noqa: E402

    _out = ROOT / "build/results/bench_sched"
    _out.mkdir(parents=True, exist_ok=True)
    os.environ["VLLM_MODEL_REDIRECT_PATH"] = str(redirect_file(_out))

BLOCK_SIZE = 16
# Prefix modes: system prompts the prompts draw from (half of them carry one).
PREFIX_SYSTEMS = {"off": 0, "on": 8, "pressure": 128}
# KV cache under pressure (prefill): the running requests' own blocks (about
# 60 requests of ~2,300 tokens; the token budget bounds them) and a prefix
# cache too small for the 128 system prompts between their reuses: prefix
# hits drop to a quarter of the unpressured rate (2.5 against 10-11 %).
PRESSURE_NUM_BLOCKS = 28_672
# The offline workload: the KV cache of the 1B offline runs on an H100
# (1,129,408 tokens), and the steps until it has cycled (about 3.7 waves
# of 1,024 requests of 24 blocks) and for two waves after that.
OFFLINE_NUM_BLOCKS = 70_588
OFFLINE_WARMUP, OFFLINE_STEPS = 1_000, 540
# Variant -> (--kv-cache-backend, kv_cache_manager_cls). Ablations run under
# "paged" so that tagma's config does not name its own manager.
VARIANTS = {
    "paged": ("paged", None),
    "tagma": ("tagma", None),
    "paged-stock": ("paged", "ablation.StockKVCacheManager"),
    "paged-released-ids": ("paged", "ablation.ReleasedBlockIdsKVCacheManager"),
    "paged-call-every-step": ("paged", "ablation.CallEveryStepKVCacheManager"),
    "tagma-call-every-step": ("paged", "ablation.TagmaCallEveryStepKVCacheManager"),
    "tagma-unbatched": ("paged", "ablation.UnbatchedKVCacheManager"),
    "tagma-pysteps": ("paged", "ablation.PythonStepsKVCacheManager"),
    "tagma-pyruns": ("paged", "ablation.PyRunsKVCacheManager"),
    "tagma-both-books": ("paged", "ablation.BothBooksKVCacheManager"),
    "tagma-noheadroom": ("paged", "ablation.NoHeadroomKVCacheManager"),
    "tagma-lru": ("paged", "ablation.LruEvictionKVCacheManager"),
    "tagma-no-evicted-headroom": (
        "paged",
        "ablation.NoEvictedHeadroomKVCacheManager",
    ),
    "tagma-py-evict": ("paged", "ablation.PyEvictKVCacheManager"),
}
KV_METHODS = (
    "allocate_slots",
    "free",
    "get_computed_blocks",
    "cache_blocks",
    "get_num_common_prefix_blocks",
    "take_new_block_ids",
    "pop_blocks_for_free",
    "allocate_batched",
)


def make_scheduler(
    variant: str,
    max_num_seqs: int,
    num_blocks: int,
    max_len: int,
    model: str = "facebook/opt-125m",
    model_max_len: int | None = None,
):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    extra = {} if model_max_len is None else {"max_model_len": model_max_len}
    model_config = ModelConfig(
        model=model, dtype="float16", seed=0, skip_tokenizer_init=True, **extra
    )
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8192,
        max_model_len=max_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    backend, manager_cls = VARIANTS[variant]
    cache = CacheConfig(
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        kv_cache_backend=backend,
        kv_cache_manager_cls=manager_cls,
    )
    vllm_config = VllmConfig(
        model_config=model_config, scheduler_config=sched, cache_config=cache
    )
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    kv_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l"], spec)],
    )
    cache.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
    )


class KVTimer:
    """Accumulates time spent in the KV manager's methods.

    The wrapper's own cost (a closure call and two clock reads) is measured
    once and subtracted per call, so it does not add the same constant to
    both backends and pull their ratio toward 1.
    """

    def __init__(self, manager) -> None:
        self.ns = 0
        self.calls = 0
        for name in KV_METHODS:
            setattr(manager, name, self._wrap(getattr(manager, name)))
        self.overhead_ns = self._calibrate()

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            self.calls += 1
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - t0

        return timed

    def _calibrate(self, n: int = 200_000) -> float:
        """The timer's own cost per call: a timed call of a function doing
        nothing, minus an untimed call of it (the call itself is real cost
        the scheduler pays either way)."""

        def noop(*args, **kwargs):
            return None

        timed = self._wrap(noop)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            noop(1, x=2)
        bare = (time.perf_counter_ns() - t0) / n
        for _ in range(n):
            timed(1, x=2)
        inner = self.ns / n
        self.ns = self.calls = 0
        return max(inner - bare, 0.0)

    def take_ns(self) -> float:
        """Time inside the KV manager since the last call, net of the timer."""
        net = self.ns - self.calls * self.overhead_ns
        self.ns = self.calls = 0
        return max(net, 0.0)


def effective_steps(workload: str, warmup: int, steps: int) -> tuple[int, int]:
    """(warm-up, timed) steps of a run: the offline workload's are at least
    enough to cycle its cache and time two waves after it."""
    if workload == "offline":
        return max(warmup, OFFLINE_WARMUP), max(steps, OFFLINE_STEPS)
    return warmup, steps


def request_factory(workload: str, prefix: str, seed: int):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    rng = random.Random(seed)
    num_systems = PREFIX_SYSTEMS[prefix]
    systems = [
        [rng.randrange(1, 30000) for _ in range(512)] for _ in range(num_systems)
    ]
    counter = itertools.count()

    def make():
        i = next(counter)
        if workload == "decode":
            prompt_len, max_tokens = rng.randint(32, 256), rng.randint(256, 1024)
        elif workload == "offline":
            prompt_len, max_tokens = 128, 256
        else:
            prompt_len, max_tokens = rng.randint(1024, 3072), rng.randint(4, 32)
        tokens = [rng.randrange(1, 30000) for _ in range(prompt_len)]
        if systems and i % 2 == 0:
            tokens = systems[(i // 2) % len(systems)] + tokens
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return Request(
            request_id=f"r{i}",
            prompt_token_ids=tokens,
            sampling_params=params,
            pooling_params=None,
            block_hasher=hasher,
        )

    return make


def fake_output(sched_out):
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(sched_out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[7] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def runs_per_request(scheduler) -> list[int]:
    out = []
    manager = scheduler.kv_cache_manager
    for req in scheduler.running:
        ids = manager.get_block_ids(req.request_id)[0]
        if ids:
            out.append(1 + sum(b != a + 1 for a, b in itertools.pairwise(ids)))
    return out


def run_one(
    backend: str,
    n: int,
    workload: str,
    prefix: str,
    steps: int,
    warmup: int,
    seed: int,
) -> dict:
    max_len = 4096
    # The previous run's scheduler is cyclic garbage: free it before this
    # one is built, so every run starts from the same heap.
    gc.collect()
    warmup, steps = effective_steps(workload, warmup, steps)
    if workload == "offline":
        num_blocks = OFFLINE_NUM_BLOCKS
    elif prefix == "pressure":
        num_blocks = PRESSURE_NUM_BLOCKS
    else:
        num_blocks = int(n * (3200 + 1100) / BLOCK_SIZE * 0.9) + 1024
    scheduler = make_scheduler(backend, n, num_blocks, max_len)
    timer = KVTimer(scheduler.kv_cache_manager)
    make = request_factory(workload, prefix, seed)
    for _ in range(n):
        scheduler.add_request(make())
    step_ns, kv_ns, runs = [], [], []
    # Prompt tokens admitted in timed steps, and how many came from the cache.
    admitted = hit = 0
    gc.collect()
    gc.disable()
    try:
        for step in range(warmup + steps):
            timer.take_ns()
            t0 = time.perf_counter_ns()
            out = scheduler.schedule()
            result = fake_output(out)
            scheduler.update_from_output(out, result)
            dt = time.perf_counter_ns() - t0
            # Keep N requests in flight (not timed).
            for _ in range(n - len(scheduler.running) - len(scheduler.waiting)):
                scheduler.add_request(make())
            if step >= warmup:
                step_ns.append(dt)
                kv_ns.append(timer.take_ns())
                for req in out.scheduled_new_reqs:
                    admitted += len(req.prompt_token_ids or ())
                    hit += req.num_computed_tokens
                if step % 25 == 0:
                    runs.extend(runs_per_request(scheduler))
    finally:
        gc.enable()
    return {
        "step_us": [x / 1e3 for x in step_ns],
        "kv_us": [x / 1e3 for x in kv_ns],
        "runs": runs,
        "hit_rate": hit / admitted if admitted else 0.0,
        "usage": scheduler.kv_cache_manager.usage,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build/results/bench_sched"))
    parser.add_argument("--n", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2, help="ABBA blocks")
    parser.add_argument(
        "--workloads", nargs="+", choices=("decode", "prefill", "offline"),
        default=["decode", "prefill"],
    )  # fmt: skip
    parser.add_argument(
        "--prefix", nargs="+", choices=tuple(PREFIX_SYSTEMS), default=["off", "on"]
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--variants",
        default="paged,tagma",
        help=f"comma-separated, paged first; of {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--replot", action="store_true", help="redraw from --out's JSON"
    )
    args = parser.parse_args()
    if args.replot:
        out = Path(args.out)
        rows = [
            (p.stem.removeprefix("sched-"), json.loads(p.read_text())["metrics"])
            for p in sorted(out.glob("sched-n=*.json"), key=_case_order)
        ]
        print_table(rows)
        plot(out, rows)
        return 0
    if args.quick:
        args.n, args.steps, args.warmup, args.repeats = [64], 30, 10, 1
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or variants[0] != "paged":
        parser.error(f"--variants: paged first, then of {list(VARIANTS)}")
    out = Path(args.out)
    rows = []
    # Pressure is sized for prefill's running set (bounded by the token
    # budget); decode's grows with N and would only preempt.
    combos = [
        (n, w, p)
        for n in args.n
        for w in args.workloads
        for p in args.prefix
        if not (w == "decode" and p == "pressure")
        and not (w == "offline" and p != "off")
    ]
    for i, (n, workload, prefix) in enumerate(combos):
        key = f"n={n}-workload={workload}-prefix={prefix}"
        print(f"[{i + 1}/{len(combos)}] {key}", flush=True)
        data: dict[str, dict[str, list]] = {
            b: {"step": [], "kv": [], "runs": [], "kv_share": [], "hits": []}
            for b in variants
        }
        order = mirrored_order(variants, args.repeats)
        for rep, backend in enumerate(order):
            r = run_one(
                backend,
                n,
                workload,
                prefix,
                args.steps,
                args.warmup,
                seed=rep // (2 * len(variants)),
            )
            d = data[backend]
            d["step"].append(statistics.median(r["step_us"]))
            d["kv"].append(statistics.median(r["kv_us"]))
            d["kv_share"].append(sum(r["kv_us"]) / sum(r["step_us"]))
            d["runs"].extend(r["runs"])
            d["hits"].append(r["hit_rate"])
            mean_runs = statistics.fmean(r["runs"] or [0])
            print(
                f"    {backend:16s} step {d['step'][-1]:9.1f} us"
                f"  kv {d['kv'][-1]:8.1f} us  runs/req mean {mean_runs:.2f}"
                f"  prefix hits {d['hits'][-1]:.1%}",
                flush=True,
            )
        metrics = {}
        for b, d in data.items():
            metrics[f"{b}/step_time"] = metric(d["step"], "us/step")
            metrics[f"{b}/kv_manager_time"] = metric(d["kv"], "us/step")
            metrics[f"{b}/kv_manager_share"] = metric(d["kv_share"], "fraction")
            metrics[f"{b}/prefix_hit_rate"] = metric(d["hits"], "fraction")
            metrics[f"{b}/runs_per_request"] = metric(
                [float(x) for x in d["runs"]], "runs"
            )
        warmup, steps = effective_steps(workload, args.warmup, args.steps)
        params = {
            "n": n,
            "workload": workload,
            "prefix": prefix,
            "steps": steps,
            "warmup": warmup,
            "order": order,
            "block_size": BLOCK_SIZE,
        }
        write_result(out, f"sched-{key}", "sched", env_info(), params, metrics)
        rows.append((key, metrics))
    summary = {
        k: {
            m: {
                "median": v["median"],
                "p10": v["p10"],
                "p90": v["p90"],
                "unit": v["unit"],
            }
            for m, v in ms.items()
        }
        for k, ms in rows
    }
    write_result(
        out, "summary", "sched", env_info(), {"runs": [k for k, _ in rows]}, summary
    )
    print_table(rows)
    plot(out, rows)
    return 0


def _variants(metrics: dict) -> list[str]:
    return list(dict.fromkeys(k.split("/")[0] for k in metrics))


def _case_order(path: Path) -> tuple:
    params = json.loads(path.read_text())["params"]
    prefix = params["prefix"]  # a bool in results from before --prefix
    if isinstance(prefix, bool):
        prefix = "on" if prefix else "off"
    return (params["n"], params["workload"], list(PREFIX_SYSTEMS).index(prefix))


def print_table(rows) -> None:
    print(
        "\n| case | variant | step us (p10-p90) | step / paged | KV us | "
        "KV / paged | runs/req (mean/max) | prefix hits |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, m in rows:
        ps, pk = m["paged/step_time"], m["paged/kv_manager_time"]
        for v in _variants(m):
            st, kv, runs = (
                m[f"{v}/step_time"],
                m[f"{v}/kv_manager_time"],
                m[f"{v}/runs_per_request"]["samples"] or [0],
            )
            cells = [
                key,
                v,
                f"{st['median']:.0f} ({st['p10']:.0f}-{st['p90']:.0f})",
                f"{st['median'] / ps['median']:.2f}",
                f"{kv['median']:.0f}",
                f"{kv['median'] / pk['median']:.2f}",
                f"{statistics.fmean(runs):.2f}/{max(runs):.0f}",
                f"{m[f'{v}/prefix_hit_rate']['median']:.1%}",
            ]
            print("| " + " | ".join(cells) + " |")


def plot(out: Path, rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    labels = [
        k.replace("-workload=", " ")
        .replace("-prefix=on", " +prefix")
        .replace("-prefix=pressure", " +prefix, pressure")
        .replace("-prefix=off", "")
        for k, _ in rows
    ]
    x = range(len(rows))
    for ax, name, title in (
        (axes[0], "step_time", "scheduler step"),
        (axes[1], "kv_manager_time", "KV manager within the step"),
    ):
        variants = _variants(rows[0][1])
        width = 0.8 / len(variants)
        for j, b in enumerate(variants):
            off = (j - (len(variants) - 1) / 2) * width
            med = [m[f"{b}/{name}"]["median"] for _, m in rows]
            lo = [med[i] - m[f"{b}/{name}"]["p10"] for i, (_, m) in enumerate(rows)]
            hi = [m[f"{b}/{name}"]["p90"] - med[i] for i, (_, m) in enumerate(rows)]
            ax.bar([i + off for i in x], med, width, yerr=[lo, hi], capsize=3, label=b)
        ax.set_xticks(list(x), labels, fontsize=7, rotation=45, ha="right")
        ax.set_ylabel("us per step (median, p10-p90 over runs)")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "sched-step_time.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
