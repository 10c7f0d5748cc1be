# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""_tagma_C.Blocks and its Block views: the pool's per-block state in the
engine, with vLLM's KVCacheBlock fields (BlockPool.make_blocks)."""

import gc
import importlib.util
import sys
import weakref

import _tagma_C as T
import pytest


class Linked:
    """A Python object a view can link to (as upstream's queue links its
    fake head and tail), weak-referenceable so the test sees it freed."""

    def __init__(self):
        self.next_free_block = None


def test_construction_and_errors():
    b = T.Blocks(5)
    assert len(b) == 5 and repr(b) == "Blocks(num_blocks=5)"
    assert T.Blocks(num_blocks=1)[0].block_id == 0
    for bad in (0, -1, T.MAX_BLOCKS + 1):
        with pytest.raises(ValueError, match=r"num_blocks must be in \[1, "):
            T.Blocks(bad)
    with pytest.raises(ValueError, match="does not fit in int64"):
        T.Blocks(2**70)
    with pytest.raises(TypeError, match="must be an int"):
        T.Blocks("3")


def test_types_are_final_immutable_and_untracked():
    with pytest.raises(TypeError, match="cannot create"):
        T.Block()
    for cls in (T.Block, T.Blocks):
        assert cls.__module__ == "vllm._tagma_C" and cls.__doc__
        with pytest.raises(TypeError):
            cls.x = 1
        with pytest.raises(TypeError):

            class Sub(cls):
                pass

    b = T.Blocks(3)
    v = b[1]
    # The collector never walks the table or a view.
    assert not gc.is_tracked(b) and not gc.is_tracked(v)
    assert sys.getsizeof(v) == 48


def test_indexing_gives_the_same_view():
    b = T.Blocks(10)
    assert b[3] is b[3] and b[-1] is b[9] and b[-10] is b[0]
    assert [v.block_id for v in b] == list(range(10))
    assert [v.block_id for v in b[2:8:3]] == [2, 5]
    assert b[7:] == [b[7], b[8], b[9]] and b[5:2] == []
    assert [v.block_id for v in b[::-4]] == [9, 5, 1]
    for i in (10, -11, 2**70):
        with pytest.raises(IndexError):
            b[i]
    with pytest.raises(TypeError, match="integers or slices"):
        b["1"]


def test_fields_default_and_write_through():
    b = T.Blocks(4)
    v = b[2]
    assert (v.block_id, v.ref_cnt, v.is_null) == (2, 0, False)
    assert v.block_hash is None and v.block_hash_num_tokens is None
    assert v.prev_free_block is None and v.next_free_block is None
    v.ref_cnt += 3
    v.ref_cnt -= 5
    assert b[2].ref_cnt == -2  # a caller's bug shows, as on KVCacheBlock
    v.is_null = 1
    assert b[2].is_null is True
    v.is_null = []
    assert v.is_null is False
    with pytest.raises(AttributeError):
        v.block_id = 3
    with pytest.raises(AttributeError):
        v.block_hash = b"x"
    with pytest.raises(AttributeError):
        v.other = 1


def test_ref_cnt_bad_values_leave_it_unchanged():
    b = T.Blocks(2)
    v = b[1]
    v.ref_cnt = 7
    for bad, exc in (
        (2**31, ValueError),
        (-(2**31) - 1, ValueError),
        (2**70, ValueError),
        ("1", TypeError),
        (1.0, TypeError),
    ):
        with pytest.raises(exc):
            v.ref_cnt = bad
        assert v.ref_cnt == 7
    with pytest.raises(TypeError, match="cannot be deleted"):
        del v.ref_cnt
    with pytest.raises(TypeError, match="cannot be deleted"):
        del v.is_null
    v.ref_cnt = 2**31 - 1
    assert v.ref_cnt == 2**31 - 1


