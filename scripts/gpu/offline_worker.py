# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""One resident engine for `offline.py --resident`.

    python3 scripts/gpu/offline_worker.py --num-prompts N [--input-len 128]
        [--output-len 256] ENGINE ARGS (--model DIR --kv-cache-backend tagma ...)

Builds one engine as `vllm bench throughput` does (`EngineArgs` from the same
command-line flags, `LLM.from_engine_args`), then runs the workload each
time its parent writes `run` on stdin: the prefix cache is emptied first
(every run sends the same prompts, as a fresh engine would see them), then N
prompts of random token ids (seeded by `--seed`), `--output-len` tokens out
with `ignore_eos`, through one `LLM.generate` call, timed as the bench times
it. Each run's result is one stdout line after RESULT (the engine's own log
lines go to stdout as well). `quit` or end of input stops it.
"""

from __future__ import annotations

import json
import random
import sys
import time

READY = "OFFLINE_WORKER_READY"
RESULT = "OFFLINE_WORKER_RESULT "


def prompts(n: int, input_len: int, seed: int) -> list[list[int]]:
    """N prompts of random token ids, the same for every variant and run."""
    rng = random.Random(seed)
    return [[rng.randrange(1000, 100_000) for _ in range(input_len)] for _ in range(n)]


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, required=True)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser = EngineArgs.add_cli_args(parser)
    args = parser.parse_args()
    llm = LLM.from_engine_args(EngineArgs.from_cli_args(args))
    sampling = SamplingParams(
        n=1,
        temperature=1.0,
        top_p=1.0,
        ignore_eos=True,
        max_tokens=args.output_len,
    )
    requests = [
        {"prompt_token_ids": ids}
        for ids in prompts(args.num_prompts, args.input_len, args.seed or 0)
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
