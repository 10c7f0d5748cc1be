# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""scripts/gpu/hook: the scheduler-thread trace, on vLLM's real Scheduler.

Runs in a subprocess with the hook folder on PYTHONPATH, as the serve
benchmark's engine core does, and drives the patched tree's Scheduler
(from `make build-fork`) with a faked model output for 130 steps.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The hook under a name of its own (a real sitecustomize may be loaded); it is
# inert without TAGMA_SCHED_TRACE.
_spec = importlib.util.spec_from_file_location(
    "sched_hook", ROOT / "scripts/gpu/hook/sitecustomize.py"
)
assert _spec is not None and _spec.loader is not None
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)

DRIVER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("bench_sched", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
s = bench.make_scheduler(sys.argv[2], 16, 4096, 4096)
make = bench.request_factory("decode", "off", 0)
for _ in range(16):
    s.add_request(make())
import gc, time, types
# The model runner's side, as the engine core calls it with one GPU: the
# executor's two calls and the wait for sampled tokens, each 2 ms here.
from vllm.v1.executor import uniproc_executor as ex
runner = types.SimpleNamespace(
    collective_rpc=lambda *a, **k: time.sleep(0.002),
    get_output=lambda: time.sleep(0.002),
)
for i in range(130):
    out = s.schedule()
    if i == 99:
        gc.collect()  # a collection between schedule and update: step 100's
    if i == 110:
        ex.UniProcExecutor.execute_model(runner, out)
        ex.UniProcExecutor.sample_tokens(runner, None)
        ex.AsyncOutputFuture(runner, True).result()
    s.update_from_output(out, bench.fake_output(out))
print("runs", bench.runs_per_request(s))
"""


def _vllm_python() -> str:
    # make test-bench-gpu runs this from the pin's venv, where vLLM is.
    py = sys.executable
    probe = subprocess.run([py, "-c", "import vllm"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail("needs `make build-fork` (vllm importable from the pin's venv)")
    return py


@pytest.mark.parametrize("backend", ["paged", "tagma"])
def test_trace_has_a_row_per_step_and_run_samples(backend, tmp_path):
    redirect = tmp_path / "redirect.json"
    models = ROOT / "tests/conformance/models"
    redirect.write_text(
        json.dumps({"facebook/opt-125m": str(models / "facebook--opt-125m")})
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "scripts/gpu/hook"),
        "TAGMA_SCHED_TRACE": str(tmp_path / "trace"),
        "VLLM_MODEL_REDIRECT_PATH": str(redirect),
        "HF_HUB_OFFLINE": "1",
    }
    r = subprocess.run(
        [_vllm_python(), "-c", DRIVER, str(ROOT / "scripts/bench/sched.py"), backend],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (tsv,) = (tmp_path / "trace").glob("sched-*.tsv")
    rows = [line.split("\t") for line in tsv.read_text().splitlines()]
    steps = [row for row in rows if row[0] == "S"]
    samples = [row for row in rows if row[0] == "R"]
    comps = [row for row in rows if row[0] == "C"]
    assert len(steps) == 130 and len(comps) == 130
    # Step 1 admits all 16 requests with their whole prompts; then each step
    # decodes every running request (the driver's prompts are short).
    _, _, admitted, hits, prefill, decodes = comps[0]
    assert (int(admitted), int(hits), int(decodes)) == (16, 0, 0)
    assert int(prefill) > 16
    assert all(int(c[2]) == 0 and int(c[5]) == 16 for c in comps[2:100])
    for _, _, sched_ns, update_ns, kv_ns, running, waiting, *rest in steps:
        assert int(sched_ns) > 0 and int(update_ns) > 0
        # The manager's time is inside schedule + update, never beside it.
        assert 0 < int(kv_ns) <= int(sched_ns) + int(update_ns)
        assert int(running) + int(waiting) <= 16
        gc_ns, kv_top, kv_top_ns, *runner_ns = rest
        assert int(gc_ns) >= 0
        assert kv_top in hook.KV_METHODS
        assert 0 < int(kv_top_ns) <= int(kv_ns)
    # The forced collection lands in the step it happened in.
    assert int(steps[99][7]) > 0
    # So do the runner calls (exec, sample, wait), and only there.
    for i, row in enumerate(steps):
        runner_ns = [int(x) for x in row[10:13]]
        if i == 110:
            assert all(2_000_000 <= ns < 200_000_000 for ns in runner_ns)
        else:
            assert runner_ns == [0, 0, 0]
    assert len(samples) == 2  # steps 64 and 128
    for _, _, n, runs_mean, runs_max, ranges_mean, ranges_max in samples:
        assert int(n) == 16 and float(runs_mean) >= 1 and int(runs_max) >= 1
        if backend == "tagma":
            # The manager's own count agrees with the block ids it hands out.
            assert float(ranges_mean) == pytest.approx(float(runs_mean))
            assert int(ranges_max) == int(runs_max)
        else:
            assert ranges_mean == ranges_max == "-"


def test_without_the_variable_nothing_is_traced(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts/gpu/hook")}
    env.pop("TAGMA_SCHED_TRACE", None)
    code = (
        "import sys; print(any(type(f).__name__ == '_Finder' for f in sys.meta_path))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert r.stdout.strip() == "False"
    env["TAGMA_SCHED_TRACE"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert r.stdout.strip() == "True"


LISTENER_PROBE = """
import socket
from vllm.entrypoints.api_server_listener import own_listener
parent = socket.socket()
parent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
parent.bind(("127.0.0.1", 0))
address = parent.getsockname()
mine = own_listener(parent)  # closes the parent's socket when it replaces it
print(mine is parent, mine.getsockname() == address)
"""


@pytest.mark.parametrize("shared", [False, True])
def test_shared_socket_keeps_the_inherited_listener(shared, tmp_path):
    """bench_serve.py --shared-socket: the patched tree's API-server hook
    keeps the parent's socket (vLLM as released) instead of binding one of
    its own at the same address."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts/gpu/hook")}
    env.pop("TAGMA_SCHED_TRACE", None)
    env.pop("TAGMA_BENCH_SHARED_SOCKET", None)
    if shared:
        env["TAGMA_BENCH_SHARED_SOCKET"] = "1"
    r = subprocess.run(
        [_vllm_python(), "-c", LISTENER_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    kept, same_address = r.stdout.split()[-2:]
    assert kept == str(shared)
    assert same_address == "True"
