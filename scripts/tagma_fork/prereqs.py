# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""What `make build-fork` and `make test` need from the machine.

The tools pip can give at a pinned version (clang-format, cmake, ninja,
ruff, mypy, ...) go into the pin's venv from scripts/requirements.txt. This
module covers the rest, which only the system package manager has. It uses
the standard library only, so it runs before any venv exists.

    python3 -m tagma_fork prereqs [--install]

Without --install it names what is missing and the command that installs it
(exit 2, EXIT_USAGE). With --install, as root on a Debian-like system, it runs apt-get;
otherwise it stops at once with the exact command to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .errors import EXIT_OK, EXIT_USAGE


@dataclass(frozen=True)
class Need:
    # The Debian package that provides it.
    package: str
    # What it is for, for the message.
    why: str

    def present(self) -> bool:
        return _PROBES[self.package]()


def _has_python_header() -> bool:
    include = sysconfig.get_paths().get("include", "")
    return bool(include) and (Path(include) / "Python.h").is_file()


def _has_venv() -> bool:
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        return False
    return True


def _has_doctest() -> bool:
    return any(
        Path(d, "doctest/doctest.h").is_file()
        for d in ("/usr/include", "/usr/local/include")
    )


_PROBES = {
    "git": lambda: shutil.which("git") is not None,
    "g++": lambda: shutil.which("g++") is not None,
    "make": lambda: shutil.which("make") is not None,
    "python3-dev": _has_python_header,
    "python3-venv": _has_venv,
    "quilt": lambda: shutil.which("quilt") is not None,
    "doctest-dev": _has_doctest,
    "xz-utils": lambda: shutil.which("xz") is not None,
}

NEEDS = (
    Need("git", "the patch stack and the trees under build/"),
    Need("g++", "the C++ engine, its tests and the _tagma_C extension"),
    Need("make", "the front door"),
    Need("python3-dev", "Python.h for the _tagma_C extension"),
    Need("python3-venv", "the build venvs"),
    Need("quilt", "the test that `quilt push -a` gives the same tree as `git am`"),
    Need("doctest-dev", "the engine's C++ tests"),
    Need("xz-utils", "the GPU bundle's tar.xz pieces"),
)


def missing() -> list[Need]:
    return [n for n in NEEDS if not n.present()]


def install_command(needs: list[Need]) -> str:
    pkgs = " ".join(n.package for n in needs)
    sudo = "" if os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get update && {sudo}apt-get install -y {pkgs}"


def main(install: bool = False) -> int:
    need = missing()
    if not need:
        print(
            "prerequisites: all present (" + ", ".join(n.package for n in NEEDS) + ")"
        )
        return EXIT_OK
    print("missing system packages:")
    for n in need:
        print(f"  {n.package:<13} {n.why}")
    can_apt = shutil.which("apt-get") is not None
    if install and can_apt and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print(f"==> apt-get install {' '.join(n.package for n in need)}", flush=True)
        for cmd in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", *(n.package for n in need)],
        ):
            if subprocess.run(cmd, env=env).returncode != 0:
                print(f"`{' '.join(cmd)}` failed", file=sys.stderr)
                return EXIT_USAGE
        still = missing()
        if still:
            print("still missing after apt-get: " + ", ".join(n.package for n in still))
            return EXIT_USAGE
        return EXIT_OK
    if can_apt:
        print(f"install them with:\n  {install_command(need)}")
    else:
        print("install them with your system's package manager (Debian names above)")
    return EXIT_USAGE
