# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""`make build-fork`: install the patched tree into build/vllm-<v>/venv.

On a machine without a GPU the Python tree is installed without compiling
vLLM's CUDA kernels (VLLM_TARGET_DEVICE=empty), next to the CPU build of
torch, so the patched modules import and their tests run. On a CUDA host the
kernels come from the pinned wheel (VLLM_USE_PRECOMPILED), so nothing of
vLLM's CUDA is rebuilt. Either way the tagma extension is built by CMake from
csrc/tagma, because neither mode runs vLLM's CMake.

Steps already done (same pin, same requirement files) are skipped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from . import ops, trees, upstream
from .errors import EXIT_FAIL, EXIT_OK

# The CPU torch for a pin whose pin.toml names none ([build]
# cpu_torch): the one this machine kind keeps on disk. vLLM 0.25.1 pins 2.11.0
# (CUDA), whose CPU tests run the same on 2.13.0.
CPU_TORCH = "torch==2.13.0"
# Never constrain these from upstream's lock: a different torch family build
# would pull a CUDA torch (several GB).
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
# What the conformance tests need beyond vLLM's runtime requirements.
TEST_REQUIREMENTS = ("pytest", "pytest-asyncio", "tblib", "pytest-timeout")
# vLLM's build-system requirements without torch (installed without build
# isolation, so the torch above is the one it sees).
BUILD_REQUIREMENTS = (
    "cmake>=3.26.1,<4",
    "ninja",
    "packaging>=24.2",
    "setuptools>=77.0.3,<81.0.0",
    "setuptools-scm>=8",
    "setuptools-rust>=1.9.0",
    "wheel",
    "jinja2",
)


def _step(title: str) -> float:
    print(f"==> {title}", flush=True)
    return time.monotonic()


