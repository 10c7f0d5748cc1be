# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Move the stack onto another vLLM release.

The stack is imported onto the new pristine base in build/rebase with a
3-way merge. At the first conflict the import stops and leaves the worktree
in `git am` so the user resolves it there; `--continue` and `--abort` pick
up from a small state file. patches/ and upstream/ are written only when
every patch has applied, so an abort (or a crash) loses nothing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from . import stack, trees, upstream
from .git import Git, GitError

EXIT_CONFLICT = 3
BRANCH = "tagma/rebase"


@dataclass(slots=True)
class State:
    """What a stopped rebase needs to resume."""

    # The pin being moved to.
    pin: dict[str, str]
    # Patches still to import after the one that stopped, in order.
    remaining: list[str]
    # The patch that stopped the import.
    current: str


def _state_path(layout: trees.Layout) -> Path:
    return layout.build / "rebase-state.json"


def load_state(layout: trees.Layout) -> State | None:
    path = _state_path(layout)
    if not path.exists():
        return None
    return State(**json.loads(path.read_text()))


def dry_run(
    layout: trees.Layout, pin: upstream.Pin
) -> list[tuple[str, str, list[str]]]:
    """Try each patch on the new base: applies, applies with 3-way, conflicts.

    A patch that conflicts is skipped and the next is tried on the tree
    without it, so one report shows every patch that needs work.
    """
    old = upstream.read_pin(layout.root)
    trees.ensure_base(layout, old)  # preimage blobs for the 3-way merges
    base = trees.ensure_base(layout, pin)
    names = trees.series_names(layout)
    rows: list[tuple[str, str, list[str]]] = []
    with tempfile.TemporaryDirectory(dir=layout.build) as tmp:
        git = trees.new_tree(layout, Path(tmp) / "try", base, None)
        for name in names:
            patch = layout.patches / name
            if stack.apply_one(git, patch, three_way=False) is None:
                rows.append((name, "applies", []))
                continue
            failure = stack.apply_one(git, patch, three_way=True)
            if failure is None:
                rows.append((name, "applies with 3-way", []))
            else:
                rows.append((name, "conflicts", failure.files))
                git.run("am", "--abort")
        trees.remove_tree(layout, Path(tmp) / "try")
    return rows


def start(layout: trees.Layout, pin: upstream.Pin) -> int:
    if load_state(layout) is not None:
        print("a rebase is already stopped; use --continue or --abort")
        return 2
    old = upstream.read_pin(layout.root)
    trees.ensure_base(layout, old)
    base = trees.ensure_base(layout, pin)
    git = trees.new_tree(layout, layout.rebase, base, BRANCH)
    trees.place_engine(layout, layout.rebase, link=True)
    names = trees.series_names(layout)
    print(f"rebasing {len(names)} patches: vllm {old.version} -> {pin.version}")
    return _run(layout, git, pin, names)


def _run(layout: trees.Layout, git: Git, pin: upstream.Pin, names: list[str]) -> int:
    for i, name in enumerate(names):
        failure = stack.apply_one(git, layout.patches / name, three_way=True)
        if failure is not None:
            state = State(asdict(pin), names[i + 1 :], name)
            _state_path(layout).write_text(json.dumps(asdict(state), indent=1))
            _report_conflict(layout, failure)
            return EXIT_CONFLICT
        stack.tag_commit(git, name)
        print(f"  {name}: applied")
    return _finish(layout, git, pin)


def _report_conflict(layout: trees.Layout, failure: stack.ApplyFailure) -> None:
    files = "\n".join(f"    {f}" for f in failure.files) or "    (see git's message)"
    print(
        f"\nSTOPPED: {failure.patch} conflicts with the new upstream.\n"
        f"  conflicting files:\n{files}\n"
        f"  resolve them in {layout.rebase}, then:\n"
        f"    git -C {layout.rebase} add <files>\n"
        "    make rebase-continue      (or: python -m tagma_fork rebase --continue)\n"
        "  or give up, keeping patches/ and upstream/ as they were:\n"
        "    make rebase-abort         (or: python -m tagma_fork rebase --abort)\n"
    )


def resume(layout: trees.Layout) -> int:
    state = load_state(layout)
    if state is None:
        print("no rebase is stopped")
        return 2
    git = Git(layout.rebase)
    if git.unmerged_files():
        print(f"still unmerged: {', '.join(git.unmerged_files())}")
        return EXIT_CONFLICT
    try:
        git.run("am", "--continue")
    except GitError as e:
        print(e.output)
        return EXIT_CONFLICT
    stack.tag_commit(git, state.current)
    print(f"  {state.current}: applied (resolved)")
    return _run(layout, git, upstream.Pin(**state.pin), state.remaining)


def abort(layout: trees.Layout) -> int:
    if load_state(layout) is None and not layout.rebase.exists():
        print("no rebase to abort")
        return 0
    git = Git(layout.rebase)
    if layout.rebase.exists() and git.am_in_progress():
        git.run("am", "--abort")
    trees.remove_tree(layout, layout.rebase)
    _state_path(layout).unlink(missing_ok=True)
    print("rebase aborted; patches/ and upstream/ are unchanged")
    return 0


def _finish(layout: trees.Layout, git: Git, pin: upstream.Pin) -> int:
    base = trees.base_ref(pin.version)
    # Export into a scratch folder first: patches/ changes in one step.
    staged = layout.build / "rebase-patches"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    stack.export(git, base, staged)
    old_dir = layout.build / "rebase-old-patches"
    shutil.rmtree(old_dir, ignore_errors=True)
    shutil.copytree(layout.patches, old_dir)
    for path in layout.patches.iterdir():
        if path.name == "series" or path.suffix == ".patch":
            path.unlink()
    for path in staged.iterdir():
        shutil.copy2(path, layout.patches / path.name)
    old = upstream.read_pin(layout.root)
    upstream.write_pin(layout.root, pin)
    _state_path(layout).unlink(missing_ok=True)
    report = _range_diff(layout, git, old, pin, old_dir)
    print(
        f"\nrebased onto vllm {pin.version}: patches/ and upstream/vllm.toml "
        f"written.\n  the old stack is kept in {old_dir}\n"
        f"  range-diff of the two stacks: {report}"
    )
    return 0


def _range_diff(
    layout: trees.Layout, git: Git, old: upstream.Pin, new: upstream.Pin, old_dir: Path
) -> Path:
    """`git range-diff` of the old stack (on its base) against the new one."""
    report = layout.build / f"range-diff-{old.version}-{new.version}.txt"
    old_tree = layout.build / "rebase-old-tree"
    base = trees.ensure_base(layout, old)
    old_git = trees.new_tree(layout, old_tree, base, None)
    stack.import_patches(old_git, old_dir, stack.read_series(old_dir))
    old_head = old_git.out("rev-parse", "HEAD")
    trees.remove_tree(layout, old_tree)
    text = git.out(
        "range-diff",
        "--no-color",
        f"{base}..{old_head}",
        f"{trees.base_ref(new.version)}..HEAD",
    )
    report.write_text(text + "\n")
    for line in text.splitlines():
        if line[:1].isdigit() or line.startswith("-:"):
            print(f"    {line}")
    return report
