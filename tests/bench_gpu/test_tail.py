# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""scripts/gpu/tail.py on synthetic engine traces with a known answer."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/gpu"))
import tail  # noqa: E402

T0 = 1_800_000_000 * 10**9


def _run(folder: Path, backend: str, steps: list[tuple[float, int, int, int, int]]):
    """A run folder whose trace has `steps`: (ms, admitted, hits, prefill, decodes)."""
    run = folder / f"run-{backend}"
    run.mkdir(parents=True)
    lines, t = [], T0
    for ms, admitted, hits, prefill, decodes in steps:
        lines.append(f"C\t{t}\t{admitted}\t{hits}\t{prefill}\t{decodes}")
        t += int(ms * 1e6)
        lines.append(f"S\t{t}\t100\t50\t20\t{decodes + admitted + 1}\t0\t0\t-\t0")
    (run / "sched-1.tsv").write_text("\n".join(lines) + "\n")
    window = [T0 / 1e9 - 1, t / 1e9 + 1]
    result = {"workload": "prefix", "window": window, "main_window": window}
    (run / "run.json").write_text(
        json.dumps({"suite": "s", "backend": backend, "results": [result]})
    )
    return run, result


def _workload(extra_prefill_ms: float, heavy_every: int) -> list:
    # 20 ms decode steps with 100 decodes; every `heavy_every`-th step also
    # prefills 8192 tokens (80 ms more); tagma's heavy steps can be slower
    # than their work explains (extra_prefill_ms).
    out = []
    for i in range(400):
        if i % heavy_every == heavy_every // 2:
            out.append((100.0 + extra_prefill_ms, 4, 4096, 8192, 100))
        else:
            out.append((20.0, 0, 0, 0, 100))
    return out


def test_steps_pair_composition_with_durations(tmp_path: Path) -> None:
    run, result = _run(tmp_path, "paged", [(20.0, 1, 0, 512, 0), (35.0, 0, 0, 0, 3)])
    steps = tail.steps_of(run, result)
    # The first step has no previous output to measure from.
    assert len(steps) == 1
    assert steps[0]["ms"] == pytest.approx(35.0)
    assert (steps[0]["decodes"], steps[0]["prefill_tokens"]) == (3, 0)


def test_itl_distribution_weights_steps_by_decodes() -> None:
    steps = [{"ms": 10.0, "decodes": 99}, {"ms": 200.0, "decodes": 1}]
    itl = tail.itl_dist(steps)  # type: ignore[arg-type]
    assert len(itl) == 100 and tail._pct(itl, 0.99) == 10.0
    assert tail._pct(itl, 1.0) == 200.0


def test_a_gpu_side_slowdown_shows_as_excess_not_as_more_work(tmp_path: Path) -> None:
    paged, rp = _run(tmp_path, "paged", _workload(0.0, 20))
    tagma, rt = _run(tmp_path, "tagma", _workload(40.0, 20))
    model = tail.fit(tail.steps_of(paged, rp))
    s_t = tail.summarize(tail.steps_of(tagma, rt), model)
    s_p = tail.summarize(tail.steps_of(paged, rp), tail.fit(tail.steps_of(tagma, rt)))
    # Same work in the tail, tagma's steps 40 ms beyond what paged's model
    # predicts for it.
    assert s_t["tail_prefill_mean"] == s_p["tail_prefill_mean"] == 8192
    assert s_t["itl_p99_ms"] == pytest.approx(140.0)
    assert s_t["tail_excess_ms_mean"] == pytest.approx(40.0, abs=1.0)


def test_more_admissions_show_as_more_work_not_excess(tmp_path: Path) -> None:
    paged, rp = _run(tmp_path, "paged", _workload(0.0, 200))
    tagma, rt = _run(tmp_path, "tagma", _workload(0.0, 10))
    s_t = tail.summarize(tail.steps_of(tagma, rt), tail.fit(tail.steps_of(paged, rp)))
    s_p = tail.summarize(tail.steps_of(paged, rp), tail.fit(tail.steps_of(tagma, rt)))
    # Twenty times the decodes exposed to prefill-heavy steps, no excess.
    assert s_t["decodes_in_heavy_steps"] == 20 * s_p["decodes_in_heavy_steps"]
    assert abs(s_t["tail_excess_ms_mean"]) < 1.0
    assert s_t["itl_p99_ms"] > s_p["itl_p99_ms"]


def _with_waiting(steps: list[dict], waiting: int) -> list[dict]:
    return [{**s, "waiting": waiting} for s in steps]


