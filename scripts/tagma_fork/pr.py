# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The upstream PR branches: two variants of one pin's stack.

Both live in the pin's PR tree, build/vllm-<v>/pr (a worktree of
build/upstream.git), on the pristine base:

    upstream/v<v> ── P1                             tagma/pr/<v>/plugin
                 ├── Pk                             tagma/pr/<v>/<name>
                 └── engine ── P1 ── P2 ── ... Pn    tagma/pr/<v>/full

`plugin` is the first patch alone, the backend-neutral plug-in point that
upstream can take first; a later patch whose message carries the trailer
`Standalone-PR: <name>` (one that needs no earlier patch) is proposed alone
too, as `<name>`; `full` adds the engine (csrc/tagma) first, so that every
later commit builds, then every patch. The tree has `full` checked out.

Every commit is authored and signed off (DCO) by the user's own git
identity, never by the stack's alias, and carries vLLM's AI-attribution
trailer (`Co-authored-by: <tool>`, docs/contributing/README.md in vLLM);
its subject gets vLLM's bracket tag from the patch's topic. The vendor-only
trailers (Forwarded, Origin, Last-Update) stay in the stack. Each variant
gets a filled description, build/vllm-<v>/PR_<variant>.md (pr_body.py).

Nothing is switched until both variants are built and checked: the commits
are made in a staging worktree (build/vllm-<v>/.pr.new) and only then do
the branches, the PR tree and the descriptions move, with signals held; a
failure before that leaves the previous ones as they were, a failure during
it removes them all.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from . import atomic, pr_body, stack, trees, upstream
from .errors import EXIT_OK, EXIT_USAGE, ToolError
from .git import Git

# vLLM's AI-assistance policy asks for a commit trailer naming the tool
# ("Co-authored-by: Claude"); this variable names it (comma-separated for
# several tools).
AI_ENV = "TAGMA_AI_COAUTHOR"
AI_DEFAULT = "Claude"

# The trailer that proposes a later patch alone, naming its branch.
STANDALONE_TRAILER = "Standalone-PR"
_STANDALONE_RE = re.compile(
    rf"(?mi)^{STANDALONE_TRAILER}:[ \t]*([a-z0-9][a-z0-9-]*)[ \t]*$"
)

# vLLM's PR title tags (docs/contributing/README.md, "PR Title and
# Classification"), by the topic that starts a patch subject (`core: ...`).
# A topic with no tag stops pr-branch: add it here rather than guess.
TITLE_TAGS = {
    "attention": "[Attention]",
    "build": "[CI/Build]",
    "ci": "[CI/Build]",
    "cmake": "[CI/Build]",
    "config": "[Core]",
    "core": "[Core]",
    "doc": "[Doc]",
    "docs": "[Doc]",
    "frontend": "[Frontend]",
    "kernel": "[Kernel]",
    "kv-connector": "[KV Connector]",
    "kv-offload": "[KV Offload]",
    "misc": "[Misc]",
    "perf": "[Perf]",
    "sched": "[Core]",
    "scheduler": "[Core]",
    "test": "[Test]",
    "tests": "[Test]",
    "v1": "[V1]",
    # The stack's worker patches change model runner V2 (vllm/v1/worker/gpu).
    "worker": "[Model Runner V2]",
}
ENGINE_SUBJECT = "core: add the tagma KV range engine (csrc/tagma)"
ENGINE_BODY = (
    "The header-only free-run index (FreeRuns) that the tagma KV-cache\n"
    "backend places blocks with, its Python binding, tests and host\n"
    "benchmark. Standard library only; no CUDA, no torch."
)
FULL_TITLE = "Tagma KV-cache backend: KV blocks as contiguous ranges"

# Trailers that stay in the stack: the vendor's DEP-3 fields, the stack's
# own sign-off (the alias; the user's is added), the export's file name.
DROPPED_TRAILERS = {
    "forwarded",
    "origin",
    "last-update",
    "signed-off-by",
    "co-authored-by",
    stack.FILENAME_TRAILER.lower(),
    STANDALONE_TRAILER.lower(),
}

