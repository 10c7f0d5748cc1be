# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""pytest plugin: make `--kv-cache-backend tagma` CacheConfig's default.

run.py loads it (`-p tagma_default`) for `--backend tagma`, so that vLLM's
own suites, which never name a backend, build every config under tagma:
CacheConfig() directly, and EngineArgs, whose field default is read from
CacheConfig's when arg_utils is first imported (after this plugin).
A test that asks for "paged" explicitly still gets paged.
"""

import sys

from pydantic.dataclasses import rebuild_dataclass

if "vllm.engine.arg_utils" in sys.modules:
    raise RuntimeError("tagma_default must load before vllm.engine.arg_utils")

from vllm.config.cache import CacheConfig  # noqa: E402

CacheConfig.__dataclass_fields__["kv_cache_backend"].default = "tagma"
CacheConfig.__pydantic_fields__["kv_cache_backend"].default = "tagma"
# EngineArgs reads the class attribute for its own field's default.
CacheConfig.kv_cache_backend = "tagma"  # type: ignore[assignment]
rebuild_dataclass(CacheConfig, force=True)

from vllm.engine.arg_utils import EngineArgs  # noqa: E402

assert CacheConfig().kv_cache_backend == "tagma"
assert EngineArgs.__dataclass_fields__["kv_cache_backend"].default == "tagma"
