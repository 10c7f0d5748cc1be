# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""prereqs: what build-fork and test need from the system, named or installed."""

from __future__ import annotations

import subprocess

import pytest

from tagma_fork import prereqs


@pytest.fixture
def missing_quilt(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every package present but quilt; apt-get calls recorded, not run."""
    state = {"quilt": False}
    probes = {name: (lambda: True) for name in prereqs._PROBES}
    probes["quilt"] = lambda: state["quilt"]
    monkeypatch.setattr(prereqs, "_PROBES", probes)
    monkeypatch.setattr(prereqs.shutil, "which", lambda cmd: f"/usr/bin/{cmd}")
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        if cmd[:2] == ["apt-get", "install"]:
            state["quilt"] = True
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(prereqs.subprocess, "run", run)
    return calls


def test_check_only_names_what_is_missing_and_the_command(
    missing_quilt: list, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 0)
    assert prereqs.main(install=False) == 2
    out = capsys.readouterr().out
    assert "quilt" in out and "doctest-dev" not in out
    assert "apt-get update && apt-get install -y quilt" in out
    assert missing_quilt == []


def test_not_root_stops_at_once_with_sudo_command(
    missing_quilt: list, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 1000)
    assert prereqs.main(install=True) == 2
    assert "sudo apt-get update && sudo apt-get install -y quilt" in (
        capsys.readouterr().out
    )
    assert missing_quilt == []


def test_root_installs_with_apt_get_and_checks_again(
    missing_quilt: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 0)
    assert prereqs.main(install=True) == 0
    assert missing_quilt == [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "quilt"],
    ]


def test_every_need_has_a_probe() -> None:
    assert {n.package for n in prereqs.NEEDS} == set(prereqs._PROBES)
