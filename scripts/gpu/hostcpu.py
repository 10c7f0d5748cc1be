# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""CPU time of a serve run's processes over its main run.

When the client sees fewer tokens per second than the engine made, the
front end is late: the API servers or the one `vllm bench serve` process
that reads every stream. Which one saturates shows in their CPU time per
second of the run (about 1.0 for a busy single-threaded asyncio loop), or,
on a crowded host, in the time they spent runnable without a CPU. Linux
only (/proc); elsewhere the numbers are simply absent.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NamedTuple

_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Sample(NamedTuple):
    title: str
    cpu_s: float  # user + system CPU time
    wait_s: float  # runnable but waiting for a CPU (all threads)


def _stat(pid: int) -> tuple[int, float] | None:
    """(process group, user + system CPU seconds) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The fields after the command name's closing parenthesis: state, ppid,
    # pgrp, ..., utime and stime at positions 11 and 12 (the name may hold
    # spaces and parentheses itself).
    rest = text.rpartition(")")[2].split()
    return int(rest[2]), (int(rest[11]) + int(rest[12])) / _CLK


def _wait(pid: int) -> float:
    """Seconds a process's threads have spent runnable on a run queue
    without a CPU (schedstat's second field): a starved process has it
    grow while its CPU time does not."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            total += int(
                Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1]
            )
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended, or no schedstats in this kernel
    return total / 1e9


def _title(pid: int, pgid: int) -> str:
    """vLLM's title for the process ("APIServer_0", "EngineCore_DP0": it
    sets them as "VLLM::<name>"), else the program's name; the group's
    leader is the `vllm serve` process itself."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (OSError, UnicodeDecodeError):
        argv0 = ""
    if "::" in argv0:
        name = argv0.split("::", 1)[1].split()
        return name[0] if name else "?"
    if pid == pgid:
        return "vllm serve"
    return Path(argv0.split()[0]).name if argv0.strip() else "?"


def group_cpu(pgid: int) -> dict[int, Sample]:
    """pid -> Sample for every live process of a process group (a server
    started in a session of its own: all its processes)."""
    out: dict[int, Sample] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st is not None and st[0] == pgid:
            out[pid] = Sample(_title(pid, pgid), st[1], _wait(pid))
    return out


def process_cpu(pid: int) -> Sample | None:
    """One live process's Sample, titled by vLLM's title or its program."""
    st = _stat(pid)
    return Sample(_title(pid, pgid=0), st[1], _wait(pid)) if st else None


def by_title(
    before: dict[int, Sample], after: dict[int, Sample], field: str = "cpu_s"
) -> dict[str, float]:
    """Seconds of `field` each title spent between two group_cpu() snapshots
    (processes started in between count from 0; titles shared by several
    add up)."""
    out: dict[str, float] = {}
    for pid, now in after.items():
        base = getattr(before[pid], field) if pid in before else 0.0
        out[now.title] = round(out.get(now.title, 0.0) + getattr(now, field) - base, 3)
    return out


def _roles(server: dict[str, float]) -> tuple[list[float], list[float]]:
    """(API servers', engine cores') values of a by_title() record."""
    api = [s for t, s in server.items() if t.startswith("APIServer")]
    if not api and "vllm serve" in server:
        # One API server: it runs in the `vllm serve` process itself.
        api = [server["vllm serve"]]
    return api, [s for t, s in server.items() if t.startswith("EngineCore")]


def cores(host_cpu: dict | None) -> dict[str, float]:
    """A run's host_cpu record per second of its main run: CPU (cores busy)
    of the client, the API servers together and the busiest of them, and
    the engine core; and the seconds a second each waited for a CPU (the
    client, the most-waiting API server, the engine core)."""
    if not host_cpu or not host_cpu.get("window_s"):
        return {}
    # math.fsum: correctly rounded, so the device's Python (3.12, whose sum()
    # compensates) and CI's (3.11) write the same digits in a report.
    w = host_cpu["window_s"]
    out: dict[str, float] = {"client_cores": host_cpu["client_s"] / w}
    api, engine = _roles(host_cpu["server_s"])
    if api:
        out["api_cores"] = math.fsum(api) / w
        out["api_max_cores"] = max(api) / w
    if engine:
        out["engine_cores"] = math.fsum(engine) / w
    if "client_wait_s" in host_cpu:
        out["client_wait"] = host_cpu["client_wait_s"] / w
        api, engine = _roles(host_cpu["server_wait_s"])
        if api:
            out["api_max_wait"] = max(api) / w
        if engine:
            out["engine_wait"] = math.fsum(engine) / w
    return out
