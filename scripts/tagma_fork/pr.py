# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The upstream PR branch.

On the pristine base: first one commit adding the engine (csrc/tagma), so
that every later commit builds, then one commit per patch. Each commit gets
the committer's DCO Signed-off-by; the vendor-only header trailers
(Forwarded, Origin, Last-Update) stay in the stack and out of the PR. The
description follows vLLM's contribution policy.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import stack, trees
from .errors import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from .git import Git

TEMPLATE = Path(__file__).with_name("pr_template.md")
VENDOR_TRAILERS = re.compile(r"^(Forwarded|Origin|Last-Update): .*\n", re.M)


def _clean_head(git: Git) -> None:
    message = git.out("log", "-1", "--format=%B") + "\n"
    cleaned = VENDOR_TRAILERS.sub("", message)
    if cleaned != message:
        git.run("commit", "--amend", "--quiet", "--no-verify", "-F", "-", stdin=cleaned)


def make_pr_branch(layout: trees.Layout) -> int:
    pin = layout.pin()
    branch = f"tagma/pr/{pin.version}"
    if Git(layout.root).run("var", "GIT_COMMITTER_IDENT", check=False).returncode:
        print("set git user.name and user.email: the DCO sign-off needs them")
        return EXIT_USAGE
    base = trees.ensure_base(layout, pin)
    names = trees.series_names(layout)
    git = trees.new_tree(layout, layout.pr, base, branch)
    trees.place_engine(layout, layout.pr, link=False)
    git.run("add", "--force", str(trees.ENGINE))
    git.run(
        "commit", "--quiet", "--signoff", "-m",
        "[Core] tagma: add the KV range engine (csrc/tagma)\n\n"
        "The header-only contiguous-range allocator and coordinate map that\n"
        "the tagma KV-cache backend builds on, with their tests and host\n"
        "benchmark. Standard library only; no CUDA, no torch.",
    )  # fmt: skip
    for name in names:
        failure = stack.apply_one(git, layout.patches / name, False, signoff=True)
        if failure:
            print(f"FAILED: {failure.patch} does not apply")
            return EXIT_FAIL
        _clean_head(git)
    log = git.out("log", "--reverse", "--format=- %s", f"{base}..HEAD")
    text = TEMPLATE.read_text().format(version=pin.version, commits=log, branch=branch)
    description = layout.pin_build / "PR_DESCRIPTION.md"
    description.write_text(text)
    print(
        f"PR branch {branch} ready in {layout.pr} ({len(names) + 1} commits).\n"
        f"  description: {description}\n"
        f"  push: git -C {layout.pr} push <your-fork-remote> {branch}"
    )
    return EXIT_OK
