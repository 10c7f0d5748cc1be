# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""report.py on hand-made run folders: medians, pooling passes, sched stats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/gpu"))

import report  # noqa: E402


def _pass(folder: Path, order: str, runs: list[tuple[str, float]], stack="abc"):
    """A bench-gpu output folder with one suite, one workload, these runs."""
    for i, (backend, tok_s) in enumerate(runs, 1):
        run_dir = folder / "s" / f"run{i}-{backend}"
        run_dir.mkdir(parents=True)
        run = {
            "suite": "s",
            "run": i,
            "backend": backend,
            "startup_s": 60.0,
            "capacity": {"kv_cache_tokens": 1000, "max_concurrency": 2.0},
            "gate": None if i == 1 else True,
            "profile": None,
            "results": [
                {
                    "workload": "w",
                    "window": [10.0, 20.0],
                    "bench": {"total_token_throughput": tok_s, "p99_ttft_ms": 5.0},
                    "peak_kv_usage": 0.5,
                    "preemptions": 0,
                }
            ],
        }
        (run_dir / "run.json").write_text(json.dumps(run))
    meta = {"stack": ["vllm", "0.25.1", "project", stack], "order": order}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu/report.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_one_folder_reports_medians_ratio_and_spread(tmp_path):
    d = _pass(
        tmp_path / "a",
        "ABBA",
        [("paged", 100), ("tagma", 110), ("tagma", 130), ("paged", 90)],
    )
    summary = report.write([d], d)
    tput = summary["s"]["w"]["total_token_throughput"]
    assert tput["paged"] == 95 and tput["tagma"] == 120
    assert tput["ratio"] == pytest.approx(120 / 95)
    assert tput["ratio_range"] == pytest.approx([110 / 100, 130 / 90])
    text = (d / "report.md").read_text()
    assert "Runs: paged [1, 4], tagma [2, 3]." in text
    assert "| total tok/s | 95 (90–100) | 120 (110–130) | 1.263 | met |" in text


def test_passes_pool_into_one_report_with_pass_run_labels(tmp_path):
    a = _pass(
        tmp_path / "a",
        "ABBA",
        [("paged", 100), ("tagma", 110), ("tagma", 120), ("paged", 90)],
    )
    b = _pass(tmp_path / "b", "BAAB", [("tagma", 130), ("paged", 80)])
    out = tmp_path / "pooled"
    r = _cli("--out", str(out), str(a), str(b))
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    tput = summary["s"]["w"]["total_token_throughput"]
    assert tput["paged"] == 90 and tput["tagma"] == 120  # medians of 3 each
    text = (out / "report.md").read_text()
    assert "Runs: paged [1.1, 1.4, 2.2], tagma [1.2, 1.3, 2.1]." in text
    assert "pass 2 (b): order: BAAB" in text
    assert "passed in 4 of 4 later runs" in text
    # The passes themselves are left as they were.
    assert not (a / "report.md").exists() and not (b / "report.md").exists()


def test_pooling_refuses_different_stacks_and_needs_out(tmp_path):
    a = _pass(tmp_path / "a", "AB", [("paged", 1), ("tagma", 1)], stack="abc")
    b = _pass(tmp_path / "b", "AB", [("paged", 1), ("tagma", 1)], stack="def")
    r = _cli("--out", str(tmp_path / "o"), str(a), str(b))
    assert r.returncode == 2
    assert "cannot pool runs of different stacks" in r.stderr
    assert not (tmp_path / "o").exists()
    r = _cli(str(a), str(b))
    assert r.returncode == 2 and "needs --out" in r.stderr
    r = _cli(str(tmp_path))
    assert r.returncode == 2 and "no <suite>/run<i>-<backend>/run.json" in r.stderr


def test_sched_stats_from_traces_or_from_run_json(tmp_path):
    d = _pass(tmp_path / "a", "AB", [("paged", 1), ("tagma", 1)])
    # Steps 1..100 µs of schedule + 0 of update, KV half of it; one step
    # outside the workload's window and one idle step must not count.
    rows = [
        f"S\t{int(15e9) + i}\t{i * 1000}\t0\t{i * 500}\t3\t0" for i in range(1, 101)
    ]
    rows.append(f"S\t{int(30e9)}\t9999999\t0\t9999999\t3\t0")
    rows.append(f"S\t{int(16e9)}\t9999999\t0\t9999999\t0\t0")
    rows.append(f"R\t{int(15e9) + 50}\t2\t1.5\t2\t1.5\t2")
    (d / "s/run1-paged/sched-1.tsv").write_text("\n".join(rows) + "\n")
    # run2 has no trace, only the stats the harness stored in run.json.
    run2 = d / "s/run2-tagma/run.json"
    run = json.loads(run2.read_text())
    run["results"][0]["sched"] = {"sched_us": 7.0, "kv_us": 3.0}
    run2.write_text(json.dumps(run))
    summary = report.write([d], d)["s"]["w"]
    assert summary["sched_us"]["paged"] == pytest.approx(50.5)
    assert summary["sched_p99_us"]["paged"] == pytest.approx(99.0)
    assert summary["kv_p99_us"]["paged"] == pytest.approx(49.5)
    assert summary["runs_mean"]["paged"] == pytest.approx(1.5)
    assert summary["sched_us"]["tagma"] == 7.0
    assert summary["sched_us"]["ratio"] == pytest.approx(7.0 / 50.5)
    assert "gc_ms" not in summary  # traces before the gc column