def test_block_hash_set_once_reset_and_released():
    b = T.Blocks(3)
    v = b[1]
    key = bytes(range(40))
    refs = sys.getrefcount(key)
    v.set_block_hash(key, num_tokens=16)
    assert v.block_hash is key and v.block_hash_num_tokens == 16
    assert sys.getrefcount(key) == refs + 1
    with pytest.raises(ValueError, match="block 1 already has a hash"):
        v.set_block_hash(b"other")
    assert v.block_hash is key and v.block_hash_num_tokens == 16
    v.reset_hash()
    assert v.block_hash is None and v.block_hash_num_tokens is None
    assert sys.getrefcount(key) == refs
    v.set_block_hash(key)  # positional, no token count
    assert v.block_hash is key and v.block_hash_num_tokens is None
    v.reset_hash()
    with pytest.raises(ValueError, match="must not be None"):
        v.set_block_hash(None)
    with pytest.raises(ValueError, match="must be >= 0"):
        v.set_block_hash(key, -1)
    with pytest.raises(TypeError):
        v.set_block_hash()
    assert v.block_hash is None and sys.getrefcount(key) == refs


def test_links_hold_references_until_the_table_goes():
    b = T.Blocks(4)
    head = Linked()
    gone = weakref.ref(head)
    v1, v2 = b[1], b[2]
    # The queue's shape: head <-> v1 <-> v2, head linking back to v1.
    v1.prev_free_block = head
    head.next_free_block = v1
    v1.next_free_block = v2
    v2.prev_free_block = v1
    assert v1.prev_free_block is head and v2.prev_free_block is v1
    v2.next_free_block = None
    assert v2.next_free_block is None
    del v1.next_free_block  # deleting a link sets it to None
    assert v1.next_free_block is None
    v1.next_free_block = v2
    # repr names linked blocks by id (no recursion), anything else by repr.
    assert repr(v1) == (
        "Block(block_id=1, ref_cnt=0, block_hash=None, "
        f"block_hash_num_tokens=None, is_null=False, prev_free_block={head!r}, "
        "next_free_block=2)"
    )
    del head
    gc.collect()
    assert gone() is not None  # v1 still links it
    del b
    gc.collect()
    # The table dropped every link; the cycle head <-> v1 is gone with it.
    assert gone() is None


def test_a_view_kept_past_its_table_raises():
    b = T.Blocks(2)
    v = b[1]
    v.ref_cnt = 3
    del b
    gc.collect()
    assert v.block_id == 1
    assert repr(v) == "Block(block_id=1, detached)"
    for read in (
        lambda: v.ref_cnt,
        lambda: v.is_null,
        lambda: v.block_hash,
        lambda: v.block_hash_num_tokens,
        lambda: v.next_free_block,
        v.reset_hash,
    ):
        with pytest.raises(RuntimeError, match="Blocks object .* is gone"):
            read()
    with pytest.raises(RuntimeError, match="is gone"):
        v.ref_cnt = 1
    with pytest.raises(RuntimeError, match="is gone"):
        v.set_block_hash(b"k")


def test_views_of_another_module_instance_are_its_own_type():
    spec = importlib.util.find_spec("_tagma_C")
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    v = other.Blocks(2)[1]
    assert type(v) is other.Block and type(v) is not T.Block
    del v, other
    gc.collect()


def test_no_leak_over_repeated_use():
    key = b"k" * 32
    obj = Linked()

    def loop(n):
        for _ in range(n):
            b = T.Blocks(64)
            for v in b[::7]:
                v.ref_cnt += 1
                v.set_block_hash(key, 16)
                v.next_free_block = obj
                v.prev_free_block = b[0]
            b[7].reset_hash()
            with pytest.raises(ValueError):
                b[14].set_block_hash(key)
            del b

    loop(200)  # warm-up
    gc.collect()
    refs = (sys.getrefcount(key), sys.getrefcount(obj), sys.getrefcount(T.Block))
    loop(2000)
    gc.collect()
    assert (
        sys.getrefcount(key),
        sys.getrefcount(obj),
        sys.getrefcount(T.Block),
    ) == refs


