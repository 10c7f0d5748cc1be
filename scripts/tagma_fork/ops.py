# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The stack verbs as library calls: apply, worktree, export, check.

Each takes the Layout of one pin and either returns or raises ToolError with
a message that says what to run next. None of them calls the CLI.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from . import atomic, stack, trees
from .errors import EXIT_USAGE, ToolError
from .git import Git


def _lint_or_raise(layout: trees.Layout) -> list[str]:
    problems = stack.lint(layout.patches)
    if problems:
        raise ToolError(
            "the stack does not lint:\n" + "\n".join(f"  {p}" for p in problems)
        )
    return trees.series_names(layout)


def _failure_text(failure: stack.ApplyFailure) -> str:
    lines = [f"patch {failure.patch} does not apply."]
    lines += [f"  touches {f}" for f in failure.files]
    lines.append(failure.output.strip())
    return "\n".join(lines)


def _import(
    layout: trees.Layout, path: Path, branch: str | None, link_engine: bool
) -> Git:
    names = _lint_or_raise(layout)
    base = trees.ensure_base(layout, layout.pin())
    git = trees.new_tree(layout, path, base, branch)
    failure = stack.import_patches(git, layout.patches, names)
    if failure:
        trees.remove_tree(layout, path)
        raise ToolError(_failure_text(failure))
    trees.place_engine(layout, path, link=link_engine)
    return git


def apply(layout: trees.Layout) -> Path:
    """build/vllm-<v>/tree = pristine sdist + series + engine.

    The new tree is built beside the old one and moved in only when every
    patch applied, so a stack that does not apply leaves the old tree (and
    the editable install that points at it) as it was. The extension built
    by build-fork is put back into the new tree.
    """
    staged = layout.pin_build / "tree.new"
    _import(layout, staged, None, link_engine=False)
    trees.place_extension(layout, staged)
    trees.remove_tree(layout, layout.tree)
    Git(layout.bare).run("worktree", "move", str(staged), str(layout.tree))
    return layout.tree


def _worktree_problem(layout: trees.Layout) -> str | None:
    """Why build/vllm-<v>/worktree cannot be exported as it is, or None."""
    wt = layout.worktree
    git = Git(wt)
    base = trees.ensure_base(layout, layout.pin())
    v = layout.version
    if trees.base_of(git) != base:
        return (
            f"{wt} is not based on vllm {v}'s pristine upstream "
            f"({trees.base_ref(v)}), so its commits cannot be exported to "
            f"{layout.patches.relative_to(layout.root)}.\n"
            f"  Recreate it: make worktree FORCE=1 VLLM_VERSION={v} "
            "(this discards its commits)"
        )
    operation = git.operation_in_progress()
    if operation:
        return (
            f"{wt} is in the middle of {operation}: its HEAD is part of the "
            "stack only.\n"
            f"  Finish it (git -C {wt} rebase --continue, or the command's "
            "--continue) or abort it (--abort), then make export."
        )
    status = git.out("status", "--porcelain", "--untracked-files=all")
    if status:
        return (
            f"{wt} has uncommitted changes or untracked files:\n"
            + "\n".join(f"  {line}" for line in status.splitlines())
            + f"\n  Commit them (git -C {wt} add -A && git -C {wt} commit), "
            "then make export; or delete them."
        )
    return None


def worktree(layout: trees.Layout, force: bool = False) -> Path:
    """build/vllm-<v>/worktree: base + one commit per patch, for editing."""
    wt = layout.worktree
    if wt.exists() and not force:
        problem = _worktree_problem(layout)
        if problem is None:
            drift = stack.export(
                Git(wt), trees.base_ref(layout.version), layout.patches, True
            )
            if drift:
                problem = (
                    f"{wt} has commits that are not in "
                    f"{layout.patches.relative_to(layout.root)} "
                    f"({', '.join(drift)}).\n  Export them: make export"
                )
        if problem:
            raise ToolError(problem + "\n  or pass FORCE=1 to discard the worktree.")
    _import(layout, wt, f"tagma/patches/{layout.version}", link_engine=True)
    return wt


def export(layout: trees.Layout, dry_run: bool = False) -> list[str]:
    """Write the worktree's commits into the pin's stack folder, canonically.

    Refuses a worktree on another base, or with uncommitted or untracked
    files. The folder is replaced in one switch (atomic.replacing).

    Returns:
        The files that differ (written, or in a dry run only reported).
    """
    if not layout.worktree.exists():
        raise ToolError(
            f"no worktree at {layout.worktree}; run make worktree "
            f"VLLM_VERSION={layout.version} first",
            EXIT_USAGE,
        )
    problem = _worktree_problem(layout)
    if problem:
        raise ToolError(problem)
    git = Git(layout.worktree)
    base = trees.base_ref(layout.version)
    if dry_run:
        return stack.export(git, base, layout.patches, dry_run=True)
    with atomic.replacing(layout.patches) as stage:
        changed = stack.export(git, base, stage)
        if not changed:
            shutil.rmtree(stage)
    return changed


def check(layout: trees.Layout) -> int:
    """Lint, apply on the pristine sdist, re-export and compare byte for byte.

    Returns:
        The number of patches checked.
    """
    names = _lint_or_raise(layout)
    base = trees.ensure_base(layout, layout.pin())
    with tempfile.TemporaryDirectory(dir=layout.pin_build) as tmp:
        path = Path(tmp) / "check"
        git = trees.new_tree(layout, path, base, None)
        try:
            failure = stack.import_patches(git, layout.patches, names)
            if failure:
                raise ToolError(_failure_text(failure))
            out = Path(tmp) / "out"
            shutil.copytree(layout.patches, out)
            drift = stack.export(git, trees.base_ref(layout.version), out)
        finally:
            trees.remove_tree(layout, path)
    if drift:
        raise ToolError(
            "drift: re-exporting the stack does not give the committed bytes: "
            + ", ".join(drift)
            + "\n  patches are written by `make export`; do not edit them by hand."
        )
    return len(names)
