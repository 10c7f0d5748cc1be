# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Patches are bytes end to end, and the lint reads headers as git writes them.

A small repository of its own (a base commit tagged `base`, one commit per
patch), so these tests need neither the sdist fixtures nor the CLI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tagma_fork import stack
from tagma_fork.git import Git

TRAILERS = (
    "Forwarded: no\nOrigin: vendor\nLast-Update: 2026-11-30\n"
    "Signed-off-by: Test <test@example.invalid>\n"
)


def message(subject: str, trailers: str = TRAILERS) -> str:
    return f"{subject}\n\nWhy this must be a patch.\n\n{trailers}"


class Repo:
    """A repository with a base commit; commits become patches in `patches`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.path = tmp / "repo"
        self.path.mkdir()
        self.patches = tmp / "patches"
        self.patches.mkdir()
        (self.patches / "series").write_bytes(b"")
        self.git = Git(self.path)
        self.git.run("init", "-q")
        (self.path / "core.py").write_bytes(b"def f():\n    return 1\n")
        self.git.run("add", "-A")
        self.git.run("commit", "-q", "-m", "base")
        self.git.run("tag", "base")

    def commit(
        self,
        name: str,
        files: dict[str, bytes],
        msg: str | None = None,
        env: dict[str, str] | None = None,
    ) -> bytes:
        """Commit `files` as patch `name`, export, return the patch's bytes."""
        for rel, data in files.items():
            (self.path / rel).write_bytes(data)
        self.git.run("add", "-A")
        self.git.run("commit", "-q", "-F", "-", stdin=msg or message(name), env=env)
        stack.tag_commit(self.git, name)
        stack.export(self.git, "base", self.patches)
        return (self.patches / name).read_bytes()

    def check(self) -> tuple[list[str], Path]:
        """Import patches/ onto base and re-export: what `check` compares.

        Returns the drift and the tree the patches were applied in.
        """
        tree = self.tmp / f"check{len(list(self.tmp.glob('check*')))}"
        self.git.run("worktree", "add", "-q", "--detach", str(tree), "base")
        git = Git(tree)
        names = stack.read_series(self.patches)
        assert stack.import_patches(git, self.patches, names) is None
        return stack.export(git, "base", self.patches, dry_run=True), tree


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Repo:
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")
    # No user config (core.autocrlf, hooks) may change the bytes under test.
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    return Repo(tmp_path)


def line_of(data: bytes, needle: bytes) -> int:
    return data[: data.index(needle)].count(b"\n") + 1


def test_crlf_file_exports_with_its_crs(repo: Repo) -> None:
    data = repo.commit("crlf.patch", {"win.txt": b"a\r\nb\r\n"})
    assert b"\n+a\r\n+b\r\n" in data
    assert stack.lint(repo.patches) == []
    drift, tree = repo.check()
    assert drift == []
    assert (tree / "win.txt").read_bytes() == b"a\r\nb\r\n"


def test_latin1_diff_round_trips(repo: Repo) -> None:
    legacy = b"/* caf\xe9 */\nint x;\n"
    data = repo.commit("latin1.patch", {"legacy.c": legacy})
    assert b"\n+/* caf\xe9 */\n" in data
    # The diff may carry any bytes; only the header must be UTF-8.
    assert stack.lint(repo.patches) == []
    drift, tree = repo.check()
    assert drift == []
    assert (tree / "legacy.c").read_bytes() == legacy
    # git's text output never raises and keeps its CRs.
    assert "caf" in repo.git.out("show", "HEAD:legacy.c")


def test_check_compares_bytes_and_lint_flags_crlf_header(repo: Repo) -> None:
    repo.commit("crlf-head.patch", {"new.py": b"X = 1\n"})
    patch = repo.patches / "crlf-head.patch"
    data = patch.read_bytes()
    needle = b"Why this must be a patch.\n"
    patch.write_bytes(data.replace(needle, needle[:-1] + b"\r\n"))
    # The committed file no longer is what export writes: drift, byte-exact.
    assert stack.export(repo.git, "base", repo.patches, dry_run=True) == [
        "crlf-head.patch"
    ]
    line = line_of(data, needle)
    assert stack.lint(repo.patches) == [
        f"crlf-head.patch:{line}: CRLF line ending in the header"
    ]
    problems = stack.lint_problems(repo.patches)
    assert [(p.file, p.line) for p in problems] == [("crlf-head.patch", line)]


