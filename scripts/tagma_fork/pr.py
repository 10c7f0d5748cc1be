# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The upstream PR branch: pristine base, one signed-off commit per patch,
one commit adding the engine, and a description that follows vLLM's
contribution policy."""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import stack, trees, upstream

TEMPLATE = Path(__file__).with_name("pr_template.md")


def make_pr_branch(layout: trees.Layout, dry_run: bool = False) -> int:
    pin = upstream.read_pin(layout.root)
    branch = f"tagma/pr/{pin.version}"
    ident = subprocess.run(
        ["git", "var", "GIT_COMMITTER_IDENT"], capture_output=True, text=True
    )
    if ident.returncode != 0:
        print("set git user.name and user.email: the DCO sign-off needs them")
        return 2
    if dry_run:
        print(f"would create {branch} in {layout.pr}")
        return 0
    base = trees.ensure_base(layout, pin)
    names = trees.series_names(layout)
    git = trees.new_tree(layout, layout.pr, base, branch)
    failure = stack.import_patches(
        git, layout.patches, names, signoff=True, name_trailer=False
    )
    if failure:
        print(f"FAILED: {failure.patch} does not apply")
        return 1
    trees.place_engine(layout, layout.pr, link=False)
    git.run("add", "--force", str(trees.ENGINE))
    git.run(
        "commit", "--quiet", "--signoff", "-m",
        "tagma: add the engine (csrc/tagma)\n\n"
        "The header-only range allocator and coordinate map, their tests and\n"
        "host benchmark. Kept as one copy in the tagma-vllm project.",
    )  # fmt: skip
    log = git.out("log", "--reverse", "--format=- %s", f"{base}..HEAD")
    text = TEMPLATE.read_text().format(version=pin.version, commits=log, branch=branch)
    description = layout.build / "PR_DESCRIPTION.md"
    description.write_text(text)
    print(
        f"PR branch {branch} ready in {layout.pr} ({len(names) + 1} commits).\n"
        f"  description: {description}\n"
        f"  push: git -C {layout.pr} push <your-fork-remote> {branch}"
    )
    return 0
