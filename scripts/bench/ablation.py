# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Ablation variants of the tagma KV manager, for benchmarks only.

Each is a KV-cache manager class that sched.py plugs in through the
plug-in point (`CacheConfig.kv_cache_manager_cls`), so the product carries
no switch for them:

- `StockKVCacheManager`: upstream's `KVCacheManager` as released, without
  the series' held-slots answer in `allocate_slots` (the decode step that
  needs no new block), i.e. paged before that patch.
- `ReleasedBlockIdsKVCacheManager`: paged whose `KVCacheBlocks` answer
  `get_block_ids(allow_none=True)` by the generator over the groups that
  vLLM as released runs (the held-slots patch asks `not any(...)`), the
  scheduler asking once per scheduled request per step.
- `CallEveryStepKVCacheManager`, `TagmaCallEveryStepKVCacheManager`: paged
  and tagma with the held-slots answer in `allocate_slots` but no
  `held_slots` entries, so the scheduler still calls `allocate_slots` for
  every running request every step (the held-slots patch before its
  scheduler hook).
- `PyRunsKVCacheManager`: tagma on the pure-Python free-run index
  (`vllm.tagma.free_runs`, the fallback where the extension cannot load)
  instead of the C++ one: what the C++ engine contributes.
- `NoHeadroomKVCacheManager`: tagma without growth headroom.
- `LruEvictionKVCacheManager`: tagma evicting as upstream's pool does: each
  allocation of n blocks first drops the hashes of the cached blocks among
  the first n of the free queue (the blocks upstream would have popped),
  instead of using clean blocks first and evicting only when no clean run
  fits.
"""

from __future__ import annotations

import itertools

from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.tagma_kv_cache_manager import TagmaBlockPool, TagmaKVCacheManager
from vllm.v1.request import Request


class StockKVCacheManager(KVCacheManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # allocate_slots then always takes the coordinator walk.
        self._held_slots_manager = None


class _ReleasedBlockIds(KVCacheBlocks):
    def get_block_ids(self, allow_none: bool = False):  # type: ignore[override]
        if allow_none and all(len(group) == 0 for group in self.blocks):
            return None
        return super().get_block_ids()


class ReleasedBlockIdsKVCacheManager(KVCacheManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Every KVCacheBlocks the scheduler gets from this manager.
        self.empty_kv_cache_blocks = _ReleasedBlockIds(
            self.empty_kv_cache_blocks.blocks
        )

    def create_kv_cache_blocks(
        self, blocks: tuple[list[KVCacheBlock], ...]
    ) -> KVCacheBlocks:
        return _ReleasedBlockIds(blocks) if any(blocks) else self.empty_kv_cache_blocks


class _CallEveryStep:
    def _note_held_slots(self, request: Request) -> None:
        # No entry: the scheduler calls allocate_slots for every request.
        return


class CallEveryStepKVCacheManager(_CallEveryStep, KVCacheManager):
    pass


class TagmaCallEveryStepKVCacheManager(_CallEveryStep, TagmaKVCacheManager):
    pass


class PyRunsBlockPool(TagmaBlockPool):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from vllm.tagma.free_runs import FreeRuns

        # Replaced before the first allocation: the same runs, in Python.
        self.free_runs = FreeRuns(self.num_gpu_blocks)
        if self.num_gpu_blocks > 1:
            self.free_runs.add_range(1, self.num_gpu_blocks - 1)


class PyRunsKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = PyRunsBlockPool


class NoHeadroomBlockPool(TagmaBlockPool):
    def _room(self, num_blocks: int) -> int:
        return 0


class NoHeadroomKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = NoHeadroomBlockPool


class LruEvictionBlockPool(TagmaBlockPool):
    def get_new_blocks_after(
        self, last_block: KVCacheBlock | None, num_blocks: int
    ) -> list[KVCacheBlock]:
        if self.enable_caching and num_blocks <= self.get_num_free_blocks():
            front = self.free_block_queue.iter_blocks_after(None)
            victims = {
                b.block_id
                for b in itertools.islice(front, num_blocks)
                if b.block_hash is not None
            }
            if victims:
                self.evict_blocks(victims)
        return super().get_new_blocks_after(last_block, num_blocks)


class LruEvictionKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = LruEvictionBlockPool
