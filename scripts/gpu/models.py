# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Weightless model folders for `vllm serve --load-format dummy`.

Each folder holds a published architecture's config.json (Llama-3.1-8B or
Llama-3.2-1B: bf16, GQA 32 query / 8 KV heads, head_dim 128, 128K positions
with llama3 RoPE scaling) and the real Llama-3 tokenizer, so ShareGPT prompts
tokenize as they would for the real model. vLLM fills the weights with random
values; the shapes, and so the compute and KV-cache sizes, are the real ones.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

BOS, EOS = 128000, 128001

_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

# name -> the fields that differ between the two published configs.
MODELS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "tie_word_embeddings": False,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "tie_word_embeddings": True,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
}


def _dump(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_model(out: Path, name: str, tokenizer_json: Path) -> Path:
    """Write out/<name>/ and return it."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    _dump(folder / "config.json", {**_COMMON, **MODELS[name]})
    _dump(folder / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS})
    shutil.copyfile(tokenizer_json, folder / "tokenizer.json")
    _dump(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|end_of_text|>",
            "model_max_length": 131072,
            "clean_up_tokenization_spaces": True,
            "model_input_names": ["input_ids", "attention_mask"],
        },
    )
    return folder
