# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The offline throughput driver (scripts/gpu/offline.py) on CPU, against the
stand-in vLLM's `bench throughput`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "scripts/gpu"
sys.path.insert(0, str(GPU))

import offline  # noqa: E402


def _offline(
    bundle_dir: Path, tmp_path: Path, *extra: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(GPU / "offline.py"),
            "--bundle",
            str(bundle_dir),
            "--out",
            str(tmp_path / "out"),
            "--dest",
            str(tmp_path / "dest"),
            *extra,
        ],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_mirrored_order():
    assert offline.order(["a", "b", "c"], 1) == ["a", "b", "c", "c", "b", "a"]
    assert offline.order(["a", "b"], 2) == ["a", "b", "b", "a"] * 2


def test_summary_ratios_are_per_mirrored_pair():
    runs = [
        {"variant": v, "output_tok_s": x}
        for v, x in [("a", 100.0), ("b", 150.0), ("b", 90.0), ("a", 100.0)]
    ]
    s = offline.summarize(runs, ["a", "b"])["variants"]
    assert s["a"]["ratio_to_a"] == 1.0
    assert s["b"]["median"] == 120.0
    assert s["b"]["pair_range"] == [0.9, 1.5]
    assert s["b"]["ratio_to_a"] == pytest.approx(1.2)


def test_variants_run_mirrored_with_a_warmup_left_out(fake_bundle, tmp_path):
    r = _offline(
        fake_bundle,
        tmp_path,
        "--variants",
        "paged-stock,paged,tagma",
        "--warmup",
        "--num-prompts",
        "64",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert [(x["variant"], x["run"]) for x in summary["runs"]] == [
        ("paged-stock", 1),
        ("paged", 1),
        ("tagma", 1),
        ("tagma", 2),
        ("paged", 2),
        ("paged-stock", 2),
    ]
    # The stand-in's rates: the stock manager is plugged in by class name.
    v = summary["variants"]
    assert v["paged-stock"]["median"] == 3000.0
    assert v["paged"]["ratio_to_paged-stock"] == pytest.approx(1 / 3)
    assert v["tagma"]["ratio_to_paged-stock"] == pytest.approx(2 / 3)
    assert (out / "paged-stock-warmup-1.log").exists()
    assert "--num-prompts" in summary["workload"]


def test_a_failed_run_stops_with_its_log(fake_bundle, tmp_path):
    r = _offline(fake_bundle, tmp_path, env={"FAKE_VLLM_THROUGHPUT_FAIL": "1"})
    assert r.returncode == 1
    assert "engine failed to start" in r.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_unknown_variant_is_refused(fake_bundle, tmp_path):
    r = _offline(fake_bundle, tmp_path, "--variants", "paged,nope")
    assert r.returncode == 2
    assert "--variants" in r.stderr
