# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""scripts/bench/alloc_calls.py (`make bench-alloc`) on the patched tree: the
calls it times are the ones the held-slots hook leaves, two in 16 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("alloc_calls", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
times = bench.one_run(bench.manager_cls(sys.argv[2]), 32, 64)
print(json.dumps({k: [len(v), min(v)] for k, v in times.items()}))
"""


def run_script(script: str, *args: str) -> dict:
    """Run a driver in a fresh interpreter (vLLM's import-time state stays
    out of this process) and return the JSON it prints last."""
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail("needs `make build-fork` (vllm importable from the pin's venv)")
    r = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", ["paged", "tagma"])
def test_each_request_makes_one_call_of_each_kind_per_block(variant):
    counts = run_script(DRIVER, str(ROOT / "scripts/bench/alloc_calls.py"), variant)
    # 32 requests, 64 decode steps: every request completes 4 blocks (held
    # call: its blocks hold the token, the block is cached) and needs 4 new
    # ones (boundary call); the other 56 steps make no call.
    assert counts["held"][0] == 32 * 4
    assert counts["boundary"][0] == 32 * 4
    assert counts["held"][1] > 0 and counts["boundary"][1] > 0


def test_an_unknown_variant_is_named():
    sys.path.insert(0, str(ROOT / "scripts/bench"))
    try:
        import alloc_calls
    finally:
        sys.path.pop(0)
    with pytest.raises(SystemExit, match="unknown variant 'pagd'"):
        alloc_calls.manager_cls("pagd")


WALKS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import alloc_calls
from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
walks = []
base = KVCacheCoordinator.get_num_blocks_to_allocate

def counting(self, *a, **k):
    walks.append(1)
    return base(self, *a, **k)

KVCacheCoordinator.get_num_blocks_to_allocate = counting
out = {}
for name in ("paged", "tagma", "held_only.PagedHeldOnly", "held_only.TagmaHeldOnly"):
    walks.clear()
    times = alloc_calls.one_run(alloc_calls.manager_cls(name), 8, 32)
    out[name] = [len(times["boundary"]), len(walks)]
print(json.dumps(out))
"""


def test_held_only_variants_send_the_boundary_step_down_the_general_path():
    out = run_script(WALKS, str(ROOT / "scripts/bench"))
    for name, (boundary, walks) in out.items():
        assert boundary == 8 * 2, name
        # Every manager walks once per admission (8 requests); the series'
        # place the next block without it, the variants walk again for it.
        expected = 8 + (boundary if "held_only" in name else 0)
        assert walks == expected, (name, walks)
