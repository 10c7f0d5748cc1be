# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""A stand-in for vLLM's offline API (LLM, SamplingParams), as
scripts/gpu/offline_worker.py uses it: generation takes the time its rate
says (paged 100K, tagma 200K output tokens/s, a plugged-in manager 300K),
and a second generate of the same prompts without reset_prefix_cache() in
between fails, as a resident engine would serve them from its cache."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from types import SimpleNamespace


class SamplingParams:
    def __init__(self, **kwargs: object) -> None:
        self.__dict__.update(kwargs)


class LLM:
    def __init__(
        self,
        model: str,
        kv_cache_backend: str = "paged",
        kv_cache_manager_cls: str = "",
        gpu_memory_utilization: float = 0.9,
        **kwargs: object,
    ) -> None:
        if os.environ.get("FAKE_VLLM_THROUGHPUT_FAIL"):
            sys.exit("fake vllm: engine failed to start")
        if kv_cache_manager_cls:
            module = kv_cache_manager_cls.rpartition(".")[0]
            if importlib.util.find_spec(module) is None:
                sys.exit(f"fake vllm: no module {module!r} for kv_cache_manager_cls")
        if not 0 < gpu_memory_utilization <= 0.44:
            sys.exit(f"fake vllm: a resident engine at {gpu_memory_utilization}")
        if kwargs.get("load_format") != "dummy" or kwargs.get("max_num_seqs") != 1024:
            sys.exit(f"fake vllm: not the bench's engine arguments: {kwargs}")
        self.rate = 100_000.0 * (1 + (kv_cache_backend == "tagma"))
        self.rate += 200_000.0 * bool(kv_cache_manager_cls)
        self.cached = False
        self.calls = 0
        # vLLM's own log lines share stdout with the worker's protocol.
        print(f"INFO fake engine: {kv_cache_backend}, {model}", flush=True)

    @classmethod
    def from_engine_args(cls, engine_args: object) -> LLM:
        return cls(**vars(engine_args))

    def reset_prefix_cache(self) -> bool:
        self.cached = False
        return True

    def generate(self, prompts: list, sampling: SamplingParams, use_tqdm: bool = True):
        if self.cached:
            raise RuntimeError("fake vllm: these prompts are cached")
        self.cached = True
        n = sampling.max_tokens  # type: ignore[attr-defined]
        time.sleep(len(prompts) * n / self.rate)
        # vLLM's 10-second stats lines, on the shared stdout: one with the
        # batch full at a rate that names the call (rate + calls), one from
        # the tail.
        self.calls += 1
        for rate, running in ((self.rate + self.calls, 1024), (self.rate / 4, 100)):
            print(
                "INFO [loggers.py:310] Engine 000: Avg prompt throughput: 0.0 "
                f"tokens/s, Avg generation throughput: {rate:.1f} tokens/s, "
                f"Running: {running} reqs, Waiting: 0 reqs",
                flush=True,
            )
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1] * n)])] * len(
            prompts
        )
