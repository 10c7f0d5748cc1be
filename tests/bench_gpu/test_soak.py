# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""scripts/gpu/soak.py on CPU: its request plan, its client against the
stand-in server (fake/vllm: streams, drops, /metrics, /reset_prefix_cache),
and the verdict it draws from a run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts/gpu"
sys.path.insert(0, str(GPU))
import soak  # noqa: E402


def test_plan_is_fixed_and_shaped_as_documented():
    reqs = soak.plan(120, 8)
    assert reqs == soak.plan(120, 8)
    assert reqs != soak.plan(120, 8, seed=1)
    assert 800 < len(reqs) < 1120  # Poisson, 8/s over 120 s
    assert 119 < reqs[-1].at < 120
    assert all(a.at < b.at for a, b in zip(reqs, reqs[1:], strict=False))
    assert all(len(r.prompt) + r.max_tokens <= soak.MAX_MODEL_LEN for r in reqs)
    cancelled = [r for r in reqs if r.cancel_after is not None]
    assert 0.2 < len(cancelled) / len(reqs) < 0.3
    assert all(1 <= r.cancel_after < r.max_tokens for r in cancelled)
    assert 0.05 < sum(r.n == 2 for r in reqs) / len(reqs) < 0.15
    # Shared prefixes end mid-block: requests that share a first token share
    # a prefix whose length is not a multiple of the block size.
    by_first: dict[int, list[list[int]]] = {}
    for r in reqs:
        by_first.setdefault(r.prompt[0], []).append(r.prompt)
    shared = [p for p in by_first.values() if len(p) > 20]
    assert len(shared) == 8
    for prompts in shared:
        common = os.path.commonprefix(prompts)
        assert len(common) % soak.BLOCK_SIZE


def test_read_metrics_sums_labels_and_keeps_names_exact():
    text = (
        "# HELP vllm:num_preemptions_total x\n"
        'vllm:num_preemptions_total{engine="0"} 3.0\n'
        'vllm:num_preemptions_total{engine="1"} 2.0\n'
        'vllm:num_preemptions_created{engine="0"} 1.7e9\n'
        "vllm:kv_cache_usage_perc 0.25\n"
    )
    m = soak.bench_serve.read_metrics(text)
    assert m["vllm:num_preemptions_total"] == 5.0
    assert m["vllm:kv_cache_usage_perc"] == 0.25
    assert m["vllm:num_preemptions_created"] == 1.7e9


def test_log_errors_finds_error_lines_and_tracebacks():
    text = (
        "INFO 12-02 08:00:00 [api_server.py:1] Started\n"
        "ERROR 12-02 08:01:00 [core.py:9] EngineCore failed\n"
        "(EngineCore pid=7) ERROR 12-02 08:01:00 [core.py:9] boom\n"
        "Traceback (most recent call last):\n"
        "INFO 12-02 08:02:00 [logger.py:1] no ERRORS here\n"
    )
    assert len(soak.log_errors(text)) == 3


def _soak(fake_bundle: Path, tmp_path: Path, **env: str):
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            str(GPU / "soak.py"),
            "--bundle",
            str(fake_bundle),
            "--out",
            str(out),
            "--dest",
            str(tmp_path / "dest"),
            "--seconds",
            "3",
            "--rate",
            "15",
            "--max-inflight",
            "8",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r, out


def test_soak_passes_against_a_server_that_keeps_its_promises(fake_bundle, tmp_path):
    r, out = _soak(fake_bundle, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((out / "soak.json").read_text())
    assert result["fails"] == []
    c = result["counts"]
    assert c["completed"] > 0 and c["cancelled"] > 0 and c["error"] == 0
    assert c["completed"] + c["cancelled"] + c["unsent"] == len(result["requests"])
    assert c["unsent"] <= 1  # the fake keeps up: at most the one past the end
    assert result["reset"] == {"http_status": 200, "body": '{"success": true}'}
    assert result["after_probe"]["usage"] == 0
    assert "--kv-cache-backend tagma" in (out / "server.cmd").read_text()
    assert "--num-gpu-blocks-override 384" in (out / "server.cmd").read_text()
    # The client dropped cancelled streams after exactly that many chunks.
    for req, o in zip(result["requests"], result["outcomes"], strict=True):
        if o["status"] == "cancelled":
            assert o["chunks"] == req["cancel_after"]
        else:
            assert o["completion_tokens"] == req["max_tokens"] * req["n"]
    assert (out / "soak.png").stat().st_size > 0


@pytest.mark.parametrize(
    "env, message",
    [
        ({"FAKE_VLLM_RESET_FAILS": "1"}, "reset_prefix_cache (validate) failed"),
        ({"FAKE_VLLM_SHORT_STREAM": "1"}, "completed streams lost tokens"),
    ],
)
def test_soak_fails_on_a_broken_invariant_or_lost_tokens(
    fake_bundle, tmp_path, env, message
):
    r, out = _soak(fake_bundle, tmp_path, **env)
    assert r.returncode == 1
    assert message in r.stderr
    assert any(
        message in f for f in json.loads((out / "soak.json").read_text())["fails"]
    )


def _passing() -> dict:
    sample = {
        "usage": 0.0,
        "running": 0,
        "waiting": 0,
        "preemptions": 4,
        "prefix_hits": 9,
    }
    return {
        "arrivals_s": 479.6,
        "requests": [
            {"max_tokens": 5, "n": 1, "cancel_after": None},
            {"max_tokens": 5, "n": 2, "cancel_after": 2},
        ],
        "outcomes": [
            {"status": "completed", "chunks": 5, "completion_tokens": 5, "error": None},
            {
                "status": "cancelled",
                "chunks": 2,
                "completion_tokens": None,
                "error": None,
            },
        ],
        "timeline": [{**sample, "inflight": 1}],
        "idle": dict(sample),
        "reset": {"http_status": 200, "body": '{"success": true}'},
        "probe": "completed",
        "after_probe": dict(sample),
        "server_alive": True,
        "log_errors": [],
    }


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda r: r["outcomes"][1].update(status="error", error="HTTP 500"), "failed"),
        (lambda r: r.update(arrivals_s=300.0), "arrivals lasted"),
        (lambda r: r["timeline"][-1].update(preemptions=0), "no preemption"),
        (lambda r: r["timeline"][-1].update(prefix_hits=0), "no prefix hit"),
        (
            lambda r: r["outcomes"][1].update(status="completed", completion_tokens=10),
            "no request was cancelled",
        ),
        (lambda r: r["idle"].update(running=2), "never went idle"),
        (lambda r: r["after_probe"].update(usage=0.01), "KV-cache usage 0.01"),
        (lambda r: r.update(probe="error"), "probe request error"),
        (lambda r: r["reset"].update(body='{"success": false}'), "reset_prefix_cache"),
        (lambda r: r.update(server_alive=False), "server exited"),
        (lambda r: r.update(log_errors=["ERROR boom"]), "server log errors"),
        (lambda r: r["outcomes"].__setitem__(0, None), "has no outcome"),
    ],
)
def test_verdict_names_each_failure(break_it, message):
    assert soak.verdict(_passing(), 480) == []
    result = copy.deepcopy(_passing())
    break_it(result)
    fails = soak.verdict(result, 480)
    assert any(message in f for f in fails), fails