def test_pool_is_held_weakly():
    pool = Linked()
    b = T.Blocks(3, pool=pool)
    v = b[2]
    assert v.pool is pool and b[0].pool is pool
    other = T.Blocks(3)
    assert other[1].pool is None
    gone = weakref.ref(pool)
    del pool
    gc.collect()
    # The views do not keep their pool alive (it would be a cycle the
    # collector cannot see: pool -> Blocks -> view -> pool).
    assert gone() is None and v.pool is None
    with pytest.raises(TypeError, match="weak reference"):
        T.Blocks(3, pool=5)
    with pytest.raises(AttributeError):
        v.pool = Linked()


def test_hand_out_takes_a_clean_range():
    b = T.Blocks(8)
    views = b.hand_out(2, 3)
    assert views == [b[2], b[3], b[4]]
    assert [v.ref_cnt for v in b] == [0, 0, 1, 1, 1, 0, 0, 0]
    assert b.hand_out(8, 0) == [] and b.hand_out(0, 0) == []


@pytest.mark.parametrize(
    "setup, args, match",
    [
        (lambda b: None, (7, 2), r"not a range of \[0, 8\)"),
        (lambda b: None, (-1, 2), "not a range"),
        (lambda b: None, (0, -1), "not a range"),
        (lambda b: setattr(b[5], "ref_cnt", 1), (3, 4), "block 5 .*ref_cnt=1"),
        (lambda b: b[4].set_block_hash(b"k"), (3, 4), "block 4 .*cached"),
        (lambda b: setattr(b[3], "is_null", True), (3, 4), "block 3 .*null"),
    ],
)
def test_hand_out_errors_change_nothing(setup, args, match):
    b = T.Blocks(8)
    setup(b)
    before = [(v.ref_cnt, v.block_hash, v.is_null) for v in b]
    with pytest.raises(ValueError, match=match):
        b.hand_out(*args)
    assert [(v.ref_cnt, v.block_hash, v.is_null) for v in b] == before


def test_hand_out_argument_types():
    b = T.Blocks(4)
    with pytest.raises(TypeError, match="must be an int"):
        b.hand_out("1", 1)
    with pytest.raises(TypeError, match="takes 2 positional arguments"):
        b.hand_out(1)
    assert [v.block_id for v in b.hand_out(np_int(1), True)] == [1]


def np_int(x):
    """An int-like that is not an int (as numpy's ints)."""

    class IntLike:
        def __index__(self):
            return x

    return IntLike()


SUFFIX = (3).to_bytes(4, "big")


def test_cache_full_sets_keys_and_fills_the_map():
    b = T.Blocks(10)
    blocks = [b[4], b[0], b[5], b[6]]
    b[0].is_null = True
    hashes = [b"h0", b"h1", b"h2", b"h3", b"h4"]
    entries = {}
    assert b.cache_full(entries, blocks, hashes, 0, 3, 16, SUFFIX) == 3
    # The null block is skipped; keys are hash + suffix, tokens (i + 1) * 16.
    assert [(v.block_hash, v.block_hash_num_tokens) for v in blocks] == [
        (b"h0" + SUFFIX, 16),
        (None, None),
        (b"h2" + SUFFIX, 48),
        (None, None),
    ]
    assert entries == {b"h0" + SUFFIX: b[4], b"h2" + SUFFIX: b[5]}
    assert hashes == [b"h0", b"h1", b"h2", b"h3", b"h4"]
    # The next block, on a later step.
    assert b.cache_full(entries, blocks, hashes, 3, 4, 16, SUFFIX) == 4
    assert entries[b"h3" + SUFFIX] is b[6] and b[6].block_hash_num_tokens == 64


