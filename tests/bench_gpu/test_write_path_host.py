# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""scripts/bench/write_path_host.py (`make bench-write-host`) on the patched
tree: each run is the decode pattern it claims, for both classes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import write_path_host as bench
bench.use_cpu_buffers()
out = {}
for name in ("paged", "tagma"):
    times, tables = bench.one_run(bench.tables_cls(name), 32, 64)
    if name == "paged":
        blocks = [int(x) for x in tables.num_blocks.np[0, :32]]
        ranges = None
    else:
        blocks = [tables.range_table.num_blocks(r) for r in range(32)]
        ranges = [int(x) for x in tables.range_table.num_ranges_np[:32]]
    staged = tables.block_tables[0] if name == "paged" else tables.range_table.table
    out[name] = {
        "steps": len(times),
        "blocks": blocks,
        "ranges": ranges,
        "left_staged": len(staged._staged_write_indices),
    }
print(json.dumps(out))
"""


def test_each_step_grows_one_row_in_16_by_one_block():
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail("needs `make build-fork` (vllm importable from the pin's venv)")
    # A fresh interpreter: use_cpu_buffers replaces two buffer_utils attributes.
    r = subprocess.run(
        [sys.executable, "-c", DRIVER, str(ROOT / "scripts/bench")],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for name in ("paged", "tagma"):
        # 32 rows, 2 new blocks a step, 64 steps: every row grows by 4 blocks
        # past its 8-block prompt; every staged write was consumed.
        assert out[name]["steps"] == 64, name
        assert out[name]["blocks"] == [8 + 4] * 32, name
        assert out[name]["left_staged"] == 0, name
    # Tagma's rows stay one range: the decode path merged every block.
    assert out["tagma"]["ranges"] == [1] * 32
