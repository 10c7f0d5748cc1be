# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The two allocate_slots calls a decode step still makes, per call, by manager.

    build/vllm-<v>/venv/bin/python scripts/bench/alloc_calls.py [--out DIR]

With the held-slots scheduler hook, a running request reaches the KV manager
on two decode steps in 16: the step that completes a block (held: its blocks
hold the token, the full block is cached) and the step that needs the next
block (boundary: a block is placed). This times each such call on its own
(perf_counter_ns around `allocate_slots`) for N running requests whose
prompts end at different offsets in a block, as the scheduler makes them:
steps that `held_slots` covers are skipped.

Variants: `paged`, `tagma`, or any KVCacheManager subclass as `module.Class`
(importable from PYTHONPATH, e.g. a manager module from an older stack, for
a before/after). Order v1..vk vk..v1 per repeat, rotated by one variant
each repeat (common.mirrored_order), a fresh manager per run; per run the
median call time of each kind, then the median and p10-p90 over runs. One
process, no model, CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
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
    variant_class,
    write_result,
)

BLOCK_SIZE = 16
KINDS = ("held", "boundary")


def manager_cls(variant: str) -> type:
    return variant_class(
        variant,
        {
            "paged": "vllm.v1.core.kv_cache_manager:KVCacheManager",
            "tagma": "vllm.v1.core.tagma_kv_cache_manager:TagmaKVCacheManager",
        },
    )


def one_run(cls: type, n: int, steps: int) -> dict[str, list[float]]:
    """Per-call times (µs) of each kind over `steps` decode steps."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    from vllm.v1.request import Request, RequestStatus

    init_none_hash(sha256)
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    # Room for every request's prompt and steps, twice over.
    blocks_per_req = (32 + steps) // BLOCK_SIZE + 2
    config = KVCacheConfig(
        num_blocks=2 * n * blocks_per_req,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    manager = cls(
        config,
        max_model_len=4096,
        enable_caching=True,
        scheduler_block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
    )
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    requests = []
    for i in range(n):
        # Prompts of 17..32 tokens: block boundaries spread over the steps.
        prompt = [(i * 131 + j) % 30000 for j in range(17 + i % BLOCK_SIZE)]
        request = Request(
            request_id=str(i),
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=2 * steps),
            pooling_params=None,
            block_hasher=hasher,
        )
        assert manager.allocate_slots(request, request.num_tokens) is not None
        request.num_computed_tokens = request.num_tokens
        request.status = RequestStatus.RUNNING
        requests.append(request)
    held_slots = manager.held_slots
    clock = time.perf_counter_ns
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    gc.collect()
    gc.disable()
    try:
        for _ in range(steps):
            for request in requests:
                request.append_output_token_ids(7)
                if request.num_computed_tokens + 1 > held_slots.get(
                    request.request_id, 0
                ):
                    kind = "held" if manager._holds_slots(request, 1) else "boundary"
                    t0 = clock()
                    blocks = manager.allocate_slots(request, 1)
                    times[kind].append((clock() - t0) / 1e3)
                    assert blocks is not None
                request.num_computed_tokens += 1
    finally:
        gc.enable()
    return times


def plot(out: Path, variants: list[str], summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KINDS), figsize=(5 * len(KINDS), 4))
    for ax, kind in zip(axes, KINDS, strict=True):
        rows = [summary[v][kind] for v in variants]
        meds = [r["median"] for r in rows]
        err = [
            [r["median"] - r["p10"] for r in rows],
            [r["p90"] - r["median"] for r in rows],
        ]
        ax.bar(range(len(variants)), meds, yerr=err, capsize=4)
        ax.set_xticks(range(len(variants)), variants, fontsize=8)
        ax.set_title(f"{kind} call (µs, p10-p90 over runs)", fontsize=10)
    fig.suptitle("allocate_slots per call, decode steps the hook does not skip")
    fig.tight_layout()
    fig.savefig(out / "alloc_calls.png", dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build/results/bench_alloc_calls"))
    parser.add_argument("--variants", default="paged,tagma")
    parser.add_argument("--n", type=int, default=256, help="running requests")
    parser.add_argument("--steps", type=int, default=320, help="decode steps a run")
    parser.add_argument("--repeats", type=int, default=4, help="mirrored blocks")
    args = parser.parse_args()
    variants = args.variants.split(",")
    classes = {v: manager_cls(v) for v in variants}
    for v in variants:
        one_run(classes[v], 16, 32)  # imports and first calls, untimed
    per_run: dict[str, dict[str, list[float]]] = {
        v: {k: [] for k in KINDS} for v in variants
    }
    order = mirrored_order(variants, args.repeats)
    for i, v in enumerate(order, 1):
        times = one_run(classes[v], args.n, args.steps)
        for kind in KINDS:
            per_run[v][kind].append(statistics.median(times[kind]))
        print(
            f"[{i}/{len(order)}] {v:<12} "
            + "  ".join(f"{k} {per_run[v][k][-1]:.2f} µs" for k in KINDS),
            flush=True,
        )
    out = Path(args.out)
    summary = {}
    env = env_info()
    params = {"n": args.n, "steps": args.steps, "repeats": args.repeats}
    for v in variants:
        metrics = {k: metric(per_run[v][k], "us") for k in KINDS}
        write_result(out, f"alloc-{v}", "alloc_calls", env, params, metrics)
        summary[v] = {
            k: {x: metrics[k][x] for x in ("median", "p10", "p90")} for k in KINDS
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(out, variants, summary)
    base = variants[0]
    heads = " | ".join(f"{k} µs (p10-p90)" for k in KINDS)
    print(f"\n| variant | {heads} | ratio to {base} |")
    print("|---|" + "---|" * (len(KINDS) + 1))
    for v in variants:
        cells = [
            "{median:.2f} ({p10:.2f}-{p90:.2f})".format(**summary[v][k]) for k in KINDS
        ]
        ratio = ", ".join(
            f"{summary[v][k]['median'] / summary[base][k]['median']:.2f}" for k in KINDS
        )
        print(f"| {v} | {' | '.join(cells)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
