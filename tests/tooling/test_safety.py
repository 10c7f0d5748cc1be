# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The tool refuses what would lose or corrupt the stack, and says what to run.

One test per defect a careful user found: export against the wrong base,
untracked files, apply's lint and its kept extension, rebase-abort's check,
the Makefile's arguments, honest --dry-run, one error path for the CLI.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from conftest import BASE_FILES, Project, make_sdist

from tagma_fork import cli, ops, rebase, trees, upstream
from tagma_fork.errors import EXIT_FAIL, EXIT_USAGE, ToolError
from tagma_fork.git import Git

ROOT = Path(__file__).resolve().parents[2]


def test_export_refuses_a_worktree_on_another_base(two_patches: Project) -> None:
    layout = two_patches.layout
    ops.worktree(layout, force=True)
    before = two_patches.snapshot()
    # The pin now names another sdist of the same version (a respin): its
    # pristine base is another commit, the worktree still sits on the old one.
    respin = make_sdist(two_patches.cache, "9.0.0", {**BASE_FILES, "NEW": "x\n"})
    upstream.write_pin(two_patches.patches, respin)
    Git(layout.bare).run("tag", "-d", "upstream/v9.0.0")
    before = two_patches.snapshot()
    with pytest.raises(ToolError, match="not based on vllm 9.0.0") as e:
        ops.export(layout)
    assert "make worktree FORCE=1 VLLM_VERSION=9.0.0" in str(e.value)
    assert two_patches.snapshot() == before
    # worktree gives the same advice, and following it works.
    with pytest.raises(ToolError, match="FORCE=1"):
        ops.worktree(layout)
    ops.worktree(layout, force=True)
    assert ops.export(layout) == []


def test_export_refuses_a_rebase_stopped_mid_stack(two_patches: Project) -> None:
    """A rebase stopped at an `edit` step leaves a clean status and a HEAD
    that is part of the stack: exporting it would drop the later patches."""
    layout = two_patches.layout
    ops.worktree(layout, force=True)
    git = Git(layout.worktree)
    base = trees.base_ref(layout.version)
    env = {"GIT_SEQUENCE_EDITOR": "sed -i 1s/^pick/edit/"}
    git.run("rebase", "-q", "-i", base, env=env)
    assert git.out("status", "--porcelain") == ""
    before = two_patches.snapshot()
    for verb in (ops.export, ops.worktree):
        with pytest.raises(ToolError, match="in the middle of a rebase") as e:
            verb(layout)
        assert "rebase --continue" in str(e.value)
    assert two_patches.snapshot() == before
    # Finished, the stack exports unchanged.
    git.run("rebase", "--continue")
    assert ops.export(layout) == []


def test_untracked_file_is_named_and_the_advice_leads_through(
    two_patches: Project,
) -> None:
    layout = two_patches.layout
    ops.worktree(layout, force=True)
    wt = layout.worktree
    (wt / "vllm/added.py").write_text("Z = 3\n")
    for verb in (ops.export, ops.worktree):
        with pytest.raises(ToolError, match=r"untracked files:\n.*vllm/added.py"):
            verb(layout)
    # The advice: commit it, then export. The new file lands in the stack.
    git = Git(wt)
    git.run("add", "-A")
    git.run("commit", "-q", "--amend", "--no-edit")
    assert ops.export(layout) == ["new-module.patch"]
    assert b"vllm/added.py" in (two_patches.patches / "new-module.patch").read_bytes()
    ops.worktree(layout)  # nothing unexported now


def test_apply_lints_first_and_keeps_the_tree(two_patches: Project) -> None:
    layout = two_patches.layout
    ops.apply(layout)
    series = two_patches.patches / "series"
    series.write_text(series.read_text() + "cache-field.patch\n")
    with pytest.raises(ToolError, match="cache-field.patch: listed twice"):
        ops.apply(layout)
    assert (layout.tree / "vllm/tagma.py").exists()
    assert Git(layout.tree).out("status", "--porcelain") == ""


