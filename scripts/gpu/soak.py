# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""`make soak-gpu`: one `vllm serve` under load for minutes, then checked idle.

    python3 scripts/gpu/soak.py --bundle build/bundle --out DIR
        [--backend tagma] [--seconds 480] [--rate 10] [--blocks 384]

Starts `vllm serve --kv-cache-backend tagma` on the 1B model (dummy weights)
with a KV cache of --blocks blocks, too small for the load, and the
development endpoints on. Requests arrive as a Poisson process for --seconds
of wall time:
most behind one of eight shared prefixes whose lengths end mid-block, some
with n=2 (blocks shared inside a request), a quarter of them dropped by the
client mid-stream (the server aborts them). At most --max-inflight are open
at once; an arrival past that waits and is counted.

Once every client is done and the server reports nothing running or
waiting, POST /reset_prefix_cache must succeed: it does only when every
block is free, and then tagma's reset first runs the manager's validate()
(every counter recomputed from the blocks) and answers 500 if an invariant
is broken. One short request after it refreshes the /metrics gauges (they
are published per engine step), and KV-cache usage must then read 0. The
soak fails on any server error (HTTP, stream or log), any completed stream
that lost tokens (usage.completion_tokens != max_tokens * n, with
ignore_eos), or no preemption, prefix hit or cancellation in the run.

Writes DIR/soak.json (every request's outcome, the /metrics timeline, the
verdict), server.log, server.cmd; `soak.py --plot DIR` draws soak.png.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import lzma
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_serve  # noqa: E402
import bundle as bundle_mod  # noqa: E402

MODEL = "llama-3.2-1b"
MAX_MODEL_LEN = 4096
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Req:
    at: float  # arrival, seconds after the start
    prompt: list[int]
    max_tokens: int
    n: int
    cancel_after: int | None  # stream chunks read before the client drops it


PROBE = Req(0.0, list(range(1, 40)), 4, 1, None)


def plan(seconds: float, rate: float, seed: int = 0) -> list[Req]:
    """The soak's requests, fixed by the seed."""
    rng = random.Random(seed)
    prefixes: list[list[int]] = []
    while len(prefixes) < 8:
        length = rng.randrange(200, 1500)
        if length % BLOCK_SIZE:  # hits end mid-block
            prefixes.append([rng.randrange(1, 128000) for _ in range(length)])
    out: list[Req] = []
    t = rng.expovariate(rate)
    while t < seconds:
        tail = [rng.randrange(1, 128000) for _ in range(rng.randrange(1, 400))]
        prompt = tail if rng.random() < 0.15 else rng.choice(prefixes) + tail
        max_tokens = min(rng.randrange(8, 512), MAX_MODEL_LEN - len(prompt))
        cancel = rng.randrange(1, max_tokens) if rng.random() < 0.25 else None
        n = 2 if rng.random() < 0.1 else 1
        out.append(Req(round(t, 4), prompt, max_tokens, n, cancel))
        t += rng.expovariate(rate)
    return out


@dataclass
class Outcome:
    status: str  # "completed", "cancelled" or "error"
    chunks: int = 0
    completion_tokens: int | None = None
    error: str | None = None
    waited_s: float = 0.0  # for a free slot (--max-inflight)


def _connect(url: str, timeout: float) -> http.client.HTTPConnection:
    u = urlsplit(url)
    return http.client.HTTPConnection(
        u.hostname or "127.0.0.1", u.port, timeout=timeout
    )


