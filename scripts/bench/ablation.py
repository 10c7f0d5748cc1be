# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Ablation variants of the tagma KV manager, for benchmarks only.

Each is a KV-cache manager class that sched.py plugs in through the
plug-in point (`CacheConfig.kv_cache_manager_cls`), so the product carries
no switch for them:

- `FastPathOnlyKVCacheManager`: tagma's `allocate_slots` (the decode step
  that needs no new block answered at once, everything else upstream's) over
  upstream's `BlockPool`: the fast path without range placement, i.e. what
  the fast path would give paged.
- `NoHeadroomKVCacheManager`: tagma without growth headroom.
"""

from __future__ import annotations

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.tagma_kv_cache_manager import TagmaBlockPool, TagmaKVCacheManager


class FastPathOnlyKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = BlockPool

    def __init__(self, *args, **kwargs) -> None:
        # Tagma's own __init__ insists on its pool; set up only what its
        # allocate_slots reads.
        KVCacheManager.__init__(self, *args, **kwargs)
        (self._group,) = self.coordinator.single_type_managers
        self._block_size = self._group.block_size
        self._req_to_blocks = self._group.req_to_blocks
        self._num_cached = self._group.num_cached_block
        self._num_ranges: dict[str, int] = {}


class NoHeadroomBlockPool(TagmaBlockPool):
    def get_new_blocks_after(
        self, last_block: KVCacheBlock | None, num_blocks: int
    ) -> list[KVCacheBlock]:
        self.room = 0
        return super().get_new_blocks_after(last_block, num_blocks)


class NoHeadroomKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = NoHeadroomBlockPool
