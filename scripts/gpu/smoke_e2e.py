# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""End-to-end correctness gate on a GPU: greedy token ids, paged vs tagma.

    python3 scripts/gpu/smoke_e2e.py --model /tmp/llama1b --out DIR

Runs the same prompts (token ids, fixed seed, dummy weights, greedy) once
per backend, each in its own process (one engine per process), and compares
the generated token ids. Prompts mix short and long lengths and share
prefixes, so tagma sees prefix hits and several ranges. Exit 1 on any
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(1, 128000) for _ in range(700)]
    out = []
    for i, length in enumerate((17, 100, 513, 1000, 2049, 3000, 64, 4000)):
        ids = [rng.randrange(1, 128000) for _ in range(length)]
        out.append(ids)
        if i % 2 == 0:
            out.append(shared + ids[:50])  # prefix hits across requests
    return out


def generate(model: str, variant: str, path: str) -> None:
    backend, _, expand = variant.partition(":")
    if expand:
        os.environ["VLLM_TAGMA_EXPAND_RANGES"] = expand
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.time()
    llm = LLM(
        model=model,
        load_format="dummy",
        max_model_len=8192,
        seed=0,
        kv_cache_backend=backend,
        gpu_memory_utilization=0.5,
    )
    init_s = time.time() - t0
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts()]
    # Twice: the second pass hits the prefix cache for every prompt.
    first = llm.generate(batch, params, use_tqdm=False)
    second = llm.generate(batch, params, use_tqdm=False)
    result = {
        "variant": variant,
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
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["tagma"],
        help="tagma variants to compare with paged: tagma[:EXPAND_MODE]",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.one:
        generate(a.model, a.one, os.path.join(a.out, f"smoke-{a.one}.json"))
        return 0
    results = {}
    for variant in ("paged", *a.variants):
        print(f"==> {variant}", flush=True)
        cmd = [sys.executable, __file__, "--model", a.model, "--out", a.out]
        subprocess.run([*cmd, "--one", variant], check=True)
        with open(os.path.join(a.out, f"smoke-{variant}.json")) as f:
            results[variant] = json.load(f)
    status = 0
    for variant in a.variants:
        status |= compare(results["paged"], results[variant], variant)
    return status


def compare(paged: dict, tagma: dict, variant: str) -> int:
    same = paged["first"] == tagma["first"] and paged["second"] == tagma["second"]
    same_cache = paged["first"] == paged["second"]
    n = len(paged["first"])
    print(
        f"{variant}: prompts: {n}; token ids equal paged vs tagma: {same}; "
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
