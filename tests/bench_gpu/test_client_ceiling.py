# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""client_ceiling.py's stand-in server: paced completion streams that
`vllm bench serve` reads as it reads vLLM's."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/gpu/client_ceiling.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream(port: int, max_tokens: int, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"prompt": "x", "max_tokens": max_tokens, "stream": True})
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()  # http.client undoes the chunked encoding
    out.append((resp.status, text, time.monotonic() - t0))
    conn.close()


def test_stand_in_streams_one_token_a_tick_then_usage_and_done():
    port = _port()
    server = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--serve", str(port), "--tick", "0.01"]
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        out: list = []
        threads = [
            threading.Thread(target=_stream, args=(port, n, out)) for n in (5, 20, 20)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        server.kill()
        server.wait()
    assert len(out) == 3
    for status, text, seconds in out:
        assert status == 200
        messages = [m for m in text.split("\n\n") if m]
        assert all(m.startswith("data: ") for m in messages)
        assert messages[-1] == "data: [DONE]"
        payloads = [json.loads(m[6:]) for m in messages[:-1]]
        tokens = [p for p in payloads if p["choices"]]
        (usage,) = [p["usage"] for p in payloads if not p["choices"]]
        # Exactly max_tokens token messages, and the usage says so (the
        # bench's output-token count comes from it).
        assert usage["completion_tokens"] == len(tokens) in (5, 20)
        # Paced: one token a 10-ms tick.
        assert seconds >= (len(tokens) - 1) * 0.01
    assert sorted(len([m for m in o[1].split("\n\n") if m]) for o in out) == [7, 22, 22]
