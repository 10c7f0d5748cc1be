# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Port a pin's stack to another vLLM release, as a new stack folder.

The stack of the source pin (patches/vllm-<old>/) is imported onto the new
pristine base in build/rebase with a 3-way merge. At the first conflict the
import stops and leaves the tree in `git am` so the user resolves it there;
`--continue` and `--abort` pick up from a small state file. The new folder
patches/vllm-<new>/ (pin, series, patches, the conformance manifest to
review) is written only when every patch has applied, staged beside and moved
in with one rename; the source folder is never written. So an abort, an
interrupt or a crash leaves patches/ as it was, or with the finished new
stack, never half of it; `--abort` checks that and says which.

The import runs with git rerere on (a resolution recorded once is replayed
when the same conflict comes back, e.g. after an abort and a second try), and
it keeps a per-patch record: how it applied (cleanly, with a 3-way merge,
conflicted and resolved by hand or by rerere), the conflicting files, and the
minutes from the stop to `--continue`. On success that record and the
range-diff of the old and new stacks are written to
build/results/rebase/<old>-to-<new>/ (report.md, range-diff.txt).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import atomic, stack, trees, upstream
from .errors import EXIT_CONFLICT, EXIT_FAIL, EXIT_OK, EXIT_USAGE, ToolError
from .git import Git, GitError

BRANCH = "tagma/rebase"
# The non-patch files a new stack folder inherits from its source.
CARRIED = ("conformance.toml",)


@dataclass(slots=True)
class State:
    """What a stopped rebase needs to resume."""

    # The pin being ported to.
    pin: dict[str, Any]
    # The source pin's version.
    source: str
    # atomic.digest of patches/ when the rebase started (what abort restores).
    digest: str
    # Patches still to import after the one that stopped, in order.
    remaining: list[str]
    # The patch that stopped the import.
    current: str
    # Per patch so far: [name, how it applied, conflicting files, minutes].
    rows: list[list] = field(default_factory=list)
    # When the import stopped (time.time()), for the minutes of the resolution.
    stopped_at: float = 0.0
    # Files that conflicted in the stopped patch.
    conflicts: list[str] = field(default_factory=list)


def _state_path(layout: trees.Layout) -> Path:
    return layout.build / "rebase-state.json"


def _save_state(layout: trees.Layout, state: State) -> None:
    atomic.write_file(_state_path(layout), json.dumps(asdict(state), indent=1).encode())


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
    old = layout.pin()
    trees.ensure_base(layout, old)  # preimage blobs for the 3-way merges
    base = trees.ensure_base(layout, pin)
    names = trees.series_names(layout)
    rows: list[tuple[str, str, list[str]]] = []
    with tempfile.TemporaryDirectory(dir=layout.pin_build) as tmp:
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
    """Port `layout`'s stack to `pin`, as patches/vllm-<pin.version>/."""
    if load_state(layout) is not None:
        raise ToolError(
            "a rebase is already stopped; make rebase-continue or make rebase-abort",
            EXIT_USAGE,
        )
    target = upstream.stack_dir(layout.root, pin.version)
    if target.exists():
        raise ToolError(
            f"{target.relative_to(layout.root)} exists already: vllm {pin.version} "
            "has a stack. To port again, remove it first (git rm -r).",
            EXIT_USAGE,
        )
    old = layout.pin()
    # The [build] table (cpu torch, relaxed lock pins) is carried over: the
    # index cannot say what the new release needs; review it after the move.
    pin = replace(pin, cpu_torch=old.cpu_torch, relax=dict(old.relax))
    trees.ensure_base(layout, old)
    base = trees.ensure_base(layout, pin)
    git = trees.new_tree(layout, layout.rebase, base, BRANCH)
    trees.place_engine(layout, layout.rebase, link=True)
    names = trees.series_names(layout)
    print(f"rebasing {len(names)} patches: vllm {old.version} -> {pin.version}")
    digest = atomic.digest(layout.stacks)
    return _run(layout, git, pin, names, digest)


# How a patch went onto the new base (the report's status column).
APPLIED = "applied cleanly"
THREE_WAY = "applied with 3-way"
RESOLVED = "conflicted, resolved by hand"
RERERE = "conflicted, resolved by rerere"
_RERERE_LINE = re.compile(r"^(?:Resolved|Staged) '(.+)' using previous resolution")