# Reserved or unroutable mail domains (RFC 2606, RFC 6761): never a person.
_RESERVED_TLDS = {"invalid", "example", "test", "localhost", "local", "(none)"}
_RESERVED_DOMAINS = {"example.com", "example.org", "example.net", "localhost"}
_IDENT_RE = re.compile(r"^(?P<name>.*?)\s*<(?P<email>[^<>]*)>")
_TOPIC_RE = re.compile(r"^(?P<topic>[A-Za-z0-9_./-]+):\s+(?P<what>\S.*)$")

# vLLM's SPDX header. Files the branch adds must carry vLLM's copyright, and
# sources must carry the header at the top (vLLM's pre-commit checks it).
SPDX_LICENSE = "SPDX-License-Identifier: Apache-2.0"
SPDX_VLLM = "SPDX-FileCopyrightText: Copyright contributors to the vLLM project"
_SPDX_COPYRIGHT_RE = re.compile(
    r"^\s*(?:#|//|/?\*)\s*SPDX-FileCopyrightText:.*$", re.MULTILINE
)
_HEADER_SUFFIXES = {".py", ".pyi", ".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh"}
_HEADER_NAMES = {"CMakeLists.txt"}


@dataclass(slots=True, frozen=True)
class Identity:
    """A git identity: the PR's author and signer."""

    name: str
    email: str

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"

    def env(self) -> dict[str, str]:
        """The environment that makes git author and commit as this identity."""
        return {
            "GIT_AUTHOR_NAME": self.name,
            "GIT_AUTHOR_EMAIL": self.email,
            "GIT_COMMITTER_NAME": self.name,
            "GIT_COMMITTER_EMAIL": self.email,
        }


@dataclass(slots=True)
class Variant:
    """One PR branch: which commits it holds and its title."""

    # "plugin", "full" or a patch's Standalone-PR name.
    name: str
    # tagma/pr/<v>/<name>.
    branch: str
    # Whether the engine commit comes first.
    engine: bool
    # Patch file names, in series order.
    patches: list[str]
    # The PR title (vLLM tags + text).
    title: str
    # Commit subjects as the branch will have them, in order.
    subjects: list[str]
    # The commit ids, once built.
    commit: str = ""


def parse_identity(text: str) -> Identity | None:
    match = _IDENT_RE.match(text.strip())
    if not match:
        return None
    return Identity(match.group("name").strip(), match.group("email").strip())


def stack_authors(layout: trees.Layout, names: list[str]) -> set[Identity]:
    """The From: identities of the stack's patches (the maintainers' alias)."""
    found = set()
    for name in names:
        head, _ = stack.split_header((layout.patches / name).read_bytes())
        lines = head.decode("utf-8", "replace").split("\n")
        ident = parse_identity(stack.mail_headers(lines)[0].get("from", ""))
        if ident:
            found.add(ident)
    return found


def alias_reason(ident: Identity, aliases: set[Identity]) -> str | None:
    """Why `ident` is not a person's own identity, or None if it may be."""
    if not ident.name:
        return "it has no name"
    if not ident.email:
        return "it has no email"
    local, _, domain = ident.email.rpartition("@")
    domain = domain.lower().rstrip(".")
    if not local or not domain:
        return f"{ident.email!r} is not an email address"
    tld = domain.rsplit(".", 1)[-1]
    reserved = tld in _RESERVED_TLDS or any(
        domain == d or domain.endswith("." + d) for d in _RESERVED_DOMAINS
    )
    if reserved or "." not in domain:
        return f"{domain!r} is a reserved or unroutable mail domain"
    if "maintainers" in ident.name.lower():
        return "its name is a group's ('maintainers'), not a person's"
    for alias in aliases:
        if ident.email.lower() == alias.email.lower() or ident.name == alias.name:
            return f"it is the patch stack's own alias ({alias})"
    return None


