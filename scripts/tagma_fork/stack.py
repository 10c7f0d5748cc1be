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
    for number, raw in enumerate(series.read_bytes().split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise StackError(f"{series}:{number}: {_not_utf8(raw, e)}") from None
        line = line.split("#", 1)[0].strip()
        if line:
            # quilt allows options after the name (e.g. -p1); we use -p1 only.
            names.append(line.split()[0])
    return names


def write_series(patches_dir: Path, names: list[str]) -> None:
    (patches_dir / "series").write_bytes("".join(f"{n}\n" for n in names).encode())


@dataclass(slots=True, frozen=True)
class Problem:
    """One lint finding, by file (and line, where it has one)."""

    # The file's name in patches/ ("series" for the series file).
    file: str
    message: str
    # 1-based line in the file; None for a finding about the whole file.
    line: int | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.message}"


def lint(patches_dir: Path) -> list[str]:
    """Every problem with the series and its files, one message each.

    The messages of lint_problems(), as `name: message` or
    `name:line: message`.
    """
    return [str(p) for p in lint_problems(patches_dir)]


def lint_problems(patches_dir: Path) -> list[Problem]:
    """Every problem with the series and its files, by file and line.

    Checks: the series exists; each entry exists, is listed once and parses
    as a git format-patch file with a subject, an author, a diff and the
    required trailers in its trailer block, its header (the part before the
    first `diff --git`) UTF-8 with LF line endings; no `.patch` file in the
    directory is left out of the series. Files are read as bytes: the diffs
    may carry any bytes (a Latin-1 source file, CRLF files).
    """
    try:
        names = read_series(patches_dir)
    except StackError as e:
        return [Problem("series", str(e))]
    problems = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            problems.append(Problem(name, "listed twice in series"))
            continue
        seen.add(name)
        path = patches_dir / name
        if not path.is_file():
            problems.append(Problem(name, "listed in series but missing"))
            continue
        problems += lint_patch(name, path.read_bytes())
    for path in sorted(patches_dir.glob("*.patch")):
        if path.name not in seen:
            problems.append(Problem(path.name, "not listed in series"))
    return problems


def lint_patch(name: str, data: bytes) -> list[Problem]:
    """The problems of one patch file's bytes (`name` labels them)."""
    head, diff = split_header(data)
    raw_lines = head.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    problems: list[Problem] = []
    lines: list[str] = []
    for number, raw in enumerate(raw_lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(Problem(name, _not_utf8(raw, e) + " in the header", number))
            line = raw.decode("utf-8", "replace")
        if line.endswith("\r"):
            # git am --keep-cr keeps it in the commit message; export drops it.
            problems.append(Problem(name, "CRLF line ending in the header", number))
            line = line[:-1]
        lines.append(line)
    if not lines or not lines[0].startswith("From "):
        problems.append(
            Problem(name, "does not start with a git format-patch 'From ' line")
        )
        return problems
    if not diff:
        problems.append(Problem(name, "no diff"))
    headers, body_start = mail_headers(lines)
    if not headers.get("subject", "").strip():
        problems.append(Problem(name, "no Subject"))
    if not re.search(r".+<.+>", headers.get("from", "")):
        problems.append(Problem(name, "no From: author"))
    message = list(enumerate(lines, 1))[body_start:]
    for i, (_, line) in enumerate(message):
        # git am ends the message at a `---` line (format-patch's separator).
        if re.fullmatch(r"---\s*", line):
            message = message[:i]
            break
    block = trailer_block(message)
    tokens = {t[0].lower(): t[1] for _, line in block if (t := _trailer(line))}
    for trailer in REQUIRED_TRAILERS:
        if tokens.get(trailer.lower(), "").strip():
            continue
        elsewhere = [
            number
            for number, line in message
            if (t := _trailer(line)) and t[0].lower() == trailer.lower()
        ]
        if elsewhere:
            problems.append(
                Problem(
                    name,
                    f"'{trailer}:' is not in the trailer block (the last "
                    "paragraph of the message, trailer lines only)",
                    elsewhere[0],
                )
            )
        else:
            problems.append(Problem(name, f"no '{trailer}:' trailer in the header"))
    for number, line in enumerate(lines, 1):
        if line.startswith(f"{FILENAME_TRAILER}:"):
            problems.append(
                Problem(name, f"'{FILENAME_TRAILER}:' must not be exported", number)
            )
    return problems


def split_header(data: bytes) -> tuple[bytes, bytes]:
    """A patch's bytes split before the first `diff --git` line."""
    if data.startswith(b"diff --git "):
        return b"", data
    cut = data.find(b"\ndiff --git ")
    if cut < 0:
        return data, b""
    return data[: cut + 1], data[cut + 1 :]


def mail_headers(lines: list[str]) -> tuple[dict[str, str], int]:
    """The unfolded mail headers of a patch's header lines, and where the
    message starts (index into `lines`).

    `lines[0]` is the mbox `From <id> <date>` line. git folds a long header
    (RFC 2822) onto lines that start with whitespace; unfolding joins them
    back. Names are lower-cased; the first of a repeated header wins.
    """
    headers: dict[str, str] = {}
    last = ""
    i = 1
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            return headers, i + 1
        if line[0] in " \t" and last:
            headers[last] += line
        elif match := re.match(r"([!-9;-~]+):[ \t]?(.*)", line):
            last = match.group(1).lower()
            if last in headers:
                last = ""  # the first wins; skip this one's continuations
            else:
                headers[last] = match.group(2)
        else:
            break  # not a header: the message begins here
        i += 1
    return headers, i


_TRAILER_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*)")


