# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Shared by the project's benchmarks: the result schema, stats and plots.

Every benchmark writes one JSON per run with the keys `schema`, `bench`,
`git`, `upstream`, `env`, `params` and `metrics: {name: {unit, samples,
median, p10, p90}}`, plus a `summary.json`; plots are drawn from the JSON
only, with the spread shown.
"""

from __future__ import annotations

import importlib
import json
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = 1


def metric(samples: list[float], unit: str) -> dict[str, Any]:
    """A metric entry: the samples and their median, p10 and p90."""
    ordered = sorted(samples)

    def pct(q: float) -> float:
        if not ordered:
            return float("nan")
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {
        "unit": unit,
        "samples": samples,
        "median": statistics.median(ordered) if ordered else float("nan"),
        "p10": pct(0.10),
        "p90": pct(0.90),
    }


def provenance() -> dict[str, Any]:
    """git commit of the project and the pinned upstream."""
    git = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    # build-fork installs the tree with the pin's version (as write_path.py
    # reads it too).
    try:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
    except ImportError:
        version = "unknown"
    return {"git": git, "upstream": f"vllm {version}"}


def env_info(**extra: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
    }
    info.update(extra)
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_result(
    out_dir: Path, name: str, bench: str, env: dict, params: dict, metrics: dict
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    doc = {
        "schema": SCHEMA,
        "bench": bench,
        **provenance(),
        "env": env,
        "params": params,
        "metrics": metrics,
    }
    path.write_text(json.dumps(doc, indent=1))
    return path


def mirrored_order(variants: list[str], repeats: int) -> list[str]:
    """The runs of an in-process A/B bench: v1..vk vk..v1 per repeat (a
    linear drift cancels), rotated by one variant each repeat. The mirror
    runs one variant twice back to back, and the second of two runs in one
    process can be the slower (heap state); the rotation gives that place,
    and the repeat boundary, to each variant in turn, so with `repeats` a
    multiple of k no variant carries it more than another."""
    order = []
    for rep in range(repeats):
        r = rep % len(variants)
        block = variants[r:] + variants[:r]
        order += block + block[::-1]
    return order


def variant_class(variant: str, named: dict[str, str]) -> type:
    """A bench variant's class: `named[variant]` ("module:Class"), or any
    class given as `module.Class` importable from PYTHONPATH (e.g. a module
    of an older stack, for a before/after in one process)."""
    if variant in named:
        module, _, name = named[variant].partition(":")
    else:
        module, _, name = variant.rpartition(".")
        if not module:
            choices = ", ".join(named)
            raise SystemExit(f"unknown variant {variant!r}: {choices} or module.Class")
    return getattr(importlib.import_module(module), name)