def user_identity(root: Path, aliases: set[Identity]) -> Identity:
    """The user's git identity as seen from `root`, or a usage error.

    user.useConfigOnly: an identity git would guess from the host name is
    not one the user chose to sign a DCO with.
    """
    proc = Git(root).run(
        "-c", "user.useConfigOnly=true", "var", "GIT_AUTHOR_IDENT", check=False
    )
    ident = parse_identity(proc.stdout) if proc.returncode == 0 else None
    reason = alias_reason(ident, aliases) if ident else "git has none configured"
    if ident is None or reason:
        shown = f"'{ident}' " if ident else ""
        raise ToolError(
            f"your git identity {shown}cannot author the PR: {reason}.\n"
            "Every commit is authored and signed off (DCO) by you, not by the "
            "patch stack's alias. Set your own:\n"
            '  git config --global user.name "Your Name"\n'
            "  git config --global user.email you@your-domain\n"
            "(or GIT_AUTHOR_NAME and GIT_AUTHOR_EMAIL), then run make pr-branch "
            "again.",
            EXIT_USAGE,
        )
    return ident


def ai_coauthors() -> list[str]:
    """The AI tools the commits credit, from TAGMA_AI_COAUTHOR."""
    raw = os.environ.get(AI_ENV, "").strip() or AI_DEFAULT
    tools = [t.strip() for t in raw.split(",") if t.strip()]
    if any("\n" in t or ":" in t.split("<")[0] for t in tools):
        raise ToolError(f"{AI_ENV}={raw!r}: give tool names, e.g. Claude", EXIT_USAGE)
    return tools


def pr_subject(subject: str) -> str:
    """`topic: what` -> `[Tag] What`, vLLM's title form."""
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject.strip())
    if subject.startswith("["):
        return subject
    match = _TOPIC_RE.match(subject)
    if not match:
        raise ToolError(
            f"patch subject {subject!r} has no `topic:`; vLLM's title tag is "
            "derived from it",
            EXIT_USAGE,
        )
    topic, what = match.group("topic").lower(), match.group("what")
    tag = TITLE_TAGS.get(topic)
    if tag is None:
        raise ToolError(
            f"patch subject {subject!r}: topic {topic!r} has no vLLM title tag; "
            "add it to TITLE_TAGS in scripts/tagma_fork/pr.py",
            EXIT_USAGE,
        )
    first = what.split(" ", 1)[0]
    # Only a plain lower-case word: `vllm._tagma_C` or `--flag` stay as written.
    if re.fullmatch(r"[a-z]+", first):
        what = what[0].upper() + what[1:]
    return f"{tag} {what}"


def title_tags(subject: str) -> str:
    """The leading `[Tag][Tag]` of a tagged subject."""
    match = re.match(r"^((?:\[[^\]]+\])+)", subject)
    return match.group(1) if match else ""


def patch_subject(layout: trees.Layout, name: str) -> str:
    head, _ = stack.split_header((layout.patches / name).read_bytes())
    lines = head.decode("utf-8", "replace").split("\n")
    return stack.mail_headers(lines)[0].get("subject", "")


def standalone_name(layout: trees.Layout, name: str) -> str | None:
    """The branch name a patch's `Standalone-PR:` trailer gives, if any."""
    head, _ = stack.split_header((layout.patches / name).read_bytes())
    match = _STANDALONE_RE.search(head.decode("utf-8", "replace"))
    return match.group(1) if match else None


def plan(layout: trees.Layout, names: list[str]) -> list[Variant]:
    """Every variant, titles and subjects checked, before anything is built."""
    version = layout.version
    subjects = [pr_subject(patch_subject(layout, n)) for n in names]
    engine = pr_subject(ENGINE_SUBJECT)
    full_subjects = [engine, *subjects]
    tags = "".join(dict.fromkeys(title_tags(s) for s in full_subjects))
    alone = [("plugin", 0)]
    for i, name in enumerate(names[1:], 1):
        if (branch := standalone_name(layout, name)) is not None:
            if branch in {b for b, _ in alone} | {"full"}:
                raise ToolError(
                    f"{name}: {STANDALONE_TRAILER}: {branch} names a branch "
                    "another variant has",
                    EXIT_USAGE,
                )
            alone.append((branch, i))
    return [
        *(
            Variant(
                branch,
                f"tagma/pr/{version}/{branch}",
                False,
                names[i : i + 1],
                subjects[i],
                subjects[i : i + 1],
            )
            for branch, i in alone
        ),
        Variant(
            "full",
            f"tagma/pr/{version}/full",
            True,
            names,
            f"{tags} {FULL_TITLE}",
            full_subjects,
        ),
    ]


