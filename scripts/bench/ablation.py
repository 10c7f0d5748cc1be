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
- `UnbatchedKVCacheManager`: tagma promising no step in `batched_slots`,
  so the scheduler calls `allocate_slots` for every block-completing and
  block-crossing decode step, as before that patch, instead of one
  `allocate_batched` call a step.
- `PythonStepsKVCacheManager`: tagma taking its promised steps in Python,
  one request at a time (the manager's path for a step the engine leaves),
  instead of the engine's one call (`Blocks.allocate_batched`): what that
  call contributes.
- `PyRunsKVCacheManager`: tagma on the pure-Python free-run index
  (`vllm.tagma.free_runs`, the fallback where the extension cannot load)
  instead of the C++ one: what the C++ engine contributes.
- `BothBooksKVCacheManager`: tagma keeping every free block in upstream's
  free queue too (the clean ones also in the run index), as before the
  pool kept each free block on one book: each block handed out is
  unlinked from the queue, each freed block linked in, and eviction walks
  past the clean blocks at the queue's front.
- `NoHeadroomKVCacheManager`: tagma without growth headroom.
- `NoEvictedHeadroomKVCacheManager`: tagma without the admission's eviction
  batch (cached blocks evicted only as many as the blocks themselves need).
- `PyEvictKVCacheManager`: tagma evicting cached blocks through upstream's
  `BlockPool.evict_blocks`, one block at a time, instead of the engine's
  one call a batch (`Blocks.evict`).
- `LruEvictionKVCacheManager`: tagma evicting as upstream's pool does: each
  allocation of n blocks first drops the hashes of the cached blocks among
  the first n of the free queue (the blocks upstream would have popped),
  instead of using clean blocks first and evicting only when no clean run
  fits.
"""

from __future__ import annotations

import itertools

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
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


class UnbatchedKVCacheManager(TagmaKVCacheManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._batching = False


class PythonStepsKVCacheManager(TagmaKVCacheManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._engine_steps = None


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


class BothBooksBlockPool(TagmaBlockPool):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Every free block (all but the null one) in the queue, in id order.
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[1:])

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def _take(self, start: int, length: int, out: list[KVCacheBlock]) -> None:
        remove = self.free_block_queue.remove
        for block in self.blocks[start : start + length]:
            remove(block)
        super()._take(start, length, out)

    def free_blocks(self, ordered_blocks) -> None:
        blocks = list(ordered_blocks)
        # Upstream's queue gets every freed block, then a second pass puts
        # the clean ones (and any headroom) into the run index.
        BlockPool.free_blocks(self, blocks)
        clean = []
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                count = self._headroom.pop(block.block_id, 0)
                if count:
                    self._num_held -= count
                    self.free_runs.add_range(block.block_id + 1, count)
                if block.block_hash is None:
                    clean.append(block.block_id)
        if clean:
            self.free_runs.add(clean)

    def _evict_lru(self, num_blocks: int) -> None:
        runs = self.free_runs

        def enough() -> bool:
            return runs.largest_run >= num_blocks or runs.num_free >= 2 * num_blocks

        if enough():
            return
        batch: set[int] = set()
        for block in self.free_block_queue.iter_blocks_after(None):
            if block.block_hash is None:
                continue  # clean: already in the run index
            batch.add(block.block_id)
            if len(batch) == num_blocks:
                self._evict_in_place(batch)
                if enough():
                    return
                batch = set()
        if batch:
            self._evict_in_place(batch)

    def _evict_in_place(self, cached: set[int]) -> None:
        # The blocks stay where they are in the queue, now clean.
        BlockPool.evict_blocks(self, cached)
        self.free_runs.add(list(cached))

    def evict_blocks(self, block_ids: set[int]) -> None:
        cached_free = [
            self.blocks[i]
            for i in block_ids
            if self.blocks[i].ref_cnt == 0 and self.blocks[i].block_hash is not None
        ]
        BlockPool.evict_blocks(self, block_ids)
        self.free_runs.add([b.block_id for b in cached_free if b.block_hash is None])

    def validate(self) -> None:
        return  # the one-book invariants do not hold here

    def reset_prefix_cache(self) -> bool:
        cached_free = [
            b.block_id
            for b in self.blocks
            if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null
        ]
        if not BlockPool.reset_prefix_cache(self):
            return False
        self.free_runs.add(cached_free)
        return True


class BothBooksKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = BothBooksBlockPool


class NoHeadroomBlockPool(TagmaBlockPool):
    def _room(self, num_blocks: int) -> int:
        return 0


class NoHeadroomKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = NoHeadroomBlockPool


class NoEvictedHeadroomBlockPool(TagmaBlockPool):
    def _evict_for_run(self, num_blocks: int) -> None:
        # Before the admission's batch: cached blocks are evicted only when
        # no clean run holds the blocks themselves, as many as needed.
        return


class NoEvictedHeadroomKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = NoEvictedHeadroomBlockPool


class PyEvictBlockPool(TagmaBlockPool):
    def make_blocks(self, num_gpu_blocks: int) -> list[KVCacheBlock]:
        blocks = super().make_blocks(num_gpu_blocks)
        self._evict = None
        return blocks


class PyEvictKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = PyEvictBlockPool


class LruEvictionBlockPool(TagmaBlockPool):
    def get_new_blocks_after(
        self, last_block: KVCacheBlock | None, num_blocks: int
    ) -> list[KVCacheBlock]:
        # Upstream's queue holds the clean free blocks first, then the
        # cached ones, least recently used first; this pool's queue holds
        # only the cached ones: its first n - (clean) are upstream's victims.
        over = num_blocks - self._num_clean()
        if (
            self.enable_caching
            and over > 0
            and num_blocks <= self.get_num_free_blocks()
        ):
            front = self.free_block_queue.iter_blocks_after(None)
            victims = {b.block_id for b in itertools.islice(front, over)}
            self.evict_blocks(victims)
        return super().get_new_blocks_after(last_block, num_blocks)


class LruEvictionKVCacheManager(TagmaKVCacheManager):
    block_pool_cls = LruEvictionBlockPool
