# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Scheduler-thread timing for the serve benchmark (no upstream hunk).

Put this folder first on PYTHONPATH and set TAGMA_SCHED_TRACE=DIR: every
Python process starts by importing this module, and the engine-core process,
when it imports vLLM's scheduler, gets Scheduler.schedule,
Scheduler.update_from_output and the KV-cache manager's entry points wrapped
with perf_counter_ns. Each process appends to DIR/sched-<pid>.tsv:

  S  wall_ns  schedule_ns  update_ns  kv_ns  running  waiting  gc_ns
     kv_top  kv_top_ns                                         (one a step)
  R  wall_ns  requests  runs_mean  runs_max  ranges_mean  ranges_max
  C  wall_ns  admitted  hit_tokens  prefill_tokens  decodes   (one a step)

R rows sample, every RUNS_EVERY steps, the contiguous runs of block ids that
each running request holds (any backend) and, for tagma, the manager's own
range count. kv_ns is the time inside the manager, nested calls counted once;
it is part of schedule_ns/update_ns, not added to them. gc_ns is the time
the process spent in garbage collection since the previous step, and kv_top
the manager entry point that took the most of kv_ns (kv_top_ns): what a slow
step spent its time on. Without TAGMA_SCHED_TRACE this module only chains to
any other sitecustomize.

C rows say what each step asked of the GPU, from the SchedulerOutput that
schedule() returned: requests admitted, the prefix-cache hits they started
with (tokens), prefill tokens (requests with more than one token scheduled)
and decode requests. The k-th C row and the k-th S row are the same step;
the time between consecutive S rows is what a decoding request waited for
its next token.
"""

from __future__ import annotations

import atexit
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from typing import Any

TARGET = "vllm.v1.core.sched.scheduler"
KV_METHODS = (
    "get_computed_blocks",
    "allocate_slots",
    "free",
    "get_blocks",
    "get_block_ids",
    "take_events",
    "cache_blocks",
    "evict_blocks",
)
RUNS_EVERY = 64
FLUSH_EVERY = 64


class _Trace:
    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"sched-{os.getpid()}.tsv")
        self.out = open(path, "a")  # noqa: SIM115 (lives as long as the process)
        atexit.register(self.out.flush)
        self.sched_ns = self.kv_ns = self.depth = self.steps = 0
        self.gc_ns = self.gc_t0 = 0
        self.kv_by_name: dict[str, int] = {}
        gc.callbacks.append(self.on_gc)

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.gc_t0 = time.perf_counter_ns()
        elif self.gc_t0:
            self.gc_ns += time.perf_counter_ns() - self.gc_t0
            self.gc_t0 = 0

    def composition(self, out: Any) -> None:
        new = getattr(out, "scheduled_new_reqs", ())
        counts = getattr(out, "num_scheduled_tokens", {})
        self.out.write(
            f"C\t{time.time_ns()}\t{len(new)}\t"
            f"{sum(r.num_computed_tokens for r in new)}\t"
            f"{sum(n for n in counts.values() if n > 1)}\t"
            f"{sum(1 for n in counts.values() if n == 1)}\n"
        )

    def step(self, sched: Any, update_ns: int) -> None:
        self.steps += 1
        top, top_ns = max(
            self.kv_by_name.items(), key=lambda kv: kv[1], default=("-", 0)
        )
        self.out.write(
            f"S\t{time.time_ns()}\t{self.sched_ns}\t{update_ns}\t{self.kv_ns}\t"
            f"{len(sched.running)}\t{len(sched.waiting)}\t{self.gc_ns}\t"
            f"{top}\t{top_ns}\n"
        )
        self.sched_ns = self.kv_ns = self.gc_ns = 0
        self.kv_by_name.clear()
        if self.steps % RUNS_EVERY == 0:
            self.sample_runs(sched)
        if self.steps % FLUSH_EVERY == 0:
            self.out.flush()

    def sample_runs(self, sched: Any) -> None:
        manager = sched.kv_cache_manager
        groups = manager.coordinator.single_type_managers
        runs = []
        for req in sched.running:
            ids = [b.block_id for b in groups[0].req_to_blocks.get(req.request_id, ())]
            ids = [i for i in ids if i != 0]  # the null block pads skipped slots
            if ids:
                runs.append(
                    1 + sum(1 for a, b in zip(ids, ids[1:], strict=False) if b != a + 1)
                )
        if not runs:
            return
        count = getattr(manager, "get_num_ranges", None)  # tagma's own count
        ranges = [count(r.request_id) for r in sched.running] if count else []
        self.out.write(
            f"R\t{time.time_ns()}\t{len(runs)}\t{sum(runs) / len(runs):.3f}\t"
            f"{max(runs)}\t"
            + (
                f"{sum(ranges) / len(ranges):.3f}\t{max(ranges)}\n"
                if ranges
                else "-\t-\n"
            )
        )


def _timed_kv(trace: _Trace, name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if trace.depth:
            return fn(*args, **kwargs)
        trace.depth = 1
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            ns = time.perf_counter_ns() - t0
            trace.kv_ns += ns
            trace.kv_by_name[name] = trace.kv_by_name.get(name, 0) + ns
            trace.depth = 0

    return wrapper


def _instrument(cls: Any, folder: str) -> None:
    init, schedule, update = cls.__init__, cls.schedule, cls.update_from_output
    trace: _Trace | None = None

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal trace
        init(self, *args, **kwargs)
        trace = _Trace(folder)
        for name in KV_METHODS:
            fn = getattr(self.kv_cache_manager, name, None)
            if fn is not None:
                setattr(self.kv_cache_manager, name, _timed_kv(trace, name, fn))

    def timed_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = schedule(self, *args, **kwargs)
        if trace is not None:
            trace.sched_ns += time.perf_counter_ns() - t0
            trace.composition(out)
        return out

    def timed_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = update(self, *args, **kwargs)
        if trace is not None:
            trace.step(self, time.perf_counter_ns() - t0)
        return out

    cls.__init__ = __init__
    cls.schedule = timed_schedule
    cls.update_from_output = timed_update


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, folder = spec.loader, self.folder
        exec_module = loader.exec_module

        def exec_and_instrument(module: Any) -> None:
            exec_module(module)
            _instrument(module.Scheduler, folder)

        loader.exec_module = exec_and_instrument  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the sitecustomize this one shadows, if the image has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("TAGMA_SCHED_TRACE"):
    sys.meta_path.insert(0, _Finder(os.environ["TAGMA_SCHED_TRACE"]))
_chain()
