# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The PR descriptions: pr_template.md filled, nothing left to paste.

vLLM's AGENTS.md asks an AI-assisted PR's description for: why it does not
duplicate an existing PR, the test commands run and their results, model
evaluation results when serving is affected, and a clear statement that AI
assistance was used. The sources, read at build time:

    build/vllm-<v>/test-record.json    the last passing `make test` (record.py)
    docs/results.md                    the conformance table, by vLLM release
    results/<dir>/write_path.json,     the GPU pipeline (ci/gpu.sh): CUDA
      gpu-tests.xml, smoke-*.json        tests, write path, greedy token ids
    results/**/summary.json (+ meta)   the serve benchmark, paged vs tagma

A source that is missing is said to be missing, in the body and as a
warning; numbers of another vLLM release than the pin are labelled with it.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from . import record, stack, trees
from .git import Git

if TYPE_CHECKING:
    from .pr import Identity, Variant

TEMPLATE = Path(__file__).with_name("pr_template.md")
RFC = Path("docs/rfc-tagma-kv-backend.md")
RESULTS_DOC = Path("docs/results.md")
RESULTS = Path("results")

PURPOSE = {
    "plugin": (
        "A backend-neutral plug-in point for the KV-cache manager: the config\n"
        "can name the `KVCacheManager` subclass (and so its `BlockPool`) and\n"
        "the V2 model runner's block-tables class, the way `--scheduler-cls`\n"
        "and `worker_cls` name theirs. The defaults are upstream's classes, so\n"
        "nothing changes for anyone who does not set them. A KV-cache backend\n"
        "that places blocks differently then plugs in without patching the\n"
        "scheduler, the KV-cache coordinator and the model runner. It is the\n"
        "first commit of the tagma backend's series and is proposed alone so\n"
        "that it can be reviewed and merged first."
    ),
    "full": (
        "Add the tagma KV-cache backend, selected with `--kv-cache-backend\n"
        "tagma` (default `paged`, unchanged). A request holds its KV blocks as\n"
        "a few contiguous block ranges (one in the steady state), placed\n"
        "through a C++ index of free runs, so the write path (slot mapping,\n"
        "model runner V2) finds a position's physical block by range\n"
        "arithmetic instead of a per-position block-table load. The\n"
        "scheduler-facing KVCacheManager contract is unchanged; configurations\n"
        "the backend does not support are rejected when the config is built,\n"
        "naming the feature. The first patch commit is the backend-neutral\n"
        "plug-in point, also proposed alone."
    ),
}

TEST_PLAN = {
    "plugin": (
        "- `make test VLLM_VERSION={v}` in tagma-vllm, on CPU: lint, the fork\n"
        "  tooling's tests, and vLLM's `tests/v1/core` plus the series' own\n"
        "  tests from the patched tree under `--kv-cache-backend paged` and\n"
        "  `tagma` (whose classes are chosen through this plug-in point).\n"
        "  These ran on the whole series, of which this is the first commit.\n"
        "- On this branch alone: `pytest tests/v1/core` (CPU), with the\n"
        "  defaults, which are upstream's classes."
    ),
    "full": (
        "- `make test VLLM_VERSION={v}` in tagma-vllm, on CPU: lint, the fork\n"
        "  tooling's tests, the engine's tests under ASan and UBSan\n"
        "  (`csrc/tagma/tests`), the binding's tests, and vLLM's\n"
        "  `tests/v1/core` plus the series' own tests from the patched tree,\n"
        "  once under `--kv-cache-backend paged` and once under `tagma`.\n"
        "- On a GPU (`bash ci/gpu.sh`): the write path's CUDA tests, its\n"
        "  microbenchmark against the paged kernels, and greedy token ids\n"
        "  under both backends.\n"
        "- Serving (`make bench-gpu`): paged and tagma under `vllm serve` on\n"
        "  one H200, same model and requests, alternating order; a greedy\n"
        "  token-id gate in every run."
    ),
}

# A patch proposed alone through its Standalone-PR trailer: its purpose is
# its own commit message.
STANDALONE_TEST_PLAN = (
    "- `make test VLLM_VERSION={v}` in tagma-vllm, on CPU: lint, the fork\n"
    "  tooling's tests, and vLLM's `tests/v1/core` plus the series' own\n"
    "  tests from the patched tree under `--kv-cache-backend paged` and\n"
    "  `tagma`. These ran on the whole series, of which this is one commit.\n"
    "- On this branch alone: the tests this commit adds and `pytest\n"
    "  tests/v1/core` (CPU)."
)

