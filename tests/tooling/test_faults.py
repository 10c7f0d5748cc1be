# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Fault injection: interrupt export and rebase at every write they make.

A driver process runs one verb with every file-system write of the tool
(renames, removals, copies, file writes, mkdir) counted. A first clean run
gives the number of writes and the "after" state; then, for each write N
and each fault, a fresh run is stopped at write N:

- `sigint`: SIGINT is sent to the process just before write N (as a user's
  Ctrl-C would arrive); the verb's handler takes over.
- `crash`: the process exits at once (os._exit) just before write N: no
  handler, no finally block runs, as with SIGKILL or a power cut.

Afterwards the next verb's first step (atomic.recover) runs, and patches/
must be byte-identical to the state before the verb or to the state after a
clean run, never a mix; for rebase, `rebase --abort` must then restore the
state before, and say so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import BASE_FILES, Project, make_sdist, replace_line

from tagma_fork import atomic, ops, rebase, stack
from tagma_fork.git import Git

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

DRIVER = textwrap.dedent(
    """
    import json, os, pathlib, shutil, signal, sys
    sys.path.insert(0, {scripts!r})
    from tagma_fork import ops, rebase, trees, upstream
    from tagma_fork.errors import EXIT_INTERRUPTED

    # A shell without job control starts background jobs with SIGINT
    # ignored, and Python then installs no handler: restore Ctrl-C's.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = json.loads(pathlib.Path(sys.argv[1]).read_text())
    at, fault, count = cfg["at"], cfg["fault"], [0]
    write_count = pathlib.Path.write_text  # the driver's own, not counted

    def counted(func):
        def wrapper(*args, **kwargs):
            count[0] += 1
            if count[0] == at:
                if fault == "crash":
                    os._exit(137)
                os.kill(os.getpid(), signal.SIGINT)
            return func(*args, **kwargs)
        return wrapper

    for mod, name in [(os, "rename"), (os, "replace"), (shutil, "rmtree"),
                      (shutil, "copytree"), (shutil, "copy2")]:
        setattr(mod, name, counted(getattr(mod, name)))
    for name in ("write_bytes", "write_text", "unlink", "mkdir"):
        setattr(pathlib.Path, name, counted(getattr(pathlib.Path, name)))

    layout = trees.Layout(pathlib.Path(cfg["root"]), pathlib.Path(cfg["build"]),
                          cfg["version"])
    try:
        if cfg["verb"] == "export":
            ops.export(layout)
        else:
            rebase.start(layout, upstream.Pin(**cfg["pin"]))
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    else:
        code = 0
    write_count(pathlib.Path(cfg["count_file"]), str(count[0]))
    sys.exit(code)
    """
).format(scripts=str(SCRIPTS))


def _drive(project: Project, tmp: Path, verb: str, at: int, fault: str, **cfg) -> int:
    """Run `verb` in a driver process, faulted at write `at` (0: never)."""
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    config = tmp / "cfg.json"
    count = tmp / "count"
    count.unlink(missing_ok=True)
    config.write_text(
        json.dumps(
            dict(
                cfg,
                verb=verb,
                at=at,
                fault=fault,
                root=str(project.layout.root),
                build=str(project.layout.build),
                version=project.layout.version,
                count_file=str(count),
            )
        )
    )
    proc = subprocess.run(
        [sys.executable, str(driver), str(config)], capture_output=True, text=True
    )
    (tmp / "err").write_text(proc.stdout + proc.stderr)
    if at == 0:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return int(count.read_text())
    return proc.returncode


def _edit_in_worktree(project: Project) -> None:
    ops.worktree(project.layout, force=True)
    wt = project.layout.worktree
    git = Git(wt)
    replace_line(wt / "vllm/core.py", "return 1\n", "return 2\n")
    git.run("commit", "-q", "-a", "--fixup=HEAD~1")
    base = project.layout.for_version("9.0.0")
    git.run(
        "rebase", "-q", "-i", "--autosquash", f"upstream/v{base.version}",
        env={"GIT_SEQUENCE_EDITOR": "true"},
    )  # fmt: skip
    (wt / "vllm/extra.py").write_text("Y = 2\n")
    git.run("add", "vllm/extra.py")
    git.run("commit", "-q", "-m", "extra: a third patch\n\nWhy.\n\n" + TRAILERS)
    stack.tag_commit(git, "extra.patch")


TRAILERS = (
    "Forwarded: no\nOrigin: vendor\nLast-Update: 2026-12-01\n"
    "Signed-off-by: Test <test@example.invalid>\n"
)


@pytest.mark.parametrize("fault", ["sigint", "crash"])
def test_export_interrupted_at_every_write(
    two_patches: Project, tmp_path: Path, fault: str
) -> None:
    _edit_in_worktree(two_patches)
    before = two_patches.snapshot()
    writes = _drive(two_patches, tmp_path, "export", 0, "none")
    after = two_patches.snapshot()
    assert after != before and "vllm-9.0.0/extra.patch" in after
    assert writes >= 4  # copy, export's writes, the switch's renames
    seen = set()
    for at in range(1, writes + 1):
        two_patches.restore(before)
        code = _drive(two_patches, tmp_path, "export", at, fault)
        assert code in (0, 137, 130), (at, code)
        atomic.recover(two_patches.layout.stacks)
        state = two_patches.snapshot()
        assert state in (before, after), f"{fault} at write {at}: a mixed stack"
        seen.add("before" if state == before else "after")
    # Early faults keep the old stack; the last ones land the new one.
    assert seen == {"before", "after"}


@pytest.mark.parametrize("fault", ["sigint", "crash"])
def test_rebase_interrupted_at_every_write(
    two_patches: Project, tmp_path: Path, fault: str
) -> None:
    text = BASE_FILES["vllm/config/cache.py"].replace("line 8\n", "line eight\n")
    pin = make_sdist(
        two_patches.cache, "9.1.0", {**BASE_FILES, "vllm/config/cache.py": text}
    )
    cfg = {"pin": {k: getattr(pin, k) for k in pin.__slots__}}
    before = two_patches.snapshot()
    writes = _drive(two_patches, tmp_path, "rebase", 0, "none", **cfg)
    after = two_patches.snapshot()
    assert "vllm-9.1.0/pin.toml" in after and writes >= 5
    seen = set()
    for at in range(1, writes + 1):
        two_patches.restore(before)
        code = _drive(two_patches, tmp_path, "rebase", at, fault, **cfg)
        assert code in (0, 137, 130), (at, code, (tmp_path / "err").read_text())
        atomic.recover(two_patches.layout.stacks)
        state = two_patches.snapshot()
        assert state in (before, after), f"{fault} at write {at}: a mixed stack"
        seen.add("before" if state == before else "after")
        if rebase.load_state(two_patches.layout) is not None:
            # A rebase left in progress: abort returns to the state before,
            # and checks it.
            assert rebase.abort(two_patches.layout) == 0, f"{fault} at {at}"
            assert two_patches.snapshot() == before
        else:
            # Finished (the state file goes last), or cut short before a
            # state was kept: abort only clears build/rebase.
            assert rebase.abort(two_patches.layout) == 0
            assert two_patches.snapshot() == state
    assert seen == {"before", "after"}
