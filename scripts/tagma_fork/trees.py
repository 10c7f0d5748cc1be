# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The trees under build/: pristine bases, the build tree, the worktree.

One bare repository, build/upstream.git, holds every pristine release the
stacks have met as a root commit tagged `upstream/v<version>` (made with a
fixed identity and date, so its id depends only on the sdist). Every tree is
a linked worktree of it, so a 3-way merge finds the old preimage blobs. Each
pin has a build folder of its own:

    build/upstream.git          upstream/v0.26.0, upstream/v0.33.0, ...
    build/vllm-<v>/venv         the patched vLLM and the tools
    build/vllm-<v>/tree         detached: base + one commit per patch (make apply)
    build/vllm-<v>/worktree     branch tagma/patches/<v>: where patches are edited
    build/vllm-<v>/pr           branch tagma/pr/<v>: the upstream PR
    build/rebase                branch tagma/rebase: a rebase in progress

The engine (csrc/tagma) has one copy, in the project; trees get a copy
(build tree, PR branch) or a symlink (worktree, so edits land in the project).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import upstream
from .git import FIXED_IDENTITY, Git
from .stack import StackError, read_series

ENGINE = Path("csrc/tagma")


@dataclass(slots=True, frozen=True)
class Layout:
    """Where everything of one pin lives."""

    # The project checkout (holds patches/, csrc/tagma).
    root: Path
    # git-ignored build folder, shared by every pin.
    build: Path
    # The pinned vLLM release this layout is about.
    version: str

    @classmethod
    def find(cls, version: str | None = None) -> Layout:
        """The checkout this package lives in, for `version` (default pin)."""
        root = Path(__file__).resolve().parents[2]
        build = Path(os.environ.get("TAGMA_BUILD", root / "build")).resolve()
        return cls(root, build, version or upstream.default_version(root))

    def for_version(self, version: str) -> Layout:
        return Layout(self.root, self.build, version)

    @property
    def stacks(self) -> Path:
        """The folder that holds every pin's stack folder."""
        return self.root / upstream.STACKS

    @property
    def patches(self) -> Path:
        """This pin's stack folder: pin.toml, series, *.patch, conformance.toml."""
        return upstream.stack_dir(self.root, self.version)

    @property
    def pin_build(self) -> Path:
        return self.build / f"vllm-{self.version}"

    def pin(self) -> upstream.Pin:
        return upstream.read_pin(self.patches)

    @property
    def bare(self) -> Path:
        return self.build / "upstream.git"

    @property
    def tree(self) -> Path:
        return self.pin_build / "tree"

    @property
    def worktree(self) -> Path:
        return self.pin_build / "worktree"

    @property
    def rebase(self) -> Path:
        return self.build / "rebase"

    @property
    def pr(self) -> Path:
        return self.pin_build / "pr"


def base_ref(version: str) -> str:
    return f"refs/tags/upstream/v{version}"


def ensure_base(layout: Layout, pin: upstream.Pin) -> str:
    """The pristine base commit of `pin`, made from its sdist if needed."""
    layout.pin_build.mkdir(parents=True, exist_ok=True)
    bare = Git(layout.bare)
    if not layout.bare.exists():
        layout.bare.mkdir()
        bare.run("init", "--quiet", "--bare")
        # Trees carry the engine as an untracked copy; keep it out of status.
        (layout.bare / "info").mkdir(exist_ok=True)
        (layout.bare / "info" / "exclude").write_text(f"/{ENGINE}\n")
    ref = base_ref(pin.version)
    found = bare.run("rev-parse", "--verify", "--quiet", ref, check=False)
    if found.returncode == 0:
        return found.stdout.strip()

    sdist = upstream.fetch(pin.sdist, pin.sdist_sha256, pin.version)
    print(f"committing pristine vllm {pin.version} to {layout.bare} ...", flush=True)
    with tempfile.TemporaryDirectory(dir=layout.build) as tmp:
        src = Path(tmp) / "src"
        upstream.extract_sdist(sdist, src)
        env = {
            **FIXED_IDENTITY,
            "GIT_DIR": str(layout.bare),
            "GIT_WORK_TREE": str(src),
            "GIT_INDEX_FILE": str(Path(tmp) / "index"),
        }
        git = Git(src, env=env)
        # -f: the sdist ships .gitignore files; every shipped file is upstream.
        git.run("add", "--all", "--force", ".")
        tree = git.out("write-tree")
        message = (
            f"vllm {pin.version}\n\n"
            f"Pristine sdist {pin.sdist}, sha256 {pin.sdist_sha256}.\n"
        )
        commit = git.run("commit-tree", tree, stdin=message).stdout.strip()
        git.run("update-ref", ref, commit)
    return commit


def base_of(git: Git) -> str | None:
    """The root commit HEAD descends from (a worktree's upstream base)."""
    roots = git.run("rev-list", "--max-parents=0", "HEAD", check=False).stdout.split()
    return roots[0] if len(roots) == 1 else None


def remove_tree(layout: Layout, path: Path) -> None:
    """Drop a linked worktree (and its directory) if it exists."""
    bare = Git(layout.bare)
    if path.exists():
        bare.run("worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)
    bare.run("worktree", "prune")


def new_tree(layout: Layout, path: Path, commit: str, branch: str | None) -> Git:
    """A fresh linked worktree at `commit` (on `branch` if given)."""
    remove_tree(layout, path)
    bare = Git(layout.bare)
    if branch:
        bare.run("worktree", "add", "--quiet", "-B", branch, str(path), commit)
    else:
        bare.run("worktree", "add", "--quiet", "--detach", str(path), commit)
    return Git(path)


def place_engine(layout: Layout, tree: Path, link: bool) -> None:
    """Give a tree the engine: a symlink to the project's copy, or a copy."""
    src = layout.root / ENGINE
    dest = tree / ENGINE
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    if not src.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if link:
        dest.symlink_to(os.path.relpath(src, dest.parent))
    else:
        shutil.copytree(
            src, dest, ignore=shutil.ignore_patterns("build*", "__pycache__")
        )


def place_extension(layout: Layout, tree: Path) -> Path | None:
    """Put the _tagma_C that build-fork built (build/vllm-<v>/tagma-ext) into
    `tree`'s vllm/, replacing any older one. None when none is built."""
    built = sorted((layout.pin_build / "tagma-ext").glob("_tagma_C*.so"))
    if not built:
        return None
    for old in (tree / "vllm").glob("_tagma_C*.so"):
        old.unlink()
    dest = tree / "vllm" / built[0].name
    shutil.copy2(built[0], dest)
    return dest


def series_names(layout: Layout) -> list[str]:
    names = read_series(layout.patches)
    missing = [n for n in names if not (layout.patches / n).is_file()]
    if missing:
        raise StackError(f"series lists missing patches: {', '.join(missing)}")
    return names
