# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""One resident engine for `offline.py --resident`.

    python3 scripts/gpu/offline_worker.py --model DIR --num-prompts N \
        --memory-share F [VARIANT FLAGS, e.g. --kv-cache-backend tagma]

Builds one `LLM` for the variant (the engine `vllm bench throughput` builds:
dummy weights, `--max-num-seqs 1024`, `--max-model-len 4096`, seed 0), then
runs the workload each time its parent writes `run` on stdin: the prefix
cache is emptied first (every run sends the same prompts, as a fresh engine
would see them), N prompts of random token ids, 128 in and 256 out with
`ignore_eos`, through one `LLM.generate` call, as the bench times it. Each
run's result is one stdout line after RESULT (the engine's own log lines go
to stdout as well). `quit` or end of input stops it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

READY = "OFFLINE_WORKER_READY"
RESULT = "OFFLINE_WORKER_RESULT "


def engine_kwargs(flags: list[str]) -> dict[str, str]:
    """A variant's CLI flags (`--kv-cache-backend tagma`) as `LLM` keyword
    arguments (`kv_cache_backend="tagma"`)."""
    if len(flags) % 2 or not all(f.startswith("--") for f in flags[::2]):
        raise ValueError(f"variant flags must be --name value pairs: {flags}")
    return {
        k.removeprefix("--").replace("-", "_"): v
        for k, v in zip(flags[::2], flags[1::2], strict=True)
    }


def prompts(n: int, input_len: int, seed: int) -> list[list[int]]:
    """N prompts of random token ids, the same for every variant and run."""
    rng = random.Random(seed)
    return [[rng.randrange(1000, 100_000) for _ in range(input_len)] for _ in range(n)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--memory-share", type=float, required=True)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args, flags = p.parse_known_args()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        load_format="dummy",
        max_num_seqs=1024,
        max_model_len=4096,
        seed=args.seed,
        gpu_memory_utilization=args.memory_share,
        **engine_kwargs(flags),  # type: ignore[arg-type]
    )
    sampling = SamplingParams(
        n=1,
        temperature=1.0,
        top_p=1.0,
        ignore_eos=True,
        max_tokens=args.output_len,
    )
    requests = [
        {"prompt_token_ids": ids}
        for ids in prompts(args.num_prompts, args.input_len, args.seed)
    ]
    print(READY, flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        if not llm.reset_prefix_cache():
            print("offline_worker: the prefix cache could not be reset", flush=True)
            return 1
        t0 = time.perf_counter()
        outputs = llm.generate(requests, sampling, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        result = {
            "output_tokens": tokens,
            "elapsed_s": elapsed,
            "output_tok_s": tokens / elapsed,
        }
        print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
