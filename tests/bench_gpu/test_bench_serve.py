# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The GPU serve benchmark's harness, on CPU, against a stand-in vLLM.

The stand-in (fake/vllm) serves /health, /metrics, /v1/completions and the
profiler endpoints and writes bench results, so these tests exercise what
bench_serve.py does on the GPU host: bundle checks and install, ABBA order,
the correctness gate, server-death detection, profile parsing, the report.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts/gpu"
sys.path.insert(0, str(GPU))

import bench_serve  # noqa: E402
import profile_trace  # noqa: E402
import report as report_mod  # noqa: E402


def _bench(
    bundle_dir: Path,
    out: Path,
    dest: Path,
    path: str,
    *extra: str,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(GPU / "bench_serve.py"),
            "--bundle",
            str(bundle_dir),
            "--out",
            str(out),
            "--dest",
            str(dest),
            *extra,
        ],
        env={**os.environ, "PATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _bench_1b(
    bundle_dir: Path, path: str, tmp_path: Path, *extra: str, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, Path]:
    """The 1b-host suite into tmp_path/out; returns the run and out."""
    out = tmp_path / "out"
    r = _bench(
        bundle_dir, out, tmp_path / "dest", path, "--suites", "1b-host", *extra, env=env
    )
    return r, out


def _pool(dest: Path, *folders: Path) -> subprocess.CompletedProcess:
    """report.py over several result folders, into dest."""
    return subprocess.run(
        [sys.executable, str(GPU / "report.py"), "--out", str(dest),
         *map(str, folders)],
        capture_output=True,
        text=True,
    )  # fmt: skip


