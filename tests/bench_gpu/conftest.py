# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Fixtures of the GPU harness tests: a bundle around the stand-in vLLM
(fake/vllm), a PATH with a stand-in nvidia-smi, and scripts/gpu/detach.sh."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts/gpu"
sys.path.insert(0, str(GPU))

import bundle  # noqa: E402


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def fake_bundle(tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    b.mkdir()
    runtime = tmp_path / "runtime"
    shutil.copytree(Path(__file__).parent / "fake", runtime)
    data = tmp_path / "data"
    for m in ("llama-3.1-8b", "llama-3.2-1b"):
        (data / "models" / m).mkdir(parents=True)
        (data / "models" / m / "config.json").write_text("{}")
    (data / "sharegpt.json").write_text("[]")
    fork = tmp_path / "fork"
    (fork / "vllm").mkdir(parents=True)
    (fork / "TAGMA_STACK").write_text("vllm 0.25.1\nproject abc123\n")
    for name, src in [
        ("vllm-runtime-0.25.1-sm90-cp312.tar.xz", runtime),
        ("bench-data.tar.xz", data),
        ("tagma-fork.tar.xz", fork),
    ]:
        bundle.pack(src, b / name)
    (b / "SHA256SUMS").write_text(
        "".join(f"{_sha(p)}  {p.name}\n" for p in sorted(b.glob("*.tar.xz")))
    )
    return b


@pytest.fixture
def gpu_path(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771 MiB'\n")
    smi.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.fixture
def detach():
    """Runs `detach.sh VERB ARGS...` in env: detach(env, "start", ...)."""

    def run(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(GPU / "detach.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