def test_cache_full_shares_a_key_as_upstream_does():
    b = T.Blocks(10)
    key = b"h" + SUFFIX
    entries = {}
    for i, view in enumerate((b[1], b[2], b[3])):
        assert b.cache_full(entries, [view], [b"h"], 0, 1, 16, SUFFIX) == 1
        if i == 0:
            assert entries[key] is b[1]
    # Upstream's BlockHashToBlockMap: one block, then {block_id: block}.
    assert entries == {key: {1: b[1], 2: b[2], 3: b[3]}}
    # A key that holds the block already is left alone (the block's own key
    # stays None, as upstream's `contain` check leaves it).
    entries2 = {key: b[7]}
    assert b.cache_full(entries2, [b[7]], [b"h"], 0, 1, 16, SUFFIX) == 1
    assert entries2 == {key: b[7]} and b[7].block_hash is None
    entries3 = {key: {8: b[8]}}
    assert b.cache_full(entries3, [b[8]], [b"h"], 0, 1, 16, SUFFIX) == 1
    assert entries3 == {key: {8: b[8]}} and b[8].block_hash is None


def test_cache_full_stops_at_a_keyed_block():
    b = T.Blocks(6)
    b[2].set_block_hash(b"old", 8)
    entries = {}
    blocks = [b[1], b[2], b[3]]
    assert b.cache_full(entries, blocks, [b"a", b"b", b"c"], 0, 3, 16, SUFFIX) == 1
    assert list(entries) == [b"a" + SUFFIX]
    assert b[2].block_hash == b"old" and b[3].block_hash is None


@pytest.mark.parametrize(
    "args, error, match",
    [
        (({}, "x", [b"a"], 0, 1, 16, SUFFIX), TypeError, "lists"),
        (([], [0], [b"a"], 0, 1, 16, SUFFIX), TypeError, "must be a dict"),
        (({}, [0], [b"a"], 0, 1, 16, "s"), TypeError, "suffix bytes"),
        (({}, [0], [b"a"], 0, 2, 16, SUFFIX), ValueError, r"end=2.*1 blocks"),
        (({}, [0, 1], [b"a"], 0, 2, 16, SUFFIX), ValueError, "1 hashes"),
        (({}, [0], [b"a"], 1, 0, 16, SUFFIX), ValueError, "start=1"),
        (({}, [0], [b"a"], 0, 1, 0, SUFFIX), ValueError, "block_size >= 1"),
        (({}, [0, 1], [b"a", "b"], 0, 2, 16, SUFFIX), TypeError, r"hashes\[1\]"),
        (({}, [0, "other"], [b"a"] * 2, 0, 2, 16, SUFFIX), TypeError, r"blocks\[1\]"),
    ],
)
def test_cache_full_errors_change_nothing(args, error, match):
    b = T.Blocks(4)
    other = T.Blocks(4)
    entries, blocks, *rest = args
    if isinstance(blocks, list):
        blocks = [other[1] if x == "other" else b[x] for x in blocks]
    before = dict(entries) if isinstance(entries, dict) else entries
    with pytest.raises(error, match=match):
        b.cache_full(entries, blocks, *rest)
    assert entries == before
    assert [v.block_hash for v in b] == [None] * 4


def test_cache_full_checks_the_entry_it_merges_with():
    # An entry that is neither a block of this pool nor a dict is a broken
    # map: TypeError, as upstream's map raises on an unexpected entry.
    b = T.Blocks(4)
    entries = {b"h" + SUFFIX: "junk"}
    with pytest.raises(TypeError, match="not a Block of this pool"):
        b.cache_full(entries, [b[1]], [b"h"], 0, 1, 16, SUFFIX)
    assert entries == {b"h" + SUFFIX: "junk"} and b[1].block_hash is None


