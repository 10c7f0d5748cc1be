# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Replay the 8b-16k serve suite's request sequence through the Scheduler (CPU).

    build/vllm-<v>/venv/bin/python scripts/bench/replay_serve.py [--blocks 57500]

A diagnostic for the serve benchmark's tail latency: drives vLLM's real
Scheduler (from the patched tree, no model; one fake token per request per
step) through the same phases as `bench_serve.py`'s 8b-16k suite on one
server, ShareGPT-like short requests, 16 prompts of 15K tokens, then the
prefix-repetition set (8 prefixes of 4,096 tokens + 512), with the H200's
block count, and reports per phase the step time (median, p99, max) and,
for tagma, how often placement fell back to LRU eviction or gave growth
headroom back. One process, paged then tagma: the ratio is side by side;
absolute times depend on the machine.

With --steps-out FILE it also writes, per step, what the step asked of the
GPU: requests admitted, their prefix-cache hit tokens, prefill tokens and
decode tokens (JSON lines), and prints per phase how many decode tokens were
emitted in prefill-heavy steps (the steps that set an ITL tail).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sched as bench  # noqa: E402  (this folder's sched.py, not the stdlib's)

BLOCK = bench.BLOCK_SIZE


def phases(seed: int) -> dict[str, list[tuple[list[int], int]]]:
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, 30000) for _ in range(n)]

    prefixes = [tokens(4096) for _ in range(8)]
    return {
        "sharegpt-like": [
            (tokens(rng.randint(20, 800)), rng.randint(20, 400)) for _ in range(300)
        ],
        "long-15k": [(tokens(15000), 256) for _ in range(16)],
        "prefix": [(prefixes[i % 8] + tokens(512), 256) for i in range(128)],
    }


# A step with at least this many prefill tokens is "prefill-heavy": on an
# 8B model it takes several times a decode step.
HEAVY_PREFILL = 2048


def composition(out) -> dict[str, int]:
    """What one SchedulerOutput asks of the GPU."""
    new = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    counts = out.num_scheduled_tokens
    return {
        "admitted": len(new),
        "hit_tokens": sum(new.values()),
        "prefill_tokens": sum(n for n in counts.values() if n > 1),
        "decodes": sum(1 for n in counts.values() if n == 1),
    }


def replay(
    backend: str, blocks: int, seed: int, trace: list | None = None
) -> list[dict]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    ids = itertools.count()
    scheduler = bench.make_scheduler(
        backend, 256, blocks, 16384, model="Qwen/Qwen3-0.6B", model_max_len=16384
    )
    pool = scheduler.kv_cache_manager.block_pool
    counts = {"evictions": 0, "headroom_releases": 0}
    if backend == "tagma":
        evict, release = pool._evict_lru, pool._release_headroom

        def counted_evict(n: int) -> None:
            counts["evictions"] += 1
            evict(n)

        def counted_release() -> None:
            counts["headroom_releases"] += 1
            release()

        pool._evict_lru, pool._release_headroom = counted_evict, counted_release
    rows = []
    for name, reqs in phases(seed).items():
        before = dict(counts)
        for prompt, out in reqs:
            scheduler.add_request(
                Request(
                    request_id=f"r{next(ids)}",
                    prompt_token_ids=prompt,
                    sampling_params=SamplingParams(max_tokens=out, ignore_eos=True),
                    pooling_params=None,
                    block_hasher=hasher,
                )
            )
        steps = []
        heavy_decodes = admitted = hits = 0
        while scheduler.running or scheduler.waiting:
            t0 = time.perf_counter_ns()
            out = scheduler.schedule()
            scheduler.update_from_output(out, bench.fake_output(out))
            steps.append((time.perf_counter_ns() - t0) / 1e3)
            comp = composition(out)
            admitted += comp["admitted"]
            hits += comp["hit_tokens"]
            if comp["prefill_tokens"] >= HEAVY_PREFILL:
                heavy_decodes += comp["decodes"]
            if trace is not None:
                trace.append({"backend": backend, "phase": name, **comp})
        steps.sort()
        rows.append(
            {
                "backend": backend,
                "phase": name,
                "steps": len(steps),
                "p50_us": steps[len(steps) // 2],
                "p99_us": steps[int(len(steps) * 0.99)],
                "max_us": steps[-1],
                **{k: counts[k] - before[k] for k in counts},
                "hit_tokens": hits,
                "heavy_decodes": heavy_decodes,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=57500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-out", help="per-step composition (JSON lines)")
    args = parser.parse_args()
    print(
        "| backend | phase | steps | p50 µs | p99 µs | max µs | evictions "
        "| releases | hit tokens | decodes in prefill-heavy steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    trace: list[dict] = []
    for backend in ("paged", "tagma"):
        for r in replay(backend, args.blocks, args.seed, trace):
            print(
                f"| {r['backend']} | {r['phase']} | {r['steps']} | {r['p50_us']:.0f} "
                f"| {r['p99_us']:.0f} | {r['max_us']:.0f} | {r['evictions']} "
                f"| {r['headroom_releases']} | {r['hit_tokens']} "
                f"| {r['heavy_decodes']} |"
            )
    if args.steps_out:
        Path(args.steps_out).write_text("".join(json.dumps(t) + "\n" for t in trace))
    return 0


if __name__ == "__main__":
    sys.exit(main())
