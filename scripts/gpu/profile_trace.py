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

With the serve harness's scheduler trace beside it (sched-<pid>.tsv, whose C
rows say what each step asked of the GPU), `by_prefill` also sorts the steps
by the prefill tokens they carried and splits each step's GPU time into
attention, GEMMs, the KV write, the write path and the rest: what an
admission step costs on the GPU under each backend. A step is matched to its
C row through the CPU time its slot-mapping kernel was launched (the trace's
runtime event with the same correlation id, on the Unix clock through
baseTimeNanoseconds): the last C row written before that launch.
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import trace_files, trace_lines  # noqa: E402

MATERIALIZE = ("_gather_block_tables_kernel", "_expand_ranges_kernel")
SLOT = ("_compute_slot_mappings_kernel", "_compute_slot_mappings_tagma_kernel")
FUSED = ("_tagma_prepare_kernel",)


def _kind(name: str) -> str | None:
    for kind, names in (("fused", FUSED), ("slot", SLOT), ("materialize", MATERIALIZE)):
        if any(n in name for n in names):
            return kind
    return None


def _read(path: Path) -> dict | list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _kernels(events: list[dict]) -> list[dict]:
    return [
        e
        for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
    ]


def load_with_launches(path: Path) -> tuple[list[dict], dict[int, int]]:
    """The kernels, and each runtime launch's CPU time (Unix ns) by correlation
    id; no launch times when the trace has no baseTimeNanoseconds."""
    trace = _read(path)
    if not isinstance(trace, dict):
        return _kernels(trace), {}
    events = trace["traceEvents"]
    base = trace.get("baseTimeNanoseconds")
    launches: dict[int, int] = {}
    if base is not None:
        for e in events:
            corr = (e.get("args") or {}).get("correlation")
            # Triton kernels launch through the driver API, CUDA C++ ones
            # through the runtime.
            cat = str(e.get("cat", "")).lower()
            if corr is not None and cat in ("cuda_runtime", "cuda_driver"):
                launches[int(corr)] = int(base) + int(float(e["ts"]) * 1000)
    return _kernels(events), launches


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _marks(kernels: list[dict]) -> list[int]:
    """Where each step starts in time-sorted kernels: its slot-mapping launch."""
    return [i for i, e in enumerate(kernels) if _kind(e["name"]) in ("slot", "fused")]


def summarize(kernels: list[dict]) -> dict:
    kernels = sorted(kernels, key=lambda e: float(e["ts"]))
    marks = _marks(kernels)
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


# GPU time of a step by what the kernel does. The KV write
# (reshape_and_cache_flash) is named like attention, so it is matched first.
PARTS = (
    ("kv_write", ("reshape_and_cache",)),
    ("attention", ("flash", "attn", "attention", "fmha")),
    ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "matmul", "sm90_")),
)
# Prefill tokens a step carried (scheduler trace C rows), in buckets.
PREFILL_BUCKETS = {
    "0": (0, 0),
    "1-511": (1, 511),
    "512-1023": (512, 1023),
    "1024+": (1024, 1 << 40),
}
# Per step, what profile.json keeps (the trace stays on the GPU host).
STEP_FIELDS = (
    *("prefill", "decodes", "busy_us", "attention_us", "gemm_us"),
    *("kv_write_us", "write_path_us", "other_us", "period_us"),
)
# A launch more than this after the last C row is not matched to a step.
MATCH_NS = 1_000_000_000


def _part(name: str) -> str:
    if _kind(name) is not None:
        return "write_path"
    low = name.lower()
    for part, keys in PARTS:
        if any(k in low for k in keys):
            return part
    return "other"


def compositions(sched_dir: Path) -> list[tuple[int, int, int, int]]:
    """The scheduler trace's C rows under sched_dir: (wall ns, admitted,
    prefill tokens, decodes), in time order."""
    rows = []
    for tsv in trace_files(sched_dir):
        for line in trace_lines(tsv):
            f = line.split("\t")
            if f[0] == "C" and len(f) >= 6:
                rows.append((int(f[1]), int(f[2]), int(f[4]), int(f[5])))
    return sorted(rows)


def by_prefill(
    kernels: list[dict],
    launches: dict[int, int],
    comps: list[tuple[int, int, int, int]],
) -> dict:
    """Each profiled step matched to the scheduler's C row of that step, and
    its GPU time by part, summarized per bucket of prefill tokens."""
    kernels = sorted(kernels, key=lambda e: float(e["ts"]))
    marks = _marks(kernels)
    # Paged's block-table gather runs just before its step's mark: it starts
    # that step's kernels, so a step's write path is its own.
    starts = [
        i - 1 if i > 0 and _kind(kernels[i - 1]["name"]) == "materialize" else i
        for i in marks
    ]
    walls = [c[0] for c in comps]
    steps, unmatched = [], 0
    for n, (a, b) in enumerate(zip(marks, marks[1:], strict=False)):
        corr = (kernels[a].get("args") or {}).get("correlation")
        launch = launches.get(int(corr)) if corr is not None else None
        if launch is None:
            unmatched += 1
            continue
        k = bisect.bisect_right(walls, launch) - 1
        if k < 0 or launch - walls[k] > MATCH_NS:
            unmatched += 1
            continue
        parts = dict.fromkeys(
            ("write_path", "kv_write", "attention", "gemm", "other"), 0.0
        )
        for e in kernels[starts[n] : starts[n + 1]]:
            parts[_part(e["name"])] += float(e["dur"])
        _, admitted, prefill, decodes = comps[k]
        steps.append(
            {
                "prefill": prefill,
                "admitted": admitted,
                "decodes": decodes,
                "period_us": float(kernels[b]["ts"]) - float(kernels[a]["ts"]),
                "busy_us": sum(parts.values()),
                **{f"{p}_us": v for p, v in parts.items()},
            }
        )
    buckets: dict[str, dict] = {}
    for label, (lo, hi) in PREFILL_BUCKETS.items():
        sel = [s for s in steps if lo <= s["prefill"] <= hi]
        if not sel:
            continue
        row: dict = {"steps": len(sel)}
        for key in ("prefill", "decodes"):
            row[f"{key}_mean"] = round(statistics.fmean(s[key] for s in sel), 1)
        for key in (
            "period_us",
            "busy_us",
            "write_path_us",
            "kv_write_us",
            "attention_us",
            "gemm_us",
            "other_us",
        ):
            row[key] = round(statistics.median(s[key] for s in sel), 1)
        buckets[label] = row
    return {
        "matched": len(steps),
        "unmatched": unmatched,
        "buckets": buckets,
        "step_fields": list(STEP_FIELDS),
        "steps": [[round(s[f], 1) for f in STEP_FIELDS] for s in steps],
    }


def summarize_dir(
    folder: Path, wait_s: float = 0.0, sched_dir: Path | None = None
) -> dict:
    """Summarize the newest trace under folder, waiting for it to be written;
    with sched_dir (the scheduler trace of the same server), also by_prefill."""
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
        kernels, launches = load_with_launches(files[-1])
        out = summarize(kernels)
        comps = compositions(sched_dir) if sched_dir is not None else []
        if comps and out.get("steps"):
            out["by_prefill"] = by_prefill(kernels, launches, comps)
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
