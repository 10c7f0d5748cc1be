# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The write path's host side per decode step, paged vs tagma block tables.

    build/vllm-<v>/venv/bin/python scripts/bench/write_path_host.py [--out DIR]

Model runner V2 hands each request's new block ids to its block tables
(`append_block_ids`), then stages them for the device (`apply_staged_writes`)
before the step's kernels run: host work in the engine thread, inside the
runner's `execute_model`. This times those two for N running requests of
which N/16 get one new block a step (a decode step at block size 16), each
request's blocks contiguous (tagma's placement; paged's cost does not depend
on the ids), on CPU: the device buffers are CPU tensors and the staged
write's own upload (`StagedWriteTensor.apply_write`, the same for both) is
replaced by clearing its lists, so only what differs between the classes is
timed.

Variants: `paged` (upstream's BlockTables), `tagma` (TagmaBlockTables), or a
BlockTables subclass as `module.Class` on PYTHONPATH (e.g. the tagma module
of an older stack, for a before/after). Order v1..vk vk..v1 per repeat,
rotated each repeat (common.mirrored_order); per run the median step, then
the median and p10-p90 over runs. One process, no GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

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
PROMPT_BLOCKS = 8


class _CpuUvaBuffer:
    """UvaBuffer on CPU: the "device view" is the host tensor."""

    def __init__(self, size: Any, dtype: Any) -> None:
        import torch

        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.uva = self.cpu


def _clear_staged(self: Any) -> None:
    """StagedWriteTensor.apply_write without its upload and kernel."""
    self._staged_write_indices.clear()
    self._staged_write_starts.clear()
    self._staged_write_contents.clear()
    self._staged_write_cu_lens.clear()


def use_cpu_buffers() -> None:
    """Point vLLM's staged buffers at CPU tensors and leave their upload out
    (the same for both classes)."""
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils

    buffer_utils.UvaBuffer = _CpuUvaBuffer  # type: ignore[misc,assignment]
    buffer_utils.StagedWriteTensor.apply_write = _clear_staged  # type: ignore[method-assign]


def tables_cls(variant: str) -> type:
    return variant_class(
        variant,
        {
            "paged": "vllm.v1.worker.gpu.block_table:BlockTables",
            "tagma": "vllm.v1.worker.gpu.tagma_block_table:TagmaBlockTables",
        },
    )


def one_run(cls: type, n: int, steps: int) -> tuple[list[float], Any]:
    """µs per decode step (appends + staging) over `steps` steps, and the
    block tables they left."""
    import torch

    # A row's most blocks; each request's blocks are one run of that many
    # ids, room to grow behind its prompt.
    row_blocks = PROMPT_BLOCKS + steps // BLOCK_SIZE + 2
    tables = cls(
        block_sizes=[BLOCK_SIZE],
        max_num_reqs=n,
        max_num_batched_tokens=n,
        max_num_blocks_per_group=[row_blocks],
        device=torch.device("cpu"),
        kernel_block_sizes=[BLOCK_SIZE],
    )
    last = []
    for row in range(n):
        first = 1 + row * row_blocks
        tables.append_block_ids(
            row, ([*range(first, first + PROMPT_BLOCKS)],), overwrite=True
        )
        last.append(first + PROMPT_BLOCKS - 1)
    tables.apply_staged_writes()
    per_step = max(1, n // BLOCK_SIZE)
    clock = time.perf_counter_ns
    times = []
    gc.collect()
    gc.disable()
    try:
        for step in range(steps):
            first_row = (step * per_step) % n
            t0 = clock()
            for row in range(first_row, first_row + per_step):
                last[row] += 1
                tables.append_block_ids(row, ([last[row]],), overwrite=False)
            tables.apply_staged_writes()
            times.append((clock() - t0) / 1e3)
    finally:
        gc.enable()
    return times, tables


def plot(out: Path, variants: list[str], summary: dict, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    rows = [summary[v] for v in variants]
    meds = [r["median"] for r in rows]
    err = [
        [r["median"] - r["p10"] for r in rows],
        [r["p90"] - r["median"] for r in rows],
    ]
    ax.bar(range(len(variants)), meds, yerr=err, capsize=4)
    ax.set_xticks(range(len(variants)), variants, fontsize=8)
    ax.set_ylabel("µs per decode step (p10-p90 over runs)")
    ax.set_title(
        f"block-table host work: {params['n']} running, "
        f"{max(1, params['n'] // BLOCK_SIZE)} new blocks a step",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out / "write_path_host.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default=str(ROOT / "build/results/bench_write_path_host")
    )
    parser.add_argument("--variants", default="paged,tagma")
    parser.add_argument("--n", type=int, default=1024, help="running requests")
    parser.add_argument("--steps", type=int, default=320, help="decode steps a run")
    parser.add_argument("--repeats", type=int, default=4, help="mirrored blocks")
    args = parser.parse_args()

    use_cpu_buffers()
    variants = args.variants.split(",")
    classes = {v: tables_cls(v) for v in variants}
    for v in variants:
        one_run(classes[v], 64, 32)  # imports and first calls, untimed
    per_run: dict[str, list[float]] = {v: [] for v in variants}
    order = mirrored_order(variants, args.repeats)
    for i, v in enumerate(order, 1):
        times, _ = one_run(classes[v], args.n, args.steps)
        per_run[v].append(statistics.median(times))
        print(f"[{i}/{len(order)}] {v:<12} {per_run[v][-1]:.1f} µs a step", flush=True)
    out = Path(args.out)
    env = env_info()
    params = {"n": args.n, "steps": args.steps, "repeats": args.repeats}
    summary = {}
    for v in variants:
        m = metric(per_run[v], "us")
        write_result(
            out, f"write-host-{v}", "write_path_host", env, params, {"step": m}
        )
        summary[v] = {x: m[x] for x in ("median", "p10", "p90")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(out, variants, summary, params)
    base = variants[0]
    print(f"\n| variant | µs a step (p10-p90) | ratio to {base} |\n|---|---|---|")
    for v in variants:
        s = summary[v]
        print(
            f"| {v} | {s['median']:.1f} ({s['p10']:.1f}-{s['p90']:.1f}) | "
            f"{s['median'] / summary[base]['median']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