def test_cache_full_and_evict_do_not_leak():
    hashes = [bytes([i]) * 32 for i in range(16)]

    def loop(n):
        for _ in range(n):
            b = T.Blocks(40)
            entries = {}
            b.cache_full(entries, b[1:17], hashes, 0, 16, 16, SUFFIX)
            b.cache_full(entries, b[17:33], hashes, 0, 16, 16, SUFFIX)
            # Key i holds blocks 1 + i and 17 + i: the odd blocks are both
            # of each even key's (the key goes) and neither of an odd key's.
            assert b.evict(entries, b[1:33:2]) == list(range(1, 33, 2))
            assert len(entries) == 8
            del b, entries

    loop(50)
    gc.collect()
    refs = [sys.getrefcount(h) for h in hashes] + [sys.getrefcount(SUFFIX)]
    loop(500)
    gc.collect()
    assert [sys.getrefcount(h) for h in hashes] + [sys.getrefcount(SUFFIX)] == refs


def _cached(b, entries, ids, hashes):
    """Blocks `ids` of `b` prefix-cached under `hashes` (one each)."""
    for i, h in zip(ids, hashes, strict=True):
        assert b.cache_full(entries, [b[i]], [h], 0, 1, 16, SUFFIX) == 1


def test_evict_drops_keys_as_upstreams_map_pop_does():
    b = T.Blocks(10)
    entries = {}
    # 1 alone under a; 2 and 3 share b; 4 shares c with 5, which stays.
    _cached(b, entries, [1, 2, 3, 4, 5], [b"a", b"b", b"b", b"c", b"c"])
    a, k, c = (x + SUFFIX for x in (b"a", b"b", b"c"))
    assert entries == {a: b[1], k: {2: b[2], 3: b[3]}, c: {4: b[4], 5: b[5]}}
    # Block 6 has no key: left as it is, its id returned all the same.
    assert b.evict(entries, [b[1], b[2], b[4], b[6]]) == [1, 2, 4, 6]
    assert entries == {k: {3: b[3]}, c: {5: b[5]}}
    assert [b[i].block_hash for i in (1, 2, 4, 6)] == [None] * 4
    assert [b[i].block_hash_num_tokens for i in (1, 2, 4)] == [None] * 3
    assert b[3].block_hash == k and b[5].block_hash == c
    # The last block of a shared key takes the key with it.
    assert b.evict(entries, [b[3]]) == [3]
    assert entries == {c: {5: b[5]}}
    # A key holding another block is left; the block loses its key anyway
    # (upstream's _remove_cached_block_hashes resets it either way).
    b[7].set_block_hash(c, 16)
    assert b.evict(entries, [b[7]]) == [7]
    assert entries == {c: {5: b[5]}} and b[7].block_hash is None
    entries2 = {a: b[8]}
    b[9].set_block_hash(a, 16)
    assert b.evict(entries2, [b[9]]) == [9]
    assert entries2 == {a: b[8]}
    # A block listed twice is evicted once.
    assert b.evict(entries, [b[5], b[5]]) == [5, 5] and entries == {}
    # The null block is skipped, key and all.
    b[0].is_null = True
    b[0].set_block_hash(b"n", 16)
    entries3 = {b"n": b[0]}
    assert b.evict(entries3, [b[0]]) == [0]
    assert entries3 == {b"n": b[0]} and b[0].block_hash == b"n"


@pytest.mark.parametrize(
    "entries, blocks, error, match",
    [
        ([], [1], TypeError, "must be a dict"),
        ({}, (1,), TypeError, "blocks a list"),
        ({}, [1, "other"], TypeError, r"blocks\[1\] is .* not a Block of this pool"),
        ({}, [1, 5], TypeError, r"blocks\[1\] is <class 'int'>"),
    ],
)
def test_evict_errors_change_nothing(entries, blocks, error, match):
    b = T.Blocks(4)
    other = T.Blocks(4)
    real = {}
    _cached(b, real, [1, 2], [b"a", b"b"])
    before = dict(real)
    if isinstance(blocks, list):
        blocks = [other[1] if x == "other" else (x if x == 5 else b[x]) for x in blocks]
    with pytest.raises(error, match=match):
        b.evict(real if isinstance(entries, dict) else entries, blocks)
    assert real == before
    assert [v.block_hash for v in b] == [None, b"a" + SUFFIX, b"b" + SUFFIX, None]
    with pytest.raises(TypeError, match="takes 2 positional arguments"):
        b.evict(real)