def test_apply_keeps_the_built_extension(two_patches: Project) -> None:
    layout = two_patches.layout
    ext = layout.pin_build / "tagma-ext"
    ext.mkdir(parents=True)
    (ext / "_tagma_C.abi3.so").write_bytes(b"\x7fELF built")
    ops.apply(layout)
    assert (layout.tree / "vllm/_tagma_C.abi3.so").read_bytes() == b"\x7fELF built"


def test_rebase_abort_checks_what_it_reports(two_patches: Project, capsys) -> None:
    text = BASE_FILES["vllm/config/cache.py"].replace("line 10\n", "line ten\n")
    pin = make_sdist(
        two_patches.cache, "9.2.0", {**BASE_FILES, "vllm/config/cache.py": text}
    )
    assert rebase.start(two_patches.layout, pin) == rebase.EXIT_CONFLICT
    assert rebase.abort(two_patches.layout) == 0
    assert "as it was before the rebase (verified)" in capsys.readouterr().out
    # Stopped again; this time patches/ is edited before the abort.
    assert rebase.start(two_patches.layout, pin) == rebase.EXIT_CONFLICT
    (two_patches.patches / "series").write_text("new-module.patch\n")
    assert rebase.abort(two_patches.layout) == EXIT_FAIL
    assert "differs from when the rebase started" in capsys.readouterr().out


def test_rebase_refuses_an_existing_stack(two_patches: Project) -> None:
    with pytest.raises(ToolError, match="vllm-9.0.0 exists already"):
        rebase.start(two_patches.layout, two_patches.pin)


def _make(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp), "BUILD": str(tmp / "b")},
    )


def test_make_rebase_without_a_version_prints_its_usage(tmp_path: Path) -> None:
    proc = _make("rebase", f"BUILD={tmp_path}/b", tmp=tmp_path)
    assert proc.returncode == 2
    assert "usage: make rebase VLLM_VERSION=<new release>" in proc.stdout
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "value", ["0.25.1; touch {m}", "0.25.1$$(touch {m})", "0.25.1' && touch '{m}"]
)
def test_make_refuses_a_version_that_is_not_one(tmp_path: Path, value: str) -> None:
    marker = tmp_path / "ran"
    for var in ("VLLM_VERSION", "FROM"):
        proc = _make(
            "rebase", f"{var}={value.format(m=marker)}", "DRY_RUN=1",
            f"BUILD={tmp_path}/b", tmp=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "is not" in proc.stderr and "release version" in proc.stderr
        assert not marker.exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("verb", ["fetch", "check", "apply", "worktree", "build"])
def test_dry_run_is_refused_where_it_would_be_ignored(verb: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([verb, "--dry-run"])
    assert e.value.code == EXIT_USAGE


def test_cli_errors_are_one_line_not_tracebacks(capsys) -> None:
    assert cli.main(["--pin", "0.25.1; rm -rf x", "check"]) == EXIT_FAIL
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a vLLM release version" in err
    assert "Traceback" not in err
    assert cli.main(["--pin", "99.0.0", "fetch"]) == EXIT_FAIL
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "vllm-99.0.0/pin.toml does not exist" in err


def test_the_library_never_calls_the_cli() -> None:
    pkg = ROOT / "scripts/tagma_fork"
    for path in pkg.glob("*.py"):
        if path.name in ("cli.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = {a.name for a in node.names}
                assert node.module != "cli" and "cli" not in names, path.name


def test_layout_paths_belong_to_their_pin(tmp_path: Path) -> None:
    layout = trees.Layout(tmp_path / "p", tmp_path / "b", "0.26.0")
    assert layout.patches == tmp_path / "p/patches/vllm-0.26.0"
    assert layout.tree == tmp_path / "b/vllm-0.26.0/tree"
    assert layout.bare == tmp_path / "b/upstream.git"
    with pytest.raises(ValueError, match="not a vLLM release version"):
        _ = trees.Layout(tmp_path, tmp_path, "../x").patches


def test_no_build_outputs_are_committed() -> None:
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert not [f for f in tracked if ".egg-info/" in f or f.startswith("build/")]
