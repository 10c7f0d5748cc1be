# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""tagma-fork: the patch-stack tool of tagma-vllm.

Verbs (each also a Makefile target):
  fetch       download the pinned sdist (and wheel) into the cache, checked
  apply       pristine sdist + series + engine -> build/tree
  worktree    build/worktree: pristine base + one commit per patch, for editing
  export      build/worktree -> patches/ (canonical; --dry-run reports drift)
  check       lint the series, apply it on the pinned sdist, re-export, compare
  rebase      move the stack to another release (--to, --continue, --abort)
  pr-branch   build/pr: upstream base + one signed-off commit per patch + engine
  build       apply, then install the patched tree into build/venv

Exit codes: 0 ok, 1 check failed or drift, 2 usage, 3 stopped at a conflict.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from . import rebase, stack, trees, upstream
from .git import Git, GitError
from .upstream import FetchError

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3


def cmd_fetch(layout: trees.Layout, args: argparse.Namespace) -> int:
    pin = upstream.read_pin(layout.root)
    print(upstream.fetch(pin.sdist, pin.sdist_sha256, pin.version))
    if args.wheel:
        print(upstream.fetch(pin.wheel, pin.wheel_sha256, pin.version))
    return EXIT_OK


def _import_onto_base(
    layout: trees.Layout, path: Path, branch: str | None, link_engine: bool
) -> tuple[Git, stack.ApplyFailure | None]:
    pin = upstream.read_pin(layout.root)
    base = trees.ensure_base(layout, pin)
    names = trees.series_names(layout)
    git = trees.new_tree(layout, path, base, branch)
    failure = stack.import_patches(git, layout.patches, names)
    trees.place_engine(layout, path, link=link_engine)
    return git, failure


def _report_failure(failure: stack.ApplyFailure) -> int:
    print(f"FAILED: patch {failure.patch} does not apply.")
    for f in failure.files:
        print(f"  touches {f}")
    print(failure.output.strip())
    return EXIT_FAIL


def cmd_apply(layout: trees.Layout, args: argparse.Namespace) -> int:
    if args.dry_run:
        print(f"would rebuild {layout.tree} from the pinned sdist and patches/")
        return EXIT_OK
    _, failure = _import_onto_base(layout, layout.tree, None, link_engine=False)
    if failure:
        return _report_failure(failure)
    n = len(trees.series_names(layout))
    print(f"applied {n} patches + engine: {layout.tree}")
    return EXIT_OK


def cmd_worktree(layout: trees.Layout, args: argparse.Namespace) -> int:
    wt = layout.worktree
    if wt.exists() and not args.force:
        git = Git(wt)
        pin = upstream.read_pin(layout.root)
        dirty = git.out("status", "--porcelain")
        drift = stack.export(git, trees.base_ref(pin.version), layout.patches, True)
        if dirty or drift:
            what = "uncommitted changes" if dirty else "unexported: " + ", ".join(drift)
            print(
                f"{wt} has work that is not in patches/ ({what}).\n"
                "Export it (make export) or pass --force (FORCE=1) to discard it."
            )
            return EXIT_FAIL
    if args.dry_run:
        print(f"would recreate {wt} on branch tagma/patches")
        return EXIT_OK
    _, failure = _import_onto_base(layout, wt, "tagma/patches", link_engine=True)
    if failure:
        return _report_failure(failure)
    print(
        f"worktree ready: {wt} (branch tagma/patches)\n"
        "  edit, then `git commit --fixup=<patch commit>` and "
        "`git rebase -i --autosquash upstream/v<ver>`,\n"
        "  or add a commit for a new patch; then `make export`."
    )
    return EXIT_OK


def cmd_export(layout: trees.Layout, args: argparse.Namespace) -> int:
    if not layout.worktree.exists():
        print(f"no worktree at {layout.worktree}; run `make worktree` first")
        return EXIT_USAGE
    pin = upstream.read_pin(layout.root)
    git = Git(layout.worktree)
    if git.out("status", "--porcelain", "--untracked-files=no"):
        print("the worktree has uncommitted changes; commit them first")
        return EXIT_FAIL
    changed = stack.export(
        git, trees.base_ref(pin.version), layout.patches, args.dry_run
    )
    if args.dry_run:
        if changed:
            print("drift: " + ", ".join(changed))
            return EXIT_FAIL
        print("no drift")
        return EXIT_OK
    print("exported: " + (", ".join(changed) if changed else "nothing changed"))
    return EXIT_OK