def _run(
    layout: trees.Layout,
    git: Git,
    pin: upstream.Pin,
    names: list[str],
    digest: str,
    rows: list[list] | None = None,
) -> int:
    rows = rows if rows is not None else []
    for i, name in enumerate(names):
        t0 = time.time()
        patch = layout.patches / name
        status = APPLIED
        files: list[str] = []
        failure = stack.apply_one(git, patch, three_way=False)
        if failure is not None:
            status = THREE_WAY
            failure = stack.apply_one(git, patch, three_way=True, rerere=True)
        if failure is not None and _replayed_by_rerere(git, failure):
            status = RERERE
            files = _rerere_files(failure.output)
            failure = None
        if failure is not None:
            state = State(
                asdict(pin), layout.version, digest, names[i + 1 :], name, rows,
                time.time(), failure.files,
            )  # fmt: skip
            _save_state(layout, state)
            _report_conflict(layout, failure)
            return EXIT_CONFLICT
        stack.tag_commit(git, name)
        rows.append([name, status, files, (time.time() - t0) / 60])
        note = f" (review: {', '.join(files)})" if status == RERERE else ""
        print(f"  {name}: {status}{note}")
    return _finish(layout, git, pin, rows)


def _replayed_by_rerere(git: Git, failure: stack.ApplyFailure) -> bool:
    """True when rerere resolved and staged every conflict of a stopped am;
    the am is then continued."""
    if failure.files or not git.am_in_progress():
        return False
    if not _rerere_files(failure.output):
        return False
    try:
        git.run(*stack.RERERE_CONFIG, "am", "--continue")
    except GitError:
        return False
    return True


def _rerere_files(output: str) -> list[str]:
    return [
        m.group(1)
        for line in output.splitlines()
        if (m := _RERERE_LINE.match(line.strip()))
    ]


def _report_conflict(layout: trees.Layout, failure: stack.ApplyFailure) -> None:
    files = "\n".join(f"    {f}" for f in failure.files) or "    (see git's message)"
    print(
        f"\nSTOPPED: {failure.patch} conflicts with the new upstream.\n"
        f"  conflicting files:\n{files}\n"
        f"  resolve them in {layout.rebase}, then:\n"
        f"    git -C {layout.rebase} add <files>\n"
        "    make rebase-continue      (or: python -m tagma_fork rebase --continue)\n"
        "  or give up, keeping patches/ as it was:\n"
        "    make rebase-abort         (or: python -m tagma_fork rebase --abort)\n"
    )


def resume(layout: trees.Layout) -> int:
    state = load_state(layout)
    if state is None:
        raise ToolError("no rebase is stopped", EXIT_USAGE)
    layout = layout.for_version(state.source)
    target = upstream.stack_dir(layout.root, state.pin["version"])
    if target.exists():
        # Cut short after the final rename: the new stack is complete.
        _state_path(layout).unlink()
        trees.remove_tree(layout, layout.rebase)
        print(f"the rebase had finished: {target.relative_to(layout.root)}/ is written")
        return EXIT_OK
    git = Git(layout.rebase)
    if git.unmerged_files():
        print(f"still unmerged: {', '.join(git.unmerged_files())}")
        return EXIT_CONFLICT
    try:
        # rerere on, so this resolution is recorded for the next time.
        git.run(*stack.RERERE_CONFIG, "am", "--continue")
    except GitError as e:
        print(e.output)
        return EXIT_CONFLICT
    stack.tag_commit(git, state.current)
    minutes = (time.time() - state.stopped_at) / 60 if state.stopped_at else 0.0
    state.rows.append([state.current, RESOLVED, state.conflicts, minutes])
    print(f"  {state.current}: {RESOLVED} in {minutes:.0f} min")
    return _run(
        layout, git, upstream.Pin(**state.pin), state.remaining, state.digest,
        state.rows,
    )  # fmt: skip