def _trailer(line: str) -> tuple[str, str] | None:
    match = _TRAILER_RE.fullmatch(line)
    return (match.group(1), match.group(2)) if match else None


def split_message(message: str) -> tuple[str, str, list[str]]:
    """A commit message's subject, body (stripped of blank edges) and the
    lines of its trailer block."""
    lines = message.rstrip("\n").split("\n")
    numbered = list(enumerate(lines[1:], 1))
    block = trailer_block(numbered)
    drop = {number for number, _ in block}
    body = "\n".join(line for number, line in numbered if number not in drop)
    return lines[0], body.strip("\n"), [line for _, line in block]


def trailer_block(message: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The trailer block of a commit message given as (line number, text).

    git's definition, strictly: the last paragraph, when every line of it is
    a `Token: value` trailer or the continuation (leading whitespace) of
    one. Empty when the last paragraph is prose.
    """
    end = len(message)
    while end and not message[end - 1][1].strip():
        end -= 1
    start = end
    while start and message[start - 1][1].strip():
        start -= 1
    block = message[start:end]
    if not block or _trailer(block[0][1]) is None:
        return []
    for _, line in block[1:]:
        if not (line[0] in " \t" or _trailer(line)):
            return []
    return block


def _not_utf8(raw: bytes, error: UnicodeDecodeError) -> str:
    return f"not UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})"


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


def render(git: Git, base: str) -> dict[str, bytes]:
    """The canonical patch files for base..HEAD, by file name, in order.

    Bytes, as git writes them: a CRLF file or a Latin-1 file in a diff comes
    out exactly as committed.
    """
    data = git.canonical_bytes(*FORMAT_PATCH_ARGS, f"{base}..HEAD")
    patches: dict[str, bytes] = {}
    if not data:
        return patches
    start = ZERO_FROM.encode() + b"\n"
    # Only at a line start: a diff that adds a patch file carries the same
    # text after its `+`.
    chunks = re.split(rb"(?m)^" + re.escape(start), data)
    if chunks[0] != b"":
        raise StackError("format-patch output must start with a From line")
    for chunk in chunks[1:]:
        name, body = _take_name(chunk)
        if name in patches:
            raise StackError(f"two commits carry {FILENAME_TRAILER}: {name}")
        # --stdout separates patches with a blank line; a file's bytes must
        # not depend on whether another patch follows it.
        patches[name] = start + body.rstrip(b"\n") + b"\n"
    return patches


def _take_name(chunk: bytes) -> tuple[str, bytes]:
    head, diff = split_header(chunk)
    match = re.search(rb"(?m)^" + FILENAME_TRAILER.encode() + rb": (\S+)\n", head)
    if match:
        head = head[: match.start()] + head[match.end() :]
        return match.group(1).decode("utf-8", "replace"), head + diff
    lines = ["From "] + head.decode("utf-8", "replace").split("\n")
    subject = mail_headers(lines)[0].get("subject", "")
    subject = re.sub(r"^\[PATCH\] ", "", subject.strip())
    if not subject:
        raise StackError("a commit without a subject cannot be exported")
    return slug(subject) + ".patch", chunk


def slug(subject: str) -> str:
    """A file name for a new patch, from its subject."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", subject).lower()[:60].strip("-")


def drift(rendered: dict[str, bytes], patches_dir: Path) -> list[str]:
    """The files of patches_dir that differ from `rendered`, byte for byte:
    changed or new patches, stale `.patch` files, and "series" when its
    names are not the rendered order.
    """
    changed = [
        name
        for name, data in rendered.items()
        if not (patches_dir / name).is_file()
        or (patches_dir / name).read_bytes() != data
    ]
    changed += [
        p.name for p in sorted(patches_dir.glob("*.patch")) if p.name not in rendered
    ]
    try:
        current = read_series(patches_dir)
    except StackError:
        current = []
    if current != list(rendered):
        changed.append("series")
    return changed


def export(git: Git, base: str, patches_dir: Path, dry_run: bool = False) -> list[str]:
    """Write base..HEAD into patches/ (series, files; stale files removed).

    Callers write into a staging folder (atomic.replacing) or a scratch one:
    the folder switch, not each file, is what makes a write all or nothing.

    Returns:
        The names of files that differ, byte for byte, from what is on disk
        (written, or in a dry run only reported). Empty means no drift.
    """
    rendered = render(git, base)
    changed = drift(rendered, patches_dir)
    if dry_run:
        return changed
    for name in changed:
        if name == "series":
            write_series(patches_dir, list(rendered))
        elif name in rendered:
            (patches_dir / name).write_bytes(rendered[name])
        else:
            (patches_dir / name).unlink()
    return changed