def test_release_drops_references_and_sorts_the_freed_blocks():
    b = T.Blocks(8)
    b.hand_out(1, 6)
    b[0].is_null = True
    b[3].ref_cnt = 2  # shared
    b[4].set_block_hash(b"k4")
    b[6].set_block_hash(b"k6")
    foreign = Linked()
    blocks = iter([b[6], b[0], b[5], foreign, b[4], b[3], b[2]])
    clean, cached, watched, others = b.release(blocks, {5: 9, 6: 1, 3: 0})
    assert clean == [5, 2]
    assert cached == [b[6], b[4]]
    assert watched == [6, 5]  # freed keys of `watch`; block 3 is still held
    assert others == [foreign]
    assert [v.ref_cnt for v in b] == [0, 1, 0, 1, 0, 0, 0, 0]
    # A block listed twice reaches 0 once.
    b[3].ref_cnt = 2
    assert b.release([b[3], b[1], b[3]], None) == ([1, 3], [], [], [])


def test_release_errors_restore_every_count():
    b = T.Blocks(6)
    b.hand_out(1, 3)
    before = [v.ref_cnt for v in b]
    with pytest.raises(ValueError, match="block 4 is freed with ref_cnt 0"):
        b.release([b[1], b[2], b[4]], None)
    assert [v.ref_cnt for v in b] == before
    with pytest.raises(ValueError, match="block 3 is freed with ref_cnt 0"):
        b.release([b[3], b[3]], None)
    assert [v.ref_cnt for v in b] == before
    with pytest.raises(TypeError, match="watch must be a dict or None"):
        b.release([b[1]], [1])
    with pytest.raises(TypeError, match="not iterable"):
        b.release(5, None)
    assert [v.ref_cnt for v in b] == before


def test_release_does_not_leak():
    def loop(n):
        for _ in range(n):
            b = T.Blocks(40)
            b.hand_out(1, 30)
            for i in range(1, 31, 3):
                b[i].set_block_hash(b"k")
            b.release(b[1:31], {4: 1, 7: 2})
            del b

    loop(50)
    gc.collect()
    refs = sys.getrefcount(T.Block)
    loop(500)
    gc.collect()
    after = sys.getrefcount(T.Block)  # outside the assert: it holds its terms
    assert after == refs


class Req:
    """The request fields Blocks.allocate_batched reads (vLLM's Request)."""

    def __init__(self, request_id, num_computed_tokens, num_tokens, hashes=()):
        self.request_id = request_id
        self.num_computed_tokens = num_computed_tokens
        self.num_tokens = num_tokens
        self.block_hashes = list(hashes)


class Made:
    """Stands in for KVCacheBlocks: records what it was made with."""

    def __init__(self, blocks):
        self.blocks = blocks


def batched_books(b, owned):
    """The dicts allocate_batched reads and writes, for requests owning the
    given block-id runs (handed out): request id -> its views."""
    req_to_blocks = {}
    for rid, (start, length) in owned.items():
        req_to_blocks[rid] = b.hand_out(start, length)
    return {
        "req_to_blocks": req_to_blocks,
        "headroom": {},
        "num_cached_block": {},
        "held_slots": {},
        "batched_slots": {},
        "new_block_ids": [],
        "new_blocks": {},
        "entries": {},
    }


def call_batched(b, steps, books, start=0, *, caching=True, engine_caches=True):
    return b.allocate_batched(
        steps,
        start,
        books["req_to_blocks"],
        books["headroom"],
        books["num_cached_block"] if caching else None,
        books["held_slots"],
        books["batched_slots"],
        books["new_block_ids"],
        books["new_blocks"],
        Made,
        books["entries"] if engine_caches else None,
        SUFFIX,
        4,  # block size
        1000,  # max_model_len
    )