def cmd_check(layout: trees.Layout, args: argparse.Namespace) -> int:
    problems = stack.lint(layout.patches)
    for p in problems:
        print(f"lint: {p}")
    if problems:
        return EXIT_FAIL
    pin = upstream.read_pin(layout.root)
    base = trees.ensure_base(layout, pin)
    names = trees.series_names(layout)
    with tempfile.TemporaryDirectory(dir=layout.build) as tmp:
        path = Path(tmp) / "check"
        git = trees.new_tree(layout, path, base, None)
        failure = stack.import_patches(git, layout.patches, names)
        if failure:
            trees.remove_tree(layout, path)
            return _report_failure(failure)
        out = Path(tmp) / "out"
        out.mkdir()
        shutil.copy(layout.patches / "series", out / "series")
        for name in names:
            shutil.copy(layout.patches / name, out / name)
        drift = stack.export(git, trees.base_ref(pin.version), out)
        trees.remove_tree(layout, path)
    if drift:
        print(
            "drift: re-exporting the stack does not give the committed bytes: "
            + ", ".join(drift)
            + "\n  patches are written by `make export`; do not edit them by hand."
        )
        return EXIT_FAIL
    print(f"check ok: {len(names)} patches lint, apply on vllm {pin.version}, no drift")
    return EXIT_OK


def cmd_rebase(layout: trees.Layout, args: argparse.Namespace) -> int:
    if args.abort:
        return rebase.abort(layout)
    if args.cont:
        return rebase.resume(layout)
    if not args.to:
        print("rebase needs --to VERSION, --continue or --abort")
        return EXIT_USAGE
    pin = upstream.pin_for(args.to)
    if args.dry_run:
        rows = rebase.dry_run(layout, pin)
        width = max(len(r[0]) for r in rows) if rows else 10
        print(f"{'patch':<{width}}  status onto vllm {pin.version}")
        for name, status, files in rows:
            print(
                f"{name:<{width}}  {status}"
                + (f": {', '.join(files)}" if files else "")
            )
        return EXIT_CONFLICT if any(r[1] == "conflicts" for r in rows) else EXIT_OK
    return rebase.start(layout, pin)


def cmd_pr_branch(layout: trees.Layout, args: argparse.Namespace) -> int:
    from .pr import make_pr_branch

    return make_pr_branch(layout, dry_run=args.dry_run)


def cmd_build(layout: trees.Layout, args: argparse.Namespace) -> int:
    from .build import build_fork

    if args.dry_run:
        print(f"would apply the stack and install it into {layout.build / 'venv'}")
        return EXIT_OK
    return build_fork(layout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tagma-fork",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="verb", required=True)

    def verb(name: str, func, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.set_defaults(func=func)
        p.add_argument("--dry-run", action="store_true", help="report, write nothing")
        return p

    verb("fetch", cmd_fetch, "fetch the pinned sdist").add_argument(
        "--wheel", action="store_true", help="also the x86_64 wheel"
    )
    verb("apply", cmd_apply, "build/tree = pinned sdist + series + engine")
    verb("worktree", cmd_worktree, "build/worktree for editing").add_argument(
        "--force", action="store_true", help="discard unexported work"
    )
    verb("export", cmd_export, "worktree -> patches/")
    verb("check", cmd_check, "lint, apply, re-export and compare")
    p = verb("rebase", cmd_rebase, "move the stack to another vLLM release")
    p.add_argument("--to", metavar="VERSION")
    p.add_argument("--continue", dest="cont", action="store_true")
    p.add_argument("--abort", action="store_true")
    verb("pr-branch", cmd_pr_branch, "upstream PR branch in build/pr")
    verb("build", cmd_build, "apply + install the patched vLLM into build/venv")

    args = parser.parse_args(argv)
    layout = trees.Layout.find()
    try:
        return args.func(layout, args)
    except (stack.StackError, FetchError, GitError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
