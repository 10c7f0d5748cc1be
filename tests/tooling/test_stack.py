# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""apply, worktree/export, check and lint on a synthetic upstream."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Project, make_sdist, replace_line

from tagma_fork import ops, stack, trees, upstream
from tagma_fork.errors import ToolError
from tagma_fork.git import Git


def test_fetch_refuses_checksum_mismatch(project: Project) -> None:
    pin = project.pin
    with pytest.raises(upstream.FetchError, match="does not match the pin"):
        upstream.fetch(pin.sdist, "f" * 64, pin.version)
    # The cached file is untouched and still passes with the right digest.
    assert upstream.fetch(pin.sdist, pin.sdist_sha256, pin.version).exists()


def test_base_commit_is_deterministic(project: Project, tmp_path: Path) -> None:
    first = trees.ensure_base(project.layout, project.pin)
    other = trees.Layout(project.layout.root, tmp_path / "other-build", "9.0.0")
    assert trees.ensure_base(other, project.pin) == first
    files = Git(project.layout.bare).out("ls-tree", "-r", "--name-only", first)
    assert "vllm.egg-info/PKG-INFO" not in files.splitlines()
    # .gitignore in the sdist must not hide upstream files from the base.
    assert "README.md" in files.splitlines()


def test_apply_places_patches_and_engine(two_patches: Project) -> None:
    assert ops.apply(two_patches.layout) == two_patches.layout.tree
    tree = two_patches.layout.tree
    assert "line 10 tagma\n" in (tree / "vllm/config/cache.py").read_text()
    assert (tree / "vllm/tagma.py").read_text() == "X = 1\n"
    engine = tree / "csrc/tagma/engine.h"
    assert engine.read_text() == "// engine\n" and not engine.is_symlink()
    assert Git(tree).out("status", "--porcelain") == ""


def test_export_round_trip_is_lossless(two_patches: Project) -> None:
    before = two_patches.snapshot()
    ops.worktree(two_patches.layout, force=True)
    assert ops.export(two_patches.layout) == []
    assert two_patches.snapshot() == before
    text = (two_patches.patches / "cache-field.patch").read_text()
    assert text.startswith(stack.ZERO_FROM)
    assert "Patch-Filename" not in text and "\n-- \n" not in text
    assert stack.read_series(two_patches.patches) == [
        "cache-field.patch",
        "new-module.patch",
    ]


def test_check_passes_then_detects_hand_edit(two_patches: Project) -> None:
    assert ops.check(two_patches.layout) == 2
    patch = two_patches.patches / "cache-field.patch"
    # A hand edit that git still applies: a trailing space in the message.
    replace_line(patch, "Why this must be a patch.\n", "Why this must be a patch. \n")
    with pytest.raises(ToolError, match="drift: .*cache-field.patch"):
        ops.check(two_patches.layout)


def test_broken_patch_is_named_and_the_old_tree_kept(two_patches: Project) -> None:
    ops.apply(two_patches.layout)
    tree = two_patches.layout.tree
    patch = two_patches.patches / "cache-field.patch"
    replace_line(patch, "-line 10\n", "-line 10 but not upstream\n")
    with pytest.raises(ToolError) as e:
        ops.apply(two_patches.layout)
    assert "cache-field.patch does not apply" in str(e.value)
    assert "vllm/config/cache.py" in str(e.value)
    # The tree the editable install points at is the last good one.
    assert (tree / "vllm/tagma.py").exists()
    assert not (two_patches.layout.pin_build / "tree.new").exists()


def test_lint_reports_every_problem(two_patches: Project) -> None:
    d = two_patches.patches
    (d / "stray.patch").write_text("not a patch\n")
    (d / "series").write_text("cache-field.patch\ncache-field.patch\ngone.patch\n")
    problems = "\n".join(stack.lint(d))
    assert "cache-field.patch: listed twice" in problems
    assert "gone.patch: listed in series but missing" in problems
    assert "new-module.patch: not listed in series" in problems
    assert "stray.patch: not listed in series" in problems
    (d / "series").write_text("stray.patch\n")
    assert "stray.patch: does not start with" in "\n".join(stack.lint(d))


def test_lint_requires_header_trailers(two_patches: Project) -> None:
    patch = two_patches.patches / "new-module.patch"
    replace_line(patch, "Forwarded: no\n", "")
    assert stack.lint(two_patches.patches) == [
        "new-module.patch: no 'Forwarded:' trailer in the header"
    ]


def test_worktree_refuses_to_drop_unexported_work(two_patches: Project) -> None:
    ops.worktree(two_patches.layout, force=True)
    wt = two_patches.layout.worktree
    (wt / "vllm/core.py").write_text("def f():\n    return 2\n")
    with pytest.raises(ToolError, match="uncommitted"):
        ops.worktree(two_patches.layout)
    assert (wt / "vllm/core.py").read_text().endswith("return 2\n")
    assert (wt / "csrc/tagma").is_symlink()


def test_quilt_push_gives_the_same_tree(two_patches: Project, tmp_path: Path) -> None:
    if shutil.which("quilt") is None:
        pytest.fail("quilt is required (make build-fork installs it)")
    ops.apply(two_patches.layout)
    plain = tmp_path / "plain"
    plain.mkdir()
    upstream.extract_sdist(two_patches.cache / two_patches.pin.sdist, plain / "src")
    src = plain / "src"
    shutil.copytree(two_patches.patches, src / "patches")
    subprocess.run(
        ["quilt", "push", "-a", "-q"],
        cwd=src,
        check=True,
        env={"QUILT_PATCHES": "patches", "PATH": "/usr/bin:/bin"},
    )
    shutil.rmtree(src / "patches")
    shutil.rmtree(src / ".pc")
    shutil.copytree(two_patches.layout.root / "csrc", src / "csrc")
    diff = subprocess.run(
        ["diff", "-r", "-x", ".git", str(src), str(two_patches.layout.tree)],
        capture_output=True,
        text=True,
    )
    assert diff.returncode == 0, diff.stdout


def test_patch_p1_applies_each_file(two_patches: Project, tmp_path: Path) -> None:
    src = tmp_path / "p1"
    upstream.extract_sdist(two_patches.cache / two_patches.pin.sdist, src)
    for name in stack.read_series(two_patches.patches):
        subprocess.run(
            ["patch", "-p1", "-s", "-i", str(two_patches.patches / name)],
            cwd=src,
            check=True,
        )
    assert (src / "vllm/tagma.py").exists()


def test_new_release_gets_its_own_base(project: Project) -> None:
    pin2 = make_sdist(project.cache, "9.1.0", {"vllm/x.py": "1\n"})
    a = trees.ensure_base(project.layout, project.pin)
    b = trees.ensure_base(project.layout, pin2)
    assert a != b
    assert Git(project.layout.bare).out("tag", "--list").splitlines() == [
        "upstream/v9.0.0",
        "upstream/v9.1.0",
    ]


def test_patch_bytes_do_not_depend_on_position(project: Project) -> None:
    project.add_patch(
        "first.patch",
        lambda wt: replace_line(wt / "vllm/core.py", "return 1\n", "return 3\n"),
        "core: first",
    )
    alone = (project.patches / "first.patch").read_bytes()
    project.add_patch(
        "second.patch",
        lambda wt: (wt / "vllm/second.py").write_text("Y = 2\n"),
        "core: second",
    )
    assert (project.patches / "first.patch").read_bytes() == alone
    assert alone.endswith(b"\n") and not alone.endswith(b"\n\n")
