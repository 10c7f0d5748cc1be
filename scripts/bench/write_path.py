# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Microbenchmark of the model runner V2 write path: paged vs tagma.

Per decode step the runner fills `input_block_tables` (read path) and
`slot_mappings` (write path). This times, under CUDA-graph replay, the
kernels of one step for:

    paged   gather + paged slot mapping (stock BlockTables)
    tagma   range expansion and slot mapping in one kernel (TagmaBlockTables)

and the parts alone: paged_gather, paged_slots, and tagma_slots (a slot
mapping with no gather before it, as a speculator's draft steps call it).
Decode batch 64/256/512 x context 4K/16K/128K, block size 16, one contiguous
range per request ("contig") or 8 ranges ("frag8").

Usage (GPU):  PYTHONPATH=<patched vllm site> \
                  python scripts/bench/write_path.py --out DIR
Smoke (CPU):  TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= \
                  python scripts/bench/write_path.py --smoke --out DIR
Plot only:    python scripts/bench/write_path.py --plot DIR/write_path.json

Writes DIR/write_path.json (schema tagma-bench/1: env, params, metrics
{name: {unit, samples, median, p10, p90}}) and a PNG drawn from the JSON.
"""

import argparse
import json
import os
import pathlib
import platform
import subprocess
import time
from collections.abc import Callable

import numpy as np
import torch

SCHEMA = "tagma-bench/1"
BENCH = "write_path"
VARIANTS = ["paged", "tagma"]
COMPONENTS = ["paged_gather", "paged_slots", "tagma_slots"]


def _import_tagma():
    """The tagma write-path module of the patched vllm on PYTHONPATH."""
    import vllm.v1.worker.gpu.tagma_block_table as mod

    return mod


class _CpuUvaBuffer:
    """Smoke mode only: UvaBuffer without pinned memory (CPU tensors)."""

    def __init__(self, size, dtype):
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.uva = self.cpu


def _layout(num_blocks: int, num_ranges: int, base: int, rng) -> list[int]:
    """Block ids of one request: num_ranges runs with gaps, shuffled."""
    cuts = np.linspace(0, num_blocks, num_ranges + 1).astype(np.int64)
    runs = []
    cursor = base
    for n in np.diff(cuts):
        runs.append(np.arange(cursor, cursor + n))
        cursor += int(n) + 1  # gap of one block: runs never merge
    order = rng.permutation(len(runs)) if num_ranges > 1 else [0]
    return np.concatenate([runs[i] for i in order]).tolist()


def _build(cfg: dict, device: torch.device, tagma_mod, BlockTables):
    batch, ctx, bs = cfg["batch"], cfg["ctx"], cfg["block_size"]
    num_blocks = -(-ctx // bs)
    # Same rounding as the runner (align to 128 // block_size).
    max_blocks = -(-num_blocks // (128 // bs)) * (128 // bs)
    kw = dict(
        block_sizes=[bs],
        max_num_reqs=batch,
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_num_blocks_per_group=[max_blocks],
        device=device,
        kernel_block_sizes=[bs],
    )
    tables = {"paged": BlockTables(**kw), "tagma": tagma_mod.TagmaBlockTables(**kw)}
    rng = np.random.default_rng(0)
    for req in range(batch):
        ids = _layout(num_blocks, cfg["ranges"], 1 + req * (num_blocks + 16), rng)
        for t in tables.values():
            t.append_block_ids(req, (ids,), overwrite=True)
    for t in tables.values():
        t.apply_staged_writes()

    # Decode step: one token per request at the last position of its context.
    idx_mapping = torch.arange(batch, dtype=torch.int32, device=device)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
    positions = torch.zeros(cfg["max_num_batched_tokens"], dtype=torch.int64)
    positions[:batch] = ctx - 1
    positions = positions.to(device)
    return tables, idx_mapping, qsl, positions


def _steps(tables, idx_mapping, qsl, positions) -> dict[str, Callable[[], None]]:
    batch = idx_mapping.shape[0]

    def step(t, gather=True, slots=True):
        def fn():
            if gather:
                t.gather_block_tables(idx_mapping, batch)
            if slots:
                t.compute_slot_mappings(idx_mapping, qsl, positions, batch)

        return fn

    p, t = tables["paged"], tables["tagma"]
    # No tagma gather alone: it only records the batch, and the
    # compute_slot_mappings() that follows fills the block table.
    return {
        "paged": step(p),
        "tagma": step(t),
        "paged_gather": step(p, slots=False),
        "paged_slots": step(p, gather=False),
        "tagma_slots": step(t, gather=False),
    }


def _check(tables, idx_mapping, qsl, positions) -> None:
    """Tagma must agree with paged before anything is timed."""
    batch = idx_mapping.shape[0]
    out = {}
    for name in VARIANTS:
        t = tables[name]
        # Read the block table after both calls: tagma expands the ranges in
        # compute_slot_mappings().
        bt = t.gather_block_tables(idx_mapping, batch)[0]
        sm = t.compute_slot_mappings(idx_mapping, qsl, positions, batch).clone()
        # The slot mapping alone (the tagma_slots step): another kernel.
        alone = t.compute_slot_mappings(idx_mapping, qsl, positions, batch).clone()
        out[name] = (bt.clone(), sm, alone)
    for what, p, t in zip(
        ("block table", "slot mapping", "slot mapping alone"),
        out["paged"],
        out["tagma"],
        strict=True,
    ):
        assert torch.equal(t, p), f"tagma: {what} differs from paged"


def _time_cuda(fn, replays: int, repeats: int) -> list[float]:
    """us per step: capture one step in a graph, replay, time with events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # compile + warm up outside the graph
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / replays)
    return samples


