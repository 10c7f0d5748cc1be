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
    # Each run's full-batch 10-s rates (the stand-in logs 0.9x and 1.1x of
    # its rate with 1,024 and 1,000 running, the ramp and tail left out).
    tagma = summary["runs"][2]["steady_gen_tok_s"]
    assert tagma == {"n": 2, "min": 1800.0, "median": 2000.0, "max": 2200.0}
    assert "--num-prompts" in summary["workload"]


def test_steady_rates_keep_the_full_batch_lines():
    line = (
        "INFO 12-06 20:20:11 [loggers.py:310] Engine 000: Avg prompt throughput: "
        "{p} tokens/s, Avg generation throughput: {g} tokens/s, Running: {n} reqs, "
        "Waiting: 0 reqs, GPU KV cache usage: 31.0%, Prefix cache hit rate: 2.4%"
    )
    text = "\n".join(
        line.format(p=p, g=g, n=n)
        for p, g, n in [
            (900.0, 12000.0, 512),  # the ramp
            (16000.0, 48341.3, 1024),
            (15000.0, 37822.6, 980),  # 95 % of 1,024 is 972.8: still full
            (0.0, 9000.0, 300),  # the tail
        ]
    )
    assert offline.steady_rates(text) == {
        "n": 2,
        "min": 37822.6,
        "median": pytest.approx(43081.95),
        "max": 48341.3,
    }
    assert offline.steady_rates("no stats here") is None


def test_a_failed_run_stops_with_its_log(fake_bundle, tmp_path):
    r = _offline(fake_bundle, tmp_path, env={"FAKE_VLLM_THROUGHPUT_FAIL": "1"})
    assert r.returncode == 1
    assert "engine failed to start" in r.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_unknown_variant_is_refused(fake_bundle, tmp_path):
    r = _offline(fake_bundle, tmp_path, "--variants", "paged,nope")
    assert r.returncode == 2
    assert "--variants" in r.stderr


def test_host_split_sums_each_part_over_the_run(tmp_path):
    # S rows: wall, schedule, update, kv, running, waiting, gc, kv_top,
    # kv_top_ns, exec, sample, wait (ns), as scripts/gpu/hook writes them.
    def s_row(wall_ms: int, sched_us: int, exec_us: int) -> str:
        ns = 1000
        return (
            f"S\t{wall_ms * 10**6}\t{sched_us * ns}\t{100 * ns}\t{50 * ns}\t8\t0\t0"
            f"\tallocate_slots\t{40 * ns}\t{exec_us * ns}\t{200 * ns}\t{300 * ns}\n"
        )

    (tmp_path / "sched-1.tsv").write_text(
        s_row(0, 9999, 9999)  # its parts ran before the first interval
        + "C\t0\t1\t0\t128\t7\n"
        + s_row(10, 1000, 2000)
        + s_row(20, 3000, 4000)
    )
    host = offline.host_split(tmp_path, output_tokens=16)
    assert host["steps"] == 2
    assert host["wall_s"] == pytest.approx(0.020)
    per_step = host["per_step_us"]
    assert per_step["schedule"] == 2000
    assert per_step["exec"] == 3000
    assert per_step["kv"] == 50
    # 10,000 µs a step less schedule, update, exec, sample and wait.
    assert per_step["rest"] == pytest.approx(10_000 - 2000 - 100 - 3000 - 200 - 300)
    assert host["per_token_us"]["schedule"] == pytest.approx(4000 / 16)
    assert offline.host_split(tmp_path / "none", output_tokens=1) == {}


def test_resident_engines_take_turns_from_an_emptied_cache(fake_bundle, tmp_path):
    r = _offline(
        fake_bundle,
        tmp_path,
        "--variants",
        "paged-stock,paged,tagma",
        "--resident",
        "--warmup",
        "--repeats",
        "2",
        "--num-prompts",
        "256",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resident"] is True
    # Mirrored, twice; the warm-up runs (one per engine) left out.
    assert [x["variant"] for x in summary["runs"]] == offline.order(
        ["paged-stock", "paged", "tagma"], 2
    )
    assert sorted(p.name for p in out.glob("*-warmup-1.json")) == [
        "paged-stock-warmup-1.json",
        "paged-warmup-1.json",
        "tagma-warmup-1.json",
    ]
    # One engine per variant, each started once: its log holds all its runs.
    assert r.stdout.count("engine ready") == 3
    for v in ("paged-stock", "paged", "tagma"):
        assert (out / f"engine-{v}.log").read_text().count("OFFLINE_WORKER_RESULT") == 5
    # Each run keeps the stats lines its engine logged during it: the
    # stand-in's full-batch line names the engine's call (its rate + calls,
    # the warm-up being call 1).
    base = {"paged-stock": 300_000.0, "paged": 100_000.0, "tagma": 200_000.0}
    for r in summary["runs"]:
        rates = r["steady_gen_tok_s"]
        assert rates["n"] == 1 and rates["min"] == base[r["variant"]] + 1 + r["run"]
    # The stand-in's rates: stock manager 300K, paged 100K, tagma 200K tok/s.
    s = summary["variants"]
    assert s["tagma"]["ratio_to_paged-stock"] == pytest.approx(2 / 3, rel=0.15)
    assert s["paged"]["ratio_to_paged-stock"] == pytest.approx(1 / 3, rel=0.15)
    assert (out / "offline.png").exists()


def test_resident_engine_that_fails_to_start_fails_the_run(fake_bundle, tmp_path):
    r = _offline(
        fake_bundle,
        tmp_path,
        "--variants",
        "paged,tagma",
        "--resident",
        "--num-prompts",
        "64",
        env={"FAKE_VLLM_THROUGHPUT_FAIL": "1"},
    )
    assert r.returncode == 1
    assert "paged engine failed" in r.stdout
    assert "engine failed to start" in r.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_resident_and_trace_are_refused_together(fake_bundle, tmp_path):
    r = _offline(fake_bundle, tmp_path, "--resident", "--trace")
    assert r.returncode == 2 and "not with --resident" in r.stderr


def test_worker_prompts_are_the_same_for_every_engine():
    import offline_worker

    assert offline_worker.prompts(3, 5, 0) == offline_worker.prompts(3, 5, 0)
    assert offline_worker.prompts(3, 5, 0) != offline_worker.prompts(3, 5, 1)
    assert [len(p) for p in offline_worker.prompts(3, 5, 0)] == [5, 5, 5]
