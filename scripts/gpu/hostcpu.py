# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""CPU time of a serve run's processes over its main run.

When the client sees fewer tokens per second than the engine made, the
front end is late: the API servers or the one `vllm bench serve` process
that reads every stream. Which one saturates shows in their CPU time per
second of the run (about 1.0 for a busy single-threaded asyncio loop).
Linux only (/proc); elsewhere the numbers are simply absent.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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


def group_cpu(pgid: int) -> dict[int, tuple[str, float]]:
    """pid -> (title, CPU s) for every live process of a process group (a
    server started in a session of its own: all its processes)."""
    out: dict[int, tuple[str, float]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st is not None and st[0] == pgid:
            out[int(entry.name)] = (_title(int(entry.name), pgid), st[1])
    return out


def process_cpu(pid: int) -> float | None:
    st = _stat(pid)
    return st[1] if st else None


def children_cpu() -> float:
    """CPU s of every child this process has reaped (a finished bench)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def by_title(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU s each title spent between two group_cpu() snapshots (processes
    started in between count from 0; titles shared by several add up)."""
    out: dict[str, float] = {}
    for pid, (title, cpu) in after.items():
        base = before[pid][1] if pid in before else 0.0
        out[title] = round(out.get(title, 0.0) + cpu - base, 3)
    return out


def cores(host_cpu: dict | None) -> dict[str, float]:
    """A run's host_cpu record as cores busy on average over its main run:
    the client, the API servers together and the busiest of them, and the
    engine core."""
    if not host_cpu or not host_cpu.get("window_s"):
        return {}
    w = host_cpu["window_s"]
    server = host_cpu.get("server_s", {})
    api = [s for t, s in server.items() if t.startswith("APIServer")]
    if not api and "vllm serve" in server:
        # One API server: it runs in the `vllm serve` process itself.
        api = [server["vllm serve"]]
    engine = [s for t, s in server.items() if t.startswith("EngineCore")]
    out: dict[str, float] = {}
    if host_cpu.get("client_s") is not None:
        out["client_cores"] = host_cpu["client_s"] / w
    if api:
        out["api_cores"] = sum(api) / w
        out["api_max_cores"] = max(api) / w
    if engine:
        out["engine_cores"] = sum(engine) / w
    return out
