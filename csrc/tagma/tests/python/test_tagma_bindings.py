# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tests of the _tagma_C extension: every method, every error path (the
right exception, the object unchanged and still usable), the module's
stable-ABI build, and a leak check over 10^5 calls. The FreeRuns tests also
run against the pure-Python fallback (vllm/tagma/free_runs.py).
"""

import array
import copy
import gc
import glob
import importlib.util
import itertools
import os
import pathlib
import pickle
import random
import shutil
import subprocess
import sys
import tracemalloc
from contextlib import suppress

import _tagma_C as T
import numpy as np
import pytest
from conftest import EXT_DIR

# ------------------------------------------------------------------ helpers


def fr_state(f):
    return (f.runs(), f.num_free, f.largest_run)


def raises_unchanged(state, exc, fn, *args, match=None):
    """fn(*args) raises exc, and state() is the same before and after."""
    before = state()
    with pytest.raises(exc, match=match):
        fn(*args)
    assert state() == before


class Index:
    """An int by __index__ only, as numpy's ints are."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


# ----------------------------------------------------------------- module


def test_module_is_abi3():
    path = pathlib.Path(T.__file__)
    assert path.name == "_tagma_C.abi3.so"
    assert path.parent == EXT_DIR.resolve() or path.parent == EXT_DIR


def test_module_contents():
    assert T.MAX_BLOCKS == 2**31 - 2
    assert [n for n in dir(T) if not n.startswith("_")] == [
        "Block",
        "Blocks",
        "FreeRuns",
        "MAX_BLOCKS",
    ]
    cls = T.FreeRuns
    assert cls.__module__ == "vllm._tagma_C"
    assert cls.__doc__
    with pytest.raises(TypeError):
        cls.x = 1  # immutable type
    with pytest.raises(TypeError):

        class Sub(cls):  # not subclassable
            pass


def test_module_multi_phase_init_gives_independent_types():
    spec = importlib.util.find_spec("_tagma_C")
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    assert other is not T
    assert other.FreeRuns is not T.FreeRuns
    f = other.FreeRuns(4)
    f.add_range(0, 4)
    assert f.take(2) == [(0, 2)]
    del f, other
    gc.collect()