def test_ttft_above_the_engine_bound_is_front_end_time(tmp_path: Path) -> None:
    run, result = _run(tmp_path, "paged", _workload(0.0, 20))
    steps = tail.steps_of(run, result)
    # The longest two consecutive steps: a 100 ms prefill step and a 20 ms one.
    split = tail.ttft_split(steps, [30.0, 90.0, 119.0, 150.0, 400.0])
    assert split["steps_with_waiting"] == 0
    assert split["engine_ttft_bound_ms"] == pytest.approx(120.0)
    assert split["client_ttft_above_bound"] == 2


def test_ttft_bound_is_withheld_when_the_engine_queued(tmp_path: Path) -> None:
    run, result = _run(tmp_path, "paged", _workload(0.0, 20))
    steps = _with_waiting(tail.steps_of(run, result), 0)
    steps[5]["waiting"] = 3
    split = tail.ttft_split(steps, [30.0, 400.0])
    assert split["steps_with_waiting"] == 1
    # A queue inside the engine adds to TTFT without bound: no claim.
    assert split["engine_ttft_bound_ms"] != split["engine_ttft_bound_ms"]  # NaN
    assert split["client_ttft_above_bound"] != split["client_ttft_above_bound"]


def test_cli_writes_report_json_and_plot(tmp_path: Path) -> None:
    suite = tmp_path / "res" / "s"
    _run(suite, "paged", _workload(0.0, 20))
    run, _ = _run(suite, "tagma", _workload(40.0, 20))
    # As results/ keeps it: xz-compressed.
    (run / "prefix.bench.json.xz").write_bytes(
        lzma.compress(
            json.dumps(
                {
                    "ttfts": [0.05, 0.5],
                    "itls": [[0.02], []],
                    "output_lens": [2, 1],
                    "start_times": [7.0, 7.0],
                }
            ).encode()
        )
    )
    for name in ("run-paged", "run-tagma"):
        (suite / name).rename(suite / f"run{1 if 'paged' in name else 2}-{name[4:]}")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu/tail.py"), str(tmp_path / "res")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "res"
    assert (out / "tail.png").stat().st_size > 0
    data = json.loads((out / "tail.json").read_text())
    runs = data["s/prefix"]["runs"]
    assert runs["tagma run2-tagma"]["tail_excess_ms_mean"] == pytest.approx(40, abs=1)
    assert "engine ITL p99 ms" in (out / "tail.md").read_text()
    tagma_run = runs["tagma run2-tagma"]
    assert tagma_run["tokens_per_chunk"] == pytest.approx(1.0)
    assert tagma_run["engine_ttft_bound_ms"] == pytest.approx(160.0)
    assert tagma_run["client_ttft_above_bound"] == 1
    # Both chunks came within 0.5 s of the first send, long before the
    # engine's last step: no lag, nothing after it.
    assert tagma_run["chunks_after_engine"] == 0
    assert tagma_run["client_lag_s"] < 0
    assert (
        "client's last chunk after the engine's last step"
        in (out / "tail.md").read_text()
    )
    # Paged kept no per-request lists: the spread is given as unknown.
    assert "p99 sampling spread" in (out / "tail.md").read_text()
    assert (
        data["s/prefix"]["p99_spread"]["TTFT p99"]["ratio"]
        != data["s/prefix"]["p99_spread"]["TTFT p99"]["ratio"]
    )


def test_a_few_stray_prefix_hits_get_no_cost_of_their_own() -> None:
    # 2 ms per 1K prefill tokens; two steps also carry a few hit tokens and
    # happen to run 6 ms long: too few to say what a hit token costs.
    steps = [
        {"ms": 5.0 + 0.002 * p, "prefill_tokens": p, "decodes": 100, "hit_tokens": 0}
        for p in range(0, 8192, 256)
    ]
    steps += [
        {"ms": 11.0 + 0.002 * p, "prefill_tokens": p, "decodes": 100, "hit_tokens": 37}
        for p in (1024, 4096)
    ]
    coef = tail.fit(steps)
    assert coef[3] == 0.0
    assert coef[1] == pytest.approx(0.002, rel=0.1)
    # With hits on enough steps, their cost is fitted.
    steps = [
        {"ms": 5.0 + 0.002 * p + 0.0005 * h, "prefill_tokens": p, "decodes": 100,
         "hit_tokens": h}
        for p in range(0, 8192, 256)
        for h in (0, 4096)
    ]  # fmt: skip
    assert tail.fit(steps)[3] == pytest.approx(0.0005)