def test_allocate_batched_grows_into_the_headroom_and_caches():
    b = T.Blocks(20)
    books = batched_books(b, {"a": (1, 2), "c": (10, 1)})
    books["headroom"].update({2: 3, 10: 1})
    books["num_cached_block"].update({"a": 1, "c": 0})
    # a: 8 tokens known, computing the 9th: block 2 completes (cached), and
    # the step needs block 3, held by the headroom after block 2.
    a = Req("a", 8, 9, [b"h0", b"h1", b"h2"])
    # c: computing its 4th token completes block 10; no new block.
    c = Req("c", 3, 4, [b"k0"])
    steps = [(a, 1), (c, 1)]
    assert call_batched(b, steps, books) == (2, 1)
    assert [v.block_id for v in books["req_to_blocks"]["a"]] == [1, 2, 3]
    assert b[3].ref_cnt == 1
    assert books["headroom"] == {3: 2, 10: 1}
    assert books["new_block_ids"] == [3]
    made = books["new_blocks"]["a"]
    assert isinstance(made, Made) and made.blocks == ([b[3]],)
    assert list(books["new_blocks"]) == ["a"]
    # Cached: a's second block, c's first; counts as cache_full leaves them.
    assert books["entries"] == {b"h1" + SUFFIX: b[2], b"k0" + SUFFIX: b[10]}
    assert b[2].block_hash_num_tokens == 8 and b[10].block_hash_num_tokens == 4
    assert books["num_cached_block"] == {"a": 2, "c": 1}
    # Held: up to the token before the next block completes; promised: the
    # blocks, plus the next one where headroom holds it.
    assert books["held_slots"] == {"a": 11, "c": 4}
    assert books["batched_slots"] == {"a": 16, "c": 8}


def test_allocate_batched_without_caching_holds_every_slot():
    b = T.Blocks(10)
    books = batched_books(b, {"a": (1, 1)})
    books["headroom"][1] = 1
    a = Req("a", 4, 5, [b"h0"])
    assert call_batched(b, [(a, 1)], books, caching=False) == (1, 1)
    assert books["held_slots"] == {"a": 8} and books["batched_slots"] == {"a": 8}
    assert books["entries"] == {} and books["headroom"] == {}


@pytest.mark.parametrize(
    "case",
    [
        "no headroom",
        "next not clean",
        "two blocks",
        "keyed block",
        "no blocks",
        "short hashes",
        "foreign block",
        "not a tuple",
        "engine does not cache",
    ],
)
def test_allocate_batched_stops_at_a_step_it_cannot_take(case):
    b = T.Blocks(12)
    other = T.Blocks(12)
    books = batched_books(b, {"ok": (8, 1), "x": (1, 2)})
    books["headroom"].update({8: 2, 2: 2})
    books["num_cached_block"].update({"ok": 0, "x": 1})
    ok = Req("ok", 1, 2, [])
    # x computes its 9th token: caches block 2, grows into block 3.
    x = Req("x", 8, 9, [b"h0", b"h1"])
    step = (x, 1)
    engine_caches = True
    if case == "no headroom":
        del books["headroom"][2]
    elif case == "next not clean":
        b[3].set_block_hash(b"other")
    elif case == "two blocks":
        step = (x, 5)
    elif case == "keyed block":
        b[2].set_block_hash(b"old", 8)
    elif case == "no blocks":
        books["req_to_blocks"]["x"] = []
    elif case == "short hashes":
        x.block_hashes = [b"h0"]
    elif case == "foreign block":
        books["req_to_blocks"]["x"][1] = other[2]
    elif case == "not a tuple":
        step = [x, 1]
    else:
        engine_caches = False
    snapshot = {
        k: (dict(v) if isinstance(v, dict) else list(v)) for k, v in books.items()
    }
    snapshot["req_to_blocks"] = {k: list(v) for k, v in books["req_to_blocks"].items()}
    refs = [v.ref_cnt for v in b]
    keys = [v.block_hash for v in b]
    # The step before it is taken; x is left as it was, and the call says
    # where it stopped; from after x, the engine goes on.
    assert call_batched(
        b, [(ok, 1), step, (ok, 1)], books, engine_caches=engine_caches
    ) == (1, 0)
    assert books["held_slots"] == {"ok": 3}
    for key in (
        "headroom",
        "num_cached_block",
        "new_block_ids",
        "new_blocks",
        "entries",
    ):
        assert books[key] == snapshot[key], key
    assert {k: list(v) for k, v in books["req_to_blocks"].items()} == (
        snapshot["req_to_blocks"]
    )
    assert [v.ref_cnt for v in b] == refs and [v.block_hash for v in b] == keys
    assert call_batched(b, [(ok, 1), step, (ok, 1)], books, 2) == (3, 0)