def test_detached_chain_gives_each_target_its_arguments(
    fake_bundle, gpu_path, tmp_path, detach
):
    """detach.sh runs several targets one after the other, each with its own
    arguments and folder: the offline set (results/offline/), the soak
    (results/soak/), then a serve suite (results/)."""
    common = ["--bundle", str(fake_bundle), "--dest", str(tmp_path / "d")]
    offline_args = ["--variants", "paged-stock,tagma", "--resident"]
    env = {
        **os.environ,
        "PATH": gpu_path,
        "DETACH_DIR": str(tmp_path / "run"),
        "DETACH_TARGET": "bench-offline soak-gpu bench-gpu",
        "SOAK_ARGS": " ".join([*common, "--seconds", "2", "--rate", "10"]),
        "OFFLINE_ARGS": " ".join([*common, *offline_args, "--num-prompts", "64"]),
    }
    start = detach(env, "start", *common, "--suites", "1b-host", "--order", "AB")
    assert start.returncode == 0, start.stderr
    tarball = tmp_path / "results.tar.xz"
    poll = detach(env, "poll", "240", str(tarball))
    assert "finished (make exit code 0)" in poll.stdout, poll.stdout + poll.stderr
    names = subprocess.run(
        ["tar", "-tJf", str(tarball)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "results/soak/soak.json" in names
    assert "results/1b-host/run2-tagma/run.json" in names
    summary = json.loads((tmp_path / "run/results/offline/summary.json").read_text())
    assert summary["resident"] is True
    runs = [r["variant"] for r in summary["runs"]]
    assert runs == ["paged-stock", "tagma", "tagma", "paged-stock"]
    assert "--num-prompts" in summary["workload"]
    assert summary["workload"][summary["workload"].index("--num-prompts") + 1] == "64"


def test_detached_chain_reports_a_failed_target_and_runs_the_rest(
    fake_bundle, gpu_path, tmp_path, detach
):
    """A target that fails does not stop the ones after it, and the chain's
    exit code says one failed."""
    common = ["--bundle", str(fake_bundle), "--dest", str(tmp_path / "d")]
    env = {
        **os.environ,
        "PATH": gpu_path,
        "DETACH_DIR": str(tmp_path / "run"),
        "DETACH_TARGET": "bench-offline soak-gpu",
        "OFFLINE_ARGS": " ".join([*common, "--variants", "paged,nope"]),
        "SOAK_ARGS": " ".join([*common, "--seconds", "2", "--rate", "10"]),
    }
    assert detach(env, "start").returncode == 0
    poll = detach(env, "poll", "240", str(tmp_path / "r.tar.xz"))
    assert poll.returncode == 0, poll.stdout + poll.stderr
    assert "finished (make exit code 2)" in poll.stdout, poll.stdout
    assert (tmp_path / "run/results/soak/soak.json").exists()


@pytest.mark.parametrize(
    "run", ["views-480s", "full-480s", "first-480s", "calibration-150s"]
)
def test_published_soaks_rebuild_their_verdict(run):
    """The committed H200 soaks: today's verdict, from their own records, is
    the one they published (results/soak-h200-0.26.0/README.md)."""
    result = soak.load(ROOT / "results/soak-h200-0.26.0" / run)
    assert soak.verdict(result, result["args"]["seconds"]) == result["fails"]
    assert (ROOT / "results/soak-h200-0.26.0" / run / "soak.png").stat().st_size > 0
    if run != "first-480s":
        assert result["fails"] == []
        assert result["timeline"][-1]["preemptions"] >= 500
    else:  # the harness's faults, as the README says
        assert any("HTTP 400" in f for f in result["fails"])
        assert any("no preemption" in f for f in result["fails"])
