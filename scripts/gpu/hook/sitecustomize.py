# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Scheduler-thread timing for the serve benchmark (no upstream hunk).

Put this folder first on PYTHONPATH and set TAGMA_SCHED_TRACE=DIR: every
Python process starts by importing this module, and the engine-core process,
when it imports vLLM's scheduler, gets Scheduler.schedule,
Scheduler.update_from_output and the KV-cache manager's entry points wrapped
with perf_counter_ns; so do the in-process executor's calls into the model
runner (vllm.v1.executor.uniproc_executor, the one-GPU default). Each
process appends to DIR/sched-<pid>.tsv:

  S  wall_ns  schedule_ns  update_ns  kv_ns  running  waiting  gc_ns
     kv_top  kv_top_ns  exec_ns  sample_ns  wait_ns            (one a step)
  R  wall_ns  requests  runs_mean  runs_max  ranges_mean  ranges_max
  C  wall_ns  admitted  hit_tokens  prefill_tokens  decodes   (one a step)

R rows sample, every RUNS_EVERY steps, the contiguous runs of block ids that
each running request holds (any backend) and, for tagma, the manager's own
range count. kv_ns is the time inside the manager, nested calls counted once;
it is part of schedule_ns/update_ns, not added to them. gc_ns is the time
the process spent in garbage collection since the previous step, and kv_top
the manager entry point that took the most of kv_ns (kv_top_ns): what a slow
step spent its time on. exec_ns and sample_ns are the engine thread's time in
the runner's execute_model and sample_tokens (its host work: inputs, block
tables, launches; under async scheduling the GPU runs behind it), wait_ns its
time waiting for a step's sampled tokens (the GPU, when it is the bound),
all since the previous S row; what the interval between S rows leaves after
these and schedule/update is the engine loop's own work (new requests,
outputs to the front end). Without TAGMA_SCHED_TRACE this module only chains to
any other sitecustomize.

C rows say what each step asked of the GPU, from the SchedulerOutput that
schedule() returned: requests admitted, the prefix-cache hits they started
with (tokens), prefill tokens (requests with more than one token scheduled)
and decode requests. The k-th C row and the k-th S row are the same step;
the time between consecutive S rows is what a decoding request waited for
its next token.

TAGMA_BENCH_SHARED_SOCKET=1 (bench_serve.py --shared-socket) makes each API
server keep the listening socket it inherits, as vLLM as released does,
instead of the socket of its own that the series' listener patch gives it:
`own_listener` returns its argument. That patch's own effect is measured as
one set with it and one without, back to back.
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

SCHEDULER = "vllm.v1.core.sched.scheduler"
EXECUTOR = "vllm.v1.executor.uniproc_executor"
KV_METHODS = (
    "get_computed_blocks",
    "allocate_slots",
    "allocate_batched",
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
        self.exec_ns = self.sample_ns = self.wait_ns = 0
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
            f"{top}\t{top_ns}\t{self.exec_ns}\t{self.sample_ns}\t{self.wait_ns}\n"
        )
        self.sched_ns = self.kv_ns = self.gc_ns = 0
        self.exec_ns = self.sample_ns = self.wait_ns = 0
        self.kv_by_name.clear()
        if self.steps % RUNS_EVERY == 0:
            self.sample_runs(sched)
        # And once idle: a server that outlives the run (bench_serve.py
        # --resident) is read before it exits.
        if self.steps % FLUSH_EVERY == 0 or not (sched.running or sched.waiting):
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


# The process's trace, made when its Scheduler is built: processes without
# one (the front end, workers of other executors) write nothing.
_TRACE: _Trace | None = None


def _instrument_scheduler(module: Any, folder: str) -> None:
    cls = module.Scheduler
    init, schedule, update = cls.__init__, cls.schedule, cls.update_from_output

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        global _TRACE
        init(self, *args, **kwargs)
        trace = _TRACE = _Trace(folder)
        for name in KV_METHODS:
            fn = getattr(self.kv_cache_manager, name, None)
            if fn is not None:
                setattr(self.kv_cache_manager, name, _timed_kv(trace, name, fn))

    def timed_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = schedule(self, *args, **kwargs)
        if _TRACE is not None:
            _TRACE.sched_ns += time.perf_counter_ns() - t0
            _TRACE.composition(out)
        return out

    def timed_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = update(self, *args, **kwargs)
        if _TRACE is not None:
            _TRACE.step(self, time.perf_counter_ns() - t0)
        return out

    cls.__init__ = __init__
    cls.schedule = timed_schedule
    cls.update_from_output = timed_update


def _timed(fn: Any, counter: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            if _TRACE is not None:
                ns = time.perf_counter_ns() - t0
                setattr(_TRACE, counter, getattr(_TRACE, counter) + ns)

    return wrapper


def _instrument_executor(module: Any, folder: str) -> None:
    executor = module.UniProcExecutor
    executor.execute_model = _timed(executor.execute_model, "exec_ns")
    executor.sample_tokens = _timed(executor.sample_tokens, "sample_ns")
    # Under async scheduling the engine waits for a step's tokens here.
    future = module.AsyncOutputFuture
    future.result = _timed(future.result, "wait_ns")


def _share_socket(module: Any, folder: str) -> None:
    def keep(inherited: Any) -> Any:
        return inherited

    module.own_listener = keep


TARGETS = {SCHEDULER: _instrument_scheduler, EXECUTOR: _instrument_executor}
LISTENER = "vllm.entrypoints.api_server_listener"


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, folder: str, targets: dict[str, Any]) -> None:
        self.folder = folder
        self.pending = dict(targets)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        instrument = self.pending.pop(name, None)
        if instrument is None:
            return None
        if not self.pending:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, folder = spec.loader, self.folder
        exec_module = loader.exec_module

        def exec_and_instrument(module: Any) -> None:
            exec_module(module)
            instrument(module, folder)

        loader.exec_module = exec_and_instrument  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the sitecustomize this one shadows, if the image has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_targets: dict[str, Any] = dict(TARGETS) if os.environ.get("TAGMA_SCHED_TRACE") else {}
if os.environ.get("TAGMA_BENCH_SHARED_SOCKET") == "1":
    _targets[LISTENER] = _share_socket
if _targets:
    sys.meta_path.insert(0, _Finder(os.environ.get("TAGMA_SCHED_TRACE", ""), _targets))
_chain()