def _host_run(folder: Path, backend: str, exec_us: int) -> tuple[Path, dict]:
    """Decode-only steps with the runner columns: 40 and then 90 running,
    every step 1 ms + exec; schedule 100, update 50, kv 20, sample 30, wait 200."""
    run = folder / f"run-{backend}"
    run.mkdir(parents=True)
    lines, t = [], T0
    for i in range(200):
        running = 40 if i < 100 else 90
        lines.append(f"C\t{t}\t0\t0\t0\t{running}")
        t += 1_000_000 + exec_us * 1000
        lines.append(
            f"S\t{t}\t100000\t50000\t20000\t{running}\t0\t0\t-\t0"
            f"\t{exec_us * 1000}\t30000\t200000"
        )
    (run / "sched-1.tsv").write_text("\n".join(lines) + "\n")
    window = [T0 / 1e9 - 1, t / 1e9 + 1]
    result = {"workload": "w", "window": window, "main_window": window}
    return run, result


def test_host_split_compares_equal_running_counts(tmp_path: Path) -> None:
    paged = tail.steps_of(*_host_run(tmp_path, "paged", 300))
    tagma = tail.steps_of(*_host_run(tmp_path, "tagma", 600))
    rows = tail.host_split({"paged": [("r1", paged)], "tagma": [("r2", tagma)]})
    # Two bins (40-59 and 80-99), one row per run in each.
    assert [(r["running"], r["run"]) for r in rows] == [
        ("40-59", "paged r1"),
        ("40-59", "tagma r2"),
        ("80-99", "paged r1"),
        ("80-99", "tagma r2"),
    ]
    for r in rows:
        exec_us = 300 if r["run"].startswith("paged") else 600
        assert r["exec_us"] == pytest.approx(exec_us)
        assert r["interval_us"] == pytest.approx(1000 + exec_us)
        # 1,000 us of interval minus schedule, update, sample and wait.
        assert r["rest_us"] == pytest.approx(1000 - 100 - 50 - 30 - 200)
        assert r["kv_us"] == pytest.approx(20)


def test_host_split_needs_the_runner_columns(tmp_path: Path) -> None:
    run, result = _run(tmp_path, "paged", [(20.0, 0, 0, 0, 3)] * 50)
    steps = tail.steps_of(run, result)
    assert steps and tail.host_split({"paged": [("r", steps)]}) == []


def test_plot_takes_many_runs_per_backend(tmp_path: Path) -> None:
    steps = tail.steps_of(*_host_run(tmp_path, "paged", 300))
    runs = {
        ("s", "w"): {
            b: [(f"r{i}", steps) for i in range(6)] for b in ("paged", "tagma")
        }
    }
    tail._plot(runs, tmp_path / "tail.png")
    assert (tmp_path / "tail.png").stat().st_size > 0


def test_host_speed_names_the_run_on_a_slow_host() -> None:
    def rows(run: str, sample_us: float) -> list[dict]:
        return [
            {"running": b, "run": run, "steps": 100, "sample_us": sample_us * k}
            for b, k in (("40-59", 1.0), ("60-79", 1.5))
        ]

    split = rows("paged r1", 1000) + rows("tagma r2", 1250) + rows("paged r3", 990)
    speed = tail.host_speed(split)
    # The median run is r1 in both bins; r2's sampler is 25 % slower there.
    assert speed["paged r1"] == pytest.approx(0.0)
    assert speed["tagma r2"] == pytest.approx(0.25)
    assert speed["paged r3"] == pytest.approx(-0.01)
    assert [r for r, x in speed.items() if x > tail.SLOW_HOST] == ["tagma r2"]


def test_front_end_lag_from_the_clients_chunk_times() -> None:
    bench = {
        "start_times": [100.0, 100.5, 100.2],
        "ttfts": [0.1, 0.2, 0.0],  # the third request failed: no chunks
        "itls": [[0.1, 0.1], [0.3], []],
    }
    got = tail.arrivals(bench)
    assert got == pytest.approx([0.1, 0.2, 0.3, 0.7, 1.0])
    # The engine's last step 0.5 s into the run: two chunks came after it,
    # the last 0.5 s later.
    lag = tail.front_end_lag(got, 0.5)
    assert lag["client_lag_s"] == pytest.approx(0.5)
    assert lag["chunks_after_engine"] == 2
    # A client that kept up gets its last chunk before the step's end mark.
    assert tail.front_end_lag(got, 1.2)["chunks_after_engine"] == 0
    # Results without the send times make no claim.
    assert tail.arrivals({k: v for k, v in bench.items() if k != "start_times"}) == []
    none = tail.front_end_lag([], 0.5)
    assert none["client_lag_s"] != none["client_lag_s"]  # NaN


