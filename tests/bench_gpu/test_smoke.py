# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""scripts/gpu/smoke_e2e.py's verdict (the GPU runs the engines; this checks
what it concludes from their results)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/gpu"))
import smoke_e2e  # noqa: E402

IDS = [[1, 2, 3], [4, 5]]


def _result(backend: str, phase: str, **kw) -> dict:
    return {
        "backend": backend,
        "phase": phase,
        "first": IDS,
        "second": IDS,
        "preemptions": 3 if phase == "preempt" else None,
        "idle_state": (
            {"usage": 0.0, "validate": "ok" if backend == "tagma" else None}
            if phase == "preempt"
            else None
        ),
    } | kw


def test_equal_ids_pass():
    assert smoke_e2e.compare(_result("paged", "plain"), _result("tagma", "plain")) == 0
    paged, tagma = _result("paged", "preempt"), _result("tagma", "preempt")
    assert smoke_e2e.compare(paged, tagma) == 0


def test_different_ids_fail(capsys):
    tagma = _result("tagma", "plain", second=[[1, 2, 9], [4, 5]])
    assert smoke_e2e.compare(_result("paged", "plain"), tagma) == 1
    assert (
        "equal with prefix-cache hits (second pass): False" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "state",
    [
        {"usage": 0.0, "validate": "tagma: block 7 has ref_cnt 1, held 0 times"},
        {"usage": 0.25, "validate": "ok"},
        None,
    ],
)
def test_preempt_phase_needs_a_clean_tagma_state_once_idle(state, capsys):
    paged = _result("paged", "preempt")
    tagma = _result("tagma", "preempt", idle_state=state)
    assert smoke_e2e.compare(paged, tagma) == 1
    assert "not clean once idle" in capsys.readouterr().out


def test_preempt_phase_needs_preemption(capsys):
    paged = _result("paged", "preempt", preemptions=0)
    assert smoke_e2e.compare(paged, _result("tagma", "preempt")) == 1
    assert "did not force preemption" in capsys.readouterr().out
