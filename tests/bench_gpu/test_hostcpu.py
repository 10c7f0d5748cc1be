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
    """A leader in a session of its own that starts one child titled as vLLM
    titles its API servers (argv[0] "VLLM::APIServer_0"), spinning."""
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen(['bash', '-c', "
        f"'exec -a VLLM::APIServer_0 {sys.executable} -c \"while True: pass\"'])\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_group_cpu_titles_and_times_the_group():
    leader = _start_group()
    try:
        deadline = time.monotonic() + 10
        snap0: dict = {}
        while time.monotonic() < deadline:
            snap0 = hostcpu.group_cpu(leader.pid)
            if "APIServer_0" in {t for t, _ in snap0.values()}:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        snap1 = hostcpu.group_cpu(leader.pid)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    titles = {t for t, _ in snap1.values()}
    assert titles == {"vllm serve", "APIServer_0"}
    spent = hostcpu.by_title(snap0, snap1)
    # The spinning child used most of a core for the half second; the
    # sleeping leader next to nothing.
    assert spent["APIServer_0"] > 0.2
    assert spent["vllm serve"] < 0.1
    # Only the group: not this process, which started it.
    assert os.getpid() not in snap1 and len(snap1) == 2


def test_by_title_counts_new_processes_from_zero_and_adds_shared_titles():
    before = {1: ("APIServer_0", 5.0), 2: ("EngineCore_DP0", 10.0)}
    after = {
        1: ("APIServer_0", 6.5),
        2: ("EngineCore_DP0", 12.0),
        3: ("python3", 0.25),
        4: ("python3", 0.5),
    }
    assert hostcpu.by_title(before, after) == {
        "APIServer_0": 1.5,
        "EngineCore_DP0": 2.0,
        "python3": 0.75,
    }


def test_cores_per_role():
    rec = {
        "window_s": 10.0,
        "client_s": 9.5,
        "server_s": {
            "APIServer_0": 6.0,
            "APIServer_1": 8.0,
            "EngineCore_DP0": 10.0,
            "vllm serve": 0.1,
        },
    }
    c = hostcpu.cores(rec)
    assert c == pytest.approx(
        {"client_cores": 0.95, "api_cores": 1.4, "api_max_cores": 0.8,
         "engine_cores": 1.0}
    )  # fmt: skip
    # One API server lives in the `vllm serve` process itself.
    one = hostcpu.cores({"window_s": 2.0, "client_s": 1.0,
                         "server_s": {"vllm serve": 1.5}})  # fmt: skip
    assert one["api_cores"] == one["api_max_cores"] == 0.75
    assert hostcpu.cores(None) == {} and hostcpu.cores({"window_s": 0}) == {}