# vLLM threads near this work, and how this PR relates to each.
DUPLICATES = (
    "- #55841 (open PR, contiguous KV block runs for disaggregated\n"
    "  transfer): same aim, contiguous blocks, for transfer descriptors; it\n"
    "  changes the default pool's placement in place, where this adds an\n"
    "  opt-in manager and a plug-in point such a pool could also use.\n"
    "- #42131 (open PR, decode fast path for scheduler and model runner):\n"
    "  complementary; it skips scheduler work for a stable decode batch,\n"
    "  this makes each `allocate_slots` call cheap.\n"
    "- #21141 (issue, speeding up BlockPool processing): its per-block\n"
    "  speed-ups (#21005, #21222) stay in the pool this backend inherits;\n"
    "  only the placement decision moves into C++.\n"
    "- #40459 (RFC, a native scheduler and KV-cache manager): a native port\n"
    "  of the whole control plane; this is narrower (one native index,\n"
    "  Python elsewhere), and the plug-in point would let such a pool plug in.\n"
    "- #35990 (closed PR, contiguous block allocation for offloading): sorts\n"
    "  freed blocks by id at the cost of LRU eviction order; tagma keeps LRU\n"
    "  order for cached blocks and indexes free runs beside the queue.\n"
    "- #6102 and #17612 (closed PR and feature request, VMM / vAttention):\n"
    "  contiguous virtual KV through CUDA's VMM API, replacing the block\n"
    "  manager and the cache-write path; tagma keeps vLLM's physical blocks,\n"
    "  block tables and attention kernels and only chooses which blocks a\n"
    "  request gets."
)

# Variants whose related threads are not the backend's.
VARIANT_DUPLICATES = {
    "held-slots": (
        "- #29206 (closed PR, early return in `KVCacheManager.allocate_slots`):\n"
        "  the same idea. This one keeps the general path's result exactly,\n"
        "  caching of completed blocks and the partial prompt tail included,\n"
        "  and its test compares the two step by step through the scheduler\n"
        "  with preemption and shared prefixes that end mid-block.\n"
        "- #42131 (open PR, decode fast path for scheduler and model runner):\n"
        "  complementary; it skips scheduler work for a stable decode batch,\n"
        "  this makes each `allocate_slots` call that needs no block cheap and\n"
        "  leaves out the call on the decode steps that need no block and\n"
        "  cache none (`KVCacheManager.held_slots`)."
    ),
}

AI_NOTE = (
    "AI assistance was used: parts of this change were written with {tools}.\n"
    "As vLLM's contribution policy asks (docs/contributing/README.md, \"AI\n"
    'Assisted Contributions"; AGENTS.md), every commit says so with\n'
    "{trailers} and carries the DCO `Signed-off-by` of its author, {ident}.\n"
    "The policy makes the human submitter responsible for the change: they\n"
    "review every changed line, validate the behaviour end to end and run\n"
    "the relevant tests (commands and results above). {name} submits this\n"
    "PR on that basis."
)

# Text that means a description was not filled in.
PLACEHOLDERS = ("(paste", "(name, date)", "- [ ]", "FILL IN", "TODO", "#xxxx")

# The serve summary's metrics a row shows, tagma / paged.
SERVE_COLUMNS = (
    ("total_token_throughput", "total tok/s"),
    ("p99_ttft_ms", "TTFT p99"),
    ("p99_tpot_ms", "TPOT p99"),
    ("p99_itl_ms", "ITL p99"),
    ("kv_us_tok", "KV manager µs/token"),
    ("sched_us_tok", "scheduler µs/token"),
)


@dataclass(slots=True)
class Sources:
    """The Test Result's parts for one pin, read once for both variants."""

    # Markdown paragraphs, each complete (numbers or a "missing" sentence).
    make_test: str
    conformance: str
    gpu: str
    serve: str
    rfc: str
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def gather(cls, layout: trees.Layout) -> Sources:
        warnings: list[str] = []
        return cls(
            make_test=make_test_section(layout, warnings),
            conformance=conformance_section(layout, warnings),
            gpu=gpu_section(layout, warnings),
            serve=serve_section(layout, warnings),
            rfc=rfc_link(layout, warnings),
            warnings=warnings,
        )


