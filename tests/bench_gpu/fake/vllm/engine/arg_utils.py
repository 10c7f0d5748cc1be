# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The engine flags offline_worker.py passes, as vLLM's EngineArgs reads
them (a flag the stand-in does not know fails the parse, as vLLM's would)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass
class EngineArgs:
    model: str = ""
    max_num_seqs: int = 256
    max_model_len: int = 0
    load_format: str = "auto"
    seed: int = 0
    gpu_memory_utilization: float = 0.9
    kv_cache_backend: str = "paged"
    kv_cache_manager_cls: str = ""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for f in fields(EngineArgs):
            kind = f.type if f.type in ("int", "float") else "str"
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                type={"int": int, "float": float, "str": str}[kind],
                default=f.default,
            )
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
