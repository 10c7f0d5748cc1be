# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""pr-branch on the synthetic upstream: the two variants, the user's identity
and vLLM's AI trailer on every commit, title tags, a filled description, and
refusals that leave the previous outputs as they were."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import BASE_FILES, Project, make_sdist, replace_line

from tagma_fork import cli, pr, pr_body, record, trees, upstream
from tagma_fork.errors import EXIT_FAIL, EXIT_OK, EXIT_USAGE, ToolError
from tagma_fork.git import Git

ALIAS = ("tagma-vllm maintainers", "maintainers@tagma-vllm.invalid")
USER = ("Ada Lovelace", "ada@lovelace.dev")
SPDX_PY = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
SPDX_CPP = SPDX_PY.replace("# ", "// ")
BASE = "upstream/v9.0.0"
PLUGIN, FULL = "tagma/pr/9.0.0/plugin", "tagma/pr/9.0.0/full"
PLUGIN_SUBJECT = "[Core] Add a KV-cache manager plug-in point"
FULL_SUBJECTS = [
    "[Core] Add the tagma KV range engine (csrc/tagma)",
    PLUGIN_SUBJECT,
    "[Core] Add the tagma manager",
    "[CI/Build] vllm._tagma_C, the extension",
]


def as_identity(mp: pytest.MonkeyPatch, name: str, email: str) -> None:
    for who in ("AUTHOR", "COMMITTER"):
        mp.setenv(f"GIT_{who}_NAME", name)
        mp.setenv(f"GIT_{who}_EMAIL", email)