def abort(layout: trees.Layout) -> int:
    """Give up a rebase and prove that patches/ is as it was before it."""
    state = load_state(layout)
    if state is None and not layout.rebase.exists():
        print("no rebase to abort")
        return EXIT_OK
    if layout.rebase.exists():
        git = Git(layout.rebase)
        if git.am_in_progress():
            git.run("am", "--abort")
        trees.remove_tree(layout, layout.rebase)
    notes = atomic.recover(layout.stacks)
    if state is not None:
        # The new folder is this rebase's own (start refuses an existing one);
        # it exists only if the rebase was cut short after its final rename.
        target = upstream.stack_dir(layout.root, state.pin["version"])
        if target.exists():
            shutil.rmtree(target)
            notes.append(f"{target.name}: removed the new stack")
    for line in notes:
        print(f"  {line}")
    _state_path(layout).unlink(missing_ok=True)
    if state is not None and atomic.digest(layout.stacks) != state.digest:
        print(
            "rebase aborted, but patches/ differs from when the rebase started "
            "(edited since?): review `git status patches/`"
        )
        return EXIT_FAIL
    print("rebase aborted; patches/ is as it was before the rebase (verified)")
    return EXIT_OK


def _finish(layout: trees.Layout, git: Git, pin: upstream.Pin, rows: list[list]) -> int:
    old = layout.pin()
    target = upstream.stack_dir(layout.root, pin.version)
    out = results_dir(layout, old.version, pin.version)
    # Everything is written and reported before the one rename that makes
    # the new stack folder appear.
    with atomic.replacing(target, copy=False) as stage:
        upstream.write_pin(stage, pin)
        for name in CARRIED:
            if (layout.patches / name).exists():
                shutil.copy2(layout.patches / name, stage / name)
        stack.export(git, trees.base_ref(pin.version), stage)
        range_diff = _range_diff(layout, git, old, pin, out / "range-diff.txt")
        report = write_report(out / "report.md", old, pin, rows, range_diff)
    _state_path(layout).unlink(missing_ok=True)
    trees.remove_tree(layout, layout.rebase)
    carried = ""
    if pin.cpu_torch or pin.relax:
        carried = (
            "\n  pin.toml's [build] table was carried over from "
            f"{old.version}: review it for {pin.version}"
        )
    rel = target.relative_to(layout.root)
    print(
        f"\nported to vllm {pin.version}: {rel}/ written "
        f"({layout.patches.relative_to(layout.root)}/ unchanged).\n"
        f"  per-patch report:             {report}\n"
        f"  range-diff of the two stacks: {range_diff}{carried}\n"
        f"  next: review {rel}/conformance.toml, then "
        f"make build-fork test VLLM_VERSION={pin.version}"
    )
    return EXIT_OK


def results_dir(layout: trees.Layout, old: str, new: str) -> Path:
    """Where a rebase from `old` to `new` writes its report and range-diff."""
    path = layout.build / "results" / "rebase" / f"{old}-to-{new}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_report(
    path: Path,
    old: upstream.Pin,
    new: upstream.Pin,
    rows: list[list],
    range_diff: Path,
) -> Path:
    """The per-patch table of a finished rebase, as Markdown."""
    lines = [
        f"# Rebase of the stack: vLLM {old.version} -> {new.version}",
        "",
        "| patch | result | conflicting files | minutes |",
        "| --- | --- | --- | --- |",
    ]
    for name, status, files, minutes in rows:
        shown = ", ".join(f"`{f}`" for f in files) or "-"
        lines.append(f"| {name} | {status} | {shown} | {minutes:.0f} |")
    lines += [
        "",
        (
            "Minutes: from the stop at a conflict to `make rebase-continue` for"
            " a patch resolved by hand; the tool's own time otherwise."
        ),
        f"Range-diff of the old and new stacks: `{range_diff.name}` (same folder).",
        "",
    ]
    path.write_text("\n".join(lines))
    return path


def _range_diff(
    layout: trees.Layout,
    git: Git,
    old: upstream.Pin,
    new: upstream.Pin,
    report: Path,
) -> Path:
    """`git range-diff` of the old stack (on its base) against the new one."""
    old_tree = layout.pin_build / "rebase-old-tree"
    base = trees.ensure_base(layout, old)
    old_git = trees.new_tree(layout, old_tree, base, None)
    stack.import_patches(old_git, layout.patches, stack.read_series(layout.patches))
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
