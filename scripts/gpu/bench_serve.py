# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""`make bench-gpu`: paged against tagma under `vllm serve`, ABBA, on a GPU host.

    python3 scripts/gpu/bench_serve.py --bundle build/bundle --out DIR
        [--suites 8b-16k,8b-128k,1b-host,8b-tp2] [--gpus 0,1] [--order ABBA]

For each suite the backends run in ABBA order (paged, tagma, tagma, paged):
each run starts `vllm serve --kv-cache-backend X` on a dummy-weight model,
waits for it (watching its pid), runs the correctness gate (greedy token ids
of a fixed prompt set, which must equal the first run's), then each workload
through `vllm bench serve` while /metrics is sampled (peak KV usage,
preemptions), and, in the first A and first B run, a torch.profiler window of
decode steps. Everything but the backend is the same: model, seed, requests,
flags, GPU. A lower-case letter in --order (aABBA) adds a warm-up run that
the report leaves out: the first server on a fresh host runs slower. With
several GPUs, suites that fit run side by side, one GPU each.
`--baseline paged-stock` makes A paged with vLLM's KV manager as released
(scripts/bench/ablation.py's StockKVCacheManager) instead of the series'.
`--shared-socket` makes every server's API servers accept from the one
listening socket they inherit, as vLLM as released does, instead of a socket
each (the series' frontend-api-server-own-listener patch; both backends):
a set with it and one without, back to back, measure that patch.

`--resident` starts each backend's server once per suite instead, both side by
side on the suite's GPU(s) at RESIDENT_GPU_SHARE of the memory each (gate at
start), and the runs of --order take turns between them: no start between
runs, so a session fits more pairs (abABBABAAB), and the two backends' runs are
seconds apart on the same host. The idle server holds memory, not the GPU or
the host; a run's folder gets its slice of its server's scheduler trace, so the
report reads it as any other (server.log and gate.json are in server-<backend>/).
Before each run its server's prefix cache is emptied (POST /reset_prefix_cache,
dev mode), so the run computes its prompts as on a server of its own.

Per run: server.log, <workload>.json (vllm bench serve's result + what this
script measured: the main run's CPU time per process, hostcpu.py), gate.json,
profile.json, sched-*.tsv (scheduler-thread timing, scripts/gpu/hook). Then
report.py writes report.md and plots; `report.py --out DIR PASS1 PASS2` pools
the runs of several invocations.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bundle as bundle_mod  # noqa: E402
import hostcpu  # noqa: E402
import profile_trace  # noqa: E402
import report  # noqa: E402

VLLM = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
BACKENDS = {"A": "paged", "B": "tagma"}
# `--baseline paged-stock`: A's servers run paged with vLLM's KV manager as
# released (scripts/bench/ablation.py), the reference issue 17's bars are
# judged against; the series' paged shares tagma's backend-neutral hooks.
STOCK_MANAGER = ("--kv-cache-manager-cls", "ablation.StockKVCacheManager")


@dataclass
class Workload:
    name: str
    args: list[str]
    warmups: int = 8


@dataclass
class Suite:
    name: str
    model: str
    max_model_len: int
    workloads: list[Workload]
    profile: Workload | None = None
    gpus: int = 1
    server_args: list[str] = field(default_factory=list)
    gate_lens: tuple[int, ...] = (8, 64, 512, 2048)
    # The profiler window, in engine steps: skipped, then kept.
    profile_window: tuple[int, int] = (48, 32)
    # Set per invocation (--baseline): extra server flags for paged only.
    paged_args: tuple[str, ...] = ()


def _random(n_in: int, n_out: int, prompts: int, *extra: str) -> list[str]:
    return [
        "--dataset-name",
        "random",
        "--random-input-len",
        str(n_in),
        "--random-output-len",
        str(n_out),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(prompts),
        *extra,
    ]


def _sharegpt(prompts: int) -> list[str]:
    return [
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        "{data}/sharegpt.json",
        "--num-prompts",
        str(prompts),
    ]


def _prefix(prompts: int, num_prefixes: int = 8) -> list[str]:
    return [
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        "4096",
        "--prefix-repetition-suffix-len",
        "512",
        "--prefix-repetition-num-prefixes",
        str(num_prefixes),
        "--prefix-repetition-output-len",
        "256",
        "--num-prompts",
        str(prompts),
    ]


def _poisson(rate: float) -> list[str]:
    # Arrivals over time, as serving latency is usually judged: a Poisson
    # process (burstiness 1) at `rate` requests/s. The bench's own
    # `--request-rate inf` comes first on its command line; this one wins.
    return ["--request-rate", str(rate), "--burstiness", "1.0"]


PREFIX = _prefix(128)
# 1B, host-bound: 1,024 requests in flight need the scheduler's room, and one
# API server bounds both backends there (docs/results.md), so four.
HOST_API4 = ["--max-num-seqs", "1024", "--api-server-count", "4"]
# Arrivals over time at about 75 % of what the 1,024 burst sustained on the
# H200 (89-99 requests/s): several hundred requests running with admissions
# every step, for about a minute.
HOST_POISSON = Workload("host-poisson", _random(128, 256, 4096) + _poisson(70))
HOST_BURST = Workload("host-1024", _random(128, 256, 1024, "--max-concurrency", "1024"))
# 8B at 128K: two 120K-token prompts (gated up to 32K tokens), and 900
# ShareGPT requests arriving at 28/s.
LONG_120K = Workload("long-120k", _random(120000, 256, 2), warmups=0)
LONG_GATE = (8, 64, 512, 2048, 8192, 32768)
SHAREGPT_POISSON = Workload("sharegpt-poisson", _sharegpt(900) + _poisson(28))
# Admissions of 512-1,021 uncached tokens (random prompts, a seed of their
# own) arriving over time into a decode batch of 128 output tokens each; the
# range ratio and seed come after _random's and win, as _poisson's rate does.
ADMIT = _random(
    768, 128, 400, "--random-range-ratio", "0.33", "--seed", "1", *_poisson(28)
)
# The ITL tail: the 16K prefix burst, and arrivals over time at about 75 % of
# what the burst runs sustained on the H200 (8b-16k: ShareGPT 38 requests/s,
# prefix 16 requests/s), long enough (~30 s, about 1,000 requests) for a
# stable p99.
# Greedy-gate prompt lengths for the 16K prefix suites: up to one whole
# prefix-workload prompt (4,096 + 512).
PREFIX_GATE = (8, 512, 4608)
TAIL = [
    Workload("prefix", PREFIX),
    Workload("sharegpt-poisson", _sharegpt(900) + _poisson(28)),
    Workload("prefix-poisson", _prefix(384) + _poisson(12)),
]

SUITES = {
    s.name: s
    for s in [
        Suite(
            "8b-16k",
            "llama-3.1-8b",
            16384,
            [
                Workload("sharegpt", _sharegpt(300)),
                Workload("long-15k", _random(15000, 256, 16), warmups=1),
                Workload("prefix", PREFIX),
            ],
            profile=Workload("profile-15k", _random(15000, 256, 8), warmups=0),
            gate_lens=(8, 64, 512, 2048, 8192, 15000),
        ),
        Suite("8b-tail", "llama-3.1-8b", 16384, TAIL, gate_lens=PREFIX_GATE),
        # 8b-tail with four API servers: in its Poisson runs a single API
        # server holds requests back before the engine (docs/itl-tail.md),
        # so TTFT there is the front end's; this measures the engine's.
        Suite(
            "8b-tail-api4",
            "llama-3.1-8b",
            16384,
            TAIL,
            server_args=["--api-server-count", "4"],
            gate_lens=PREFIX_GATE,
        ),
        # The steady state of a long-running server: a KV cache of 16,384
        # blocks (262K tokens) under 64 shared prefixes of 4,096 tokens and
        # the requests running on them, so the free pool is cached blocks and
        # every placement evicts (the CPU bench's `--prefix pressure`,
        # docs/ablation.md). Sized on paper; the first run's peak KV usage,
        # preemptions and prefix hits say whether it needs retuning.
        Suite(
            "8b-pressure",
            "llama-3.1-8b",
            16384,
            [Workload("prefix64-poisson", _prefix(512, 64) + _poisson(10))],
            server_args=["--num-gpu-blocks-override", "16384"],
            gate_lens=PREFIX_GATE,
        ),
        Suite(
            "8b-128k",
            "llama-3.1-8b",
            131072,
            [
                Workload("sharegpt", _sharegpt(300)),
                LONG_120K,
            ],
            profile=Workload("profile-120k", _random(120000, 256, 1), warmups=0),
            gate_lens=LONG_GATE,
        ),
        # The ShareGPT burst's TPOT p99 over 300 requests is three short
        # requests (docs/itl-tail.md); 1,200 make it twelve. At 128K also
        # arrivals over time, at 8b-tail's ShareGPT rate.
        Suite(
            "8b-16k-sharegpt",
            "llama-3.1-8b",
            16384,
            [Workload("sharegpt-1200", _sharegpt(1200))],
            gate_lens=(8, 512, 8192),
        ),
        Suite(
            "8b-128k-tail",
            "llama-3.1-8b",
            131072,
            [
                Workload("sharegpt-1200", _sharegpt(1200)),
                SHAREGPT_POISSON,
            ],
            gate_lens=(8, 512, 8192),
        ),
        # 8b-128k-tail's Poisson workload alone, for more pairs per session.
        # Without the burst before it, its prompts start uncached (in
        # 8b-128k-tail the burst has cached them): its own run set.
        Suite(
            "8b-128k-poisson",
            "llama-3.1-8b",
            131072,
            [SHAREGPT_POISSON],
            gate_lens=(8, 512, 8192),
        ),
        # 8b-128k-poisson with a profiler window over admission steps: after
        # each run's Poisson workload, 400 uncached prompts of 512-1,021
        # tokens arrive at its rate into a running decode batch, and 384
        # steps are kept (about one in five admits a prompt), so the GPU time
        # of steps that admit 512-1,023 prefill tokens can be compared
        # between backends, part by part (profile_trace.by_prefill).
        Suite(
            "8b-128k-admit",
            "llama-3.1-8b",
            131072,
            [SHAREGPT_POISSON],
            profile=Workload("profile-admit", ADMIT, warmups=0),
            profile_window=(64, 384),
            gate_lens=(8, 512, 8192),
        ),
        # 8b-128k's long workload alone: the ShareGPT burst of 300 is
        # superseded by 8b-128k-tail's 1,200, and a run without it and the
        # profile fits more runs in a device session.
        Suite(
            "8b-128k-long",
            "llama-3.1-8b",
            131072,
            [LONG_120K],
            gate_lens=LONG_GATE,
        ),
        # 8b-128k's ShareGPT burst with four API servers: a single API
        # server falls behind tagma's token stream there (more tokens per
        # streamed chunk than under paged, docs/itl-tail.md), so this
        # separates the front end from the engine.
        Suite(
            "8b-128k-api4",
            "llama-3.1-8b",
            131072,
            [Workload("sharegpt", _sharegpt(300))],
            gate_lens=(8, 512, 8192),
            server_args=["--api-server-count", "4"],
        ),
        Suite(
            "1b-host",
            "llama-3.2-1b",
            4096,
            [
                Workload(
                    "host-512", _random(128, 256, 512, "--max-concurrency", "512")
                ),
                Workload(
                    "host-1024", _random(128, 256, 1024, "--max-concurrency", "1024")
                ),
            ],
            profile=Workload("profile-host", _random(128, 256, 256), warmups=0),
            server_args=["--max-num-seqs", "1024"],
        ),
        # 1b-host with four API servers, so this measures the engine, as the
        # host-bound issue asks, and its Poisson arrivals. The burst's ITL
        # p99 is its admission ramp (docs/itl-tail.md).
        Suite(
            "1b-host-api4",
            "llama-3.2-1b",
            4096,
            [HOST_BURST, HOST_POISSON],
            server_args=HOST_API4,
        ),
        # 1b-host-api4's burst alone (1,024 concurrent), for more runs per
        # session.
        Suite(
            "1b-burst-api4",
            "llama-3.2-1b",
            4096,
            [HOST_BURST],
            server_args=HOST_API4,
        ),
        # The same burst with eight API servers: whether four are the front
        # end's ceiling. With one shared socket they were (the client seconds
        # behind the engine, results/serve-h200-0.26.0/
        # 1b-burst-api4-resident-stock); with a socket each, four kept up
        # with 60K output tok/s (1b-burst-api4-listener).
        Suite(
            "1b-burst-api8",
            "llama-3.2-1b",
            4096,
            [HOST_BURST],
            server_args=["--max-num-seqs", "1024", "--api-server-count", "8"],
        ),
        # The Poisson workload alone: its medians differ between the backends
        # by less than the host drifts between runs (docs/itl-tail.md), so it
        # needs more runs than fit a device session beside the burst (about
        # 2.5 minutes a run with the server's start).
        Suite(
            "1b-poisson-api4",
            "llama-3.2-1b",
            4096,
            [HOST_POISSON],
            server_args=HOST_API4,
        ),
        Suite(
            "8b-tp2",
            "llama-3.1-8b",
            16384,
            [Workload("sharegpt", _sharegpt(300))],
            gpus=2,
            server_args=["--tensor-parallel-size", "2"],
        ),
    ]
}


class BenchError(RuntimeError):
    """A stop with a message for the user (exit code 1)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _post(url: str, body: dict, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def server_env(pythonpath: str) -> dict[str, str]:
    """The environment of every `vllm serve` the harness starts: the bundle's
    packages first, offline, and the same sampler for both backends."""
    return {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # The image has no flashinfer; the same sampler for both backends.
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
    }


def serve_cmd(
    suite: Suite, backend: str, port: int, model_dir: Path, run_dir: Path
) -> list[str]:
    """A suite's `vllm serve` command, with the profiler writing to run_dir."""
    trace_dir = run_dir / "trace"
    profiler = {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
        "delay_iterations": suite.profile_window[0],
        "max_iterations": suite.profile_window[1],
    }
    return [
        *VLLM,
        "serve",
        str(model_dir),
        "--load-format",
        "dummy",
        "--max-model-len",
        str(suite.max_model_len),
        "--port",
        str(port),
        "--seed",
        "0",
        "--kv-cache-backend",
        backend,
        *(suite.paged_args if backend == "paged" else ()),
        "--profiler-config",
        json.dumps(profiler),
        *suite.server_args,
    ]


class Server:
    """A `vllm serve` process: started on `cmd`, its output in
    run_dir/server.log (and the command in server.cmd)."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], port: int, run_dir: Path
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = run_dir / "server.log"
        (run_dir / "server.cmd").write_text(" ".join(cmd) + "\n")
        self.out = open(self.log, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started = time.monotonic()

    def wait_ready(self, timeout: float) -> float:
        while time.monotonic() - self.started < timeout:
            if not _alive(self.proc):
                raise BenchError(
                    f"server exited with code {self.proc.returncode} while starting; "
                    f"{self.log}:\n{_tail(self.log)}"
                )
            try:
                _get(self.url + "/health", timeout=2)
                return time.monotonic() - self.started
            except OSError:
                time.sleep(1)
        raise BenchError(
            f"server not ready after {timeout:.0f} s; {self.log}:\n{_tail(self.log)}"
        )

    def check_alive(self, what: str) -> None:
        if not _alive(self.proc):
            raise BenchError(
                f"server died during {what} (exit code {self.proc.returncode}); "
                f"{self.log}:\n{_tail(self.log)}"
            )

    def stop(self) -> None:
        if _alive(self.proc):
            os.killpg(
                self.proc.pid, signal.SIGTERM
            )  # SIGINT may be ignored when detached
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.out.close()


def capacity(log_path: Path) -> dict:
    text = log_path.read_text(errors="replace")
    out: dict = {}
    if m := re.search(r"GPU KV cache size: ([\d,]+) tokens", text):
        out["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    if m := re.search(
        r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text
    ):
        out["max_concurrency"] = float(m.group(2))
    if m := re.search(r"num_gpu_blocks[ =:]+(\d+)", text):
        out["num_gpu_blocks"] = int(m.group(1))
    return out


def read_metrics(text: str) -> dict[str, float]:
    """/metrics text as {name: value}, each summed over its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
    return out


class MetricsSampler(threading.Thread):
    """Polls /metrics: peak KV-cache usage and the preemption counter."""

    def __init__(self, url: str, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.url, self.period = url + "/metrics", period
        self.stop_event = threading.Event()
        self.peak_usage = 0.0
        self.samples = 0
        self.preemptions_start: float | None = None
        self.preemptions_end: float | None = None

    @staticmethod
    def _read(text: str, name: str) -> float | None:
        return read_metrics(text).get(name)

    def poll(self) -> str:
        try:
            text = _get(self.url).decode()
        except OSError:
            return ""
        if (u := self._read(text, "vllm:kv_cache_usage_perc")) is not None:
            self.peak_usage = max(self.peak_usage, u)
            self.samples += 1
        return text

    def run(self) -> None:
        self.preemptions_start = self._read(self.poll(), "vllm:num_preemptions_total")
        while not self.stop_event.wait(self.period):
            self.poll()

    def finish(self) -> dict:
        self.stop_event.set()
        self.join()
        self.preemptions_end = self._read(self.poll(), "vllm:num_preemptions_total")
        pre = None
        if self.preemptions_start is not None and self.preemptions_end is not None:
            pre = self.preemptions_end - self.preemptions_start
        return {
            "peak_kv_usage": self.peak_usage,
            "metric_samples": self.samples,
            "preemptions": pre,
        }


def gate_prompts(lens: tuple[int, ...], seed: int = 1234) -> list[list[int]]:
    """Fixed token-id prompts (a linear congruential stream: no numpy needed)."""
    x, out = seed, []
    for n in lens:
        ids = []
        for _ in range(n):
            x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
            ids.append(1000 + (x >> 33) % 120000)
        out.append(ids)
    return out


def run_gate(server: Server, model_dir: Path, suite: Suite) -> list[list[int]]:
    body = {
        "model": str(model_dir),
        "prompt": gate_prompts(suite.gate_lens),
        "max_tokens": 32,
        "temperature": 0.0,
        "seed": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    resp = _post(server.url + "/v1/completions", body)
    choices = sorted(resp["choices"], key=lambda c: c["index"])
    ids = [c.get("token_ids") for c in choices]
    if any(not t for t in ids):
        raise BenchError("the server returned no token_ids for the correctness gate")
    return ids


def run_bench(
    wl: Workload,
    server: Server,
    env: dict[str, str],
    model_dir: Path,
    data: Path,
    run_dir: Path,
    profile: bool,
) -> dict:
    args = [a.replace("{data}", str(data)) for a in wl.args]
    cmd = [
        *VLLM,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--model",
        str(model_dir),
        "--port",
        str(server.port),
        "--seed",
        "0",
        "--ignore-eos",
        "--request-rate",
        "inf",
        "--num-warmups",
        str(wl.warmups),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--result-dir",
        str(run_dir),
        "--result-filename",
        f"{wl.name}.bench.json",
        "--disable-tqdm",
        # Per-request ITLs, for the tail-latency question in the README.
        "--save-detailed",
        *args,
    ]
    if profile:
        cmd.append("--profile")
    sampler = MetricsSampler(server.url)
    sampler.start()
    t0 = time.time()
    marks: dict[str, float] = {}
    samples: dict[str, tuple] = {}
    log_start = server.log.stat().st_size
    bench_log = run_dir / f"{wl.name}.bench.log"
    with open(bench_log, "w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

        def sample(mark: str) -> None:
            # The processes' CPU and run-queue time at the main run's start
            # and once the bench prints its result (hostcpu.py).
            samples[mark] = (
                hostcpu.process_cpu(proc.pid),
                hostcpu.group_cpu(server.proc.pid),
            )

        copier = threading.Thread(target=copy_marking, args=(proc, out, marks, sample))
        copier.start()
        while proc.poll() is None:
            if not _alive(server.proc):
                proc.kill()
                break
            time.sleep(0.5)
        copier.join()
    t1 = time.time()
    per_api_server = requests_per_api_server(server.log, log_start)
    extra = sampler.finish()
    server.check_alive(wl.name)
    if proc.returncode != 0:
        raise BenchError(
            f"vllm bench serve failed for {wl.name} (exit {proc.returncode}); "
            f"{bench_log}:\n{_tail(bench_log)}"
        )
    result = slim_detailed(run_dir / f"{wl.name}.bench.json")
    # The per-request lists stay in <workload>.bench.json; run.json keeps
    # the summary.
    result = {k: v for k, v in result.items() if not isinstance(v, list)}
    out_r = {
        "workload": wl.name,
        "window": [t0, t1],
        "warmups": wl.warmups,
        "bench": result,
        "api_server_requests": per_api_server,
        **extra,
    }
    if MAIN_RUN in marks:
        # From the main run's start: the bench's own start-up, single-prompt
        # test and warm-up requests are not the workload.
        out_r["main_window"] = [marks[MAIN_RUN], t1]
        if (host := host_cpu(marks, samples)) is not None:
            out_r["host_cpu"] = host
    return out_r


# uvicorn's access-log line for a completion, after vLLM's "(ApiServer_<i>
# pid=...)" prefix. vLLM writes a prefix and its line separately, so lines
# of several processes can run together ("(ApiServer_3 ...) (ApiServer_2
# ...) INFO: ..."; about 1 % of the lines at 1,024 requests at once): the
# prefix next to the line is taken as its own, and a line with none counts
# as "?".
_COMPLETION = '"POST /v1/completions HTTP/1.1"'
_API_SERVER = re.compile(r"ApiServer_(\d+)")


def requests_per_api_server(log: Path, start: int) -> dict[str, int]:
    """Completion requests each API server took in a server log from byte
    `start` on (a run's share of a resident server's log). On vLLM's one
    shared listening socket (as released, or --shared-socket) whichever
    process is ready first accepts a burst's connections, so the shares can
    be far from even, and the busiest server then bounds what the client
    sees; with a socket each (the series' listener patch) they are even."""
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    out: dict[str, int] = {}
    for line in text.splitlines():
        if _COMPLETION in line:
            tags = _API_SERVER.findall(line.split("INFO:")[0])
            key = tags[-1] if tags else "?"
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def host_cpu(marks: dict[str, float], samples: dict[str, tuple]) -> dict | None:
    """The main run's CPU and run-queue seconds per process, from the
    samples at its two marks: which part of the front end saturates, or
    starves, when the client lags the engine. None without both marks (a
    bench that failed) or without /proc."""
    if set(samples) != {MAIN_RUN, RESULT}:
        return None
    (c0, s0), (c1, s1) = samples[MAIN_RUN], samples[RESULT]
    if c0 is None or c1 is None:
        return None
    return {
        "window_s": round(marks[RESULT] - marks[MAIN_RUN], 3),
        "client_s": round(c1.cpu_s - c0.cpu_s, 3),
        "client_wait_s": round(c1.wait_s - c0.wait_s, 3),
        "server_s": hostcpu.by_title(s0, s1),
        "server_wait_s": hostcpu.by_title(s0, s1, "wait_s"),
    }


# The per-request lists tail.py reads; the rest (generated texts) is dropped.
DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")


def _round_s(x: Any) -> Any:
    # Seconds to 10 µs: a tenth of the shortest step, a third of the bytes.
    if isinstance(x, list):
        return [_round_s(v) for v in x]
    return round(x, 5) if isinstance(x, float) else x


def slim_detailed(path: Path) -> dict:
    """Rewrite a `--save-detailed` result with only the per-request lists
    that are read later, times rounded to 10 µs (4,096 requests of 256
    tokens: 32 MB as written, 10 MB after), and return it."""
    result = json.loads(path.read_text())
    slim = {
        k: _round_s(v) if isinstance(v, list) else v
        for k, v in result.items()
        if not isinstance(v, list) or k in DETAILED
    }
    path.write_text(json.dumps(slim, separators=(",", ":")))
    return slim


# The line `vllm bench serve` prints once its warm-up requests are done.
MAIN_RUN = "Starting main benchmark run"


# The line it prints once the main run is over, before its numbers.
RESULT = "============ Serving Benchmark Result"


def copy_marking(
    proc: subprocess.Popen,
    out,
    marks: dict[str, float],
    on_mark: Callable[[str], None],
) -> None:
    """Copy the bench's output to its log, noting when the main run starts
    and ends (MAIN_RUN, RESULT) and calling on_mark then."""
    assert proc.stdout is not None
    for line in proc.stdout:
        for mark in (MAIN_RUN, RESULT):
            if line.startswith(mark) and mark not in marks:
                marks[mark] = time.time()
                on_mark(mark)
        out.write(line)
        out.flush()


@dataclass
class Started:
    """A server that passed the gate, and what its start measured."""

    server: Server
    dir: Path  # server.log, server.cmd, gate.json, scheduler and profiler traces
    ready_s: float
    capacity: dict
    gate: bool | None  # equal to the suite's first server's ids (None: first)


def start_server(
    suite: Suite,
    backend: str,
    env: dict[str, str],
    paths: dict,
    server_dir: Path,
    port: int,
    reference: dict,
    tag: str,
    extra_args: tuple[str, ...] = (),
) -> Started:
    """Start `vllm serve` for `backend` in server_dir, wait for it and run the
    correctness gate; the server is stopped again if either fails."""
    model_dir = paths["data"] / "models" / suite.model
    env = {**env, "TAGMA_SCHED_TRACE": str(server_dir)}
    log(f"{tag}: starting the server")
    cmd = serve_cmd(suite, backend, port, model_dir, server_dir) + list(extra_args)
    server = Server(cmd, env, port, server_dir)
    try:
        ready = server.wait_ready(900)
        cap = capacity(server.log)
        log(f"{tag}: ready in {ready:.0f} s, {cap}")
        ids = run_gate(server, model_dir, suite)
        equal = ids == reference["ids"] if "ids" in reference else None
        if equal is None:
            reference.update(ids=ids, backend=backend)
        gate: dict[str, Any] = {"token_ids": ids}
        if equal is not None:
            gate["equal_to_run1"] = equal
        (server_dir / "gate.json").write_text(json.dumps(gate))
        if equal is False:
            raise BenchError(
                f"correctness gate failed: greedy token ids under {backend} "
                f"differ from run 1 ({reference['backend']}); "
                f"see {server_dir / 'gate.json'}"
            )
    except BaseException:
        server.stop()
        raise
    return Started(server, server_dir, ready, cap, equal)


def measure(
    suite: Suite,
    index: int,
    backend: str,
    started: Started,
    env: dict[str, str],
    paths: dict,
    run_dir: Path,
    tag: str,
    warmup: bool,
    profile: bool,
) -> dict:
    """One run's workloads (and profiler window) against a started server;
    returns run.json's content but for the scheduler numbers."""
    model_dir = paths["data"] / "models" / suite.model
    server = started.server
    results = []
    for wl in suite.workloads:
        r = run_bench(wl, server, env, model_dir, paths["data"], run_dir, False)
        b = r["bench"]
        log(
            f"{tag} {wl.name}: "
            f"{b.get('total_token_throughput', 0):.0f} tok/s, "
            f"TTFT p99 {b.get('p99_ttft_ms', 0):.0f} ms, "
            f"TPOT p99 {b.get('p99_tpot_ms', 0):.1f} ms, "
            f"peak KV {r['peak_kv_usage']:.2f}, preemptions {r['preemptions']}"
        )
        results.append(r)
    prof = None
    if suite.profile is not None and profile:
        log(f"{tag}: profiler window")
        run_bench(suite.profile, server, env, model_dir, paths["data"], run_dir, True)
        # A long window's trace takes longer to write.
        wait_s = 60 + suite.profile_window[1] // 2
        prof = profile_trace.summarize_dir(
            started.dir / "trace", wait_s=wait_s, sched_dir=started.dir
        )
        (run_dir / "profile.json").write_text(json.dumps(prof, indent=1))
        log(f"{tag}: profile {profile_trace.brief(prof)}")
    return {
        "suite": suite.name,
        "run": index + 1,
        "warmup": warmup,
        "backend": backend,
        **({"manager": "stock"} if backend == "paged" and suite.paged_args else {}),
        "startup_s": started.ready_s,
        "capacity": started.capacity,
        "gate": started.gate,
        "results": results,
        "profile": prof,
    }


def write_run(run_dir: Path, summary: dict) -> None:
    # run.json carries the scheduler numbers too, so a report can be rebuilt
    # from run.json files alone (the traces are left behind on the host).
    trace = report.read_trace(run_dir)
    for r in summary["results"]:
        r["sched"] = report.sched_stats(trace, r)
    (run_dir / "run.json").write_text(json.dumps(summary, indent=1))


def _run_dir(out: Path, suite: Suite, index: int, backend: str) -> Path:
    run_dir = out / suite.name / f"run{index + 1}-{backend}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    return run_dir


def _tag(suite: Suite, index: int, backend: str, warmup: bool) -> str:
    return f"{suite.name} run {index + 1} ({backend}{', warm-up' if warmup else ''})"


def run_one(
    suite: Suite,
    index: int,
    backend: str,
    env: dict[str, str],
    paths: dict,
    out: Path,
    port: int,
    reference: dict,
    warmup: bool = False,
    profile: bool = False,
) -> None:
    """One run on a server of its own, started and stopped in run_dir."""
    run_dir = _run_dir(out, suite, index, backend)
    tag = _tag(suite, index, backend, warmup)
    started = start_server(suite, backend, env, paths, run_dir, port, reference, tag)
    try:
        summary = measure(
            suite, index, backend, started, env, paths, run_dir, tag, warmup, profile
        )
    finally:
        started.server.stop()
    write_run(run_dir, summary)


def plan_runs(order: str, deadline: float) -> Iterator[tuple[int, str, bool, bool]]:
    """(index, backend, warm-up, profile) for each letter of --order, raising
    BenchError once past `deadline` (monotonic). A lower-case letter is a
    warm-up run: measured like the others (and the gate's reference when
    first) but left out of the report; the profiler window is the first
    measured run of each backend."""
    profiled: set[str] = set()
    for i, letter in enumerate(order):
        if time.monotonic() > deadline:
            raise BenchError(f"time budget spent before run {i + 1} (--budget-s)")
        warmup = letter.islower()
        backend = BACKENDS[letter.upper()]
        profile = not warmup and backend not in profiled
        if profile:
            profiled.add(backend)
        yield i, backend, warmup, profile


# --resident: each backend's server takes this share of the GPU's memory, so
# both fit beside each other with room for the CUDA contexts.
RESIDENT_GPU_SHARE = 0.44
# How long a resident server gets to write the trace rows of a run's last
# steps (the hook flushes once the scheduler is idle).
TRACE_SETTLE_S = 2.0


def slice_traces(server_dir: Path, run_dir: Path, t0: float, t1: float) -> None:
    """Copy the scheduler-trace rows a resident server wrote in [t0, t1]
    (seconds) into run_dir, one file per engine process as the hook names
    them, so a run's folder reads as one with a server of its own."""
    lo, hi = int(t0 * 1e9), int(t1 * 1e9)
    for tsv in report.trace_files(server_dir):
        rows = []
        for line in report.trace_lines(tsv):
            f = line.split("\t")
            if len(f) >= 2 and f[1].isdigit() and lo <= int(f[1]) <= hi:
                rows.append(line)
        (run_dir / tsv.name).write_text("".join(f"{line}\n" for line in rows))


def post_reset_prefix_cache(url: str, timeout: float = 300) -> tuple[int, str]:
    """POST /reset_prefix_cache (a route of vLLM's dev mode): the HTTP status
    and body. Under tagma the reset first runs the manager's validate() and
    answers 500 on a broken invariant."""
    req = urllib.request.Request(url + "/reset_prefix_cache", b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def reset_prefix_cache(server: Server, tries: int = 10) -> None:
    """Empty a resident server's prefix cache before a run: the suites send
    the same prompts every run, which a server of its own computes in full
    and a resident one would find cached (1b-burst-api4: 112 of each
    prompt's 128 tokens). vLLM answers success false while blocks are still
    held (a request finishing), so it is asked again."""
    for _ in range(tries):
        status, body = post_reset_prefix_cache(server.url, timeout=120)
        if status != 200:
            raise BenchError(
                f"POST /reset_prefix_cache answered {status}: {body[:500]}"
            )
        if json.loads(body).get("success"):
            return
        time.sleep(1)
    raise BenchError(f"the prefix cache would not reset in {tries} tries: {body}")


def run_resident(
    suite: Suite,
    order: str,
    env: dict[str, str],
    paths: dict,
    out: Path,
    errors: list[str],
    deadline: float,
) -> None:
    """`--resident`: one server per backend, both up for the whole suite on the
    same GPU(s), each at RESIDENT_GPU_SHARE of the memory; the runs take turns
    in `order`, the idle server holding memory only. A switch between backends
    costs no start, so a session fits more pairs, and neighbouring runs of the
    two backends are seconds apart on the same host."""
    backends = list(dict.fromkeys(BACKENDS[x.upper()] for x in order))
    reference: dict = {}
    servers: dict[str, Started] = {}
    try:
        for backend, port in zip(backends, free_ports(len(backends)), strict=True):
            server_dir = out / suite.name / f"server-{backend}"
            shutil.rmtree(server_dir, ignore_errors=True)
            server_dir.mkdir(parents=True)
            servers[backend] = start_server(
                suite,
                backend,
                {**env, "VLLM_SERVER_DEV_MODE": "1"},  # POST /reset_prefix_cache
                paths,
                server_dir,
                port,
                reference,
                f"{suite.name} {backend} server",
                ("--gpu-memory-utilization", str(RESIDENT_GPU_SHARE)),
            )
        for i, backend, warmup, profile in plan_runs(order, deadline):
            started = servers[backend]
            for other in servers.values():
                other.server.check_alive(f"run {i + 1}")
            run_dir = _run_dir(out, suite, i, backend)
            tag = _tag(suite, i, backend, warmup)
            reset_prefix_cache(started.server)
            summary = measure(
                suite, i, backend, started, env, paths, run_dir, tag, warmup, profile
            )
            summary["server"] = started.dir.name
            summary["prefix_cache_reset"] = True
            time.sleep(TRACE_SETTLE_S)
            windows = [r["window"] for r in summary["results"]]
            slice_traces(started.dir, run_dir, windows[0][0], windows[-1][1])
            write_run(run_dir, summary)
    except BenchError as e:
        errors.append(f"{suite.name}: {e}")
        log(f"STOP {suite.name}: {e}")
    finally:
        for started in servers.values():
            started.server.stop()


def run_suite(
    suite: Suite,
    order: str,
    env: dict[str, str],
    paths: dict,
    out: Path,
    port: int,
    errors: list[str],
    deadline: float,
) -> None:
    reference: dict = {}
    try:
        for i, backend, warmup, profile in plan_runs(order, deadline):
            run_one(
                suite,
                i,
                backend,
                env,
                paths,
                out,
                port,
                reference,
                warmup=warmup,
                profile=profile,
            )
    except BenchError as e:
        errors.append(f"{suite.name}: {e}")
        log(f"STOP {suite.name}: {e}")


def free_ports(n: int) -> list[int]:
    """n distinct ports nothing listens on now (fixed ones clash with other
    servers on the host); all are held while picking, so none repeats."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def check_gpus(need: int) -> list[str]:
    if shutil.which("nvidia-smi") is None:
        raise BenchError(
            "no GPU: nvidia-smi is not on PATH (make bench-gpu runs on the GPU host)"
        )
    q = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    gpus = [line for line in q.stdout.splitlines() if line.strip()]
    if q.returncode != 0 or len(gpus) < need:
        raise BenchError(
            f"need {need} GPU(s), nvidia-smi shows {len(gpus)}: {q.stderr.strip()}"
        )
    return gpus


def plan(suites: list[Suite], gpus: list[int]) -> list[list[tuple[Suite, list[int]]]]:
    """Waves of suites that run side by side, each on its own GPUs."""
    waves: list[list[tuple[Suite, list[int]]]] = []
    free: list[int] = []
    for suite in suites:
        if suite.gpus > len(gpus):
            continue
        if len(free) < suite.gpus:
            waves.append([])
            free = list(gpus)
        waves[-1].append((suite, free[: suite.gpus]))
        free = free[suite.gpus :]
    return waves


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--dest", default="/tmp/tagma-bench", help="where the bundle unpacks"
    )
    parser.add_argument("--suites", default="8b-16k,8b-128k,1b-host,8b-tp2")
    parser.add_argument("--gpus", default="", help="GPU indices (default: all)")
    parser.add_argument(
        "--order",
        default="ABBA",
        help="A = paged, B = tagma; lower case = a warm-up run left out of the "
        "report (e.g. aABBA)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=0,
        help="start no run after this many seconds (0: no limit)",
    )
    parser.add_argument(
        "--resident",
        action="store_true",
        help="one server per backend for the whole suite, side by side on its "
        f"GPU(s) at {RESIDENT_GPU_SHARE} of the memory each; runs take turns",
    )
    parser.add_argument(
        "--baseline",
        choices=("paged", "paged-stock"),
        default="paged",
        help="what A runs: the series' paged, or paged with vLLM's KV manager "
        "as released (paged-stock)",
    )
    parser.add_argument(
        "--shared-socket",
        action="store_true",
        help="API servers accept from one shared listening socket, as vLLM as "
        "released does, not one each (both backends): to measure the series' "
        "listener patch against a set without this flag",
    )
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()

    t_all = time.monotonic()
    deadline = t_all + args.budget_s if args.budget_s else float("inf")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        names = [n for n in args.suites.split(",") if n]
        unknown = [n for n in names if n not in SUITES]
        if unknown:
            raise BenchError(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
        if not args.order or set(args.order.upper()) - set(BACKENDS):
            raise BenchError(
                f"--order takes A (paged) and B (tagma), lower case for a "
                f"warm-up run, got {args.order!r}"
            )
        shown = check_gpus(1)
        gpus = (
            [int(g) for g in args.gpus.split(",")]
            if args.gpus
            else list(range(len(shown)))
        )
        log(f"GPUs: {'; '.join(shown)}")
        log(f"installing the bundle from {args.bundle}")
        paths = bundle_mod.install(Path(args.bundle), Path(args.dest))
    except (BenchError, SystemExit) as e:
        print(f"bench-gpu: {e}", file=sys.stderr)
        return 1

    stock = args.baseline == "paged-stock"
    suites = [
        replace(SUITES[n], paged_args=STOCK_MANAGER if stock else ()) for n in names
    ]
    skipped = [s.name for s in suites if s.gpus > len(gpus)]
    for name in skipped:
        log(
            f"skipping {name}: needs {SUITES[name].gpus} GPUs, "
            f"this host has {len(gpus)}"
        )
    base_env = {
        # ablation.py (the stock manager) sits beside the CPU benchmarks.
        **server_env(
            f"{HERE / 'hook'}:"
            + (f"{HERE.parent / 'bench'}:" if stock else "")
            + str(paths["site"])
        ),
        # Multicast stays off on shared multi-GPU hosts.
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        # vLLM's symm-mem all-reduce would probe multicast at TP>1; NCCL and
        # the custom all-reduce (CUDA IPC) carry TP=2 without it.
        "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
        # The hook keeps each API server on the inherited socket.
        **({"TAGMA_BENCH_SHARED_SOCKET": "1"} if args.shared_socket else {}),
    }
    errors: list[str] = []
    meta = {
        "order": args.order,
        "baseline": args.baseline,
        "shared_socket": args.shared_socket,
        "resident": args.resident,
        "gpus": shown,
        "skipped": skipped,
        "stack": (paths["site"] / "TAGMA_STACK").read_text().split(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "finished": False,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    for wave in plan(suites, gpus):
        threads = []
        for (suite, devs), port in zip(wave, free_ports(len(wave)), strict=True):
            env = {
                **base_env,
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, devs)),
                # One compile cache a suite: runs 2-4 reuse run 1's.
                "VLLM_CACHE_ROOT": str(Path(args.dest) / "vllm-cache" / suite.name),
            }
            mode = ", both servers resident" if args.resident else ""
            log(f"suite {suite.name} on GPU {devs}, order {args.order}{mode}")
            t = threading.Thread(
                target=run_resident if args.resident else run_suite,
                args=(suite, args.order, env, paths, out)
                + (() if args.resident else (port,))
                + (errors, deadline),
            )
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    meta["wall_s"] = round(time.monotonic() - t_all, 1)
    meta["errors"] = errors
    meta["finished"] = True
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    if not args.no_report:
        report.write([out], out)
        log(f"report: {out / 'report.md'}")
    for err in errors:
        print(f"bench-gpu: {err}", file=sys.stderr)
    log(f"done in {meta['wall_s']:.0f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