def _done(t0: float) -> None:
    print(f"    done in {time.monotonic() - t0:.0f} s", flush=True)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("    $ " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        # pip's notes about empty local index folders are noise here.
        if "is ignored: it is neither a file nor a directory" not in line:
            print("    " + line, end="", flush=True)
    if proc.wait() != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and os.environ.get(
        "TAGMA_FORCE_CPU", "0"
    ) in ("", "0")


def constraints(tree: Path, out: Path, relax: Mapping[str, str] | None = None) -> Path:
    """Upstream's CPU test lock minus the torch family, as a constraints file.

    A name in `relax` (the pin's [build.relax], name -> reason) is constrained
    to `name==V.*` instead of `name==V`, so a post-release of V (a re-upload
    the index may hold instead of V itself) satisfies it. Every relaxed name
    must occur in the lock: a stale entry is an error, not a silent no-op.
    """
    relax = relax or {}
    lines = []
    seen = set()
    for line in (tree / "requirements/test/cpu.txt").read_text().splitlines():
        name = line.split("==", 1)[0].strip().lower()
        if (
            "==" in line
            and not line.startswith((" ", "#"))
            and name not in TORCH_FAMILY
        ):
            req = line.split(";")[0].split("#")[0].strip().replace(" \\", "")
            if name in relax:
                seen.add(name)
                req = f"{req}.*"
                print(f"    relaxed: {req}  ({relax[name]})")
            lines.append(req)
    if stale := sorted(set(relax) - seen):
        raise ValueError(
            f"[build.relax] names {', '.join(stale)}, which "
            "requirements/test/cpu.txt does not pin; remove them from the pin"
        )
    out.write_text("\n".join(lines) + "\n")
    return out


def _stamp(venv: Path, key: str) -> Path:
    return venv / f".tagma-{key}"


def _fingerprint(*parts: str | Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(Path(part).read_bytes() if isinstance(part, Path) else part.encode())
    return h.hexdigest()


def build_extension(layout: trees.Layout, py: Path, tree: Path) -> int:
    """Build _tagma_C standalone and place it in the tree's vllm/.

    Neither VLLM_TARGET_DEVICE=empty nor VLLM_USE_PRECOMPILED runs vLLM's
    CMake, so the patched target there never builds in these modes; the
    engine's own CMake builds the same sources into the same *.abi3.so.
    """
    cmake = str(py.parent / "cmake")
    out = layout.pin_build / "tagma-ext"
    _run([cmake, "-S", str(layout.root / trees.ENGINE), "-B", str(out),
          "-DTAGMA_PYTHON_EXT=ON", "-DTAGMA_BUILD_TESTS=OFF", "-DTAGMA_BUILD_BENCH=OFF",
          "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={py}"])  # fmt: skip
    _run([cmake, "--build", str(out), "-j2", "--target", "_tagma_C"])
    placed = trees.place_extension(layout, tree)
    if placed is None:
        print(f"    no _tagma_C*.so in {out}")
        return EXIT_FAIL
    print(f"    {placed}")
    return EXIT_OK


def build_fork(layout: trees.Layout) -> int:
    pin = layout.pin()
    venv = layout.pin_build / "venv"
    py = venv / "bin" / "python"
    tree = layout.tree
    cuda = has_cuda()
    t_all = time.monotonic()

    t0 = _step(f"apply the stack on vllm {pin.version} -> {tree}")
    ops.apply(layout)
    _done(t0)

    if not py.exists():
        t0 = _step(f"create {venv}")
        _run([sys.executable, "-m", "venv", str(venv)])
        _done(t0)

    cons = constraints(tree, layout.pin_build / "constraints.txt", pin.relax)
    cpu_torch = pin.cpu_torch or CPU_TORCH
    key = _fingerprint(
        cons,
        tree / "requirements/common.txt",
        layout.root / "scripts/requirements.txt",
        # Only a pin's own torch enters the key, so venvs built with the
        # default keep their stamp.
        *([cpu_torch] if pin.cpu_torch else []),
    )
    stamp = _stamp(venv, "deps")
    if stamp.exists() and stamp.read_text() == key:
        print("==> dependencies: up to date (cached)")
    else:
        t0 = _step("install torch and vLLM's requirements")
        pip = [str(py), "-m", "pip", "install", "--quiet"]
        if cuda:
            _run([*pip, "-r", str(tree / "requirements/cuda.txt"), "-c", str(cons)])
        else:
            _run([*pip, cpu_torch])
        _run(
            [
                *pip,
                "-c",
                str(cons),
                "-r",
                str(tree / "requirements/common.txt"),
                *TEST_REQUIREMENTS,
                *BUILD_REQUIREMENTS,
            ]
        )
        stamp.write_text(key)
        _done(t0)

    t0 = _step("install the patched tree (editable)")
    env = {"SETUPTOOLS_SCM_PRETEND_VERSION": pin.version}
    if cuda:
        wheel = upstream.fetch(pin.wheel, pin.wheel_sha256, pin.version)
        env |= {
            "VLLM_USE_PRECOMPILED": "1",
            "VLLM_PRECOMPILED_WHEEL_LOCATION": str(wheel),
        }
    else:
        env |= {"VLLM_TARGET_DEVICE": "empty"}
    _run(
        [str(py), "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "-e", str(tree)],
        env=env,
    )  # fmt: skip
    _done(t0)

    t0 = _step("build vllm._tagma_C (stable ABI 3.11) from csrc/tagma")
    if build_extension(layout, py, tree) != EXIT_OK:
        return EXIT_FAIL
    _done(t0)

    t0 = _step("install the test-only CPU platform plugin")
    plugin = layout.root / "tests/conformance/cpu_platform"
    if not cuda and plugin.exists():
        _run(
            [str(py), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(plugin)]
        )
    _done(t0)

    version = subprocess.run(
        [str(py), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True, text=True, cwd=layout.pin_build,
    )  # fmt: skip
    shown = (version.stdout.strip().splitlines() or ["?"])[-1]
    print(
        f"\nbuilt tagma-vllm on vllm {pin.version} "
        f"({'CUDA, precompiled kernels' if cuda else 'CPU, no vLLM kernels'}) "
        f"in {time.monotonic() - t_all:.0f} s\n"
        f"  tree: {tree}\n  venv: {venv}  (vllm.__version__ = {shown})\n"
        f"  try:  {py} -c 'import vllm; print(vllm.__version__)'"
    )
    return EXIT_OK if version.returncode == 0 else EXIT_FAIL