def _time_cpu(fn, replays: int, repeats: int) -> list[float]:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(replays):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / replays)
    return samples


def _stats(samples: list[float], unit: str) -> dict:
    a = np.asarray(samples)
    return {
        "unit": unit,
        "samples": [round(float(x), 4) for x in a],
        "median": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
    }


def _key(name: str, cfg: dict) -> str:
    return (
        f"{name}|batch={cfg['batch']}|ctx={cfg['ctx']}|layout="
        f"{'contig' if cfg['ranges'] == 1 else 'frag' + str(cfg['ranges'])}"
    )


def _env(device: torch.device) -> dict:
    import triton

    try:
        git = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except Exception:
        git = ""
    try:
        import vllm

        upstream = getattr(vllm, "__version__", "unknown")
    except Exception:
        upstream = "unknown"
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    return {
        "gpu": gpu,
        "driver": torch.version.cuda if device.type == "cuda" else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "git": git or None,
        "upstream": upstream,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }


def run(args) -> dict:
    if args.smoke:
        import vllm.v1.worker.gpu.buffer_utils as buffer_utils

        buffer_utils.UvaBuffer = _CpuUvaBuffer
        device = torch.device("cpu")
        batches, ctxs, range_counts = [2, 4], [64, 256], [1, 8]
        replays, repeats, timer = 2, 3, _time_cpu
    else:
        device = torch.device("cuda")
        batches, ctxs, range_counts = args.batches, args.ctxs, args.ranges
        replays, repeats, timer = args.replays, args.repeats, _time_cuda

    tagma_mod = _import_tagma()
    from vllm.v1.worker.gpu.block_table import BlockTables

    params = {
        "block_size": 16,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "batches": batches,
        "ctxs": ctxs,
        "ranges": range_counts,
        "replays": replays,
        "repeats": repeats,
        "smoke": args.smoke,
        "step": "decode, 1 token per request at position ctx-1",
    }
    metrics: dict[str, dict] = {}
    for ranges in range_counts:
        for batch in batches:
            for ctx in ctxs:
                cfg = dict(
                    batch=batch,
                    ctx=ctx,
                    ranges=ranges,
                    block_size=16,
                    max_num_batched_tokens=args.max_num_batched_tokens,
                )
                tables, idx, qsl, pos = _build(cfg, device, tagma_mod, BlockTables)
                _check(tables, idx, qsl, pos)
                for name, fn in _steps(tables, idx, qsl, pos).items():
                    samples = timer(fn, replays, repeats)
                    metrics[_key(name, cfg)] = _stats(samples, "us/step")
                line = "  ".join(
                    f"{n}={metrics[_key(n, cfg)]['median']:.2f}"
                    for n in VARIANTS + COMPONENTS
                )
                print(f"batch={batch} ctx={ctx} ranges={ranges}: {line}", flush=True)
                del tables
    return {
        "schema": SCHEMA,
        "bench": BENCH,
        "env": _env(device),
        "params": params,
        "metrics": metrics,
    }