def _other_pythons(versions=("3.12", "3.13")):
    found = {}
    for v in versions:
        exe = shutil.which(f"python{v}")
        cands = [exe] if exe else []
        cands += sorted(
            glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}*/bin/python{v}"))
        )
        for c in cands:
            try:
                out = subprocess.run(
                    [c, "-c", "import sys; print(sys.version_info[:2])"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0:
                found[v] = c
                break
    return found


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_module_imports_under_newer_python(version):
    exe = _other_pythons().get(version)
    if exe is None:
        pytest.skip(f"no Python {version} here")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _tagma_C as t; "
        "f = t.FreeRuns(8); f.add_range(0, 8); print(sys.version_info[:2], "
        "f.take(3), t.__file__)"
    )
    out = subprocess.run(
        [exe, "-c", code, str(EXT_DIR)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "[(0, 3)]" in out.stdout and "abi3.so" in out.stdout


# --------------------------------------------------------------- FreeRuns


def test_free_runs_starts_empty(engine):
    f = engine.FreeRuns(16)
    assert (f.num_free, f.largest_run) == (0, 0)
    assert f.runs() == []
    assert 0 not in f
    assert f.take_after(-1, 4) == 0
    assert f.validate()
    assert repr(f) == "FreeRuns(num_blocks=16, num_free=0, num_runs=0)"


@pytest.mark.parametrize("args", [(0,), (-1,), (T.MAX_BLOCKS + 1,), (2**70,)])
def test_free_runs_constructor_errors(engine, args):
    with pytest.raises(ValueError, match=r"FreeRuns"):
        engine.FreeRuns(*args)


def test_free_runs_is_final_and_not_picklable(engine):
    # The stub's @final, and no copy of an object whose state Python does
    # not see; the fallback must not quietly allow either.
    with pytest.raises(TypeError, match="not an acceptable base type"):

        class Sub(engine.FreeRuns):
            pass

    f = engine.FreeRuns(8)
    for fn in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot pickle"):
            fn(f)


def test_free_runs_constructor_types(engine):
    assert repr(engine.FreeRuns(num_blocks=8)).startswith("FreeRuns(num_blocks=8,")
    assert repr(engine.FreeRuns(np.int64(8))).startswith("FreeRuns(num_blocks=8,")
    with pytest.raises(TypeError):
        engine.FreeRuns("8")
    with pytest.raises(TypeError):
        engine.FreeRuns(8.0)
    with pytest.raises(TypeError):
        engine.FreeRuns()
    with pytest.raises(TypeError):
        engine.FreeRuns(8, 1)


def test_free_runs_add_coalesces(engine):
    f = engine.FreeRuns(16)
    f.add([3, 1, 2])
    assert f.runs() == [(1, 3)]
    f.add((5, 9, 8))
    assert f.runs() == [(1, 3), (5, 1), (8, 2)]
    f.add(iter([4]))  # any iterable
    assert f.runs() == [(1, 5), (8, 2)]
    f.add(range(10, 12))
    f.add([])
    assert f.runs() == [(1, 5), (8, 4)]
    assert (f.num_free, f.largest_run, len(f.runs())) == (9, 5, 2)
    assert f.validate()


@pytest.mark.parametrize(
    "make",
    [
        lambda v: np.array(v, dtype=np.uint32),
        lambda v: np.array(v, dtype=np.int32),
        lambda v: np.array(v, dtype=np.int64),
        lambda v: np.array(v, dtype=np.uint64),
        lambda v: array.array("I", v),
        lambda v: array.array("i", v),
        lambda v: array.array("q", v),
        lambda v: memoryview(array.array("I", v)),
        lambda v: np.repeat(np.array(v, dtype=np.int64), 2)[::2],  # strided
        lambda v: [np.int64(x) for x in v],
    ],
)
def test_free_runs_add_buffers(engine, make):
    f = engine.FreeRuns(64)
    f.add(make([7, 5, 6, 40]))
    assert f.runs() == [(5, 3), (40, 1)]
    f.add(make([39, 8]))
    assert f.runs() == [(5, 4), (39, 2)]
    assert f.validate()


def test_free_runs_add_buffer_errors_leave_state_unchanged(engine):
    f = engine.FreeRuns(16)
    f.add_range(2, 3)
    st = lambda: fr_state(f)  # noqa: E731
    raises_unchanged(st, TypeError, f.add, np.array([1.0, 2.0]), match="format")
    raises_unchanged(st, TypeError, f.add, b"\x00\x01")
    raises_unchanged(
        st,
        ValueError,
        f.add,
        np.array([1, -1], dtype=np.int32),
        match=r"block out of range: block -1 not in \[0, 16\)",
    )
    raises_unchanged(
        st, ValueError, f.add, np.array([2**40], dtype=np.int64), match="out of range"
    )
    raises_unchanged(
        st, ValueError, f.add, np.array([2**63], dtype=np.uint64), match="out of range"
    )
    raises_unchanged(
        st,
        ValueError,
        f.add,
        np.array([16], dtype=np.uint32),
        match=r"block 16 not in \[0, 16\)",
    )
    raises_unchanged(
        st, ValueError, f.add, np.array([0, 0], dtype=np.uint32), match="twice"
    )
    f.add(np.array([0, 1], dtype=np.uint32))  # still usable
    assert f.runs() == [(0, 5)]


def test_free_runs_add_errors_leave_state_unchanged(engine):
    f = engine.FreeRuns(16)
    f.add_range(2, 3)
    f.add_range(10, 2)
    st = lambda: fr_state(f)  # noqa: E731
    raises_unchanged(
        st,
        ValueError,
        f.add,
        [0, 16],
        match=r"FreeRuns.add\(<2 ids>\): block out of range: block 16 not in \[0, 16\)",
    )
    raises_unchanged(st, ValueError, f.add, [0, -1], match=r"block -1 not in \[0, 16\)")
    raises_unchanged(st, ValueError, f.add, [2**64], match="out of range")
    raises_unchanged(
        st, ValueError, f.add, [7, 6, 7], match="the same block twice: block 7"
    )
    raises_unchanged(
        st, ValueError, f.add, [0, 1, 9, 10], match="block already free: block 10"
    )
    raises_unchanged(st, TypeError, f.add, [0, "1"], match=r"ids\[1\] must be an int")
    raises_unchanged(st, TypeError, f.add, [0, 1.5])
    raises_unchanged(st, TypeError, f.add, 5, match="iterable")
    raises_unchanged(st, TypeError, f.add)
    raises_unchanged(st, TypeError, f.add, [1], [2])
    with pytest.raises(TypeError):
        f.add(ids=[1])  # positional only
    f.add([0, 1])
    assert f.runs() == [(0, 5), (10, 2)]


def test_free_runs_add_range(engine):
    f = engine.FreeRuns(16)
    f.add_range(4, 4)
    f.add_range(0, 4)
    f.add_range(8, 8)
    assert f.runs() == [(0, 16)]
    assert f.validate()


def test_free_runs_add_range_errors_leave_state_unchanged(engine):
    f = engine.FreeRuns(16)
    f.add_range(2, 3)
    st = lambda: fr_state(f)  # noqa: E731
    raises_unchanged(st, ValueError, f.add_range, 0, 0, match="zero count")
    raises_unchanged(st, ValueError, f.add_range, 0, -1, match="length must be >= 0")
    raises_unchanged(st, ValueError, f.add_range, -1, 2, match="out of range")
    raises_unchanged(st, ValueError, f.add_range, 15, 2, match="out of range")
    raises_unchanged(st, ValueError, f.add_range, 0, 2**63 - 1, match="out of range")
    raises_unchanged(st, ValueError, f.add_range, 0, 2**64, match="int64")
    raises_unchanged(
        st,
        ValueError,
        f.add_range,
        0,
        3,
        match=r"FreeRuns.add_range\(start=0, length=3\): block already free: block 2",
    )
    raises_unchanged(st, TypeError, f.add_range, 0, "3")
    raises_unchanged(st, TypeError, f.add_range, 0)
    f.add_range(0, 2)
    assert f.runs() == [(0, 5)]


def test_free_runs_take_after(engine):
    f = engine.FreeRuns(16)
    f.add_range(4, 4)
    f.add_range(10, 6)
    assert f.take_after(3, 2) == 2
    assert f.take_after(5, 9) == 2
    assert f.take_after(7, 1) == 0  # block 8 not free
    assert f.take_after(10, 2) == 2  # from inside a run
    assert f.runs() == [(10, 1), (13, 3)]
    assert f.take_after(15, 1) == 0  # the last block: nothing after it
    assert f.take_after(12, 0) == 0
    assert f.take_after(12, 2**63 - 1) == 3
    assert f.runs() == [(10, 1)]
    before = fr_state(f)
    with pytest.raises(
        ValueError, match=r"take_after\(block=9, n=-1\).*n must be >= 0"
    ):
        f.take_after(9, -1)
    with pytest.raises(TypeError):
        f.take_after(9)
    assert fr_state(f) == before
    assert f.take_after(9, 1) == 1


@pytest.mark.parametrize("block", [16, 99, -2, -5, 2**63, 2**64, -(2**64)])
def test_free_runs_take_after_out_of_range_block_raises(engine, block):
    # It returned 0, as if the block were merely not followed by free ones.
    f = engine.FreeRuns(16)
    f.add_range(0, 16)
    raises_unchanged(
        lambda: fr_state(f),
        ValueError,
        f.take_after,
        block,
        1,
        match=(
            rf"FreeRuns.take_after\(block={block}, n=1\): "
            rf"block out of range: block {block} not in \[-1, 16\)"
        ),
    )
    raises_unchanged(
        lambda: fr_state(f), TypeError, f.take_after, 1.0, 1, match="block must be"
    )
    assert f.take_after(-1, 2) == 2  # -1: from block 0 on
    assert f.take_after(15, 1) == 0  # the last block: nothing after it
    assert f.runs() == [(2, 14)]


def test_free_runs_take_best_fit_lowest_address(engine):
    f = engine.FreeRuns(64)
    for s, n in [(0, 4), (7, 6), (20, 6), (30, 34)]:
        f.add_range(s, n)
    assert f.take(5) == [(7, 5)]
    assert f.take(6) == [(20, 6)]
    assert f.take(4, 1) == [(0, 4)]
    assert f.take(1) == [(12, 1)]
    assert f.take(34) == [(30, 34)]
    assert f.num_free == 0


def test_free_runs_take_multi_range(engine):
    f = engine.FreeRuns(20)
    for s, n in [(0, 3), (4, 5), (10, 2), (13, 4)]:
        f.add_range(s, n)
    assert f.take(12, 3) == [(4, 5), (13, 4), (0, 3)]
    assert f.runs() == [(10, 2)]
    assert f.validate()


def test_free_runs_take_errors_leave_state_unchanged(engine):
    f = engine.FreeRuns(20)
    for s, n in [(0, 3), (4, 5), (10, 2), (13, 4)]:
        f.add_range(s, n)
    st = lambda: fr_state(f)  # noqa: E731
    raises_unchanged(
        st,
        MemoryError,
        f.take,
        15,
        match=(
            r"FreeRuns.take\(n=15, max_ranges=256\): "
            r"out of memory: 14 free blocks, largest run 5"
        ),
    )
    raises_unchanged(st, MemoryError, f.take, 2**62)
    raises_unchanged(
        st,
        ValueError,
        f.take,
        12,
        2,
        match=r"too many ranges: 12 blocks need more than 2 ranges",
    )
    raises_unchanged(st, ValueError, f.take, 0, match="zero count")
    raises_unchanged(st, ValueError, f.take, -1, match="n must be >= 0")
    raises_unchanged(st, ValueError, f.take, 1, 0, match="max_ranges must be >= 1")
    raises_unchanged(st, TypeError, f.take, 1.0)
    raises_unchanged(st, TypeError, f.take)
    raises_unchanged(st, TypeError, f.take, 1, 2, 3)
    assert len(f.take(14, 4)) == 4
    assert f.num_free == 0


def test_free_runs_contains_and_properties(engine):
    f = engine.FreeRuns(8)
    f.add([1, 2])
    assert 1 in f and 2 in f and 0 not in f
    assert -1 not in f and 8 not in f and 2**80 not in f
    assert np.int64(1) in f and True in f  # ints by __index__
    with pytest.raises(AttributeError):
        f.num_free = 3
    assert f.runs() == [(1, 2)]


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        (np.array([2**63], dtype=np.uint64), 2**63),
        (np.array([2**64 - 1], dtype=np.uint64), 2**64 - 1),
        (np.array([-1], dtype=np.int64).view(np.uint64), 2**64 - 1),
        (np.array([2**32], dtype=np.uint64), 2**32),
        (np.array([2**32], dtype=np.int64), 2**32),
        (np.array([-(2**63)], dtype=np.int64), -(2**63)),
        (np.array([-1], dtype=np.int32), -1),
        ([2**64], 2**64),
        ([2**63], 2**63),
        ([-1], -1),
        ([np.uint64(2**64 - 1)], 2**64 - 1),
        ([Index(-(2**64))], -(2**64)),
    ],
)
def test_free_runs_out_of_range_ids_reported_as_passed(engine, data, shown):
    # A uint64 id above int64 (2**63; 2**64 - 1, numpy's -1) was reported as
    # "block -1"; every id that does not fit is now named as passed, in the
    # words of the engine's own range error (ids >= num_blocks).
    f = engine.FreeRuns(16)
    f.add_range(2, 3)
    st = lambda: fr_state(f)  # noqa: E731
    raises_unchanged(
        st,
        ValueError,
        f.add,
        data,
        match=(
            rf"^FreeRuns.add\(<1 ids>\): block out of range: "
            rf"block {shown} not in \[0, 16\)$"
        ),
    )


def _free_runs_8(engine):
    f = engine.FreeRuns(8)
    f.add([1, 2])
    return f


_NOT_INTS = {
    "str": "1",
    "bytes": b"1",
    "float": 1.0,
    "float-1.5": 1.5,
    "None": None,
    "tuple": (1,),
    "list": [1],
    "object": object(),
    "complex": 1j,
    "np.float64": np.float64(1),
}


def _check_contains_non_int(obj, key):
    assert (key in obj) is False
    assert key not in obj
    assert 1 in obj and Index(1) in obj and np.int64(1) in obj


@pytest.mark.parametrize("key", list(_NOT_INTS.values()), ids=list(_NOT_INTS))
def test_free_runs_contains_non_int_is_false(engine, key):
    # The stub's __contains__ takes any object; `"1" in obj` raised TypeError.
    _check_contains_non_int(_free_runs_8(engine), key)


class _BadIndex:
    def __index__(self):
        raise RuntimeError("boom")


def test_free_runs_contains_index_error_propagates(engine):
    with pytest.raises(RuntimeError, match="boom"):
        _BadIndex() in _free_runs_8(engine)  # noqa: B015


def test_free_runs_ids_whose_index_calls_back(engine):
    # An id's __index__ that calls add on the same object reused the
    # vector the outer call was filling: blocks 1, 2, 3 were silently lost.
    f = engine.FreeRuns(16)

    class AddsTen:
        def __index__(self):
            f.add([10])
            return 0

    f.add([AddsTen(), 1, 2, 3])
    assert f.runs() == [(0, 4), (10, 1)]
    assert f.validate()


def test_free_runs_id_dropped_by_its_own_index(engine):
    # The out-of-range message printed an item the list no longer held (its
    # __index__ had cleared the list): a use after free, a crash. In a child
    # process, so that the old crash fails this test only. The engine is
    # loaded by its file: _tagma_C.abi3.so or free_runs.py.
    path = pathlib.Path(engine.__file__)
    code = (
        "import sys, importlib.util as u\n"
        "s = u.spec_from_file_location(sys.argv[2], sys.argv[1])\n"
        "t = u.module_from_spec(s); s.loader.exec_module(t)\n"
        "class Id:\n"
        "    def __init__(self, owner): self.owner = owner\n"
        "    def __index__(self): self.owner.clear(); return 2**40\n"
        "f = t.FreeRuns(16)\n"
        "for _ in range(100):\n"
        "    ids = []\n"
        "    ids.append(Id(ids))\n"
        "    try: f.add(ids)\n"
        "    except ValueError as e: msg = str(e)\n"
        "print(msg)\n"
    )
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-c", code, str(path), path.name.split(".")[0]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "block out of range: block 1099511627776 not in [0, 16)" in out.stdout


# ------------------------------------------- FreeRuns: the Python engine
# vllm.tagma falls back to vllm/tagma/free_runs.py when _tagma_C cannot load.
# Every FreeRuns test above runs against both engines; these check that the
# two agree on random call sequences, and what only the Python one needs.


def test_free_runs_python_engine_has_the_same_interface(py_engine):
    assert py_engine.MAX_BLOCKS == T.MAX_BLOCKS

    def public(cls):
        return {n for n in dir(cls) if not n.startswith("_")} | {
            n for n in ("__contains__", "__repr__") if n in vars(cls)
        }

    assert public(T.FreeRuns) == {
        "add",
        "add_range",
        "take_after",
        "take",
        "runs",
        "validate",
        "num_free",
        "largest_run",
        "__contains__",
        "__repr__",
    }

    assert public(py_engine.FreeRuns) == public(T.FreeRuns)


@pytest.mark.parametrize("version", ["current", "3.10"])
def test_free_runs_python_engine_is_stdlib_only(py_engine, version):
    # The fallback serves Pythons that cannot load _tagma_C (3.10 among
    # them), and must load without vLLM, torch or numpy.
    path = py_engine.__file__  # first: without the engine, fail, not skip
    exe = sys.executable
    if version != "current":
        exe = _other_pythons((version,)).get(version)
        if exe is None:
            pytest.skip(f"no Python {version} here")
    code = (
        "import sys, importlib.util as u\n"
        "s = u.spec_from_file_location('free_runs', sys.argv[1])\n"
        "t = u.module_from_spec(s); s.loader.exec_module(t)\n"
        "f = t.FreeRuns(64); f.add_range(1, 40); f.add([50, 51, 52, 53])\n"
        "assert f.take(4) == [(50, 4)] and f.take_after(1, 5) == 5, f.runs()\n"
        "assert f.take(34, 1) == [(7, 34)], f.runs()\n"
        "bad = {'vllm', 'torch', 'numpy'} & {m.split('.')[0] for m in sys.modules}\n"
        "print(sys.version_info[:2], f.runs(), f.validate(), sorted(bad))\n"
    )
    out = subprocess.run(
        [exe, "-X", "dev", "-c", code, path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("[(1, 1)] True []"), out.stdout


def test_free_runs_python_validate_finds_broken_invariants(py_engine):
    def make():
        f = py_engine.FreeRuns(32)
        f.add_range(1, 6)
        f.add_range(10, 4)
        f.add_range(20, 1)
        assert f.validate()
        return f

    def touching(f):  # two runs that touch: not coalesced
        f._len[1] = 9

    def unsorted(f):
        f._starts.reverse()

    def stale_fit(f):
        f._fit.pop()

    def extra_fit(f):
        f._fit.append(1 << 32 | 20)

    def wrong_count(f):
        f._free += 1

    def empty_run(f):
        f._len[20] = 0

    def past_the_end(f):
        f._starts.append(31)
        f._len[31] = 2

    for breaks in (
        touching,
        unsorted,
        stale_fit,
        extra_fit,
        wrong_count,
        empty_run,
        past_the_end,
    ):
        f = make()
        breaks(f)
        assert not f.validate(), breaks.__name__


def _gaps(runs, n):
    """The (start, length) of the blocks that are not free, by address."""
    out, prev = [], 0
    for s, length in runs:
        if s > prev:
            out.append((prev, s - prev))
        prev = s + length
    if prev < n:
        out.append((prev, n - prev))
    return out


def _id_forms(ids):
    """The forms the binding reads ids in that can hold these values."""
    lo, hi = (min(ids), max(ids)) if ids else (0, 0)
    forms = [list, tuple, lambda v: iter(list(v))]
    if lo >= 0 and hi < 2**32:
        forms += [
            lambda v: np.array(v, dtype=np.uint32),
            lambda v: array.array("I", v),
            lambda v: memoryview(array.array("I", v)),
        ]
    if lo >= -(2**31) and hi < 2**31:
        forms += [lambda v: np.array(v, dtype=np.int32)]
    if lo >= -(2**63) and hi < 2**63:
        forms += [
            lambda v: np.array(v, dtype=np.int64),
            lambda v: np.repeat(np.array(v, dtype=np.int64), 2)[::2],  # strided
            lambda v: array.array("q", v),
            lambda v: [np.int64(x) for x in v],
        ]
    if lo >= 0 and hi < 2**64:
        forms += [lambda v: np.array(v, dtype=np.uint64)]
    return forms


def _random_ids(rng, n, spans):
    """Ids mostly from the spans (the runs or the gaps), sometimes wrong."""
    ids = []
    if spans:
        s, length = rng.choice(spans)
        a = rng.randrange(s, s + length)
        k = rng.choice([1, 1, 2, 3, 8, length])
        ids = list(range(a, min(a + k, s + length)))
        if rng.random() < 0.1:
            ids += [rng.randrange(s, s + length) for _ in range(2)]  # repeats
        rng.shuffle(ids)
    r = rng.random()
    if r < 0.15:
        ids.insert(rng.randrange(len(ids) + 1), rng.randrange(n))  # any block
    elif r < 0.2:  # one or two out of range: the first given is named
        bad = [n, n + 7, -1, 2**31, 2**32, 2**63, 2**64 - 1]
        for _ in range(rng.randint(1, 2)):
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(bad))
    elif r < 0.22:
        ids.append(rng.choice(["1", 1.5, None]))
        return lambda: list(ids)
    form = rng.choice(_id_forms(ids))
    return lambda: form(ids)


def _random_call(rng, f, n):
    """(method, args) for a random call on f (of n blocks), mostly one that
    succeeds."""
    runs = f.runs()
    gaps = _gaps(runs, n)
    op = rng.choices(["add", "add_range", "take", "take_after"], weights=[4, 3, 4, 4])[
        0
    ]
    if op == "add":
        return op, [_random_ids(rng, n, gaps if rng.random() < 0.8 else runs)]
    if op == "add_range":
        if gaps and rng.random() < 0.8:
            s, length = rng.choice(gaps)
            start = rng.randrange(s, s + length)
            return op, [start, rng.randint(1, s + length - start)]
        return op, [rng.randint(-2, n + 1), rng.choice([-1, 0, 1, 3, n, 2**62])]
    if op == "take":
        r = rng.random()
        if r < 0.8:
            k = rng.choice([1, 1, 2, 3, 5, 8, 16, max(1, n // 4)])
        else:
            k = rng.choice([0, -1, n + 1, 2**40, f.num_free])
        if rng.random() < 0.5:
            return op, [k]
        return op, [k, rng.choice([1, 2, 3, 4, 256, 0, -1])]
    # take_after: mostly the block right before a run (growth in place)
    if runs and rng.random() < 0.7:
        s, length = rng.choice(runs)
        block = s - 1 if rng.random() < 0.8 else rng.randrange(s, s + length) - 1
    else:
        block = rng.randint(-3, n + 1)
    return op, [block, rng.choice([0, 1, 2, 3, 2**63 - 1, -1, rng.randrange(n)])]


def _outcome(f, method, args):
    try:
        return ("ok", getattr(f, method)(*args))
    except (ValueError, MemoryError, TypeError) as e:
        return (type(e).__name__, str(e))


def _lockstep(py_engine, rng, n, steps):
    c, p = T.FreeRuns(n), py_engine.FreeRuns(n)
    if rng.random() < 0.5:
        c.add_range(0, n)
        p.add_range(0, n)
    for step in range(steps):
        method, args = _random_call(rng, c, n)
        made = [x() if callable(x) else x for x in args]
        made_again = [x() if callable(x) else x for x in args]
        want = _outcome(c, method, made)
        got = _outcome(p, method, made_again)
        where = f"step {step}: {method}{tuple(made)} on FreeRuns({n})"
        assert got == want, where
        assert fr_state(p) == fr_state(c), where
        assert repr(p) == repr(c), where
        assert p.validate() and c.validate(), where
        b = rng.randint(-1, n)
        assert (b in p) == (b in c), where


@pytest.mark.parametrize("seed", range(24))
def test_free_runs_engines_agree_random(py_engine, seed):
    # The same random calls, errors included, on the C++ and the Python
    # engine: the same results or exceptions (type and message), the same
    # runs after every call, and both valid.
    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 16, 64, 100, 257])
    _lockstep(py_engine, rng, n, 400)


def test_free_runs_engines_agree_fragmented(py_engine):
    # Many runs: the best-fit index and the multi-range fallback at scale.
    rng = random.Random(1)
    n = 100_000
    c, p = T.FreeRuns(n), py_engine.FreeRuns(n)
    holes = set(rng.sample(range(n), 3_000))
    for f in (c, p):
        f.add([b for b in range(n) if b not in holes])
    assert fr_state(p) == fr_state(c)
    for k in itertools.islice(itertools.cycle([1, 3, 16, 64, 200, 1000]), 300):
        want, got = _outcome(c, "take", [k, 4]), _outcome(p, "take", [k, 4])
        assert got == want, k
        if want[0] == "ok" and rng.random() < 0.5:
            back = [b for s, length in want[1] for b in range(s, s + length)]
            rng.shuffle(back)
            c.add(back)
            p.add(back)
    assert fr_state(p) == fr_state(c)
    assert p.validate() and c.validate()


# ------------------------------------------------------------- leak check

N = 100_000


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _loop(f, ids):
    for _ in range(N):
        r = f.take(1)
        f.add([r[0][0]])
        f.add(ids)
        f.take_after(3999, 10)
        (start, length), *_ = f.take(3, 4)
        f.add_range(start, length)
        f.add_range(0, f.take_after(-1, 2))
        with suppress(MemoryError):
            f.take(10**6)
        with suppress(ValueError):
            f.add([0])  # already free
        with suppress(ValueError):
            f.take_after(10**6, 1)  # block out of range
        with suppress(ValueError):
            f.add([2**64])  # id beyond uint64, named in the message
        with suppress(ValueError):
            f.add_range(0, 0)  # zero count
        with suppress(TypeError):
            f.add(["x"])
        assert "x" not in f
        with suppress(ValueError):
            f.take(2, 0)  # max_ranges < 1
        f.runs()


def test_leak_no_growth_over_1e5_calls():
    f = T.FreeRuns(4096)
    f.add_range(0, 4000)
    ids = np.arange(4000, 4010, dtype=np.uint32)
    objs = {"f": f, "ids": ids}

    _loop(f, ids)  # warm-up: caches, free lists, interned ints
    gc.collect()
    refs = {n: sys.getrefcount(o) for n, o in objs.items()}
    rss0 = _rss_kib()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    mem0 = tracemalloc.get_traced_memory()[0]
    _loop(f, ids)
    gc.collect()
    mem1 = tracemalloc.get_traced_memory()[0]
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    rss1 = _rss_kib()

    grown = mem1 - mem0
    top = snap1.compare_to(snap0, "lineno")[:3]
    print(
        f"leak check: {N} iterations x 17 calls; traced Python memory "
        f"{grown:+d} B, RSS {rss1 - rss0:+d} KiB, refcounts "
        f"{ {n: sys.getrefcount(o) - refs[n] for n, o in objs.items()} }"
    )
    assert {n: sys.getrefcount(o) for n, o in objs.items()} == refs
    # tracemalloc's own bookkeeping is a few KiB; a leak of one object per
    # call would be >= 1.6 MB here.
    assert grown < 64 * 1024, top
    if "asan" not in os.environ.get("LD_PRELOAD", ""):  # ASan's quarantine
        assert rss1 - rss0 < 2048
    assert f.validate()
    assert f.runs() == [(0, 4000)]


def test_leak_returned_objects_have_one_reference():
    f = T.FreeRuns(64)
    f.add_range(0, 64)

    def refs(fn, *args):
        obj = fn(*args)
        return sys.getrefcount(obj)  # 2: the name + the argument

    for fn, args in ((f.take, (3,)), (f.runs, ()), (repr, (f,))):
        assert refs(fn, *args) == 2, fn
    # Computed outside `assert`: pytest's rewriting holds temporaries.
    t = f.take(2)
    n_take = sys.getrefcount(t[0])  # the list + the argument
    r = f.runs()
    n_run = sys.getrefcount(r[0])
    e = None
    try:
        f.take(10**6)
    except MemoryError as exc:
        e = exc
    n_exc = sys.getrefcount(e)
    assert (n_take, n_run, n_exc) == (2, 2, 2)
