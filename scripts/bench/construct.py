# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""KV-cache manager start-up: construction time and memory, paged vs tagma.

    build/vllm-<v>/venv/bin/python scripts/bench/construct.py [--n 100000 1000000]

Builds the scheduler's KV-cache manager (one full-attention group) with N
blocks and reports, per backend, in ABBA order within one process:

- `construct_ms`: the manager's constructor (its block pool included);
- `bytes_per_block`: Python memory the constructor leaves allocated, per
  block (tracemalloc, in a separate pass since tracing slows allocation);
- then, as vLLM's engine core does after start-up, a full collection and
  `gc.freeze()`, and after it `first_pass_ms`: handing out every block
  once, 256 at a time, straight from the pool; and `full_gc_ms`: one full
  collection once every block has been used. Work a pool moves out of
  construction (blocks created on first use) shows up in these two: the
  serving process pays it, and its objects are not frozen.

Run it from the pin's tree (`make bench-construct`), as sched.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, env_info, metric, write_result  # noqa: E402

BACKENDS = ("paged", "tagma")


def build(backend: str, num_blocks: int):
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.tagma_kv_cache_manager import TagmaKVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    cls = TagmaKVCacheManager if backend == "tagma" else KVCacheManager
    return cls(
        config,
        max_model_len=4096,
        enable_caching=True,
        hash_block_size=16,
        scheduler_block_size=16,
    )


def time_one(backend: str, num_blocks: int) -> tuple[float, float, float]:
    """(construct_ms, first_pass_ms, full_gc_ms) of one manager."""
    gc.collect()
    t0 = time.perf_counter()
    manager = build(backend, num_blocks)
    construct = time.perf_counter() - t0
    gc.collect()
    gc.freeze()
    try:
        pool = manager.block_pool
        t0 = time.perf_counter()
        while (free := pool.get_num_free_blocks()) > 0:
            pool.get_new_blocks(min(256, free))
        first_pass = time.perf_counter() - t0
        t0 = time.perf_counter()
        gc.collect()
        full_gc = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    del manager, pool
    return construct * 1e3, first_pass * 1e3, full_gc * 1e3


def bytes_per_block(backend: str, num_blocks: int) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        manager = build(backend, num_blocks)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del manager
    return (after - before) / num_blocks


def plot(out: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in (
        (axes[0], "construct_ms", "manager construction (ms, log)"),
        (axes[1], "first_pass_ms", "every block handed out once (ms)"),
        (axes[2], "full_gc_ms", "a full collection afterwards (ms)"),
    ):
        labels, meds, lo, hi = [], [], [], []
        for row in rows:
            m = row["metrics"][key]
            labels.append(f"{row['backend']}\nN={row['n']:,}")
            meds.append(m["median"])
            lo.append(m["median"] - m["p10"])
            hi.append(m["p90"] - m["median"])
        ax.bar(range(len(rows)), meds, yerr=[lo, hi], capsize=4)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        if key == "construct_ms":
            ax.set_yscale("log")
    fig.suptitle("KV-cache manager start-up, paged vs tagma (p10-p90 over runs)")
    fig.tight_layout()
    fig.savefig(out / "construct.png", dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build/results/bench_construct"))
    parser.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3, help="ABBA blocks")
    args = parser.parse_args()
    out = Path(args.out)
    for backend in BACKENDS:
        time_one(backend, 1024)  # imports and first-call costs, untimed
    rows = []
    for n in args.n:
        samples: dict[str, dict[str, list[float]]] = {
            b: {"construct_ms": [], "first_pass_ms": [], "full_gc_ms": []}
            for b in BACKENDS
        }
        order = (list(BACKENDS) + list(BACKENDS)[::-1]) * args.repeats
        for i, backend in enumerate(order):
            construct, first_pass, full_gc = time_one(backend, n)
            samples[backend]["construct_ms"].append(construct)
            samples[backend]["first_pass_ms"].append(first_pass)
            samples[backend]["full_gc_ms"].append(full_gc)
            print(
                f"[N={n:,} {i + 1}/{len(order)}] {backend:6s} construct "
                f"{construct:9.1f} ms  first pass {first_pass:8.1f} ms  "
                f"full gc {full_gc:6.1f} ms",
                flush=True,
            )
        for backend in BACKENDS:
            metrics = {k: metric(v, "ms") for k, v in samples[backend].items()}
            metrics["bytes_per_block"] = metric([bytes_per_block(backend, n)], "B")
            params = {"backend": backend, "n": n, "repeats": args.repeats}
            write_result(
                out, f"construct-{backend}-{n}", "construct", env_info(), params,
                metrics,
            )  # fmt: skip
            rows.append({"backend": backend, "n": n, "metrics": metrics})
    summary = {
        f"{r['backend']}-{r['n']}": {k: m["median"] for k, m in r["metrics"].items()}
        for r in rows
    }
    write_result(out, "summary", "construct", env_info(), {"rows": len(rows)}, summary)
    plot(out, rows)
    header = "backend | N | construct ms (p10-p90) | B/block | first pass ms"
    print(f"\n| {header} | full gc ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        m = r["metrics"]
        c = m["construct_ms"]
        print(
            f"| {r['backend']} | {r['n']:,} | {c['median']:.1f} "
            f"({c['p10']:.1f}-{c['p90']:.1f}) | "
            f"{m['bytes_per_block']['median']:.1f} | "
            f"{m['first_pass_ms']['median']:.1f} | "
            f"{m['full_gc_ms']['median']:.1f} |"
        )
    print(json.dumps({"out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
