# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Ablation variants of the tagma KV manager, for benchmarks only.

Each is a KV-cache manager class that sched.py plugs in through the
plug-in point (`CacheConfig.kv_cache_manager_cls`), so the product carries
no switch for them:

- `StockKVCacheManager`: upstream's `KVCacheManager` as released, without
  the series' held-slots answer in `allocate_slots` (the decode step that
  needs no new block), i.e. paged before that patch.
- `NoHeadroomKVCacheManager`: tagma without growth headroom.
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.tagma_kv_cache_manager import TagmaBlockPool, TagmaKVCacheManager


class StockKVCacheManager(KVCacheManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # allocate_slots then always takes the coordinator walk.
        self._held_slots_manager = None


class NoHeadroomBlockPool(TagmaBlockPool):
    def get_new_blocks_after(
        self, last_block: KVCacheBlock | None, num_blocks: int
    ) -> list[KVCacheBlock]:
        self.room = 0
        return super().get_new_blocks_after(last_block, num_blocks)


class NoHeadroomKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = NoHeadroomBlockPool
