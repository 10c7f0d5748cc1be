# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Managers that answer only held decode steps without the general path.

Benchmark variants for `alloc_calls.py --variants held_only.PagedHeldOnly,
paged,held_only.TagmaHeldOnly,tagma` (alloc_calls.py puts scripts/bench on
the path): the same managers, with the decode step that crosses a block
boundary sent down upstream's general path, as before the held-slots patch
answered it too.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.tagma_kv_cache_manager import TagmaKVCacheManager


def _held_only(self: Any, request: Any, num_tokens: int) -> int | None:
    short = KVCacheManager._blocks_short(self, request, num_tokens)
    return 0 if short == 0 else None


class PagedHeldOnly(KVCacheManager):
    _blocks_short = _held_only


class TagmaHeldOnly(TagmaKVCacheManager):
    _blocks_short = _held_only