@pytest.mark.parametrize(
    "index, value, error, match",
    [
        (0, {}, TypeError, "steps a list"),
        (2, [], TypeError, "req_to_blocks"),
        (4, [], TypeError, "num_cached_block a dict or None"),
        (7, {}, TypeError, "new_block_ids a list or None"),
        (9, 5, TypeError, "make_new callable"),
        (10, [], TypeError, "entries a dict or None"),
        (11, "s", TypeError, "suffix bytes"),
        (1, 5, ValueError, r"start=5.*1 steps"),
        (1, -1, ValueError, "start=-1"),
        (12, 0, ValueError, "block_size and max_model_len >= 1"),
        (13, "x", TypeError, "max_model_len must be an int"),
    ],
)
def test_allocate_batched_errors_change_nothing(index, value, error, match):
    b = T.Blocks(10)
    books = batched_books(b, {"a": (1, 1)})
    books["headroom"][1] = 1
    args = [
        [(Req("a", 4, 5, [b"h0"]), 1)], 0, books["req_to_blocks"],
        books["headroom"], books["num_cached_block"], books["held_slots"],
        books["batched_slots"], books["new_block_ids"], books["new_blocks"],
        Made, books["entries"], SUFFIX, 4, 1000,
    ]  # fmt: skip
    args[index] = value
    with pytest.raises(error, match=match):
        b.allocate_batched(*args)
    assert books["headroom"] == {1: 1} and books["held_slots"] == {}
    assert [v.block_id for v in books["req_to_blocks"]["a"]] == [1]
    assert [v.ref_cnt for v in b] == [0, 1] + [0] * 8
    with pytest.raises(TypeError, match="takes 14 positional arguments"):
        b.allocate_batched(*args[:13])


def test_allocate_batched_passes_a_request_error_on():
    class Broken:
        request_id = "a"
        num_computed_tokens = 4
        block_hashes = [b"h0"]

        @property
        def num_tokens(self):
            raise KeyError("num_tokens")

    b = T.Blocks(10)
    books = batched_books(b, {"a": (1, 1)})
    books["headroom"][1] = 1
    with pytest.raises(KeyError, match="num_tokens"):
        call_batched(b, [(Broken(), 1)], books)
    assert books["headroom"] == {1: 1} and b[2].ref_cnt == 0


def test_allocate_batched_does_not_leak():
    hashes = [bytes([i]) * 32 for i in range(8)]
    rid = "req-leak"

    def loop(n):
        for _ in range(n):
            b = T.Blocks(40)
            books = batched_books(b, {rid: (1, 1)})
            books["headroom"][1] = 20
            for t in range(4, 4 * 8, 4):
                # The step completing a block, then the one crossing it.
                req = Req(rid, t - 1, t, hashes)
                call_batched(b, [(req, 1)], books)
                req = Req(rid, t, t + 1, hashes)
                call_batched(b, [(req, 1)], books)
            del b, books

    def counts():
        held = [*hashes, SUFFIX, rid, Made, T.Block]
        return [sys.getrefcount(x) for x in held]

    loop(20)
    gc.collect()
    refs = counts()
    loop(200)
    gc.collect()
    after = counts()  # outside the assert: it holds its terms
    assert after == refs