def print_ratios(result: dict) -> None:
    m = result["metrics"]
    print("\nmedian us/step (ratio to paged gather+slots; slots: alone, to paged's)")
    print(
        f"{'layout':7} {'batch':>5} {'ctx':>7} {'paged':>7} {'tagma':>18} "
        f"{'paged slots':>11} {'tagma slots':>18}"
    )
    for key in m:
        name, *rest = key.split("|")
        if name != "paged":
            continue
        suffix = "|".join(rest)
        cfg = dict(kv.split("=") for kv in rest)
        paged = m[key]["median"]
        tagma = m[f"tagma|{suffix}"]["median"]
        ps = m[f"paged_slots|{suffix}"]["median"]
        ts = m[f"tagma_slots|{suffix}"]["median"]
        print(
            f"{cfg['layout']:7} {cfg['batch']:>5} {cfg['ctx']:>7} {paged:7.2f} "
            f"{tagma:8.2f} ({tagma / paged:4.2f}x) {ps:11.2f} "
            f"{ts:8.2f} ({ts / ps:4.2f}x)"
        )


def _ctx_label(c: str) -> str:
    ctx = int(c.split("=")[1])
    return f"{ctx // 1024}K" if ctx >= 1024 else str(ctx)


def plot(result: dict, png: pathlib.Path) -> None:
    """Draw medians with p10-p90 bars from the JSON result only."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no PNG (run --plot on the JSON later)")
        return
    m = result["metrics"]
    layouts = sorted({k.split("layout=")[1] for k in m})
    configs = []
    for k in m:
        if k.startswith("paged|"):
            _, b, c, _ = k.split("|")
            if (b, c) not in configs:
                configs.append((b, c))
    fig, axes = plt.subplots(
        1, len(layouts), figsize=(7 * len(layouts), 4.5), squeeze=False
    )
    width = 0.8 / len(VARIANTS)
    for ax, layout in zip(axes[0], layouts, strict=False):
        x = np.arange(len(configs))
        for i, v in enumerate(VARIANTS):
            stats = [m[f"{v}|{b}|{c}|layout={layout}"] for b, c in configs]
            med = np.array([s["median"] for s in stats])
            err = np.array(
                [
                    [s["median"] - s["p10"] for s in stats],
                    [s["p90"] - s["median"] for s in stats],
                ]
            )
            offset = (i - (len(VARIANTS) - 1) / 2) * width
            ax.bar(x + offset, med, width, yerr=err, capsize=2, label=v)
        ax.set_xticks(x)
        ax.set_xticklabels(
            [f"{b.split('=')[1]}\n{_ctx_label(c)}" for b, c in configs],
            fontsize=8,
        )
        ax.set_xlabel("decode batch / context")
        ax.set_ylabel("us per step (median, p10-p90)")
        ax.set_title(f"write path per step, layout={layout} ({result['env']['gpu']})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("."))
    p.add_argument("--smoke", action="store_true", help="tiny CPU run (interpreter)")
    p.add_argument("--plot", type=pathlib.Path, help="only draw the PNG of a JSON")
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256, 512])
    p.add_argument("--ctxs", type=int, nargs="+", default=[4096, 16384, 131072])
    p.add_argument("--ranges", type=int, nargs="+", default=[1, 8])
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    args = p.parse_args()

    if args.plot is not None:
        result = json.loads(args.plot.read_text())
        print_ratios(result)
        plot(result, args.plot.with_suffix(".png"))
        return
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("--smoke needs TRITON_INTERPRET=1 (CPU tensors)")

    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{BENCH}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    print_ratios(result)
    plot(result, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