def _requests(rng, base: list[float], scale: float = 1.0, noise: float = 0.0) -> dict:
    # One run's per-request TTFTs and TPOTs: a shared per-request base (the
    # same prompts and arrivals in every run) times `scale`, plus this run's
    # own noise.
    ttfts = [b * scale + rng.gauss(0, noise) for b in base]
    return {
        "ttfts_ms": ttfts,
        "tpots_ms": [t / 5 for t in ttfts],
        "input_lens": list(range(len(base))),
    }


def _base(rng, n: int = 900) -> list[float]:
    return [30 + rng.expovariate(1 / 5) for _ in range(n)]


def test_p99_spread_excludes_one_for_a_real_shift() -> None:
    import random

    rng = random.Random(1)
    base = _base(rng)
    paged = [_requests(rng, base, noise=1.0) for _ in range(2)]
    tagma = [_requests(rng, base, scale=1.15, noise=1.0) for _ in range(2)]
    spread = tail.p99_spread(paged, tagma, draws=200)
    assert spread["paired"]
    ttft = spread["TTFT p99"]
    assert ttft["ratio"] == pytest.approx(1.15, abs=0.03)
    assert 1.0 < ttft["lo"] <= ttft["ratio"] <= ttft["hi"]
    # Paged against itself: around 1.00, and the interval says so.
    assert ttft["aa_lo"] < 1.0 < ttft["aa_hi"]
    assert spread["TPOT p99"]["lo"] > 1.0


def test_p99_spread_includes_one_when_only_the_slowest_requests_differ() -> None:
    import random

    rng = random.Random(2)
    base = _base(rng)
    # Same work under both backends; each run's own noise decides which
    # requests end up at the p99.
    paged = [_requests(rng, base, noise=3.0) for _ in range(2)]
    tagma = [_requests(rng, base, noise=3.0) for _ in range(2)]
    ttft = tail.p99_spread(paged, tagma, draws=200)["TTFT p99"]
    assert ttft["lo"] < 1.0 < ttft["hi"]
    assert ttft["lo"] <= ttft["ratio"] <= ttft["hi"]


def test_p99_spread_resamples_each_run_alone_when_the_requests_differ() -> None:
    import random

    rng = random.Random(3)
    paged = [_requests(rng, _base(rng))]
    tagma = [_requests(rng, _base(rng, 800))]
    spread = tail.p99_spread(paged, tagma, draws=50)
    assert not spread["paired"]
    # One paged run: no AA to give.
    assert spread["TTFT p99"]["aa"] != spread["TTFT p99"]["aa"]  # NaN
    assert spread["TTFT p99"]["lo"] <= spread["TTFT p99"]["hi"]
    # A side without per-request lists makes no claim.
    none = tail.p99_spread([], tagma, draws=10)["TTFT p99"]
    assert none["ratio"] != none["ratio"]


def test_per_request_ttft_and_tpot_as_the_bench_computes_them() -> None:
    bench = {
        "ttfts": [0.05, 0.0, 0.02],
        "itls": [[0.01, 0.03], [], [0.02]],
        "output_lens": [3, 1, 2],
        "errors": ["", "connection reset", ""],
    }
    got = tail.request_tpots(bench)
    assert got[0] == pytest.approx(20.0)
    assert got[1] != got[1]  # one token: no TPOT
    assert got[2] == pytest.approx(20.0)
    ttfts = tail.request_ttfts(bench)
    # The failed request's 0 TTFT is no fast request: left out.
    assert ttfts[0] == pytest.approx(50.0) and ttfts[2] == pytest.approx(20.0)
    assert ttfts[1] != ttfts[1]
    # Results without the error list: every request counts.
    assert tail.request_ttfts({"ttfts": [0.01]}) == [pytest.approx(10.0)]


def test_p99_spread_without_the_prompt_lists_pairs_nothing() -> None:
    import random

    rng = random.Random(4)
    # Results from before the bench kept input_lens, runs of unequal size.
    for sizes in ((900, 899), (900, 900)):
        paged = [_requests(rng, _base(rng, sizes[0])) for _ in range(2)]
        tagma = [_requests(rng, _base(rng, sizes[1]))]
        for r in paged + tagma:
            r["input_lens"] = []
        spread = tail.p99_spread(paged, tagma, draws=20)
        assert not spread["paired"]
        assert spread["TTFT p99"]["lo"] <= spread["TTFT p99"]["hi"]
