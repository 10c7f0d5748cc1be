# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""hostcpu.py: per-process CPU time of a server's process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/gpu"))

import hostcpu  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="needs Linux /proc"
)


def _start_group() -> subprocess.Popen:
    """A leader in a session of its own that starts two children titled as
    vLLM titles its API servers (argv[0] "VLLM::APIServer_<i>"), both
    spinning on the same CPU, so each waits for it about half the time."""
    spin = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
    spin += "while True: pass"
    code = "import subprocess, sys, time\n"
    for i in (0, 1):
        code += (
            f"subprocess.Popen(['bash', '-c', 'exec -a VLLM::APIServer_{i} "
            f'{sys.executable} -c "$0"\', {spin!r}])\n'
        )
    code += "time.sleep(60)\n"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_group_cpu_titles_times_and_waits_of_the_group():
    leader = _start_group()
    try:
        deadline = time.monotonic() + 10
        snap0: dict = {}
        while time.monotonic() < deadline:
            snap0 = hostcpu.group_cpu(leader.pid)
            if len({x.title for x in snap0.values()}) == 3:
                break
            time.sleep(0.05)
        time.sleep(1.0)
        snap1 = hostcpu.group_cpu(leader.pid)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    titles = {x.title for x in snap1.values()}
    assert titles == {"vllm serve", "APIServer_0", "APIServer_1"}
    spent = hostcpu.by_title(snap0, snap1)
    waited = hostcpu.by_title(snap0, snap1, "wait_s")
    # The two spinners shared one core for the second: each ran and waited
    # about half of it; the sleeping leader neither.
    for name in ("APIServer_0", "APIServer_1"):
        assert 0.1 < spent[name] < 0.8
        assert waited[name] > 0.2
    assert spent["APIServer_0"] + spent["APIServer_1"] < 1.1
    assert spent["vllm serve"] < 0.1 and waited["vllm serve"] < 0.1
    # One process alone: a program that is no group's leader keeps its name.
    me = hostcpu.process_cpu(os.getpid())
    assert me is not None and me.title.startswith("python") and me.cpu_s > 0
    # Only the group: not this process, which started it.
    assert os.getpid() not in snap1 and len(snap1) == 3


def test_by_title_counts_new_processes_from_zero_and_adds_shared_titles():
    S = hostcpu.Sample
    before = {1: S("APIServer_0", 5.0, 1.0), 2: S("EngineCore_DP0", 10.0, 0.5)}
    after = {
        1: S("APIServer_0", 6.5, 1.25),
        2: S("EngineCore_DP0", 12.0, 0.5),
        3: S("python3", 0.25, 0.0),
        4: S("python3", 0.5, 0.125),
    }
    assert hostcpu.by_title(before, after) == {
        "APIServer_0": 1.5,
        "EngineCore_DP0": 2.0,
        "python3": 0.75,
    }
    assert hostcpu.by_title(before, after, "wait_s") == {
        "APIServer_0": 0.25,
        "EngineCore_DP0": 0.0,
        "python3": 0.125,
    }


def test_cores_per_role():
    rec = {
        "window_s": 10.0,
        "client_s": 9.5,
        "client_wait_s": 0.5,
        "server_s": {
            "APIServer_0": 6.0,
            "APIServer_1": 8.0,
            "EngineCore_DP0": 10.0,
            "vllm serve": 0.1,
        },
        "server_wait_s": {
            "APIServer_0": 3.0,
            "APIServer_1": 1.0,
            "EngineCore_DP0": 0.2,
            "vllm serve": 0.0,
        },
    }
    c = hostcpu.cores(rec)
    assert c == pytest.approx(
        {"client_cores": 0.95, "api_cores": 1.4, "api_max_cores": 0.8,
         "engine_cores": 1.0, "client_wait": 0.05, "api_max_wait": 0.3,
         "engine_wait": 0.02}
    )  # fmt: skip
    # One API server lives in the `vllm serve` process itself.
    one = hostcpu.cores({"window_s": 2.0, "client_s": 1.0,
                         "server_s": {"vllm serve": 1.5}})  # fmt: skip
    assert one["api_cores"] == one["api_max_cores"] == 0.75
    assert hostcpu.cores(None) == {} and hostcpu.cores({"window_s": 0}) == {}
