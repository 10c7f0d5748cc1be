# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Replace a stack folder in one step, and recover from an interrupted one.

A verb that writes a stack (export, rebase) builds the new folder beside the
old one as `.<name>.new` and switches with renames: the old folder becomes
`.<name>.old`, the new one takes its name, the old one is deleted. Signals
are held off while the renames run. Should the process die anyway, the
leftovers say where it stopped, and `recover` (run before every verb) takes
the stack to a consistent state: the new one if its rename happened, the old
one otherwise. A folder is never a mix of the two.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

_NEW, _OLD = ".new", ".old"
_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def staging(target: Path) -> Path:
    return target.parent / f".{target.name}{_NEW}"


def retired(target: Path) -> Path:
    return target.parent / f".{target.name}{_OLD}"


def recover(parent: Path) -> list[str]:
    """Finish or undo every switch in `parent` that was cut short.

    Returns:
        One line per repair, for the user.
    """
    done: list[str] = []
    if not parent.is_dir():
        return done
    for old in sorted(parent.glob(f".*{_OLD}")):
        target = parent / old.name[1 : -len(_OLD)]
        if target.exists():
            # The new folder took the name: only the old one's removal is left.
            shutil.rmtree(old)
            done.append(
                f"{target.name}: finished an interrupted switch (new stack kept)"
            )
        else:
            os.rename(old, target)
            done.append(
                f"{target.name}: undid an interrupted switch (old stack restored)"
            )
    for new in sorted(parent.glob(f".*{_NEW}")):
        shutil.rmtree(new)
        done.append(f"{new.name[1 : -len(_NEW)]}: removed an unfinished new stack")
    return done


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Defer SIGINT, SIGTERM and SIGHUP until the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def switch(stage: Path, target: Path) -> None:
    """Make `stage` the folder `target`, replacing what is there."""
    with signals_held():
        try:
            if target.exists():
                old = retired(target)
                os.rename(target, old)
                os.rename(stage, target)
                shutil.rmtree(old)
            else:
                os.rename(stage, target)
        except BaseException:
            recover(target.parent)
            raise


@contextlib.contextmanager
def replacing(target: Path, copy: bool = True) -> Iterator[Path]:
    """Yield a staging folder for `target`; switch to it when the block ends.

    The staging folder starts as a copy of `target` (or empty). If the block
    raises, the staging folder is dropped and `target` is left as it was.
    The block may remove the staging folder to mean "nothing to switch".
    """
    recover(target.parent)
    stage = staging(target)
    if copy and target.exists():
        shutil.copytree(target, stage, symlinks=True)
    else:
        stage.mkdir(parents=True)
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if stage.exists():
        switch(stage, target)


def write_file(path: Path, data: bytes) -> None:
    """Replace one file in one rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def digest(folder: Path) -> str:
    """A hash of every file under `folder` (names and bytes), dot-files left out
    at the top level (the switch's own staging folders)."""
    h = hashlib.sha256()
    if not folder.exists():
        return ""
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if rel.parts[0].startswith(".") or not path.is_file():
            continue
        h.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