def test_non_utf8_header_is_named_not_raised(repo: Repo) -> None:
    repo.commit("latin1-head.patch", {"new.py": b"X = 1\n"})
    patch = repo.patches / "latin1-head.patch"
    data = patch.read_bytes()
    needle = b"Why this must be a patch."
    patch.write_bytes(data.replace(needle, b"Why this must be a caf\xe9 patch."))
    line = line_of(data, needle)
    assert stack.lint(repo.patches) == [
        f"latin1-head.patch:{line}: not UTF-8 (byte 0xe9 at column 23) in the header"
    ]
    assert stack.export(repo.git, "base", repo.patches, dry_run=True) == [
        "latin1-head.patch"
    ]
    # export puts back the bytes the commit has.
    stack.export(repo.git, "base", repo.patches)
    assert patch.read_bytes() == data


def test_non_utf8_series_is_named(repo: Repo) -> None:
    (repo.patches / "series").write_bytes(b"a.patch\nb\xff.patch\n")
    assert stack.lint(repo.patches) == [
        f"series: {repo.patches / 'series'}:2: not UTF-8 (byte 0xff at column 2)"
    ]


def test_folded_from_header_passes_lint(repo: Repo) -> None:
    # Over 78 characters with the address; git am keeps names of <= 60.
    name, email = (
        "Author With A Fairly Long Name",
        "a.rather.long.address.for.a.fold@example.invalid",
    )
    data = repo.commit(
        "long-author.patch",
        {"new.py": b"X = 1\n"},
        env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email},
    )
    # git folds it (RFC 2822): the address is on a continuation line.
    assert f"\nFrom: {name}\n <{email}>\n".encode() in data
    assert stack.lint(repo.patches) == []
    assert repo.check()[0] == []


def test_folded_subject_names_an_untagged_patch(repo: Repo) -> None:
    subject = "core: " + " ".join(["word"] * 20) + " tail"
    (repo.path / "new.py").write_bytes(b"X = 1\n")
    repo.git.run("add", "-A")
    repo.git.run("commit", "-q", "-F", "-", stdin=message(subject))
    rendered = stack.render(repo.git, "base")
    assert list(rendered) == [stack.slug(subject) + ".patch"]
    assert b"\n " in rendered[stack.slug(subject) + ".patch"].split(b"\n\n")[0]


def test_trailer_in_the_body_paragraph_is_flagged(repo: Repo) -> None:
    msg = (
        "body sign-off\n\nWhy this must be a patch.\n"
        "Signed-off-by: Test <test@example.invalid>\n\n"
        "Forwarded: no\nOrigin: vendor\nLast-Update: 2026-11-30\n"
    )
    data = repo.commit("body.patch", {"new.py": b"X = 1\n"}, msg)
    line = line_of(data, b"Signed-off-by:")
    assert stack.lint(repo.patches) == [
        (
            f"body.patch:{line}: 'Signed-off-by:' is not in the trailer block "
            "(the last paragraph of the message, trailer lines only)"
        )
    ]


def test_prose_in_the_last_paragraph_is_no_trailer_block(repo: Repo) -> None:
    msg = message("prose", TRAILERS + "and a closing remark.\n")
    repo.commit("prose.patch", {"new.py": b"X = 1\n"}, msg)
    problems = stack.lint(repo.patches)
    assert len(problems) == len(stack.REQUIRED_TRAILERS)
    for problem, trailer in zip(problems, stack.REQUIRED_TRAILERS, strict=True):
        # By line: each sits in the last paragraph, which has prose in it.
        assert problem.startswith("prose.patch:")
        assert f"'{trailer}:' is not in the trailer block" in problem


def test_trailer_continuation_lines_are_part_of_the_block(repo: Repo) -> None:
    trailers = TRAILERS.replace("Origin: vendor\n", "Origin: vendor,\n  see the RFC\n")
    repo.commit("cont.patch", {"new.py": b"X = 1\n"}, message("cont", trailers))
    assert stack.lint(repo.patches) == []


def test_a_patch_that_adds_a_patch_file(repo: Repo) -> None:
    inner = stack.ZERO_FROM.encode() + b"\nFrom: X <x@y>\nSubject: inner\n"
    data = repo.commit("outer.patch", {"inner.patch": inner})
    assert list(stack.render(repo.git, "base")) == ["outer.patch"]
    assert b"\n+" + stack.ZERO_FROM.encode() + b"\n" in data
    assert repo.check()[0] == []