def test_gc_time_is_summed_over_the_main_run(tmp_path):
    d = _pass(tmp_path / "a", "AB", [("paged", 1), ("tagma", 1)])
    rows = [
        f"S\t{int(15e9) + i}\t1000\t0\t500\t3\t0\t{i * 1000}\tfree\t400"
        for i in range(1, 11)
    ]
    rows.append(f"S\t{int(15e9) + 5}\t1000\t0\t500\t0\t0\t2000000\t-\t0")  # idle
    rows.append(f"S\t{int(30e9)}\t1000\t0\t500\t3\t0\t9000000\tfree\t400")  # after
    (d / "s/run1-paged/sched-1.tsv").write_text("\n".join(rows) + "\n")
    summary = report.write([d], d)["s"]["w"]
    # 1..10 µs in busy steps + 2 ms in the idle one between them; the step
    # after the main run is out.
    assert summary["gc_ms"]["paged"] == pytest.approx(0.055 + 2.0)
    assert "engine-core GC ms (main run total)" in (d / "report.md").read_text()


@pytest.mark.parametrize(
    "name, passes",
    [
        ("serve-h200/8b-16k-128k", ["."]),
        ("serve-h200/8b-tp2", ["."]),
        ("serve-h200/1b-host", ["pass1", "pass2"]),
        ("serve-h200-0.26.0/8b-tail", ["."]),
        ("serve-h200-0.26.0/8b-128k", ["."]),
        ("serve-h200-0.26.0/8b-tail-abba", ["."]),
        ("serve-h200-0.26.0/api4-abba", ["."]),
        ("serve-h200-0.26.0/1b-api4-poisson", ["."]),
        ("serve-h200-0.26.0/1b-poisson-abbabaab", ["."]),
        ("serve-h200-0.26.0/8b-16k-abba", ["."]),
        ("serve-h200-0.26.0/8b-16k-sharegpt", ["."]),
        ("serve-h200-0.26.0/8b-128k-tail", ["."]),
        ("serve-h200-0.26.0/h200-long-burst", ["."]),
        ("serve-h200-0.26.0/128k-poisson-1b-burst-aabba", ["."]),
        ("serve-h200-0.26.0/128k-poisson-1b-burst-abaab", ["."]),
        ("serve-h200-0.26.0/1b-burst-api4-resident-stock", ["."]),
        ("serve-h200-0.26.0/1b-burst-api4-listener-stock", ["."]),
        ("serve-h200-0.26.0/1b-burst-api4-listener", ["."]),
        ("serve-h100-0.26.0/8b-128k-poisson-resident-partial", ["."]),
        ("serve-h100-0.26.0/8b-128k-poisson-resident", ["."]),
    ],
)
def test_published_reports_rebuild_from_their_run_json(name, passes, tmp_path):
    """results/serve-h* (what the docs cite) is report.py's own output."""
    published = ROOT / "results" / name
    report.write([published / p for p in passes], tmp_path)
    for f in ("report.md", "summary.json"):
        assert (tmp_path / f).read_text() == (published / f).read_text(), f


def test_sched_stats_keep_the_main_run_only(tmp_path):
    """Warm-up steps (few running) before the main run are left out."""
    d = _pass(tmp_path / "a", "AB", [("paged", 1), ("tagma", 1)])
    s = 1_000_000_000
    rows = [f"S\t{11 * s + i * s // 10}\t900000\t0\t1000\t1\t0" for i in range(30)]
    rows += [f"S\t{15 * s + i * s // 10}\t3000\t0\t2000\t100\t0" for i in range(21)]
    rows.append(f"S\t{18 * s}\t500\t0\t100\t0\t0")  # idle, after the main run
    run_dir = d / "s/run1-paged"
    (run_dir / "sched-1.tsv").write_text("\n".join(rows) + "\n")
    run = json.loads((run_dir / "run.json").read_text())
    run["results"][0]["bench"]["total_output_tokens"] = 4000
    (run_dir / "run.json").write_text(json.dumps(run))
    paged = report.write([d], d)["s"]["w"]
    # No mark from the harness: the main run starts with the first step
    # holding more requests than the default warm-up (8), at 15 s.
    assert paged["sched_us"]["paged"] == pytest.approx(3.0)
    assert paged["sched_p99_us"]["paged"] == pytest.approx(3.0)
    # 4,000 tokens over 15 s .. 17 s on the engine; 21 steps of 3 µs
    # (KV 2 µs) spread over them.
    assert paged["engine_tok_s"]["paged"] == pytest.approx(2000.0)
    assert paged["sched_us_tok"]["paged"] == pytest.approx(21 * 3.0 / 4000)
    assert paged["kv_us_tok"]["paged"] == pytest.approx(21 * 2.0 / 4000)
    result = {"window": [10.0, 20.0], "bench": {"total_output_tokens": 4000}}
    trace = report.read_trace(run_dir)
    assert report.sched_stats(trace, result)["steps"] == 21
    # A warm-up as large as the workload: no step stands out, all count.
    whole = report.sched_stats(trace, {**result, "warmups": 100})
    assert whole["steps"] == 51 and whole["sched_us"] == pytest.approx(900.0)
    # The harness's mark of the main run's start wins.
    marked = report.sched_stats(trace, {**result, "main_window": [12.0, 20.0]})
    assert marked["steps"] == 20 + 21  # warm-up steps from 12 s on, the main run
    assert marked["engine_tok_s"] == pytest.approx(4000 / 5.0)
    assert report.sched_stats(trace, {"window": [19.0, 20.0]}) == {}
