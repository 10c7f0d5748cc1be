# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The patch stack: the series file, lint, import into git and export.

A patch in the stack is one git format-patch file; `patches/series` lists
them in order (quilt's format: one name a line, `#` comments). In a git
worktree each patch is one commit whose message carries a `Patch-Filename:`
trailer, so export writes it back under the same name whatever its subject
becomes. The trailer never reaches the exported file.

Export is canonical: zero commit id, no diffstat, no signature, full blob
ids, and git's user configuration ignored, so exporting twice gives the same
bytes and `check` can detect drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .git import Git, GitError

FILENAME_TRAILER = "Patch-Filename"
# Trailers every patch header must carry (DEP-3 fields in git form).
REQUIRED_TRAILERS = ("Forwarded", "Origin", "Last-Update", "Signed-off-by")
ZERO_FROM = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"

FORMAT_PATCH_ARGS = (
    "format-patch",
    "--stdout",
    "--zero-commit",
    "--no-stat",
    "--no-signature",
    "--full-index",
    "--no-numbered",
    "--no-binary",
    "--no-renames",
    "--no-encode-email-headers",
    "--no-thread",
    "--no-cover-letter",
)


class StackError(RuntimeError):
    """The stack could not be read, applied or written."""


@dataclass(slots=True)
class ApplyFailure:
    """A patch that stopped an import."""

    # The patch's file name in patches/.
    patch: str
    # Files the patch touches that did not apply (unmerged after a 3-way).
    files: list[str]
    # git's own message.
    output: str


def read_series(patches_dir: Path) -> list[str]:
    """Patch names in series order (comments and blank lines dropped)."""
    series = patches_dir / "series"
    if not series.exists():
        raise StackError(f"{series} does not exist")
    names = []
    for line in series.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            # quilt allows options after the name (e.g. -p1); we use -p1 only.
            names.append(line.split()[0])
    return names


def write_series(patches_dir: Path, names: list[str]) -> None:
    (patches_dir / "series").write_text("".join(f"{n}\n" for n in names))


def lint(patches_dir: Path) -> list[str]:
    """Every problem with the series and its files, one message each.

    Checks: the series exists; each entry exists, is listed once and parses
    as a git format-patch file with a subject, a diff and the required
    trailers; no `.patch` file in the directory is left out of the series.
    """
    try:
        names = read_series(patches_dir)
    except StackError as e:
        return [str(e)]
    problems = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            problems.append(f"{name}: listed twice in series")
            continue
        seen.add(name)
        path = patches_dir / name
        if not path.is_file():
            problems.append(f"{name}: listed in series but missing")
            continue
        problems += [f"{name}: {p}" for p in _lint_patch(path.read_text())]
    for path in sorted(patches_dir.glob("*.patch")):
        if path.name not in seen:
            problems.append(f"{path.name}: not listed in series")
    return problems


def _lint_patch(text: str) -> list[str]:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("From "):
        return ["does not start with a git format-patch 'From ' line"]
    head, sep, _ = text.partition("\ndiff --git ")
    problems = []
    if not sep:
        problems.append("no diff")
    if not re.search(r"^Subject: .+", head, re.M):
        problems.append("no Subject")
    if not re.search(r"^From: .+<.+>", head, re.M):
        problems.append("no From: author")
    for trailer in REQUIRED_TRAILERS:
        if not re.search(rf"^{trailer}: \S", head, re.M):
            problems.append(f"no '{trailer}:' trailer in the header")
    if re.search(rf"^{FILENAME_TRAILER}:", head, re.M):
        problems.append(f"'{FILENAME_TRAILER}:' must not be exported")
    return problems


def import_patches(
    git: Git,
    patches_dir: Path,
    names: list[str],
    three_way: bool = False,
    signoff: bool = False,
    name_trailer: bool = True,
) -> ApplyFailure | None:
    """`git am` each patch onto HEAD; stop at the first that fails.

    Args:
        three_way: fall back to a 3-way merge (needs the preimage blobs in
            the repository, which the pristine base of the old pin provides).
        signoff: add the committer's Signed-off-by (the PR branch).
        name_trailer: record the file name as a trailer for export.

    Returns:
        None when every patch applied; otherwise the failure, with the
        repository left in the middle of `git am` when `three_way` is set
        (so the user can resolve and continue) and clean otherwise.
    """
    for name in names:
        failure = apply_one(git, patches_dir / name, three_way, signoff)
        if failure is not None:
            return failure
        if name_trailer:
            tag_commit(git, name)
    return None


# git rerere for the rebase tree: a conflict resolved once is replayed (and
# staged) the next time the same conflict appears, e.g. when a rebase is
# aborted and redone, or repeated onto a respun release. The resolutions live
# in the shared upstream.git (rr-cache), so they outlive the rebase tree.
RERERE_CONFIG = ("-c", "rerere.enabled=true", "-c", "rerere.autoUpdate=true")


def apply_one(
    git: Git,
    patch: Path,
    three_way: bool,
    signoff: bool = False,
    rerere: bool = False,
) -> ApplyFailure | None:
    args = [*(RERERE_CONFIG if rerere else ()), "am", "--keep-cr", "--quiet"]
    if three_way:
        args.append("-3")
    if signoff:
        args.append("--signoff")
    try:
        git.run(*args, str(patch))
    except GitError as e:
        files = git.unmerged_files() if three_way else git.files_of_patch(patch)
        if not three_way and git.am_in_progress():
            git.run("am", "--abort")
        return ApplyFailure(patch.name, files, e.output)
    return None


def tag_commit(git: Git, name: str) -> None:
    """Record `name` as HEAD's Patch-Filename trailer."""
    git.run(
        "-c",
        "trailer.ifexists=replace",
        "commit",
        "--amend",
        "--no-edit",
        "--no-verify",
        "--allow-empty",
        "--trailer",
        f"{FILENAME_TRAILER}: {name}",
    )


def render(git: Git, base: str) -> dict[str, str]:
    """The canonical patch files for base..HEAD, by file name, in order."""
    text = git.canonical(*FORMAT_PATCH_ARGS, f"{base}..HEAD")
    patches: dict[str, str] = {}
    if not text:
        return patches
    chunks = text.split(ZERO_FROM + "\n")
    assert chunks[0] == "", "format-patch output must start with a From line"
    for chunk in chunks[1:]:
        name, body = _take_name(chunk)
        if name in patches:
            raise StackError(f"two commits carry {FILENAME_TRAILER}: {name}")
        # --stdout separates patches with a blank line; a file's bytes must
        # not depend on whether another patch follows it.
        patches[name] = ZERO_FROM + "\n" + body.rstrip("\n") + "\n"
    return patches


def _take_name(chunk: str) -> tuple[str, str]:
    head, sep, diff = chunk.partition("\ndiff --git ")
    match = re.search(rf"^{FILENAME_TRAILER}: (\S+)\n", head, re.M)
    if match:
        head = head[: match.start()] + head[match.end() :]
        return match.group(1), head + sep + diff
    subject = re.search(r"^Subject: (?:\[PATCH\] )?(.+)$", head, re.M)
    if not subject:
        raise StackError("a commit without a subject cannot be exported")
    return slug(subject.group(1)) + ".patch", chunk


def slug(subject: str) -> str:
    """A file name for a new patch, from its subject."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", subject).strip("-").lower()[:60]


def export(git: Git, base: str, patches_dir: Path, dry_run: bool = False) -> list[str]:
    """Write base..HEAD into patches/ (series, files; stale files removed).

    Returns:
        The names of files that differ from what is on disk (written, or in
        a dry run only reported). Empty means no drift.
    """
    rendered = render(git, base)
    changed = []
    for name, text in rendered.items():
        path = patches_dir / name
        if not path.exists() or path.read_text() != text:
            changed.append(name)
            if not dry_run:
                path.write_text(text)
    stale = [p for p in patches_dir.glob("*.patch") if p.name not in rendered]
    for path in stale:
        changed.append(path.name)
        if not dry_run:
            path.unlink()
    names = list(rendered)
    try:
        current = read_series(patches_dir)
    except StackError:
        current = []
    if current != names:
        changed.append("series")
        if not dry_run:
            write_series(patches_dir, names)
    return changed
