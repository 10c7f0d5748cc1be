# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""End-to-end correctness gate on a GPU: greedy token ids, paged vs tagma.

    python3 scripts/gpu/smoke_e2e.py --model /tmp/llama1b --out DIR

Runs the same prompts (token ids, fixed seed, dummy weights, greedy) once
per backend, each in its own process (one engine per process), and compares
the generated token ids. Prompts mix short and long lengths and share
prefixes, so tagma sees prefix hits and several ranges. Exit 1 on any
difference.

Two phases, each paged then tagma:
- "plain": a roomy KV cache, the batch as it comes.
- "preempt": VLLM_BATCH_INVARIANT=1 (batch-invariant kernels, so a different
  batch composition cannot change the numerics) and a KV cache of
  PREEMPT_BLOCKS blocks, too small for the batch (40 requests, 256 tokens
  each), so the scheduler preempts and resumes requests; the shared prefixes
  (700 and 333 tokens) end mid-block.
  The phase fails unless both backends preempted at least once. Its engine
  runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, both backends), so that
  once both passes are done the tagma manager's validate() runs on the live
  scheduler (every counter recomputed from the blocks, the scheduler's
  deferred frees included) and its KV usage must be back to 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

BACKENDS = ("paged", "tagma")
PHASES = ("plain", "preempt")
# 16-token blocks: 4,800 tokens of KV for 40 requests of up to 1,356 tokens.
PREEMPT_BLOCKS = 300


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(1, 128000) for _ in range(700)]
    other = [rng.randrange(1, 128000) for _ in range(333)]
    out = []
    for i, length in enumerate((17, 100, 513, 1000, 2049, 3000, 64, 4000)):
        ids = [rng.randrange(1, 128000) for _ in range(length)]
        out.append(ids)
        if i % 2 == 0:
            out.append(shared + ids[:50])  # prefix hits across requests
        else:
            out.append(other + ids[:29])
    return out


def preempt_prompts() -> list[list[int]]:
    """Many mid-length prompts, most behind one of two shared prefixes that
    end mid-block: admitted together, their decode growth overflows the
    small cache, so running requests are preempted and resumed."""
    rng = random.Random(1)
    shared = [[rng.randrange(1, 128000) for _ in range(n)] for n in (700, 333)]
    out = []
    for i in range(40):
        ids = [rng.randrange(1, 128000) for _ in range(rng.randrange(40, 400))]
        out.append(ids if i % 5 == 4 else shared[i % 2] + ids)
    return out


def num_preemptions(llm) -> int:
    return int(
        sum(
            getattr(m, "value", 0)
            for m in llm.get_metrics()
            if m.name == "vllm:num_preemptions"
        )
    )


def idle_state(llm) -> dict:
    """The in-process scheduler's KV state once idle: usage, and under tagma
    whether validate() holds (the error it raised otherwise)."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    manager = scheduler.kv_cache_manager
    state: dict = {"usage": manager.usage, "validate": None}
    if hasattr(manager, "validate"):
        deferred = [b for _, blocks in scheduler.deferred_frees for b in blocks]
        try:
            manager.validate(held_elsewhere=deferred)
            state["validate"] = "ok"
        except RuntimeError as e:
            state["validate"] = str(e)
    return state


def generate(model: str, backend: str, phase: str, path: str) -> None:
    if phase == "preempt":
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra: dict = {}
    if phase == "preempt":
        # max_model_len must fit the small cache (4,096 <= 4,800 tokens).
        extra = {
            "num_gpu_blocks_override": PREEMPT_BLOCKS,
            "disable_log_stats": False,
            "max_model_len": 4096,
        }
    t0 = time.time()
    llm = LLM(
        model=model,
        load_format="dummy",
        seed=0,
        kv_cache_backend=backend,
        gpu_memory_utilization=0.5,
        **({"max_model_len": 8192} | extra),
    )
    init_s = time.time() - t0
    max_tokens = 256 if phase == "preempt" else 48
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = preempt_prompts() if phase == "preempt" else prompts()
    batch = [TokensPrompt(prompt_token_ids=p) for p in ids]
    # Twice: the second pass hits the prefix cache for every prompt.
    first = llm.generate(batch, params, use_tqdm=False)
    second = llm.generate(batch, params, use_tqdm=False)
    result = {
        "backend": backend,
        "phase": phase,
        "preemptions": num_preemptions(llm) if phase == "preempt" else None,
        "idle_state": idle_state(llm) if phase == "preempt" else None,
        "engine_init_s": round(init_s, 1),
        "first": [list(o.outputs[0].token_ids) for o in first],
        "second": [list(o.outputs[0].token_ids) for o in second],
    }
    with open(path, "w") as f:
        json.dump(result, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # backend phase
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.one:
        backend, phase = a.one
        path = os.path.join(a.out, f"smoke-{phase}-{backend}.json")
        generate(a.model, backend, phase, path)
        return 0
    status = 0
    for phase in a.phases:
        results = {}
        for backend in BACKENDS:
            print(f"==> {phase}: {backend}", flush=True)
            cmd = [sys.executable, __file__, "--model", a.model, "--out", a.out]
            subprocess.run([*cmd, "--one", backend, phase], check=True)
            with open(os.path.join(a.out, f"smoke-{phase}-{backend}.json")) as f:
                results[backend] = json.load(f)
        status |= compare(results["paged"], results["tagma"])
    return status


def compare(paged: dict, tagma: dict) -> int:
    same = paged["first"] == tagma["first"] and paged["second"] == tagma["second"]
    same_cache = paged["first"] == paged["second"]
    n = len(paged["first"])
    phase = paged.get("phase", "plain")
    if phase == "preempt":
        counts = (paged["preemptions"], tagma["preemptions"])
        print(f"[preempt] preemptions paged {counts[0]}, tagma {counts[1]}")
        if min(counts) < 1:
            print("  the KV cache did not force preemption: the phase proves nothing")
            same = False
        state = tagma.get("idle_state") or {}
        print(f"[preempt] tagma once idle: {state}; paged: {paged.get('idle_state')}")
        if state.get("validate") != "ok" or state.get("usage") != 0.0:
            print("  tagma's KV state is not clean once idle")
            same = False
    print(
        f"[{phase}] prompts: {n}; token ids equal paged vs tagma: {same}; "
        f"equal with prefix-cache hits (second pass): "
        f"{paged['second'] == tagma['second']}; paged first==second: {same_cache}"
    )
    for i, (p, t) in enumerate(zip(paged["first"], tagma["first"], strict=True)):
        if p != t:
            pairs = enumerate(zip(p, t, strict=False))
            first = next((j for j, (x, y) in pairs if x != y), min(len(p), len(t)))
            print(f"  prompt {i}: first difference at token {first}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