def pr_message(message: str, ident: Identity, coauthors: list[str]) -> str:
    """A stack commit's message as the PR has it: the vLLM-tagged subject,
    the body, the trailers that are not the stack's own, then vLLM's AI
    attribution and the user's sign-off."""
    subject, body, block = stack.split_message(message)
    kept = [
        line
        for line in block
        if not (
            (match := re.match(r"([A-Za-z0-9-]+)\s*:", line))
            and match.group(1).lower() in DROPPED_TRAILERS
        )
    ]
    trailers = [
        *kept,
        *(f"Co-authored-by: {tool}" for tool in coauthors),
        f"Signed-off-by: {ident}",
    ]
    parts = [pr_subject(subject), body, "\n".join(trailers)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _commit_engine(layout: trees.Layout, git: Git, message: str) -> None:
    trees.place_engine(layout, git.cwd, link=False)
    git.run("add", "--force", str(trees.ENGINE))
    git.run("commit", "--quiet", "--no-verify", "-F", "-", stdin=message)


def _build(
    layout: trees.Layout,
    git: Git,
    base: str,
    variant: Variant,
    ident: Identity,
    coauthors: list[str],
) -> str:
    """Make `variant`'s commits on `base` in the staging tree; its tip."""
    git.run("checkout", "--quiet", "--force", "--detach", base)
    git.run("clean", "--quiet", "-fdx")
    if variant.engine:
        engine = f"{ENGINE_SUBJECT}\n\n{ENGINE_BODY}\n"
        _commit_engine(layout, git, pr_message(engine, ident, coauthors))
    for name in variant.patches:
        failure = stack.apply_one(git, layout.patches / name, False)
        if failure:
            raise ToolError(
                f"{failure.patch} does not apply onto vllm {layout.version} "
                f"({', '.join(failure.files) or 'see git am'}); "
                f"run make check VLLM_VERSION={layout.version}:\n{failure.output}"
            )
        message = git.out("log", "-1", "--format=%B")
        git.run(
            "commit", "--amend", "--quiet", "--no-verify", "--reset-author",
            "-F", "-", stdin=pr_message(message, ident, coauthors),
        )  # fmt: skip
    return git.out("rev-parse", "HEAD")


def spdx_problems(git: Git, base: str, tip: str) -> list[str]:
    """Files `tip` adds over `base` that lack vLLM's SPDX header or carry
    another copyright."""
    added = git.out(
        "diff", "--name-only", "--no-renames", "--diff-filter=A", base, tip
    ).splitlines()
    problems = []
    for path in added:
        text = git.run_bytes("show", f"{tip}:{path}").stdout.decode("utf-8", "replace")
        foreign = [
            line.strip()
            for line in _SPDX_COPYRIGHT_RE.findall(text)
            if SPDX_VLLM not in line
        ]
        problems += [f"{path}: {line}" for line in foreign]
        name = Path(path)
        needs_header = name.suffix in _HEADER_SUFFIXES or name.name in _HEADER_NAMES
        head = "\n".join(text.splitlines()[:5])
        if (
            needs_header
            and text.strip()
            and not foreign
            and not (SPDX_LICENSE in head and SPDX_VLLM in head)
        ):
            problems.append(f"{path}: no vLLM SPDX header in its first lines")
    return problems


def newest(layout: trees.Layout) -> trees.Layout:
    """The layout of the highest pinned version (compared as versions)."""
    versions = upstream.versions(layout.root)
    if not versions:
        raise ToolError(f"no pins in {layout.stacks}", EXIT_USAGE)
    return layout.for_version(versions[-1])


def _drop_branches(layout: trees.Layout) -> None:
    """Delete every tagma/pr/<v>/* branch and PR_*.md of the pin (variants
    come and go with the series' trailers)."""
    bare = Git(layout.bare)
    prefix = f"refs/heads/tagma/pr/{layout.version}/"
    for ref in bare.out("for-each-ref", "--format=%(refname)", prefix).split():
        bare.run("update-ref", "-d", ref, check=False)
    for path in layout.pin_build.glob("PR_*.md"):
        path.unlink(missing_ok=True)


def _remove_outputs(layout: trees.Layout) -> None:
    """Drop the PR tree, its branches and descriptions (a failed switch)."""
    trees.remove_tree(layout, layout.pr)
    _drop_branches(layout)


def _switch(
    layout: trees.Layout, stage: Path, variants: list[Variant], texts: dict[str, str]
) -> None:
    """Replace the PR tree, branches and descriptions with the staged ones."""
    bare = Git(layout.bare)
    with atomic.signals_held():
        try:
            trees.remove_tree(layout, layout.pr)
            # The single branch of earlier versions, tagma/pr/<v>, would be a
            # file where refs/heads/tagma/pr/<v>/ must be a folder.
            bare.run(
                "update-ref", "-d", f"refs/heads/tagma/pr/{layout.version}",
                check=False,
            )  # fmt: skip
            _drop_branches(layout)
            for v in variants:
                bare.run("update-ref", f"refs/heads/{v.branch}", v.commit)
            bare.run("worktree", "move", str(stage), str(layout.pr))
            Git(layout.pr).run("checkout", "--quiet", variants[-1].branch)
            for name, text in texts.items():
                atomic.write_file(layout.pin_build / f"PR_{name}.md", text.encode())
        except BaseException:
            _remove_outputs(layout)
            raise


def make_pr_branch(layout: trees.Layout, dry_run: bool = False) -> int:
    """Build both PR variants of `layout`'s pin (see the module docstring).

    Raises:
        ToolError: EXIT_USAGE for a missing or alias identity, an untagged
            topic or an empty series, before anything is written; EXIT_FAIL
            for a patch that does not apply or a foreign SPDX copyright,
            with the previous outputs left as they were.
    """
    pin = layout.pin()
    names = trees.series_names(layout)
    if not names:
        raise ToolError(f"the series of vllm {pin.version} is empty", EXIT_USAGE)
    ident = user_identity(layout.root, stack_authors(layout, names))
    coauthors = ai_coauthors()
    variants = plan(layout, names)
    sources = pr_body.Sources.gather(layout)
    for warning in sources.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if dry_run:
        print(
            f"vllm {pin.version}: author and Signed-off-by {ident}; "
            f"Co-authored-by: {', '.join(coauthors)}"
        )
        for v in variants:
            print(f"{v.branch}: {v.title}")
            for subject in v.subjects:
                print(f"  {subject}")
        names_md = ",".join(v.name for v in variants)
        print(f"would write {layout.pr}, {layout.pin_build}/PR_{{{names_md}}}.md")
        return EXIT_OK

    base = trees.ensure_base(layout, pin)
    stage = atomic.staging(layout.pr)
    git = Git(trees.new_tree(layout, stage, base, None).cwd, env=ident.env())
    try:
        for v in variants:
            v.commit = _build(layout, git, base, v, ident, coauthors)
        problems = [p for v in variants for p in spdx_problems(git, base, v.commit)]
        if problems:
            raise ToolError(
                "files the PR adds must carry vLLM's SPDX header "
                f"(# {SPDX_LICENSE} / # {SPDX_VLLM}; // in C++):\n  "
                + "\n  ".join(dict.fromkeys(problems))
            )
        texts = {
            v.name: pr_body.describe(layout, v, git, base, ident, coauthors, sources)
            for v in variants
        }
        _switch(layout, stage, variants, texts)
    finally:
        if stage.exists():
            trees.remove_tree(layout, stage)
            shutil.rmtree(stage, ignore_errors=True)

    for v in variants:
        n = len(v.subjects)
        print(f"{v.branch}: {n} commit{'s' * (n != 1)} - {v.title}")
    print(
        f"PR tree {layout.pr} (on {variants[-1].branch}); author and "
        f"Signed-off-by {ident}, Co-authored-by: {', '.join(coauthors)}.\n"
        f"  descriptions: {layout.pin_build}/"
        + ", ".join(f"PR_{v.name}.md" for v in variants)
        + " "
        "(first line: the title)\n"
        "  vLLM's AI policy: review every changed line and run the tests "
        "before you push; the description says you did.\n"
        f"  push: git -C {layout.pr} push <your-fork-remote> "
        + " ".join(v.branch for v in variants)
    )
    return EXIT_OK
