# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""How many streamed tokens a second one `vllm bench serve` process can read.

    python3 scripts/gpu/client_ceiling.py --data DATA [--ticks 0.04 0.03 0.02]

The 1B burst suites send 1,024 requests at once and read 1,024 streams token
by token in one Python process. To know whether that process, rather than
the server, set a run's client-side throughput, this serves the same
workload from a stand-in that costs next to nothing: every `tick` seconds
it writes one completion token to every open stream, as an engine step
would, and `vllm bench serve` (the real one: vLLM must be importable) reads
them. Per tick it prints what was offered, what the client measured, and
the CPU each process used over the main run, in cores. The stand-in and
the client are pinned to different CPUs when the host has two or more.

DATA is the bench data (`tar -xJf build/bundle/bench-data.tar.xz -C DATA`):
its models/llama-3.2-1b tokenizer makes the prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hostcpu  # noqa: E402
from bench_serve import MAIN_RUN, RESULT, copy_marking  # noqa: E402


def _chunk(payload: str) -> bytes:
    data = f"data: {payload}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_TOKEN = _chunk(
    json.dumps(
        {
            "id": "cmpl-0",
            "object": "text_completion",
            "created": 0,
            "model": "m",
            "choices": [
                {"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}
            ],
            "usage": None,
        }
    )
)
_DONE = _chunk("[DONE]") + b"0\r\n\r\n"


def serve(port: int, tick: float) -> None:
    """The stand-in: one token to every open stream each tick, then the
    usage message and [DONE] once a stream has its max_tokens."""
    streams: dict[asyncio.Transport, list[int]] = {}

    class Conn(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.t = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while (end := self.buf.find(b"\r\n\r\n")) >= 0:
                head = self.buf[:end].decode()
                size = 0
                for line in head.split("\r\n")[1:]:
                    key, _, value = line.partition(":")
                    if key.strip().lower() == "content-length":
                        size = int(value)
                if len(self.buf) < end + 4 + size:
                    return
                body = self.buf[end + 4 : end + 4 + size]
                self.buf = self.buf[end + 4 + size :]
                if head.split()[1].startswith("/v1/completions"):
                    req = json.loads(body)
                    self.t.write(_HEAD)
                    n = int(req["max_tokens"])
                    streams[self.t] = [n, n]  # tokens left, tokens asked
                else:
                    self.t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")

        def connection_lost(self, exc) -> None:
            streams.pop(self.t, None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Conn, "127.0.0.1", port)
        due = time.monotonic()
        while True:
            due += tick  # a fixed rate: writing late does not stretch ticks
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            for t, st in list(streams.items()):
                t.write(_TOKEN)
                st[0] -= 1
                if st[0] <= 0:
                    usage = {"prompt_tokens": 0, "completion_tokens": st[1]}
                    t.write(_chunk(json.dumps({"choices": [], "usage": usage})))
                    t.write(_DONE)
                    del streams[t]

    asyncio.run(main())


def _pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


def _cpu(pid: int) -> float:
    sample = hostcpu.process_cpu(pid)
    if sample is None:
        raise SystemExit(f"process {pid} is gone (or no /proc here)")
    return sample.cpu_s


def measure(data: Path, tick: float, prompts: int, port: int) -> dict:
    two = (os.cpu_count() or 1) >= 2
    stand_in = subprocess.Popen(
        [*_pin(1 if two else None), sys.executable, __file__, "--serve", str(port),
         "--tick", str(tick)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        cmd = [
            *_pin(0 if two else None), sys.executable, "-m",
            "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
            "--model", str(data / "models/llama-3.2-1b"), "--port", str(port),
            "--seed", "0", "--ignore-eos", "--request-rate", "inf",
            "--num-warmups", "0", "--dataset-name", "random",
            "--random-input-len", "128", "--random-output-len", "256",
            "--num-prompts", str(prompts), "--max-concurrency", str(prompts),
            "--disable-tqdm", "--percentile-metrics", "itl",
            "--metric-percentiles", "50,99",
        ]  # fmt: skip
        bench = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        # The main run, marked in the bench's output as bench_serve.py does.
        out = io.StringIO()
        marks: dict[str, float] = {}
        cpu: dict[str, tuple[float, float]] = {}

        def on_mark(mark: str) -> None:
            cpu[mark] = (_cpu(bench.pid), _cpu(stand_in.pid))

        copy_marking(bench, out, marks, on_mark)
        bench.wait()
    finally:
        stand_in.kill()
        stand_in.wait()
    text = out.getvalue()
    if bench.returncode != 0 or set(marks) != {MAIN_RUN, RESULT}:
        raise SystemExit(f"vllm bench serve failed (exit {bench.returncode}):\n{text}")

    def field(label: str) -> float:
        m = re.search(rf"^{re.escape(label)}.*?([\d.]+)\s*$", text, re.M)
        if m is None:
            raise SystemExit(f"no {label!r} in the bench's output:\n{text}")
        return float(m.group(1))

    t0, t1 = marks[MAIN_RUN], marks[RESULT]
    (c0, s0), (c1, s1) = cpu[MAIN_RUN], cpu[RESULT]
    return {
        "tick_s": tick,
        "prompts": prompts,
        "offered_tok_s": prompts / tick,
        "client_tok_s": field("Output token throughput (tok/s):"),
        "itl_p50_ms": field("Median ITL (ms):"),
        "itl_p99_ms": field("P99 ITL (ms):"),
        "client_cores": (c1 - c0) / (t1 - t0),
        "stand_in_cores": (s1 - s0) / (t1 - t0),
    }


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib here: no plot")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    offered = [r["offered_tok_s"] / 1e3 for r in rows]
    a.plot(offered, offered, "--", color="grey", label="offered")
    a.plot(offered, [r["client_tok_s"] / 1e3 for r in rows], "o-", label="client")
    a.set_xlabel("offered K tok/s")
    a.set_ylabel("client-measured K tok/s")
    a.legend()
    b.plot(offered, [r["client_cores"] for r in rows], "o-", label="client")
    b.plot(offered, [r["stand_in_cores"] for r in rows], "o-", label="stand-in")
    b.set_xlabel("offered K tok/s")
    b.set_ylabel("CPU, cores (main run)")
    b.legend()
    fig.suptitle(f"one vllm bench serve process, {rows[0]['prompts']} streams")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help="the bench data, unpacked")
    p.add_argument("--ticks", type=float, nargs="+", default=[0.04, 0.03, 0.02])
    p.add_argument("--num-prompts", type=int, default=1024)
    p.add_argument("--port", type=int, default=18123)
    p.add_argument("--out", type=Path, help="the rows as JSON here, a plot beside")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tick", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.tick)
        return
    if args.data is None:
        p.error("--data is required")
    rows = []
    for tick in args.ticks:
        r = measure(args.data, tick, args.num_prompts, args.port)
        rows.append(r)
        print(
            f"tick {tick * 1e3:.0f} ms: offered {r['offered_tok_s']:,.0f} tok/s, "
            f"client {r['client_tok_s']:,.0f} tok/s, ITL p50 {r['itl_p50_ms']:.1f} "
            f"p99 {r['itl_p99_ms']:.1f} ms, client {r['client_cores']:.2f} cores, "
            f"stand-in {r['stand_in_cores']:.2f} cores",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
        plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
