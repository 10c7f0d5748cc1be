# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""A stand-in for `python -m vllm.entrypoints.cli.main serve|bench serve|bench
throughput`.

It speaks just enough of the server's HTTP surface (/health, /metrics,
/v1/completions with token ids, streamed or not, /start_profile,
/stop_profile, /reset_prefix_cache) and writes a bench serve result file, so
the benchmark and soak harnesses run on a machine without a GPU.
FAKE_VLLM_DIE_AFTER=N makes the server exit after N completions;
FAKE_VLLM_TAGMA_DIFFERS=1 makes tagma's greedy ids differ;
FAKE_VLLM_RESET_FAILS=1 makes /reset_prefix_cache answer 500 (a broken
invariant); FAKE_VLLM_SHORT_STREAM=1 drops the last token of n=1 streams.
`bench throughput` prints and writes what the real one does, at 1,000
output tokens/s per backend argument's length (so variants differ) or fails
with FAKE_VLLM_THROUGHPUT_FAIL=1.
"""

import argparse
import gzip
import importlib.util
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def serve(argv):
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--port", type=int)
    p.add_argument("--kv-cache-backend")
    p.add_argument("--profiler-config")
    p.add_argument("--kv-cache-manager-cls", default="")
    args, _ = p.parse_known_args(argv)
    if args.kv_cache_manager_cls:
        # vLLM imports the class by its qualified name: its module must be
        # on the server's path (not imported here: it needs the real vLLM).
        module = args.kv_cache_manager_cls.rpartition(".")[0]
        if importlib.util.find_spec(module) is None:
            sys.exit(f"fake vllm: no module {module!r} for --kv-cache-manager-cls")
    prof = json.loads(args.profiler_config or "{}")
    state = {"completions": 0, "preempt": 0, "streams": 0, "open": 0, "hits": 0}
    lock = threading.Lock()
    die_after = int(os.environ.get("FAKE_VLLM_DIE_AFTER", "0"))
    # A scheduler-trace row per /metrics poll, as scripts/gpu/hook writes
    # them (a step's end, its times and the running/waiting counts).
    trace_dir = os.environ.get("TAGMA_SCHED_TRACE")
    trace = (
        open(Path(trace_dir) / f"sched-{os.getpid()}.tsv", "a")  # noqa: SIM115
        if trace_dir
        else None
    )
    if os.environ.get("TAGMA_BENCH_SHARED_SOCKET") == "1":
        # What the harness's hook would do to real API servers, said aloud.
        print("fake vllm: API servers on the inherited socket", flush=True)
    print("GPU KV cache size: 1,234,560 tokens", flush=True)
    print("Maximum concurrency for 16,384 tokens per request: 75.35x", flush=True)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, code, body, ctype="application/json"):
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self.reply(200, "")
            if self.path == "/metrics":
                if trace is not None:  # an engine step for every poll
                    trace.write(
                        f"S\t{time.time_ns()}\t1000\t1000\t100\t"
                        f"{state['open'] + 1}\t0\t0\t-\t0\t0\t0\t0\n"
                    )
                    trace.flush()
                state["preempt"] += 1 if args.kv_cache_backend == "paged" else 0
                # 0.42 until a stream has run (bench serve's fixed peak), then
                # the share of streams open (the soak's idle check).
                usage = state["open"] / 10 if state["streams"] else 0.42
                return self.reply(
                    200,
                    (
                        "# HELP vllm:kv_cache_usage_perc usage\n"
                        f'vllm:kv_cache_usage_perc{{engine="0"}} {usage}\n'
                        f'vllm:num_preemptions_total{{engine="0"}} {state["preempt"]}\n'
                        f'vllm:num_preemptions_created{{engine="0"}} 1.7e9\n'
                        f'vllm:num_requests_running{{engine="0"}} {state["open"]}\n'
                        'vllm:num_requests_waiting{engine="0"} 0\n'
                        f'vllm:prefix_cache_hits_total{{engine="0"}} {state["hits"]}\n'
                    ),
                    "text/plain",
                )
            self.reply(404, "")

        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(n) or b"{}")
            if body.get("n", 1) > 1 and body.get("temperature") == 0:
                # As vLLM's request validation.
                msg = "n must be 1 when using greedy sampling"
                return self.reply(400, json.dumps({"error": {"message": msg}}))
            if self.path == "/v1/completions" and body.get("stream"):
                return self.stream(body)
            if self.path == "/reset_prefix_cache":
                if os.environ.get("VLLM_SERVER_DEV_MODE") != "1":
                    return self.reply(404, "")  # as vLLM: a dev-mode route
                print("fake vllm: prefix cache reset", flush=True)
                if os.environ.get("FAKE_VLLM_RESET_FAILS"):
                    return self.reply(500, '{"error": "tagma: block 7 has ref_cnt 1"}')
                return self.reply(200, json.dumps({"success": state["open"] == 0}))
            if self.path == "/v1/completions":
                # uvicorn's access line as vLLM's API servers log it; the
                # stand-in bench's prompts "b<k>" land on server 1 for k = 3,
                # on server 0 otherwise (a skewed spread, as a burst gets).
                prompt = body["prompt"][0] if body.get("prompt") else ""
                tag = 1 if prompt == "b3" else 0
                print(
                    f"(ApiServer_{tag} pid={os.getpid()}) INFO:     127.0.0.1:5 - "
                    '"POST /v1/completions HTTP/1.1" 200 OK',
                    flush=True,
                )
                state["completions"] += 1
                shift = (
                    1
                    if (
                        args.kv_cache_backend == "tagma"
                        and os.environ.get("FAKE_VLLM_TAGMA_DIFFERS")
                    )
                    else 0
                )
                choices = [
                    {"index": i, "text": "", "token_ids": [len(pr) % 97 + shift] * 4}
                    for i, pr in enumerate(body["prompt"])
                ]
                self.reply(200, json.dumps({"choices": choices}))
                if die_after and state["completions"] >= die_after:
                    os._exit(3)
                return
            if self.path == "/start_profile":
                return self.reply(200, "")
            if self.path == "/stop_profile":
                d = Path(prof["torch_profiler_dir"])
                d.mkdir(parents=True, exist_ok=True)
                ev, t = [], 0.0
                for _ in range(6):
                    if args.kv_cache_backend == "paged":
                        ev.append(
                            {
                                "ph": "X",
                                "cat": "kernel",
                                "name": "_gather_block_tables_kernel",
                                "ts": t,
                                "dur": 3.0,
                            }
                        )
                        ev.append(
                            {
                                "ph": "X",
                                "cat": "kernel",
                                "name": "_compute_slot_mappings_kernel",
                                "ts": t + 4,
                                "dur": 2.0,
                            }
                        )
                    else:
                        ev.append(
                            {
                                "ph": "X",
                                "cat": "kernel",
                                "name": "_tagma_prepare_kernel",
                                "ts": t + 4,
                                "dur": 2.5,
                            }
                        )
                    ev.append(
                        {
                            "ph": "X",
                            "cat": "kernel",
                            "name": "attention",
                            "ts": t + 10,
                            "dur": 900.0,
                        }
                    )
                    t += 1000.0
                with gzip.open(d / "rank0.pt.trace.json.gz", "wt") as f:
                    json.dump({"traceEvents": ev}, f)
                return self.reply(200, "")
            self.reply(404, "")

        def stream(self, body):
            with lock:
                state["streams"] += 1
                state["open"] += 1
                state["hits"] += len(body["prompt"]) > 100
                state["preempt"] += state["streams"] % 7 == 0
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                n, tokens = body.get("n", 1), body["max_tokens"]
                sent = tokens * n
                if n == 1 and os.environ.get("FAKE_VLLM_SHORT_STREAM"):
                    sent -= 1
                for i in range(sent):
                    chunk = {"choices": [{"index": i % n, "text": "x"}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.0005)
                usage = {"choices": [], "usage": {"completion_tokens": sent}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away: the real server aborts the request
            finally:
                with lock:
                    state["open"] -= 1

    ThreadingHTTPServer(("127.0.0.1", args.port), H).serve_forever()


def bench(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--port")
    p.add_argument("--result-dir")
    p.add_argument("--result-filename")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--profile", action="store_true")
    args, _ = p.parse_known_args(argv)
    import urllib.request

    base = f"http://127.0.0.1:{args.port}"
    import time

    print("Warming up with 8 requests...", flush=True)
    time.sleep(0.3)  # the warm-up, before the main run's marker
    print("Starting main benchmark run...", flush=True)
    if args.profile:
        urllib.request.urlopen(urllib.request.Request(base + "/start_profile", b"{}"))
    urllib.request.urlopen(base + "/metrics").read()
    for k in range(4):  # a few of the run's requests
        urllib.request.urlopen(
            urllib.request.Request(
                base + "/v1/completions",
                json.dumps({"prompt": [f"b{k}"], "max_tokens": 1}).encode(),
                {"Content-Type": "application/json"},
            )
        ).read()
    # A step well inside the main run: the harness stamps the marker when its
    # reader thread sees the line, which on a busy machine can come after the
    # poll above.
    time.sleep(0.2)
    urllib.request.urlopen(base + "/metrics").read()
    if args.profile:
        urllib.request.urlopen(urllib.request.Request(base + "/stop_profile", b"{}"))
    result = {
        "completed": args.num_prompts,
        "request_throughput": 10.0,
        "output_throughput": 1000.0,
        "total_token_throughput": 3000.0,
        **{
            f"{s}_{m}_ms": 5.0
            for s in ("mean", "median", "p50", "p90", "p99")
            for m in ("ttft", "tpot", "itl", "e2el")
        },
    }
    Path(args.result_dir, args.result_filename).write_text(json.dumps(result))
    print("============ Serving Benchmark Result ============", flush=True)
    print("Benchmark done", flush=True)


def throughput(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--output-json", required=True)
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--kv-cache-backend", default="paged")
    p.add_argument("--kv-cache-manager-cls", default="")
    args, _ = p.parse_known_args(argv)
    if os.environ.get("FAKE_VLLM_THROUGHPUT_FAIL"):
        sys.exit("fake vllm: engine failed to start")
    # paged 1,000, tagma 2,000, a plugged-in manager 3,000 output tok/s.
    tok_s = 1000.0 * (1 + (args.kv_cache_backend == "tagma"))
    tok_s += 2000.0 * bool(args.kv_cache_manager_cls)
    elapsed = args.num_prompts * 256 / tok_s
    # vLLM's 10-second stats lines: the ramp, two with the batch full, the tail.
    for rate, running in ((0.2, 300), (0.9, 1024), (1.1, 1000), (0.5, 200)):
        print(
            "INFO [loggers.py:310] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            f"Avg generation throughput: {rate * tok_s:.1f} tokens/s, "
            f"Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: 30.0%"
        )
    print(
        f"Throughput: {args.num_prompts / elapsed:.2f} requests/s, "
        f"{3 * tok_s:.2f} total tokens/s, {tok_s:.2f} output tokens/s"
    )
    Path(args.output_json).write_text(
        json.dumps({"elapsed_time": elapsed, "num_requests": args.num_prompts})
    )


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2:])
    elif sys.argv[1:3] == ["bench", "serve"]:
        bench(sys.argv[3:])
    elif sys.argv[1:3] == ["bench", "throughput"]:
        throughput(sys.argv[3:])
    else:
        sys.exit(f"fake vllm: unsupported {sys.argv[1:]}")
