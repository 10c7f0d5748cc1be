# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""tagma-fork: the patch-stack tool of tagma-vllm.

Every verb works on one pin, `--pin VERSION` (default: the version named by
patches/default); its stack is patches/vllm-<VERSION>/.

Verbs (each also a Makefile target):
  fetch       download the pin's sdist (and wheel) into the cache, checked
  apply       pristine sdist + series + engine -> build/vllm-<v>/tree
  worktree    build/vllm-<v>/worktree: base + one commit per patch, for editing
  export      worktree -> patches/vllm-<v>/ (canonical; --dry-run reports drift)
  check       lint, apply on the pinned sdist, re-export, compare (--all: every pin)
  rebase      port the pin's stack to another release (--to, --continue, --abort)
  pr-branch   build/vllm-<v>/pr, on the newest pin unless --pin is given:
              tagma/pr/<v>/plugin (base + the first patch),
              tagma/pr/<v>/<name> (base + a patch with the trailer
              Standalone-PR: <name>) and
              tagma/pr/<v>/full (base + engine + every patch), authored
              and signed off by your git identity, vLLM title tags and
              AI trailer (TAGMA_AI_COAUTHOR, default Claude); filled
              descriptions PR_<variant>.md (--dry-run: plan only)
  build       apply, then install the patched tree into build/vllm-<v>/venv
  prereqs     check (--install: install) what build and test need

Exit codes: 0 ok, 1 failed (check, drift, a refused write), 2 usage,
3 rebase stopped at a conflict, 130 interrupted (the stack left consistent).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from . import atomic, ops, prereqs, rebase, stack, trees, upstream
from .errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, ToolError
from .git import GitError
from .upstream import FetchError


def cmd_fetch(layout: trees.Layout, args: argparse.Namespace) -> int:
    pin = layout.pin()
    print(upstream.fetch(pin.sdist, pin.sdist_sha256, pin.version))
    if args.wheel:
        print(upstream.fetch(pin.wheel, pin.wheel_sha256, pin.version))
    return EXIT_OK


def cmd_apply(layout: trees.Layout, args: argparse.Namespace) -> int:
    tree = ops.apply(layout)
    print(f"applied {len(trees.series_names(layout))} patches + engine: {tree}")
    return EXIT_OK


def cmd_worktree(layout: trees.Layout, args: argparse.Namespace) -> int:
    wt = ops.worktree(layout, force=args.force)
    print(
        f"worktree ready: {wt} (branch tagma/patches/{layout.version})\n"
        "  edit, then `git commit --fixup=<patch commit>` and "
        f"`git rebase -i --autosquash {trees.base_ref(layout.version)}`,\n"
        "  or add a commit for a new patch; then `make export`."
    )
    return EXIT_OK


def cmd_export(layout: trees.Layout, args: argparse.Namespace) -> int:
    changed = ops.export(layout, dry_run=args.dry_run)
    if args.dry_run:
        if changed:
            print("drift: " + ", ".join(changed))
            return EXIT_FAIL
        print("no drift")
        return EXIT_OK
    print("exported: " + (", ".join(changed) if changed else "nothing changed"))
    return EXIT_OK


def cmd_check(layout: trees.Layout, args: argparse.Namespace) -> int:
    versions = upstream.versions(layout.root) if args.all else [layout.version]
    failed = []
    for version in versions:
        one = layout.for_version(version)
        try:
            n = ops.check(one)
        except (ToolError, stack.StackError, GitError, FetchError, ValueError) as e:
            print(f"check FAILED for vllm {version}:\n{e}")
            failed.append(version)
            continue
        print(f"check ok: vllm {version}: {n} patches lint, apply, no drift")
    return EXIT_FAIL if failed else EXIT_OK


def cmd_rebase(layout: trees.Layout, args: argparse.Namespace) -> int:
    if args.abort:
        return rebase.abort(layout)
    if args.cont:
        return rebase.resume(layout)
    if not args.to:
        raise ToolError("rebase needs --to VERSION, --continue or --abort", EXIT_USAGE)
    pin = upstream.pin_for(upstream.check_version(args.to))
    if args.dry_run:
        rows = rebase.dry_run(layout, pin)
        width = max(len(r[0]) for r in rows) if rows else 10
        print(f"{'patch':<{width}}  status onto vllm {pin.version}")
        for name, status, files in rows:
            print(
                f"{name:<{width}}  {status}"
                + (f": {', '.join(files)}" if files else "")
            )
        conflicts = any(r[1] == "conflicts" for r in rows)
        return rebase.EXIT_CONFLICT if conflicts else EXIT_OK
    return rebase.start(layout, pin)


def cmd_pr_branch(layout: trees.Layout, args: argparse.Namespace) -> int:
    from . import pr

    # A PR goes to upstream's newest release: the highest pin, not the
    # default, unless --pin names one.
    if args.pin is None:
        layout = pr.newest(layout)
    return pr.make_pr_branch(layout, dry_run=args.dry_run)


def cmd_build(layout: trees.Layout, args: argparse.Namespace) -> int:
    from .build import build_fork

    return build_fork(layout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tagma-fork",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--pin",
        metavar="VERSION",
        help="the pinned vLLM release (default: patches/default)",
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    Verb = Callable[[trees.Layout, argparse.Namespace], int]

    def verb(name: str, func: Verb, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.set_defaults(func=func)
        return p

    verb("fetch", cmd_fetch, "fetch the pinned sdist").add_argument(
        "--wheel", action="store_true", help="also the x86_64 wheel"
    )
    verb("apply", cmd_apply, "the pin's build tree = sdist + series + engine")
    verb("worktree", cmd_worktree, "the pin's worktree for editing").add_argument(
        "--force", action="store_true", help="discard unexported work"
    )
    verb("export", cmd_export, "worktree -> the pin's stack folder").add_argument(
        "--dry-run", action="store_true", help="report drift, write nothing"
    )
    verb("check", cmd_check, "lint, apply, re-export and compare").add_argument(
        "--all", action="store_true", help="every pin in patches/"
    )
    p = verb("rebase", cmd_rebase, "port the stack to another vLLM release")
    p.add_argument("--to", metavar="VERSION")
    p.add_argument("--continue", dest="cont", action="store_true")
    p.add_argument("--abort", action="store_true")
    p.add_argument(
        "--dry-run", action="store_true", help="report per patch, write nothing"
    )
    verb(
        "pr-branch", cmd_pr_branch, "the upstream PR branches (default: newest pin)"
    ).add_argument("--dry-run", action="store_true", help="check and plan only")
    verb("build", cmd_build, "apply + install the patched vLLM into the pin's venv")
    p = sub.add_parser("prereqs", help="check what build and test need")
    p.add_argument(
        "--install", action="store_true", help="install what is missing (as root)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "prereqs":
            return prereqs.main(install=args.install)
        layout = trees.Layout.find(
            upstream.check_version(args.pin) if args.pin else None
        )
        # A verb killed while it switched a stack folder left markers behind:
        # settle them first, so every verb sees the old stack or the new one.
        for line in atomic.recover(layout.stacks):
            print(f"recovered: {line}")
        return args.func(layout, args)
    except KeyboardInterrupt:
        print("interrupted; the stack folders are consistent", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except (stack.StackError, FetchError, GitError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