def run_request(url: str, model: str, req: Req) -> Outcome:
    """One streamed completion; drops the connection after req.cancel_after
    chunks, as a client that goes away does."""
    conn = _connect(url, timeout=600)
    body = {
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "n": req.n,
        # Greedy takes n=1 only: the n=2 requests sample, seeded.
        "temperature": 0.0 if req.n == 1 else 1.0,
        "seed": len(req.prompt),
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = Outcome("error")
    try:
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps(body),
            {"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return out
        while line := resp.readline():
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                out.status = "completed"
                break
            chunk = json.loads(data)
            if "error" in chunk:
                out.error = str(chunk["error"])[:300]
                return out
            if chunk.get("usage"):
                out.completion_tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices"):
                out.chunks += 1
                if req.cancel_after is not None and out.chunks >= req.cancel_after:
                    out.status = "cancelled"
                    break
        else:
            out.error = f"stream ended after {out.chunks} chunks without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


METRICS = {
    "usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "preemptions": "vllm:num_preemptions_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
}


def sample(url: str) -> dict[str, float]:
    m = bench_serve.read_metrics(
        bench_serve._get(url + "/metrics", timeout=10).decode()
    )
    return {k: m.get(name, 0.0) for k, name in METRICS.items()}


def soak(
    url: str, model: str, reqs: list[Req], max_inflight: int, seconds: float
) -> dict:
    """Sends reqs on their arrival times, for `seconds` of wall time (a
    server that falls behind keeps slots busy and delays arrivals; what is
    left at the end is not sent); returns outcomes and the timeline."""
    outcomes: list[Outcome | None] = [None] * len(reqs)
    slots = threading.BoundedSemaphore(max_inflight)
    inflight = [0]
    lock = threading.Lock()
    stop = threading.Event()
    timeline: list[dict] = []
    t0 = time.monotonic()

    def watch() -> None:
        while not stop.wait(1.0):
            try:
                s = sample(url)
            except OSError:
                continue
            with lock:
                s["inflight"] = inflight[0]
            timeline.append({"t": round(time.monotonic() - t0, 1), **s})

    def one(i: int, waited: float) -> None:
        try:
            out = run_request(url, model, reqs[i])
            out.waited_s = round(waited, 3)
            outcomes[i] = out
        finally:
            with lock:
                inflight[0] -= 1
            slots.release()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = []
    last_report = sent_at = 0.0
    for i, req in enumerate(reqs):
        time.sleep(max(0.0, t0 + req.at - time.monotonic()))
        asked = time.monotonic()
        if asked - t0 >= seconds:
            break
        slots.acquire()
        sent_at = time.monotonic() - t0
        with lock:
            inflight[0] += 1
        t = threading.Thread(target=one, args=(i, time.monotonic() - asked))
        t.start()
        threads.append(t)
        if sent_at - last_report >= 60:
            last_report = sent_at
            done = [o for o in outcomes if o is not None]
            bench_serve.log(
                f"soak {sent_at:.0f} s: {i + 1} sent (planned for "
                f"{req.at:.0f} s), {len(done)} done, "
                f"{sum(o.status == 'error' for o in done)} errors, "
                f"last sample {timeline[-1] if timeline else {}}"
            )
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    for i in range(len(threads), len(reqs)):
        outcomes[i] = Outcome("unsent")
    return {
        "arrivals_s": round(sent_at, 1),
        "sent": len(threads),
        "wall_s": round(time.monotonic() - t0, 1),
        "outcomes": [asdict(o) if o else None for o in outcomes],
        "timeline": timeline,
    }


def wait_idle(url: str, timeout: float) -> dict:
    """/metrics once nothing runs or waits (or the last sample at timeout)."""
    end = time.monotonic() + timeout
    while True:
        s = sample(url)
        if (s["running"] == 0 and s["waiting"] == 0) or time.monotonic() > end:
            return s
        time.sleep(1)


def reset_prefix_cache(url: str) -> dict:
    status, body = bench_serve.post_reset_prefix_cache(url)
    return {"http_status": status, "body": body[:2000]}


def log_errors(log_text: str) -> list[str]:
    """Server log lines that report an error (vLLM's ERROR level, tracebacks)."""
    return [
        line
        for line in log_text.splitlines()
        if " ERROR " in line or line.startswith(("ERROR", "Traceback"))
    ]


def verdict(result: dict, seconds: float) -> list[str]:
    """What failed, in words; empty when the soak passed."""
    fails = []
    pairs = list(zip(result["requests"], result["outcomes"], strict=True))
    if any(o is None for _, o in pairs):
        fails.append("a request has no outcome")
    pairs = [(r, o) for r, o in pairs if o is not None]
    outcomes = [o for _, o in pairs]
    errors = [o for o in outcomes if o["status"] == "error"]
    if errors:
        fails.append(f"{len(errors)} requests failed, first: {errors[0]['error']}")
    short = [
        (r["max_tokens"] * r["n"], o["completion_tokens"])
        for r, o in pairs
        if o["status"] == "completed"
        and o["completion_tokens"] != r["max_tokens"] * r["n"]
    ]
    if short:
        fails.append(
            f"{len(short)} completed streams lost tokens (asked, got): {short[:4]}"
        )
    if result["arrivals_s"] < seconds - 1:
        fails.append(f"arrivals lasted {result['arrivals_s']} s, not {seconds}")
    for kind in ("completed", "cancelled"):
        if not any(o["status"] == kind for o in outcomes):
            fails.append(f"no request was {kind}")
    last = result["timeline"][-1] if result["timeline"] else {}
    for what, name in (("preemption", "preemptions"), ("prefix hit", "prefix_hits")):
        if last.get(name, 0) < 1:
            fails.append(f"no {what}: the soak did not exercise it")
    idle = result["idle"]
    if idle["running"] or idle["waiting"]:
        fails.append(f"the server never went idle: {idle}")
    if result["probe"] != "completed" or result["after_probe"]["usage"] != 0:
        fails.append(
            f"KV-cache usage {result['after_probe']['usage']} once idle, not 0 "
            f"(probe request {result['probe']})"
        )
    reset = result["reset"]
    if reset["http_status"] != 200 or json.loads(reset["body"] or "{}") != {
        "success": True
    }:
        fails.append(f"reset_prefix_cache (validate) failed: {reset}")
    if not result["server_alive"]:
        fails.append("the server exited")
    if result["log_errors"]:
        fails.append(f"server log errors: {result['log_errors'][:3]}")
    return fails


def load(out: Path) -> dict:
    """A run's soak.json; published runs keep it xz-compressed."""
    path = out / "soak.json"
    if path.exists():
        return json.loads(path.read_text())
    return json.loads(lzma.decompress((out / "soak.json.xz").read_bytes()))


def plot(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = load(out)
    tl = result["timeline"]
    t = [s["t"] for s in tl]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    axes[0].plot(t, [s["usage"] for s in tl])
    axes[0].set_ylabel("KV-cache usage")
    axes[1].plot(t, [s["running"] for s in tl], label="running")
    axes[1].plot(t, [s["waiting"] for s in tl], label="waiting")
    axes[1].plot(t, [s["inflight"] for s in tl], label="client streams open")
    axes[1].legend(loc="upper right")
    axes[1].set_ylabel("requests")
    axes[2].plot(t, [s["preemptions"] for s in tl], label="preemptions")
    axes[2].set_ylabel("preemptions (total)")
    axes[2].set_xlabel("seconds since the first arrival")
    c = result["counts"]
    fig.suptitle(
        f"soak, {result['backend']}: {c['completed']} completed, "
        f"{c['cancelled']} cancelled, {c['error']} errors; "
        f"{'PASS' if not result['fails'] else 'FAIL'}"
    )
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dest", default="/tmp/tagma-bench")
    ap.add_argument("--backend", default="tagma", choices=("paged", "tagma"))
    ap.add_argument("--seconds", type=float, default=480.0)
    ap.add_argument("--rate", type=float, default=10.0, help="arrivals per second")
    ap.add_argument("--blocks", type=int, default=384, help="KV-cache blocks")
    ap.add_argument("--max-inflight", type=int, default=64)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--plot", action="store_true", help="only draw DIR/soak.png")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    if a.plot:
        print(plot(out))
        return 0
    if not a.bundle:
        ap.error("--bundle is required")
    out.mkdir(parents=True, exist_ok=True)
    try:
        paths = bundle_mod.install(Path(a.bundle), Path(a.dest))
    except SystemExit as e:
        print(f"soak: {e}", file=sys.stderr)
        return 1
    model_dir = paths["data"] / "models" / MODEL
    port = bench_serve.free_ports(1)[0]
    env = {
        **bench_serve.server_env(str(paths["site"])),
        "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
        "VLLM_CACHE_ROOT": str(Path(a.dest) / "vllm-cache" / "soak"),
    }
    cmd = [
        *bench_serve.VLLM,
        "serve",
        str(model_dir),
        "--load-format",
        "dummy",
        "--seed",
        "0",
        "--port",
        str(port),
        "--kv-cache-backend",
        a.backend,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--num-gpu-blocks-override",
        str(a.blocks),
        "--gpu-memory-utilization",
        str(a.gpu_memory_utilization),
    ]
    reqs = plan(a.seconds, a.rate)
    server = bench_serve.Server(cmd, env, port, out)
    try:
        ready = server.wait_ready(900)
        bench_serve.log(
            f"server ready in {ready:.0f} s; {len(reqs)} requests over "
            f"{a.seconds:.0f} s"
        )
        result = soak(server.url, str(model_dir), reqs, a.max_inflight, a.seconds)
        result["idle"] = wait_idle(server.url, 120)
        result["reset"] = reset_prefix_cache(server.url)
        # The gauges are published per engine step: one short request after
        # the reset makes them current, and must leave usage 0.
        result["probe"] = run_request(server.url, str(model_dir), PROBE).status
        result["after_probe"] = wait_idle(server.url, 60)
        result["server_alive"] = bench_serve._alive(server.proc)
        result["log_errors"] = log_errors(server.log.read_text(errors="replace"))
    except bench_serve.BenchError as e:
        print(f"soak: {e}", file=sys.stderr)
        return 1
    finally:
        server.stop()
    result["requests"] = [
        {
            "at": r.at,
            "prompt_len": len(r.prompt),
            "max_tokens": r.max_tokens,
            "n": r.n,
            "cancel_after": r.cancel_after,
        }
        for r in reqs
    ]
    result.update(
        backend=a.backend,
        args=vars(a),
        stack=(paths["site"] / "TAGMA_STACK").read_text().split(),
        counts={
            k: sum(o is not None and o["status"] == k for o in result["outcomes"])
            for k in ("completed", "cancelled", "error", "unsent")
        },
    )
    result["fails"] = verdict(result, a.seconds)
    (out / "soak.json").write_text(json.dumps(result))
    bench_serve.log(
        f"soak {a.backend}: {result['counts']}, idle {result['idle']}, "
        f"reset {result['reset']}"
    )
    for f in result["fails"]:
        print(f"soak FAIL: {f}", file=sys.stderr)
    # No matplotlib on the GPU host: `soak.py --plot DIR` where it is.
    with contextlib.suppress(ImportError):
        plot(out)
    return 1 if result["fails"] else 0


if __name__ == "__main__":
    sys.exit(main())
