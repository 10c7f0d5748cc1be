# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""A thin git helper for patch-stack work.

It knows nothing of vLLM or of this project: it runs git, with the user's
global and system configuration switched off where the output must be
canonical (export).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

# A fixed identity and clock for commits whose ids must not depend on who
# ran the tool or when (the pristine upstream base commit).
FIXED_IDENTITY = {
    "GIT_AUTHOR_NAME": "upstream",
    "GIT_AUTHOR_EMAIL": "upstream@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "upstream",
    "GIT_COMMITTER_EMAIL": "upstream@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}

# format-patch output depends on format.* and diff.* settings; these pin
# every setting that changes the bytes of an exported patch.
CANONICAL_CONFIG = (
    "-c", "core.abbrev=40",
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicprefix=false",
    "-c", "diff.relative=false",
    "-c", "diff.renames=false",
    "-c", "diff.algorithm=myers",
    "-c", "diff.context=3",
    "-c", "diff.interHunkContext=0",
    "-c", "format.signoff=false",
    "-c", "format.numbered=false",
    "-c", "format.coverLetter=false",
    "-c", "core.quotePath=true",
)  # fmt: skip


# Files git keeps while a command that rewrites history is stopped.
_IN_PROGRESS = (
    ("rebase-merge", "a rebase"),
    ("rebase-apply", "a rebase or git am"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"),
    ("REVERT_HEAD", "a revert"),
    ("MERGE_HEAD", "a merge"),
)


class GitError(RuntimeError):
    """A git command failed; carries its command line and output."""

    def __init__(self, args: Sequence[str], returncode: int, output: str):
        self.args_ = list(args)
        self.returncode = returncode
        self.output = output
        super().__init__(
            f"`{shlex.join(args)}` exited with {returncode}:\n{output.strip()}"
        )


class Git:
    """Runs git in one directory.

    Args:
        cwd: the repository (or worktree) to run in.
        env: extra environment for every command.
    """

    def __init__(
        self,
        cwd: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.cwd = Path(cwd)
        self.env = dict(env or {})

    def _environ(self, extra: dict[str, str] | None) -> dict[str, str]:
        environ = dict(os.environ)
        # Never let a user's pager, editor or hooks into a scripted run.
        environ.update(
            GIT_PAGER="cat", GIT_EDITOR="true", GIT_TERMINAL_PROMPT="0", LC_ALL="C"
        )
        environ.update(self.env)
        environ.update(extra or {})
        return environ

    def run(
        self,
        *args: str,
        check: bool = True,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `git args...` and return the completed process, as text.

        The text is git's bytes decoded as UTF-8, a bad byte replaced (so
        decoding never raises and the text can always be printed), with no
        newline translation (a CR stays). Use run_bytes where the bytes
        themselves matter: patch files.

        Args:
            check: raise GitError on a non-zero exit.
            env: extra environment for this command.
            stdin: text (or bytes) fed to the command.
        """
        if isinstance(stdin, str):
            stdin = stdin.encode("utf-8")
        proc = self.run_bytes(*args, check=check, env=env, stdin=stdin)
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, _decode(proc.stdout), _decode(proc.stderr)
        )

    def run_bytes(
        self,
        *args: str,
        check: bool = True,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run `git args...`; stdout and stderr are git's bytes, untouched."""
        cmd = ["git", *args]
        proc = subprocess.run(
            cmd,
            cwd=self.cwd,
            env=self._environ(env),
            input=stdin,
            capture_output=True,
        )
        if check and proc.returncode != 0:
            output = _decode(proc.stdout + proc.stderr)
            raise GitError(cmd, proc.returncode, output)
        return proc

    def out(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Run a read-only command and return its stdout, stripped."""
        return self.run(*args, env=env).stdout.strip()

    def canonical(self, *args: str) -> str:
        """Run a read-only command with user and system config ignored."""
        return _decode(self.canonical_bytes(*args))

    def canonical_bytes(self, *args: str) -> bytes:
        """canonical(), but git's stdout bytes as they are (patch files)."""
        env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
        return self.run_bytes(*CANONICAL_CONFIG, *args, env=env).stdout

    def _git_dir(self) -> Path:
        git_dir = Path(self.out("rev-parse", "--git-dir"))
        return git_dir if git_dir.is_absolute() else self.cwd / git_dir

    def am_in_progress(self) -> bool:
        return (self._git_dir() / "rebase-apply").exists()

    def operation_in_progress(self) -> str | None:
        """The history-editing command stopped mid-way in this tree, or None.

        A rebase stopped at an `edit` step leaves a clean status, yet HEAD
        is only part of the stack.
        """
        git_dir = self._git_dir()
        for marker, name in _IN_PROGRESS:
            if (git_dir / marker).exists():
                return name
        return None

    def unmerged_files(self) -> list[str]:
        out = self.out("diff", "--name-only", "--diff-filter=U")
        return out.splitlines()

    def files_of_patch(self, patch: Path) -> list[str]:
        """The paths a patch touches, read from its diff headers."""
        out = self.run("apply", "--numstat", str(patch), check=False)
        return [line.split("\t")[-1] for line in out.stdout.splitlines() if line]


def _decode(data: bytes) -> str:
    # For messages and names: never raise on a Latin-1 file's bytes in git's
    # output; anything that must stay byte-exact goes through run_bytes.
    return data.decode("utf-8", "replace")