def rfc_link(layout: trees.Layout, warnings: list[str]) -> str:
    if (layout.root / RFC).is_file():
        return f"[{RFC}]({RFC}) in the tagma-vllm project"
    warnings.append(f"{RFC} is not in this checkout; the PR links it anyway")
    return f"`{RFC}` in the tagma-vllm project (not in this checkout yet)"


def make_test_section(layout: trees.Layout, warnings: list[str]) -> str:
    v = layout.version
    rec = record.read(layout)
    if rec is None:
        warnings.append(
            f"no make test record for vLLM {v} ({record.record_path(layout)}): "
            f"run make test VLLM_VERSION={v}"
        )
        return (
            f"**`make test`**: no `make test` record for vLLM {v} in this "
            f"checkout: run `make test VLLM_VERSION={v}` and build the branch "
            "again."
        )
    commit = (rec.get("git") or {}).get("commit") or ""
    head = Git(layout.root).run("rev-parse", "HEAD", check=False).stdout.strip()
    tree = f"tagma-vllm `{commit[:12]}`" if commit else "tagma-vllm commit unknown"
    facts = [str(rec.get("date", "date unknown")), tree]
    if (rec.get("git") or {}).get("dirty"):
        facts[-1] += " with uncommitted changes"
    if isinstance(rec.get("duration_s"), int | float):
        facts.append(f"{rec['duration_s'] / 60:.0f} min")
    text = (
        f"**`make test VLLM_VERSION={v}`**, the last passing run "
        f"({', '.join(facts)}): every target passed."
    )
    if head and commit and commit != head:
        warnings.append(
            f"the make test record is of {commit[:12]}, this checkout is at {head[:12]}"
        )
        text += (
            f" This checkout is now at `{head[:12]}`; run `make test` again "
            "for a record of it."
        )
    rows = rec.get("suites") or {}
    if not rows:
        return text + " The run wrote no junit files, so there are no counts."
    lines = [
        text,
        "",
        "| suite | tests | passed | failed | errors | skipped | deselected |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, c in rows.items():
        cells = [c.get(k, "-") for k in ("tests", "passed", "failed", "errors",
                                         "skipped", "deselected")]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(lines)


def conformance_rows(text: str, version: str) -> list[dict[str, str]]:
    """The rows for `version` of the conformance table in docs/results.md
    (the table whose header has `vllm`, `backend` and `collected`)."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        lower = [c.lower() for c in cells]
        if header is None:
            if {"vllm", "backend", "collected"} <= set(lower):
                header = lower
            continue
        if set(line) <= set("|-: "):
            continue
        row = dict(zip(header, cells, strict=False))
        if row.get("vllm") == version:
            rows.append(row)
    return rows


def conformance_section(layout: trees.Layout, warnings: list[str]) -> str:
    v = layout.version
    path = layout.root / RESULTS_DOC
    rows = conformance_rows(path.read_text(), v) if path.is_file() else []
    if not rows:
        warnings.append(f"{RESULTS_DOC} has no conformance counts for vLLM {v}")
        return f"**Conformance**: {RESULTS_DOC} has no counts for vLLM {v}."
    parts = []
    for row in rows:
        words = [
            f"{row[k]} {k}"
            for k in ("collected", "passed", "failed", "skipped", "deselected")
            if row.get(k)
        ]
        required = next((row[k] for k in row if k.startswith("failed with")), "")
        if required:
            words.append(f"{required} failed with tagma's error naming the feature, "
                         "as required")  # fmt: skip
        parts.append(f"{row.get('backend', '?')}: {', '.join(words)}")
    return (
        f"**Conformance** (vLLM's `tests/v1/core` + the series' tests, CPU; "
        f"committed in {RESULTS_DOC} for vLLM {v}): " + "; ".join(parts) + "."
    )


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _pick(
    found: dict[str, Any], pin: str, what: str, warnings: list[str]
) -> tuple[str, str] | None:
    """The pin's entry if it has one, else the newest release's; and a label.
    A warning names `what` when there is none or it is another release's."""
    if pin in found:
        return pin, f"vLLM {pin}"
    ordered = sorted(found, key=lambda v: _version(v) or Version("0"))
    if not ordered:
        warnings.append(f"no committed {what}")
        return None
    other = ordered[-1]
    label = f"vLLM {other}, not this PR's base {pin}: none is committed for {pin}"
    warnings.append(f"{what} are of {label}")
    return other, label


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def gpu_dirs(root: Path) -> dict[str, Path]:
    """results/ folders of the GPU pipeline, by the vLLM release they ran."""
    found: dict[str, Path] = {}
    for folder in sorted((root / RESULTS).glob("*/")):
        bench = _json(folder / "write_path.json")
        version = ((bench or {}).get("env") or {}).get("upstream")
        if not version and (folder / "gpu-tests.xml").is_file():
            match = re.search(r"-(\d[0-9a-z.]*)$", folder.name)
            version = match.group(1) if match else None
        if version and _version(version):
            found[version] = folder
    return found


def _ratio_span(values: list[float]) -> str:
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{low}x" if low == high else f"{low}–{high}x"


def gpu_section(layout: trees.Layout, warnings: list[str]) -> str:
    found = gpu_dirs(layout.root)
    chosen = _pick(found, layout.version, "GPU pipeline results", warnings)
    if chosen is None:
        return "**GPU pipeline** (`ci/gpu.sh`): no committed results in this checkout."
    version, label = chosen
    folder = found[version]
    rel = folder.relative_to(layout.root)
    lines = [f"**GPU pipeline** (`ci/gpu.sh`, {label}; `{rel}/`):"]
    tests = folder / "gpu-tests.xml"
    if tests.is_file():
        try:
            c = record.junit_counts(tests)
            lines.append(
                f"- CUDA tests: {c['passed']} passed, {c['failed']} failed, "
                f"{c['errors']} errors, {c['skipped']} skipped."
            )
        except (ET.ParseError, ValueError):
            lines.append("- CUDA tests: `gpu-tests.xml` is unreadable.")
    else:
        lines.append("- CUDA tests: no `gpu-tests.xml` committed.")
    have_smoke = False
    # smoke_e2e.py writes smoke-<phase>-<backend>.json.
    for phase in ("plain", "preempt"):
        paged = _json(folder / f"smoke-{phase}-paged.json")
        tagma = _json(folder / f"smoke-{phase}-tagma.json")
        if not (isinstance(paged, dict) and isinstance(tagma, dict)):
            continue
        have_smoke = True
        keys = [k for k in ("first", "second") if k in paged]
        same = bool(keys) and all(paged[k] == tagma.get(k) for k in keys)
        n = len(paged.get("first") or [])
        how = "under paged and tagma"
        if phase == "preempt":
            how += (
                " with VLLM_BATCH_INVARIANT=1 and a KV cache small enough to "
                f"preempt ({paged.get('preemptions')} and "
                f"{tagma.get('preemptions')} preemptions)"
            )
        lines.append(
            f"- Greedy token ids, {n} prompts run twice (the second time from "
            f"the prefix cache): {'equal' if same else 'DIFFERENT'} {how}."
        )
    if not have_smoke:
        lines.append("- Greedy token ids: no `smoke-*-paged.json`/`-tagma.json`.")
    bench = _json(folder / "write_path.json")
    metrics = (bench or {}).get("metrics") or {}
    ratios = {}
    for key, m in metrics.items():
        kind, _, config = key.partition("|")
        base = metrics.get(f"paged|{config}")
        if kind in ("tagma", "tagma_fused") and base and base.get("median"):
            ratios[config] = m["median"] / base["median"]
    if ratios:
        one = [r for c, r in ratios.items() if "layout=contig" in c]
        lines.append(
            f"- Write path per decode step (block-table fill + slot mapping, "
            f"median of each configuration): tagma's fused kernel takes "
            f"{_ratio_span(list(ratios.values()))} paged's time over "
            f"{len(ratios)} configurations"
            + (f" ({_ratio_span(one)} with one range)" if one else "")
            + "."
        )
    else:
        lines.append("- Write path: no paged/tagma_fused pairs in `write_path.json`.")
    return "\n".join(lines)


def serve_runs(folder: Path) -> tuple[str | None, int]:
    """The vLLM release of a serve-suite folder and its runs per backend."""
    version, runs = None, 0
    for meta_path in sorted(folder.rglob("meta.json")):
        meta = _json(meta_path) or {}
        stack = meta.get("stack") or []
        if len(stack) >= 2 and stack[0] == "vllm":
            version = version or str(stack[1])
        # A = paged, B = tagma in bench_serve's order strings.
        runs += str(meta.get("order", "")).count("A")
    return version, runs


def _cell(metric: dict[str, Any] | None) -> str:
    if not metric or metric.get("ratio") is None:
        return "-"
    text = f"{metric['ratio']:.3f}"
    span = metric.get("ratio_range") or []
    if len(span) == 2 and span[1] - span[0] > 0.0005:
        text += f" ({span[0]:.2f}–{span[1]:.2f})"
    return text


def serve_section(layout: trees.Layout, warnings: list[str]) -> str:
    by_version: dict[str, list[Path]] = {}
    for summary in sorted((layout.root / RESULTS).rglob("summary.json")):
        version, _ = serve_runs(summary.parent)
        if version and _version(version):
            by_version.setdefault(version, []).append(summary)
    chosen = _pick(by_version, layout.version, "serve benchmark results", warnings)
    if chosen is None:
        return "**Serving** (`make bench-gpu`): no committed results in this checkout."
    version, label = chosen
    header = " | ".join(name for _, name in SERVE_COLUMNS)
    lines = [
        (
            f"**Serving**, paged vs tagma under `vllm serve` ({label}); tagma / "
            "paged, (min–max over run pairs) where there is more than one:"
        ),
        "",
        f"| suite / workload | runs per backend | {header} |",
        "| --- | --- |" + " --- |" * len(SERVE_COLUMNS),
    ]
    for summary in by_version[version]:
        data = _json(summary)
        if not isinstance(data, dict):
            warnings.append(f"{summary.relative_to(layout.root)} is unreadable")
            continue
        _, runs = serve_runs(summary.parent)
        for suite, workloads in data.items():
            for workload, metrics in (workloads or {}).items():
                if workload == "profile" or not isinstance(metrics, dict):
                    continue
                cells = [_cell(metrics.get(key)) for key, _ in SERVE_COLUMNS]
                lines.append(
                    f"| {suite} / {workload} | {runs or '-'} | "
                    + " | ".join(cells) + " |"
                )  # fmt: skip
    lines += ["", f"Every number with its setting and spread: {RESULTS_DOC}."]
    return "\n".join(lines)


def describe(
    layout: trees.Layout,
    variant: Variant,
    git: Git,
    base: str,
    ident: Identity,
    coauthors: list[str],
    sources: Sources,
) -> str:
    """The description of one variant; its first line is the PR title."""
    v = layout.version
    commits = git.out("log", "--reverse", "--format=- %s", f"{base}..{variant.commit}")
    result = [sources.make_test, sources.conformance]
    if variant.name == "full":
        result += [sources.gpu, sources.serve]
    elif variant.name == "plugin":
        result.append(
            "**Benchmarks**: none for this commit alone; it adds no work on the "
            "default path. The backend built on it is measured in the full PR "
            f"(branch `tagma/pr/{v}/full`)."
        )
    else:
        result.append(
            "**Benchmarks**: the commit message's (under Purpose), from "
            "tagma-vllm's `docs/ablation.md`."
        )
    purpose = (
        PURPOSE.get(variant.name)
        or stack.split_message(git.out("log", "-1", "--format=%B", variant.commit))[1]
    )
    text = TEMPLATE.read_text().format(
        title=variant.title,
        purpose=purpose,
        version=v,
        branch=variant.branch,
        rfc=sources.rfc,
        commits=commits,
        duplicates=VARIANT_DUPLICATES.get(variant.name, DUPLICATES),
        test_plan=TEST_PLAN.get(variant.name, STANDALONE_TEST_PLAN).format(v=v),
        test_result="\n\n".join(result),
        ai=AI_NOTE.format(
            tools=", ".join(coauthors),
            trailers=" and ".join(f"`Co-authored-by: {t}`" for t in coauthors),
            ident=f"`{ident}`",
            name=ident.name,
        ),
    )
    left = [p for p in PLACEHOLDERS if p in text]
    assert not left, f"PR description still has placeholder text: {left}"
    return text
