# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""A synthetic upstream and project for the tooling tests.

The fixtures build small sdists (tar.gz with one top folder, like vLLM's),
put them in a private cache under their pinned sha256, and lay out a project
(patches/default, patches/vllm-<v>/, csrc/tagma) so that every verb runs for
real, quickly, and without the network.
"""

from __future__ import annotations

import io
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from tagma_fork import trees, upstream  # noqa: E402
from tagma_fork.git import Git  # noqa: E402

BASE_FILES = {
    "vllm/__init__.py": "__version__ = 'x'\n",
    "vllm/config/cache.py": "".join(f"line {i}\n" for i in range(1, 41)),
    "vllm/core.py": "def f():\n    return 1\n",
    "README.md": "upstream readme\n",
    "vllm.egg-info/PKG-INFO": "Version: 9.0.0\n",
    ".gitignore": "*.md\n",
}


def make_sdist(cache: Path, version: str, files: dict[str, str]) -> upstream.Pin:
    """Write vllm-<version>.tar.gz into `cache` and return its pin."""
    name = f"vllm-{version}.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    path = cache / name
    path.write_bytes(buf.getvalue())
    wheel = f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    return upstream.Pin(version, name, upstream.sha256_of(path), wheel, "0" * 64)


class Project:
    """A project checkout plus helpers to edit its stack through the tools."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cache = tmp / "cache"
        self.cache.mkdir()
        monkeypatch.setenv("TAGMA_CACHE", str(self.cache))
        root = tmp / "proj"
        (root / "csrc/tagma").mkdir(parents=True)
        (root / "csrc/tagma/engine.h").write_text("// engine\n")
        (root / "patches").mkdir()
        (root / "patches/default").write_text("9.0.0\n")
        self.pin = make_sdist(self.cache, "9.0.0", BASE_FILES)
        self.layout = trees.Layout(root, tmp / "build", "9.0.0")
        self.patches.mkdir()
        (self.patches / "series").write_text("")
        (self.patches / "conformance.toml").write_text("# deselect nothing\n")
        upstream.write_pin(self.patches, self.pin)

    @property
    def patches(self) -> Path:
        return self.layout.patches

    def snapshot(self) -> dict[str, bytes]:
        """Every file under patches/ (every pin), for before/after checks."""
        top = self.layout.root / "patches"
        return {
            str(p.relative_to(top)): p.read_bytes()
            for p in sorted(top.rglob("*"))
            if p.is_file()
        }

    def restore(self, snap: dict[str, bytes]) -> None:
        """Make patches/ exactly `snap` again."""
        import shutil

        top = self.layout.root / "patches"
        shutil.rmtree(top)
        for rel, data in snap.items():
            (top / rel).parent.mkdir(parents=True, exist_ok=True)
            (top / rel).write_bytes(data)

    def add_patch(
        self,
        name: str,
        edit: Callable[[Path], None],
        subject: str,
        trailers: str = "",
    ) -> None:
        """Make a worktree, apply `edit`, commit it as patch `name` (with
        extra `trailers` lines), export."""
        from tagma_fork import ops, stack

        ops.worktree(self.layout, force=True)
        wt = self.layout.worktree
        edit(wt)
        git = Git(wt)
        git.run("add", "-A")
        git.run("commit", "-q", "-m", header(subject) + trailers)
        stack.tag_commit(git, name)
        ops.export(self.layout)


def header(subject: str) -> str:
    return (
        f"{subject}\n\nWhy this must be a patch.\n\n"
        "Forwarded: no\nOrigin: vendor\nLast-Update: 2026-11-30\n"
        "Signed-off-by: Test <test@example.invalid>\n"
    )


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, path)
    path.write_text(text.replace(old, new, 1))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Test")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "test@example.invalid")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Test")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "test@example.invalid")
    return Project(tmp_path, monkeypatch)


@pytest.fixture
def two_patches(project: Project) -> Project:
    """A stack of two patches: one edits cache.py line 10, one adds a module."""
    project.add_patch(
        "cache-field.patch",
        lambda wt: replace_line(
            wt / "vllm/config/cache.py", "line 10\n", "line 10 tagma\n"
        ),
        "config: tag line 10",
    )
    project.add_patch(
        "new-module.patch",
        lambda wt: (wt / "vllm/tagma.py").write_text("X = 1\n"),
        "tagma: add a module",
    )
    return project