@pytest.fixture
def stack(project: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    """Three patches exported by the maintainers' alias, as the real stack
    is; the user is Ada, and no git config of the machine leaks in."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv(pr.AI_ENV, raising=False)
    root = project.layout.root
    (root / "csrc/tagma/engine.h").write_text(SPDX_CPP + "#pragma once\n")
    as_identity(monkeypatch, *ALIAS)
    project.add_patch(
        "plugin-point.patch",
        lambda wt: replace_line(
            wt / "vllm/config/cache.py", "line 10\n", "line 10 manager_cls\n"
        ),
        "config: add a KV-cache manager plug-in point",
    )
    project.add_patch(
        "tagma-manager.patch",
        lambda wt: (wt / "vllm/tagma.py").write_text(SPDX_PY + "X = 1\n"),
        "core: add the tagma manager",
    )
    project.add_patch(
        "build-ext.patch",
        lambda wt: replace_line(wt / "vllm/core.py", "return 1\n", "return 3\n"),
        "build: vllm._tagma_C, the extension",
    )
    as_identity(monkeypatch, *USER)
    return project


def log(layout: trees.Layout, fmt: str, rev: str) -> str:
    return Git(layout.pr).out("log", "--reverse", f"--format={fmt}", rev)


def outputs(layout: trees.Layout) -> dict[str, object]:
    """What pr-branch writes: branches, the PR tree's HEAD, descriptions."""
    bare = Git(layout.bare)
    refs = bare.out("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/")
    head = Git(layout.pr).out("rev-parse", "HEAD") if layout.pr.exists() else None
    files = {p.name: p.read_bytes() for p in sorted(layout.pin_build.glob("PR_*.md"))}
    worktrees = bare.out("worktree", "list", "--porcelain")
    return {"refs": refs, "head": head, "files": files, "worktrees": worktrees}


def pr_branches(git: Git) -> list[str]:
    refs = git.out("for-each-ref", "--format=%(refname:short)", "refs/heads/")
    return [b for b in refs.splitlines() if b.startswith("tagma/pr/")]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_pr_branch_builds_plugin_and_full(stack: Project) -> None:
    layout = stack.layout
    assert pr.make_pr_branch(layout) == EXIT_OK
    git = Git(layout.pr)
    assert pr_branches(git) == [
        FULL,
        PLUGIN,
    ]
    # The plug-in point alone: one commit over the base, no engine.
    assert git.out("rev-list", "--count", f"{BASE}..{PLUGIN}") == "1"
    assert log(layout, "%s", f"{BASE}..{PLUGIN}") == PLUGIN_SUBJECT
    changed = git.out("diff", "--name-only", BASE, PLUGIN)
    assert changed.splitlines() == ["vllm/config/cache.py"]
    # The full variant: the engine first, then every patch.
    assert log(layout, "%s", f"{BASE}..{FULL}").splitlines() == FULL_SUBJECTS
    assert git.out("show", f"{FULL}:csrc/tagma/engine.h").startswith("// SPDX")
    assert git.out("symbolic-ref", "--short", "HEAD") == FULL
    assert git.out("status", "--porcelain") == ""
    assert not pr.atomic.staging(layout.pr).exists()
    plugin_md = (layout.pin_build / "PR_plugin.md").read_text()
    full_md = (layout.pin_build / "PR_full.md").read_text()
    assert plugin_md.splitlines()[0] == PLUGIN_SUBJECT
    assert full_md.splitlines()[0] == f"[Core][CI/Build] {pr.FULL_TITLE}"
    assert not (layout.pin_build / "PR_DESCRIPTION.md").exists()


NEUTRAL = "tagma/pr/9.0.0/fast-path"


@pytest.fixture
def neutral(stack: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    """The stack plus a later patch that upstream could take alone."""
    as_identity(monkeypatch, *ALIAS)
    stack.add_patch(
        "fast-path.patch",
        lambda wt: (wt / "vllm/fast.py").write_text(SPDX_PY + "Y = 2\n"),
        "core: answer held slots early",
        trailers="Standalone-PR: fast-path\n",
    )
    as_identity(monkeypatch, *USER)
    return stack


def test_standalone_trailer_gets_its_own_branch(neutral: Project) -> None:
    layout = neutral.layout
    bare = Git(layout.bare)
    # A variant of an earlier build that the series no longer has goes away.
    bare.run("update-ref", "refs/heads/tagma/pr/9.0.0/gone", BASE)
    (layout.pin_build / "PR_gone.md").write_text("old\n")
    assert pr.make_pr_branch(layout) == EXIT_OK
    git = Git(layout.pr)
    assert pr_branches(git) == [
        NEUTRAL,
        FULL,
        PLUGIN,
    ]
    assert not (layout.pin_build / "PR_gone.md").exists()
    # The patch alone on the base, its trailer kept in the stack only.
    assert git.out("diff", "--name-only", BASE, NEUTRAL) == "vllm/fast.py"
    message = log(layout, "%B", f"{BASE}..{NEUTRAL}")
    assert message.splitlines()[0] == "[Core] Answer held slots early"
    assert "Standalone-PR" not in message
    assert message.rstrip().endswith("Signed-off-by: Ada Lovelace <ada@lovelace.dev>")
    # The full PR still carries it, after the other patches.
    assert log(layout, "%s", f"{BASE}..{FULL}").splitlines()[-1] == (
        "[Core] Answer held slots early"
    )
    md = (layout.pin_build / "PR_fast-path.md").read_text()
    assert md.splitlines()[0] == "[Core] Answer held slots early"
    assert "Why this must be a patch." in md
    assert "Forwarded: no" not in md
    assert "On this branch alone: the tests this commit adds" in md


def test_standalone_name_must_be_unique(neutral: Project, monkeypatch) -> None:
    as_identity(monkeypatch, *ALIAS)
    neutral.add_patch(
        "again.patch",
        lambda wt: (wt / "vllm/again.py").write_text(SPDX_PY),
        "core: again",
        trailers="Standalone-PR: fast-path\n",
    )
    as_identity(monkeypatch, *USER)
    before = outputs(neutral.layout)
    with pytest.raises(ToolError, match="Standalone-PR: fast-path") as e:
        pr.make_pr_branch(neutral.layout)
    assert e.value.code == EXIT_USAGE
    assert outputs(neutral.layout) == before


def test_pr_commits_are_the_users_with_ai_trailers(stack: Project) -> None:
    layout = stack.layout
    assert pr.make_pr_branch(layout) == EXIT_OK
    for rev in (f"{BASE}..{PLUGIN}", f"{BASE}..{FULL}"):
        text = log(layout, "%an%n%b%x00", rev)
        commits = [c.strip("\n") for c in text.split("\0") if c.strip()]
        assert len(commits) == (1 if rev.endswith("plugin") else 4)
        for commit in commits:
            lines = commit.splitlines()
            assert lines[0] == "Ada Lovelace"
            assert lines[-2:] == [
                "Co-authored-by: Claude",
                "Signed-off-by: Ada Lovelace <ada@lovelace.dev>",
            ]
    everything = log(layout, "%an %ae %cn %ce%n%B", f"{BASE}..{FULL}")
    for gone in ("maintainers", "Forwarded:", "Origin:", "Last-Update:",
                 "test@example.invalid", "Patch-Filename"):  # fmt: skip
        assert gone not in everything
    # The patch's own explanation stays.
    assert "Why this must be a patch." in everything


def test_pr_ai_tools_come_from_the_environment(
    stack: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(pr.AI_ENV, "Claude, GitHub Copilot")
    assert pr.make_pr_branch(stack.layout) == EXIT_OK
    body = log(stack.layout, "%b", f"{BASE}..{PLUGIN}")
    assert body.splitlines()[-3:] == [
        "Co-authored-by: Claude",
        "Co-authored-by: GitHub Copilot",
        "Signed-off-by: Ada Lovelace <ada@lovelace.dev>",
    ]
    md = (stack.layout.pin_build / "PR_plugin.md").read_text()
    assert "`Co-authored-by: GitHub Copilot`" in md


def test_pr_description_is_filled(
    stack: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = stack.layout
    assert pr.make_pr_branch(layout) == EXIT_OK
    err = capsys.readouterr().err
    assert "warning: no make test record for vLLM 9.0.0" in err
    for name, subjects in (("plugin", [PLUGIN_SUBJECT]), ("full", FULL_SUBJECTS)):
        md = (layout.pin_build / f"PR_{name}.md").read_text()
        for placeholder in ("(paste", "(name, date)", "- [ ]", "FILL IN"):
            assert placeholder not in md
        assert not re.search(r"\{[a-z_]+\}", md)
        headings = [line for line in md.splitlines() if line.startswith("## ")]
        assert headings == [
            "## Purpose",
            "## Duplicate-work check",
            "## Test Plan",
            "## Test Result",
            "## AI assistance",
        ]
        for subject in subjects:
            assert f"- {subject}\n" in md
        for thread in ("#55841", "#42131", "#21141", "#40459", "#35990",
                       "#6102", "#17612"):  # fmt: skip
            assert thread in md
        assert "docs/rfc-tagma-kv-backend.md" in md
        assert "no `make test` record for vLLM 9.0.0 in this checkout" in md
        assert "run `make test VLLM_VERSION=9.0.0`" in md
        assert "AI assistance was used" in md and "`Co-authored-by: Claude`" in md
        assert "Ada Lovelace <ada@lovelace.dev>" in md
    full = (layout.pin_build / "PR_full.md").read_text()
    assert "**GPU pipeline** (`ci/gpu.sh`): no committed results" in full
    assert "**Serving** (`make bench-gpu`): no committed results" in full


def write_results(root: Path, build: Path, started: float) -> None:
    """A make test's junit files, committed GPU and serve results, and the
    conformance table of docs/results.md, for vLLM 9.0.0."""
    junit = build / "results/conformance/9.0.0"
    junit.mkdir(parents=True)
    (junit / "paged.xml").write_text(
        '<testsuites><testsuite tests="10" failures="0" errors="0" '
        'skipped="2" time="3.5"/></testsuites>'
    )
    (junit / "paged.json").write_text(json.dumps({"counts": {"deselected": 3}}))
    stale = junit / "tagma.xml"
    stale.write_text('<testsuite tests="99" failures="9"/>')
    os.utime(stale, (started - 3600, started - 3600))

    gpu = root / "results/gpu-9.0.0"
    gpu.mkdir(parents=True)
    (gpu / "gpu-tests.xml").write_text(
        '<testsuites><testsuite tests="12" failures="0" errors="0" skipped="4"/>'
        "</testsuites>"
    )
    smoke = {"first": [[1, 2], [3]], "second": [[1, 2], [3]]}
    (gpu / "smoke-plain-paged.json").write_text(json.dumps(smoke))
    (gpu / "smoke-plain-tagma.json").write_text(json.dumps(smoke))
    preempt = {**smoke, "preemptions": 3}
    (gpu / "smoke-preempt-paged.json").write_text(json.dumps(preempt))
    (gpu / "smoke-preempt-tagma.json").write_text(
        json.dumps({**preempt, "second": [[1, 2], [4]]})
    )
    (gpu / "write_path.json").write_text(json.dumps({
        "env": {"upstream": "9.0.0"},
        "metrics": {
            "paged|batch=64|layout=contig": {"median": 10.0},
            "tagma|batch=64|layout=contig": {"median": 4.0},
            "paged|batch=64|layout=frag8": {"median": 10.0},
            "tagma_fused|batch=64|layout=frag8": {"median": 5.0},
        },
    }))  # fmt: skip
    serve = root / "results/serve-h200-9.0.0/8b"
    serve.mkdir(parents=True)
    (serve / "meta.json").write_text(
        json.dumps({"stack": ["vllm", "9.0.0", "project", "0" * 40], "order": "ABBA"})
    )
    metric = {"paged": 1.0, "tagma": 1.02, "ratio": 1.02, "ratio_range": [0.98, 1.05]}
    (serve / "summary.json").write_text(json.dumps({
        "8b": {"sharegpt": {"total_token_throughput": metric}, "profile": {}},
    }))  # fmt: skip
    (root / "docs").mkdir()
    (root / "docs/results.md").write_text(
        "| vLLM | backend | collected | passed | failed | skipped | deselected "
        "| failed with tagma's error, as required |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
        "| 8.0.0 | paged | 1 | 1 | 0 | 0 | 0 | |\n"
        "| 9.0.0 | paged | 13 | 8 | 0 | 2 | 3 | |\n"
        "| 9.0.0 | tagma | 13 | 6 | 0 | 2 | 3 | 2 |\n"
    )
    (root / "docs/rfc-tagma-kv-backend.md").write_text("# RFC\n")


def test_pr_description_reads_the_record_and_the_results(
    stack: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = stack.layout
    started = time.time() - 60
    write_results(layout.root, layout.build, started)
    record.write(layout, started, started + 1200)
    assert pr.make_pr_branch(layout) == EXIT_OK
    assert "warning" not in capsys.readouterr().err
    md = (layout.pin_build / "PR_full.md").read_text()
    assert "the last passing run" in md and "20 min" in md
    assert "tagma-vllm commit unknown" in md
    # This run's junit counts, with the harness's deselected; the stale
    # file of an older run is left out.
    assert "| conformance/paged | 10 | 8 | 0 | 0 | 2 | 3 |" in md
    assert "conformance/tagma" not in md
    assert "paged: 13 collected, 8 passed, 0 failed, 2 skipped, 3 deselected" in md
    assert "2 failed with tagma's error naming the feature" in md
    assert "CUDA tests: 8 passed, 0 failed, 0 errors, 4 skipped." in md
    assert "Greedy token ids, 2 prompts run twice" in md and "equal under" in md
    assert "DIFFERENT under paged and tagma with VLLM_BATCH_INVARIANT=1" in md
    assert "(3 and 3 preemptions)" in md
    assert "0.40–0.50x paged's time over 2 configurations" in md
    assert "(0.40x with one range)" in md
    assert "| 8b / sharegpt | 2 | 1.020 (0.98–1.05) |" in md
    assert "profile" not in md
    plugin = (layout.pin_build / "PR_plugin.md").read_text()
    assert "| conformance/paged |" in plugin and "GPU pipeline" not in plugin


def test_pr_labels_results_of_another_release(stack: Project) -> None:
    layout = stack.layout
    write_results(layout.root, layout.build, time.time())
    shutil.move(layout.root / "results/gpu-9.0.0", layout.root / "results/gpu-8.0.0")
    bench = layout.root / "results/gpu-8.0.0/write_path.json"
    bench.write_text(bench.read_text().replace('"9.0.0"', '"8.0.0"'))
    assert pr.make_pr_branch(layout) == EXIT_OK
    md = (layout.pin_build / "PR_full.md").read_text()
    assert "vLLM 8.0.0, not this PR's base 9.0.0: none is committed for 9.0.0" in md


@pytest.mark.parametrize(
    "name,email",
    [
        ALIAS,
        ("Ada Lovelace", "ada@example.com"),
        ("Ada Lovelace", "ada@mail.example.org"),
        ("Ada Lovelace", "ada@host.test"),
        ("Ada Lovelace", "ada@localhost"),
        ("Release maintainers", "release@lovelace.dev"),
    ],
)
def test_pr_refuses_an_alias_identity(
    stack: Project, monkeypatch: pytest.MonkeyPatch, name: str, email: str
) -> None:
    layout = stack.layout
    as_identity(monkeypatch, name, email)
    before = listing(layout.build)
    with pytest.raises(ToolError) as err:
        pr.make_pr_branch(layout)
    assert err.value.code == EXIT_USAGE
    assert "git config --global user.email" in str(err.value)
    assert listing(layout.build) == before
    assert not layout.pr.exists()


def test_pr_alias_is_the_stacks_own_from() -> None:
    bot = pr.Identity("Tagma Bot", "bot@tagma.dev")
    assert "alias" in (pr.alias_reason(bot, {bot}) or "")
    assert pr.alias_reason(pr.Identity(*USER), {bot}) is None


def test_pr_refuses_a_missing_identity(
    stack: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    layout = stack.layout
    for var in ("NAME", "EMAIL"):
        for who in ("AUTHOR", "COMMITTER"):
            monkeypatch.delenv(f"GIT_{who}_{var}", raising=False)
    monkeypatch.delenv("EMAIL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    before = listing(layout.build)
    with pytest.raises(ToolError) as err:
        pr.make_pr_branch(layout)
    assert err.value.code == EXIT_USAGE
    assert "git has none configured" in str(err.value)
    assert listing(layout.build) == before


def test_pr_refuses_a_topic_without_a_tag(
    two_patches: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_identity(monkeypatch, *USER)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    before = listing(two_patches.layout.build)
    with pytest.raises(ToolError) as err:
        pr.make_pr_branch(two_patches.layout)
    assert err.value.code == EXIT_USAGE and "'tagma'" in str(err.value)
    assert listing(two_patches.layout.build) == before


def test_pr_subject_tags() -> None:
    assert pr.pr_subject("[PATCH] worker: tagma write path") == (
        "[Model Runner V2] Tagma write path"
    )
    assert pr.pr_subject("build: vllm._tagma_C, x") == "[CI/Build] vllm._tagma_C, x"
    assert pr.pr_subject("config: --kv-cache-backend") == "[Core] --kv-cache-backend"
    assert pr.pr_subject("[Kernel] already tagged") == "[Kernel] already tagged"
    with pytest.raises(ToolError):
        pr.pr_subject("no topic here")


def break_engine(layout: trees.Layout) -> None:
    (layout.root / "csrc/tagma/engine.h").write_text(
        "// SPDX-License-Identifier: Apache-2.0\n"
        "// SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project\n"
    )


def break_last_patch(layout: trees.Layout) -> None:
    patch = layout.patches / "build-ext.patch"
    patch.write_bytes(patch.read_bytes().replace(b"-    return 1", b"-    return 7"))


@pytest.mark.parametrize(
    "fault,message",
    [
        (break_engine, "csrc/tagma/engine.h: // SPDX-FileCopyrightText"),
        (break_last_patch, "build-ext.patch does not apply"),
    ],
)
def test_pr_failure_keeps_the_previous_outputs(
    stack: Project, fault, message: str
) -> None:
    layout = stack.layout
    assert pr.make_pr_branch(layout) == EXIT_OK
    before = outputs(layout)
    fault(layout)
    with pytest.raises(ToolError) as err:
        pr.make_pr_branch(layout)
    assert err.value.code == EXIT_FAIL
    assert message in str(err.value)
    assert outputs(layout) == before
    assert not pr.atomic.staging(layout.pr).exists()


def add_pin(project: Project, version: str) -> None:
    src, dest = project.patches, project.layout.for_version(version).patches
    shutil.copytree(src, dest)
    upstream.write_pin(dest, make_sdist(project.cache, version, BASE_FILES))


def test_pr_branch_defaults_to_the_newest_pin(
    stack: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 9.0.10 > 9.0.9 as versions, not as strings.
    add_pin(stack, "9.0.10")
    add_pin(stack, "9.0.9")
    layout = stack.layout
    monkeypatch.setattr(
        trees.Layout,
        "find",
        classmethod(lambda cls, version=None: layout.for_version(version or "9.0.0")),
    )
    assert cli.main(["pr-branch"]) == EXIT_OK
    newest = layout.for_version("9.0.10")
    assert Git(newest.pr).out("symbolic-ref", "--short", "HEAD") == (
        "tagma/pr/9.0.10/full"
    )
    assert (newest.pin_build / "PR_full.md").is_file()
    assert not layout.pr.exists()
    assert not layout.for_version("9.0.9").pr.exists()
    # --pin still picks one.
    assert cli.main(["--pin", "9.0.0", "pr-branch"]) == EXIT_OK
    assert (layout.pin_build / "PR_plugin.md").is_file()


def test_pr_dry_run_writes_nothing(
    stack: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    before = listing(stack.layout.build)
    assert pr.make_pr_branch(stack.layout, dry_run=True) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{FULL}: [Core][CI/Build] {pr.FULL_TITLE}" in out
    assert "Ada Lovelace <ada@lovelace.dev>" in out
    assert listing(stack.layout.build) == before


def test_record_counts_this_runs_junit(stack: Project) -> None:
    layout = stack.layout
    started = time.time() - 10
    write_results(layout.root, layout.build, started)
    path = record.write(layout, started, started + 95)
    data = json.loads(path.read_text())
    assert path == layout.pin_build / "test-record.json"
    assert data["pin"] == "9.0.0" and data["outcome"] == "passed"
    assert data["duration_s"] == 95 and data["date"].endswith("+00:00")
    assert data["suites"] == {
        "conformance/paged": {
            "tests": 10, "failed": 0, "errors": 0, "skipped": 2, "passed": 8,
            "time_s": 3.5, "deselected": 3,
        }
    }  # fmt: skip
    assert record.read(layout) == data
    assert record.read(layout.for_version("9.9.9")) is None
    assert pr_body.conformance_rows(
        (layout.root / "docs/results.md").read_text(), "8.0.0"
    ) == [{"vllm": "8.0.0", "backend": "paged", "collected": "1", "passed": "1",
           "failed": "0", "skipped": "0", "deselected": "0",
           "failed with tagma's error, as required": ""}]  # fmt: skip
