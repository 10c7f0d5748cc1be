# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The write path's share of a decode step, from a torch.profiler trace.

vLLM's worker writes a Chrome trace (JSON, often gzipped) when the profiler
window ends. Each engine step launches exactly one slot-mapping kernel
(paged: _compute_slot_mappings_kernel after _gather_block_tables_kernel;
tagma: _tagma_prepare_kernel, which expands the ranges into the block table
and writes the slot mapping in one launch, or its two-kernel variants), so
consecutive slot-mapping launches delimit steps on the GPU timeline.
Per step: the step period (launch to launch), the GPU time of the
block-table materialization and of slot mapping, and the share of the period.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from pathlib import Path

MATERIALIZE = ("_gather_block_tables_kernel", "_expand_ranges_kernel")
SLOT = ("_compute_slot_mappings_kernel", "_compute_slot_mappings_tagma_kernel")
FUSED = ("_tagma_prepare_kernel",)


def _kind(name: str) -> str | None:
    for kind, names in (("fused", FUSED), ("slot", SLOT), ("materialize", MATERIALIZE)):
        if any(n in name for n in names):
            return kind
    return None


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [
        e
        for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
    ]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(kernels: list[dict]) -> dict:
    kernels = sorted(kernels, key=lambda e: float(e["ts"]))
    marks = [i for i, e in enumerate(kernels) if _kind(e["name"]) in ("slot", "fused")]
    steps = []
    for a, b in zip(marks, marks[1:], strict=False):
        # A step runs from one slot-mapping launch to the next; its
        # materialization kernel, if separate, runs just before the mark.
        window = kernels[a:b]
        period = float(kernels[b]["ts"]) - float(kernels[a]["ts"])
        write = {"materialize": 0.0, "slot": 0.0, "fused": 0.0}
        for e in window:
            if (k := _kind(e["name"])) is not None:
                write[k] += float(e["dur"])
        busy = sum(float(e["dur"]) for e in window)
        steps.append((period, write, busy))
    if not steps:
        return {"steps": 0, "error": "no slot-mapping kernels in the trace"}
    periods = [s[0] for s in steps]
    total = [s[1]["materialize"] + s[1]["slot"] + s[1]["fused"] for s in steps]
    per_kernel: dict[str, float] = {}
    for e in kernels:
        per_kernel[e["name"]] = per_kernel.get(e["name"], 0.0) + float(e["dur"])
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:8]
    return {
        "steps": len(steps),
        "step_period_us": _median(periods),
        "gpu_busy_us": _median([s[2] for s in steps]),
        "materialize_us": _median([s[1]["materialize"] for s in steps]),
        "slot_mapping_us": _median([s[1]["slot"] for s in steps]),
        "fused_us": _median([s[1]["fused"] for s in steps]),
        "write_path_us": _median(total),
        "write_path_share": _median(
            [t / p for t, p in zip(total, periods, strict=True) if p > 0]
        ),
        "kernel_names": sorted({e["name"] for e in kernels if _kind(e["name"])}),
        "top_kernels_us": [[n[:80], round(t, 1)] for n, t in top],
    }


def summarize_dir(folder: Path, wait_s: float = 0.0) -> dict:
    """Summarize the newest trace under folder, waiting for it to be written."""
    deadline = time.monotonic() + wait_s
    last_size = -1
    while True:
        files = sorted(
            (p for p in folder.rglob("*") if p.is_file() and ".json" in p.name),
            key=lambda p: p.stat().st_mtime,
        )
        if files:
            size = files[-1].stat().st_size
            if size == last_size:
                break
            last_size = size
        if time.monotonic() > deadline:
            if not files:
                return {"steps": 0, "error": f"no trace written under {folder}"}
            break
        time.sleep(2)
    try:
        out = summarize(load(files[-1]))
    except (OSError, ValueError, KeyError, EOFError) as e:
        return {"steps": 0, "error": f"{files[-1].name}: {e}"}
    out["trace"] = files[-1].name
    return out


def brief(p: dict | None) -> str:
    if not p or not p.get("steps"):
        return (p or {}).get("error", "none")
    return (
        f"{p['steps']} steps, period {p['step_period_us']:.0f} us, write path "
        f"{p['write_path_us']:.1f} us ({100 * p['write_path_share']:.3f} %)"
    )
