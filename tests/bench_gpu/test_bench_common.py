# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""scripts/bench/common.py: the run order of the in-process A/B benches."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/bench"))

import common  # noqa: E402


def _back_to_back(order: list[str]) -> Counter:
    """Which variant ran second of two consecutive runs of itself."""
    return Counter(b for a, b in zip(order, order[1:], strict=False) if a == b)


def test_mirrored_order_cancels_drift_per_repeat():
    variants = ["paged", "tagma", "x"]
    order = common.mirrored_order(variants, 3)
    assert len(order) == 18
    for rep in range(3):
        block = order[6 * rep : 6 * rep + 6]
        assert block == block[::-1]
        # Mean position of every variant is the block's middle.
        sums = {sum(i for i, v in enumerate(block) if v == name) for name in variants}
        assert sums == {5}


def test_mirrored_order_shares_the_back_to_back_place():
    """The second run of a back-to-back pair can be the slower in one
    process; over k repeats each of k variants gets it equally often."""
    assert common.mirrored_order(["paged", "tagma"], 1) == [
        "paged", "tagma", "tagma", "paged"
    ]  # fmt: skip
    for variants in (["paged", "tagma"], ["paged", "tagma", "x"]):
        k = len(variants)
        order = common.mirrored_order(variants, 2 * k)
        assert Counter(order) == {v: 4 * k for v in variants}
        counts = _back_to_back(order)
        assert set(counts) == set(variants)
        assert len(set(counts.values())) == 1, counts


def test_variant_class_names_the_choices_and_imports_module_dot_class():
    named = {"a": "collections:Counter", "b": "pathlib:Path"}
    assert common.variant_class("a", named) is Counter
    assert common.variant_class("collections.OrderedDict", named).__name__ == (
        "OrderedDict"
    )
    with pytest.raises(SystemExit, match="unknown variant 'pagd': a, b or module"):
        common.variant_class("pagd", named)