def test_abba_run_writes_every_run_and_the_report(fake_bundle, gpu_path, tmp_path):
    r, out = _bench_1b(fake_bundle, gpu_path, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = sorted(p.name for p in (out / "1b-host").iterdir())
    assert runs == ["run1-paged", "run2-tagma", "run3-tagma", "run4-paged"]
    for run in runs:
        summary = json.loads((out / "1b-host" / run / "run.json").read_text())
        assert summary["capacity"] == {
            "kv_cache_tokens": 1234560,
            "max_concurrency": 75.35,
        }
        assert [w["workload"] for w in summary["results"]] == ["host-512", "host-1024"]
        assert summary["results"][0]["peak_kv_usage"] == pytest.approx(0.42)
        # Stored so a report can be rebuilt without the traces (the fake
        # server's: a step a /metrics poll).
        assert all(r["sched"]["steps"] > 0 for r in summary["results"])
        # The main run starts after the bench's warm-up, inside its window.
        for r in summary["results"]:
            start, end = r["main_window"]
            assert r["window"][0] + 0.3 <= start < end == r["window"][1]
        log = (out / "1b-host" / run / "host-512.bench.log").read_text()
        assert "Starting main benchmark run..." in log and "Benchmark done" in log
        cmd = (out / "1b-host" / run / "server.cmd").read_text()
        assert f"--kv-cache-backend {run.split('-')[1]}" in cmd
    first = json.loads((out / "1b-host/run1-paged/run.json").read_text())
    assert first["gate"] is None  # the reference
    later = json.loads((out / "1b-host/run4-paged/run.json").read_text())
    assert later["gate"] is True
    # The profiler window runs in the first A and first B run only.
    assert first["profile"]["steps"] == 5
    assert first["profile"]["write_path_us"] == pytest.approx(5.0)
    tagma = json.loads((out / "1b-host/run2-tagma/run.json").read_text())
    assert tagma["profile"]["fused_us"] == pytest.approx(2.5)
    assert later["profile"] is None
    report = (out / "report.md").read_text()
    assert "## 1b-host" in report and "| total tok/s |" in report
    assert "passed in 3 of 3" in report
    assert (out / "1b-host.png").exists()


def test_warmup_run_is_the_gate_reference_but_left_out_of_the_report(
    fake_bundle, gpu_path, tmp_path
):
    r, out = _bench_1b(fake_bundle, gpu_path, tmp_path, "--order", "bAB")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1b-host run 1 (tagma, warm-up): starting the server" in r.stdout
    runs = {
        p.name: json.loads((p / "run.json").read_text())
        for p in (out / "1b-host").iterdir()
    }
    assert sorted(runs) == ["run1-tagma", "run2-paged", "run3-tagma"]
    assert [runs[k]["warmup"] for k in sorted(runs)] == [True, False, False]
    # The gate compares with the warm-up run; the profile skips it.
    assert runs["run1-tagma"]["gate"] is None and runs["run1-tagma"]["profile"] is None
    assert runs["run2-paged"]["gate"] is True and runs["run3-tagma"]["gate"] is True
    assert runs["run2-paged"]["profile"] and runs["run3-tagma"]["profile"]
    report = (out / "report.md").read_text()
    assert "Runs: paged [2], tagma [3], warm-up (left out) [1]." in report
    assert "passed in 2 of 2 later runs" in report
    r = _bench(
        fake_bundle, out, tmp_path / "dest", gpu_path, "--order", "AXB", "--no-report"
    )
    assert r.returncode == 1 and "--order takes A (paged) and B (tagma)" in r.stderr


def test_paged_stock_baseline_runs_vllms_manager_as_released(
    fake_bundle, gpu_path, tmp_path
):
    r, out = _bench_1b(
        fake_bundle, gpu_path, tmp_path, "--baseline", "paged-stock", "--order", "AB"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    paged = out / "1b-host/run1-paged"
    tagma = out / "1b-host/run2-tagma"
    # The stand-in exits unless the manager's module is on the server's path.
    stock = "--kv-cache-manager-cls ablation.StockKVCacheManager"
    assert stock in (paged / "server.cmd").read_text()
    assert stock not in (tagma / "server.cmd").read_text()
    assert json.loads((paged / "run.json").read_text())["manager"] == "stock"
    assert "manager" not in json.loads((tagma / "run.json").read_text())
    assert json.loads((out / "meta.json").read_text())["baseline"] == "paged-stock"
    report = (out / "report.md").read_text()
    assert "(A = paged with vLLM's KV manager as released" in report
    # Passes of different baselines are not pooled into one ratio.
    r2, out2 = _bench_1b(fake_bundle, gpu_path, tmp_path / "b", "--order", "AB")
    assert r2.returncode == 0, r2.stdout + r2.stderr
    pooled = _pool(tmp_path / "pooled", out, out2)
    assert pooled.returncode != 0
    assert "cannot pool runs of different baselines" in pooled.stderr


def test_shared_socket_reaches_every_server_and_is_not_pooled(
    fake_bundle, gpu_path, tmp_path
):
    r, out = _bench_1b(
        fake_bundle, gpu_path, tmp_path, "--shared-socket", "--order", "AB"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for run in ("run1-paged", "run2-tagma"):
        log = (out / "1b-host" / run / "server.log").read_text()
        assert "API servers on the inherited socket" in log
    assert json.loads((out / "meta.json").read_text())["shared_socket"] is True
    assert (
        "API servers on one shared listening socket" in (out / "report.md").read_text()
    )
    r2, out2 = _bench_1b(fake_bundle, gpu_path, tmp_path / "b", "--order", "AB")
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert (
        "API servers on the inherited socket"
        not in (out2 / "1b-host/run1-paged/server.log").read_text()
    )
    pooled = _pool(tmp_path / "pooled", out, out2)
    assert pooled.returncode != 0
    assert "cannot pool runs with and without --shared-socket" in pooled.stderr


def test_resident_servers_start_once_and_take_turns(fake_bundle, gpu_path, tmp_path):
    r, out = _bench_1b(
        fake_bundle, gpu_path, tmp_path, "--resident", "--order", "aABBA"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    suite = out / "1b-host"
    assert sorted(p.name for p in suite.iterdir()) == [
        "run1-paged",
        "run2-paged",
        "run3-tagma",
        "run4-tagma",
        "run5-paged",
        "server-paged",
        "server-tagma",
    ]
    # One start a backend, each at its share of the GPU, the gate at start.
    assert r.stdout.count("starting the server") == 2
    for backend in ("paged", "tagma"):
        cmd = (suite / f"server-{backend}" / "server.cmd").read_text()
        assert f"--kv-cache-backend {backend}" in cmd
        assert cmd.split()[-2:] == ["--gpu-memory-utilization", "0.44"]
    gate = json.loads((suite / "server-tagma/gate.json").read_text())
    assert gate["equal_to_run1"] is True
    runs = {
        p.name: json.loads((p / "run.json").read_text()) for p in suite.glob("run*")
    }
    assert [runs[k]["warmup"] for k in sorted(runs)] == [True] + [False] * 4
    assert {k: v["server"] for k, v in runs.items()} == {
        k: f"server-{k.split('-')[1]}" for k in runs
    }
    # Each run's folder holds the trace rows of its own window only, one
    # row a stream of its workloads (the fake server's hook).
    for name, run in runs.items():
        (tsv,) = (suite / name).glob("sched-*.tsv")
        stamps = [int(line.split("\t")[1]) for line in tsv.read_text().splitlines()]
        lo, hi = run["results"][0]["window"][0], run["results"][-1]["window"][1]
        assert stamps and all(lo * 1e9 <= t <= hi * 1e9 for t in stamps)
        assert run["results"][0]["sched"]["steps"] > 0
    # The profiler window: the first measured run of each backend.
    assert runs["run2-paged"]["profile"] and runs["run3-tagma"]["profile"]
    assert runs["run5-paged"]["profile"] is None
    assert (
        "Runs: paged [2, 5], tagma [3, 4], warm-up (left out) [1]."
        in (out / "report.md").read_text()
    )
    assert json.loads((out / "meta.json").read_text())["resident"] is True
    # Each run starts from an empty prefix cache, as on a server of its own:
    # one reset before each of a server's runs (the route needs dev mode).
    for backend, n in (("paged", 3), ("tagma", 2)):
        log = (suite / f"server-{backend}" / "server.log").read_text()
        assert log.count("fake vllm: prefix cache reset") == n
    assert all(run["prefix_cache_reset"] for run in runs.values())
    # A run counts its own requests only, not those of the server's earlier
    # runs in the same log.
    for run in runs.values():
        assert run["results"][0]["api_server_requests"] == {"0": 3, "1": 1}


def test_resident_reset_failure_stops_the_suite(fake_bundle, gpu_path, tmp_path):
    # tagma's reset runs validate(); a broken invariant answers 500.
    r, out = _bench_1b(
        fake_bundle, gpu_path, tmp_path, "--resident",
        env={"FAKE_VLLM_RESET_FAILS": "1"},
    )  # fmt: skip
    assert r.returncode == 1
    assert "POST /reset_prefix_cache answered 500" in r.stderr
    assert "block 7 has ref_cnt 1" in r.stderr
    assert not list((out / "1b-host").glob("run*/run.json"))


def test_runs_record_the_processes_cpu_time(fake_bundle, gpu_path, tmp_path):
    r, out = _bench_1b(fake_bundle, gpu_path, tmp_path, "--order", "AB")
    assert r.returncode == 0, r.stdout + r.stderr
    for run in ("run1-paged", "run2-tagma"):
        res = json.loads((out / "1b-host" / run / "run.json").read_text())
        for wl in res["results"]:
            cpu = wl["host_cpu"]
            # From the main run's start to the bench's result line.
            main = wl["main_window"][1] - wl["main_window"][0]
            assert 0 < cpu["window_s"] <= main
            assert cpu["client_s"] >= 0 and cpu["client_wait_s"] >= 0
            # The fake server is one process, the group's leader.
            assert list(cpu["server_s"]) == list(cpu["server_wait_s"]) == ["vllm serve"]
            assert cpu["server_s"]["vllm serve"] >= 0
            # The stand-in bench's four requests: three on server 0.
            assert wl["api_server_requests"] == {"0": 3, "1": 1}
    report = (out / "report.md").read_text()
    assert "| busiest API server's share of requests | 0.75 | 0.75 | 1.000 |" in report
    assert "| bench client CPU, cores (main run) |" in report
    assert "| API servers CPU, cores (together) |" in report
    assert "| most-waiting API server, s per s |" in report


def test_resident_gate_mismatch_stops_before_any_run(fake_bundle, gpu_path, tmp_path):
    r, out = _bench_1b(
        fake_bundle,
        gpu_path,
        tmp_path,
        "--resident",
        env={"FAKE_VLLM_TAGMA_DIFFERS": "1"},
    )
    assert r.returncode == 1 and "correctness gate failed" in r.stderr
    assert not list((out / "1b-host").glob("run*"))
    # Both servers are stopped: nothing still answers on their ports.
    assert "STOP 1b-host" in r.stdout


def test_dead_server_stops_the_suite_with_its_log(fake_bundle, gpu_path, tmp_path):
    r, _ = _bench_1b(fake_bundle, gpu_path, tmp_path, env={"FAKE_VLLM_DIE_AFTER": "1"})
    assert r.returncode == 1
    assert "server died during host-512" in r.stderr
    assert "exit code 3" in r.stderr


def test_gate_mismatch_stops_before_timing(fake_bundle, gpu_path, tmp_path):
    r, out = _bench_1b(
        fake_bundle, gpu_path, tmp_path, env={"FAKE_VLLM_TAGMA_DIFFERS": "1"}
    )
    assert r.returncode == 1
    assert "correctness gate failed" in r.stderr
    assert not list((out / "1b-host/run2-tagma").glob("*.bench.json"))


def test_missing_or_corrupt_bundle_and_no_gpu(fake_bundle, gpu_path, tmp_path):
    r = _bench(tmp_path / "nothing", tmp_path / "o1", tmp_path / "d", gpu_path)
    assert r.returncode == 1 and "run `make bundle`" in r.stderr
    piece = fake_bundle / "bench-data.tar.xz"
    piece.write_bytes(piece.read_bytes() + b"x")
    r = _bench(fake_bundle, tmp_path / "o2", tmp_path / "d", gpu_path)
    assert r.returncode == 1 and "sha256 mismatch" in r.stderr
    r = _bench(fake_bundle, tmp_path / "o3", tmp_path / "d", "/usr/bin:/bin")
    assert r.returncode == 1 and "no GPU" in r.stderr


def test_suites_share_gpus_in_waves():

    s = bench_serve.SUITES
    waves = bench_serve.plan(
        [s["8b-16k"], s["8b-128k"], s["1b-host"], s["8b-tp2"]], [0, 1]
    )
    assert [[(x.name, g) for x, g in w] for w in waves] == [
        [("8b-16k", [0]), ("8b-128k", [1])],
        [("1b-host", [0])],
        [("8b-tp2", [0, 1])],
    ]
    assert bench_serve.plan([s["8b-tp2"]], [0]) == []


@pytest.mark.parametrize(
    "alone_name, whole_name, index",
    [
        ("1b-poisson-api4", "1b-host-api4", 1),
        ("1b-burst-api4", "1b-host-api4", 0),
        ("8b-128k-long", "8b-128k", 1),
        ("8b-128k-poisson", "8b-128k-tail", 1),
        ("8b-128k-admit", "8b-128k-tail", 1),
    ],
)
def test_a_one_workload_suite_is_its_suites_workload(alone_name, whole_name, index):
    """More runs of one workload must measure what the larger suite
    measured: same model, context, requests, arrival rate and server flags."""

    whole = bench_serve.SUITES[whole_name]
    alone = bench_serve.SUITES[alone_name]
    (workload,) = alone.workloads
    assert workload == whole.workloads[index]
    assert (alone.model, alone.max_model_len, alone.server_args, alone.gpus) == (
        whole.model,
        whole.max_model_len,
        whole.server_args,
        whole.gpus,
    )


def _step_kernels(t: float, corr: int, prefill_us: float) -> list[dict]:
    """One engine step's kernels: its slot-mapping mark, the KV write,
    attention, a GEMM that grows with the prefill and a norm."""
    return [
        {
            "name": "_compute_slot_mappings_kernel",
            "ts": t,
            "dur": 2.0,
            "args": {"correlation": corr},
        },
        {"name": "reshape_and_cache_flash_kernel", "ts": t + 3, "dur": 4.0},
        {"name": "void flash::flash_fwd_splitkv_kernel", "ts": t + 8, "dur": 30.0},
        {"name": "sm90_xmma_gemm_bf16", "ts": t + 40, "dur": 100.0 + prefill_us},
        {"name": "rms_norm_kernel", "ts": t + 300, "dur": 5.0},
    ]


def test_profiled_steps_are_matched_to_their_scheduler_step():
    """by_prefill matches each step's slot-mapping launch to the last C row
    written before it and splits the step's GPU time by part per bucket."""
    base = 1_700_000_000_000_000_000
    kernels, launches, comps = [], {}, []
    # Steps every 1,000 µs on the GPU; prefill 0, 700, 0, 2,000, 0 tokens.
    prefills = [0, 700, 0, 2000, 0]
    for i, prefill in enumerate(prefills):
        kernels += _step_kernels(1000.0 * i, 10 + i, prefill / 10)
        # schedule() returned 300 µs before the launch; the launch's CPU time
        # is on the Unix clock through the runtime event.
        launch = base + i * 1_000_000 + 50_000
        launches[10 + i] = launch
        comps.append((launch - 300_000, int(prefill > 0), prefill, 4))
    kernels.append(
        {
            "name": "_compute_slot_mappings_kernel",
            "ts": 5000.0,
            "dur": 2.0,
            "args": {"correlation": 99},
        }
    )
    out = profile_trace.by_prefill(kernels, launches, comps)
    assert out["matched"] == 5 and out["unmatched"] == 0
    b = out["buckets"]
    assert set(b) == {"0", "512-1023", "1024+"}
    assert b["0"]["steps"] == 3 and b["512-1023"]["steps"] == 1
    assert b["512-1023"]["gemm_us"] == 170.0
    assert b["1024+"]["gemm_us"] == 300.0
    assert b["0"]["attention_us"] == 30.0 and b["0"]["kv_write_us"] == 4.0
    assert b["0"]["write_path_us"] == 2.0 and b["0"]["other_us"] == 5.0
    assert b["0"]["busy_us"] == 141.0 and b["0"]["period_us"] == 1000.0
    assert b["512-1023"]["prefill_mean"] == 700.0
    # Every matched step is kept, in order, for analysis without the trace.
    fields = out["step_fields"]
    assert [st[fields.index("prefill")] for st in out["steps"]] == prefills
    assert out["steps"][3][fields.index("gemm_us")] == 300.0
    # A launch with no C row before it (or too long after one) is not
    # matched to a step, and is counted.
    late = {k: v + 5_000_000_000 for k, v in launches.items()}
    late[10] = launches[10]
    assert profile_trace.by_prefill(kernels, late, comps)["unmatched"] == 4


def test_summarize_dir_reads_launch_times_and_the_scheduler_trace(tmp_path):
    base = 1_700_000_000_000_000_000
    events = []
    for i, prefill in enumerate([0, 600, 0]):
        events += [
            {"ph": "X", "cat": "kernel", **k}
            for k in _step_kernels(1000.0 * i, i, prefill / 10)
        ]
        # The runtime event's ts is µs after baseTimeNanoseconds.
        events.append(
            {
                "ph": "X",
                # A Triton kernel's launch: the driver API.
                "cat": "cuda_driver",
                "name": "cuLaunchKernelEx",
                "ts": 1000.0 * i - 10,
                "dur": 3,
                "args": {"correlation": i},
            }
        )
    trace = tmp_path / "trace"
    trace.mkdir()
    with gzip.open(trace / "w.pt.trace.json.gz", "wt") as f:
        json.dump({"baseTimeNanoseconds": base, "traceEvents": events}, f)
    rows = [
        f"C\t{base + 1_000_000 * i - 200_000}\t1\t0\t{p}\t3"
        for i, p in enumerate([0, 600, 0])
    ]
    (tmp_path / "sched-7.tsv").write_text("\n".join(rows) + "\n")
    out = profile_trace.summarize_dir(trace, sched_dir=tmp_path)
    assert out["steps"] == 2
    assert out["by_prefill"]["matched"] == 2
    assert out["by_prefill"]["buckets"]["512-1023"]["gemm_us"] == 160.0
    lines = report_mod.by_prefill_lines("s", [("tagma", "run 2", out)])
    assert any(
        line.startswith("| tagma | run 2 | 512-1023 | 1 | 600 |") for line in lines
    )
    # Paged's gather, launched just before its step's slot mapping, counts
    # in its own step, not the one before.
    gathered = []
    for i, prefill in enumerate([0, 600, 0]):
        step = _step_kernels(1000.0 * i, i, prefill / 10)
        gather = {"name": "_gather_block_tables_kernel", "ts": 1000.0 * i - 5}
        gathered += [{**gather, "dur": 3.0 + i}, *step]
    launches = {i: base + 1_000_000 * i - 10_000 for i in range(3)}
    comps = [
        (base + 1_000_000 * i - 200_000, 1, p, 3) for i, p in enumerate([0, 600, 0])
    ]
    b = profile_trace.by_prefill(gathered, launches, comps)["buckets"]
    assert b["0"]["write_path_us"] == 5.0 and b["512-1023"]["write_path_us"] == 6.0
    # Without a scheduler trace the decode summary stands alone.
    assert "by_prefill" not in profile_trace.summarize_dir(trace)


def test_the_admission_profile_window_keeps_hundreds_of_steps():
    s = bench_serve.SUITES["8b-128k-admit"]
    assert s.profile is not None and s.profile_window == (64, 384)
    args = s.profile.args
    # Uncached prompts of 512-1,021 tokens: random, a seed of their own.
    assert args[args.index("--dataset-name") + 1] == "random"
    assert args[args.index("--seed") + 1] == "1"
    # argparse keeps the last value: the range ratio that follows _random's.
    last = len(args) - 1 - args[::-1].index("--random-range-ratio")
    assert args[last + 1] == "0.33"
    cmd = bench_serve.serve_cmd(s, "tagma", 8000, Path("/m"), Path("/r"))
    prof = json.loads(cmd[cmd.index("--profiler-config") + 1])
    assert (prof["delay_iterations"], prof["max_iterations"]) == (64, 384)
    other = bench_serve.serve_cmd(
        bench_serve.SUITES["8b-16k"], "paged", 8000, Path("/m"), Path("/r")
    )
    prof = json.loads(other[other.index("--profiler-config") + 1])
    assert (prof["delay_iterations"], prof["max_iterations"]) == (48, 32)


def test_the_1b_poisson_workload_arrives_at_70_per_second():
    (poisson,) = bench_serve.SUITES["1b-poisson-api4"].workloads
    assert poisson.args[poisson.args.index("--request-rate") + 1] == "70"


def test_side_by_side_suites_get_distinct_free_ports():
    import socket

    ports = bench_serve.free_ports(4)
    assert len(set(ports)) == 4
    for port in ports:  # free: each can be bound right away
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_profile_steps_are_delimited_by_slot_mapping_launches():
    kernels = []
    for i in range(4):
        t = 100.0 * i
        kernels += [
            {"name": "_gather_block_tables_kernel", "ts": t, "dur": 2.0},
            {"name": "_compute_slot_mappings_kernel", "ts": t + 3, "dur": 1.0},
            {"name": "gemm", "ts": t + 5, "dur": 50.0},
        ]
    s = profile_trace.summarize(kernels)
    assert s["steps"] == 3
    assert s["step_period_us"] == 100.0
    # The gather of step i+1 is launched before its slot-mapping mark, so
    # it lands in step i's window: still one gather and one slot per step.
    assert s["materialize_us"] == 2.0 and s["slot_mapping_us"] == 1.0
    assert s["write_path_share"] == pytest.approx(0.03)
    assert profile_trace._kind("_compute_slot_mappings_tagma_kernel") == "slot"
    assert profile_trace._kind("_tagma_prepare_kernel") == "fused"
    assert profile_trace.summarize([])["steps"] == 0


def test_gate_prompts_are_fixed():

    a = bench_serve.gate_prompts((5, 300))
    assert a == bench_serve.gate_prompts((5, 300))
    assert [len(p) for p in a] == [5, 300]
    assert all(1000 <= t < 121000 for p in a for t in p)


def test_detached_run_outlives_its_command_and_packs_results(
    fake_bundle, gpu_path, tmp_path, detach
):
    env = {**os.environ, "PATH": gpu_path, "DETACH_DIR": str(tmp_path / "run")}
    args = ["--bundle", str(fake_bundle), "--dest", str(tmp_path / "d")]
    start = detach(env, "start", *args, "--suites", "1b-host", timeout=60)
    assert start.returncode == 0, start.stderr
    tarball = tmp_path / "results.tar.xz"
    poll = detach(env, "poll", "240", str(tarball))
    assert poll.returncode == 0, poll.stdout + poll.stderr
    assert "finished" in poll.stdout

    def listing(data: bytes) -> list[str]:
        return (
            subprocess.run(
                ["tar", "-tJf", "-"], input=data, capture_output=True, check=True
            )
            .stdout.decode()
            .split()
        )

    names = listing(tarball.read_bytes())
    assert "results/report.md" in names
    assert "results/1b-host/run4-paged/run.json" in names
    assert not any("/trace/" in name for name in names)
    # Past the part size the pack comes in parts that join into the same.
    poll = detach({**env, "DETACH_PART_BYTES": "1024"}, "poll", "1", str(tarball))
    assert poll.returncode == 0 and "parts: cat" in poll.stdout
    parts = sorted(tmp_path.glob("results.tar.xz.part*"))
    assert len(parts) > 1 and not tarball.exists()
    assert all(p.stat().st_size <= 1024 for p in parts)
    assert listing(b"".join(p.read_bytes() for p in parts)) == names


def test_poll_reports_a_run_that_ends_while_packing_as_running(tmp_path, detach):
    """A run that finishes while poll packs is not reported finished: its last
    results are not in that pack, so the caller must poll once more."""
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    (run / "bench.log").write_text("run 5 (paged): starting the server\n")
    # tar stand-in: the run ends (make writes rc) just as packing starts.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tar = bin_dir / "tar"
    real_tar = shutil.which("tar")
    tar.write_text(f'#!/bin/sh\necho 0 >"{run}/rc"\nexec {real_tar} "$@"\n')
    tar.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DETACH_DIR": str(run),
    }
    tarball = tmp_path / "r.tar.xz"
    poll = detach(env, "poll", "0", str(tarball))
    assert poll.returncode == 3 and "still running" in poll.stdout, poll.stdout
    assert (run / "rc").exists() and tarball.exists()
    # The next poll sees the finished run.
    poll = detach(env, "poll", "0", str(tarball))
    assert poll.returncode == 0 and "finished (make exit code 0)" in poll.stdout


def test_detailed_results_keep_what_tail_reads(tmp_path):
    path = tmp_path / "w.bench.json"
    path.write_text(
        json.dumps(
            {
                "mean_ttft_ms": 12.3456789,
                "ttfts": [0.0123456789, 0.02],
                "itls": [[0.00312345678, 0.004], []],
                "output_lens": [3, 1],
                "generated_texts": ["x" * 1000, "y"],
            }
        )
    )
    slim = bench_serve.slim_detailed(path)
    assert json.loads(path.read_text()) == slim
    # Summary values untouched, times to 10 us, the texts gone.
    assert slim == {
        "mean_ttft_ms": 12.3456789,
        "ttfts": [0.01235, 0.02],
        "itls": [[0.00312, 0.004], []],
        "output_lens": [3, 1],
    }


def test_the_api8_burst_differs_from_the_api4_burst_only_in_api_servers():
    four, eight = (
        bench_serve.SUITES["1b-burst-api4"],
        bench_serve.SUITES["1b-burst-api8"],
    )
    assert eight.workloads == four.workloads
    assert (eight.model, eight.max_model_len) == (four.model, four.max_model_len)
    a4, a8 = list(four.server_args), list(eight.server_args)
    i = a4.index("--api-server-count")
    assert (a4[i + 1], a8[i + 1]) == ("4", "8")
    assert a4[: i + 1] == a8[: i + 1] and a4[i + 2 :] == a8[i + 2 :]


def test_requests_per_api_server_reads_the_run_s_part_of_the_log(tmp_path):
    log = tmp_path / "server.log"
    access = '"POST /v1/completions HTTP/1.1" 200 OK'
    earlier = f"(ApiServer_2 pid=9) INFO:     127.0.0.1:1 - {access}\n"
    log.write_text(earlier)
    start = log.stat().st_size
    with open(log, "a") as f:
        f.write(
            f"(ApiServer_0 pid=7) INFO:     127.0.0.1:2 - {access}\n"
            # Two processes' writes run together: the prefix next to the
            # line is its own.
            f"(ApiServer_3 pid=10) (ApiServer_1 pid=8) INFO:     127.0.0.1:3 - "
            f"{access}\n"
            # The prefix went to another line: no server named.
            f"INFO:     127.0.0.1:4 - {access}\n"
            '(ApiServer_0 pid=7) INFO:     127.0.0.1:5 - "GET /metrics HTTP/1.1"\n'
        )
    counts = bench_serve.requests_per_api_server(log, start)
    assert counts == {"0": 1, "1": 1, "?": 1}
    assert bench_serve.requests_per_api_server(log, 0)["2"] == 1
    assert report_mod.busiest_share({"0": 3, "1": 1, "?": 5}) == 0.75
    assert report_mod.busiest_share({"?": 4}) is None
    assert report_mod.busiest_share(None) is None
