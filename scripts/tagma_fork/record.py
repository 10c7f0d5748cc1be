# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The record of the last passing `make test`: build/vllm-<v>/test-record.json.

`make test` runs this as the last line of its recipe, so a record is written
only by a run in which every target passed, and it replaces the previous
one. It holds the pin, the project's commit (and whether the checkout had
uncommitted changes), the date, the run's duration, and the per-suite
counts of the junit files that run wrote (test-conformance's; the other
targets write none). pr-branch fills the PR's Test Result from it.

    python -m tagma_fork.record --pin 0.26.0 --started <epoch seconds>

`--started` is make's `$(shell date +%s)` in the same recipe: make expands
a recipe's lines when the recipe starts, so it is the start of `make test`.
Junit files older than that are from another run and are left out.
"""

from __future__ import annotations

import argparse
import json
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import atomic, trees, upstream
from .git import Git

RECORD = "test-record.json"
SCHEMA = 1


def record_path(layout: trees.Layout) -> Path:
    return layout.pin_build / RECORD


def junit_dir(layout: trees.Layout) -> Path:
    """Where `make test-conformance` writes its junit and JSON files."""
    return layout.build / "results" / "conformance" / layout.version


def junit_counts(path: Path) -> dict[str, Any]:
    """tests, passed, failed, errors, skipped and time over every testsuite."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    seconds = 0.0
    for suite in suites:
        total["tests"] += int(suite.get("tests", 0))
        total["failed"] += int(suite.get("failures", 0))
        total["errors"] += int(suite.get("errors", 0))
        total["skipped"] += int(suite.get("skipped", 0))
        seconds += float(suite.get("time", 0) or 0)
    passed = total["tests"] - total["failed"] - total["errors"] - total["skipped"]
    return {**total, "passed": passed, "time_s": round(seconds, 1)}


def suites(layout: trees.Layout, started: float | None) -> dict[str, Any]:
    """The junit counts of this run, by suite (`conformance/<file stem>`).

    Where the conformance harness left its JSON beside the junit file, its
    deselected and rejected-as-expected counts are added.
    """
    found: dict[str, Any] = {}
    folder = junit_dir(layout)
    for xml in sorted(folder.glob("*.xml")) if folder.is_dir() else []:
        if started is not None and xml.stat().st_mtime < started:
            continue
        try:
            counts = junit_counts(xml)
        except (ET.ParseError, ValueError) as e:
            counts = {"unreadable": str(e)}
        extra = xml.with_suffix(".json")
        if extra.is_file():
            try:
                more = json.loads(extra.read_text()).get("counts", {})
            except (ValueError, AttributeError):
                more = {}
            for key in ("deselected", "rejected_as_expected"):
                if key in more:
                    counts[key] = more[key]
        found[f"conformance/{xml.stem}"] = counts
    return found


def build_record(
    layout: trees.Layout, started: float | None, now: float
) -> dict[str, Any]:
    git = Git(layout.root)
    head = git.run("rev-parse", "HEAD", check=False)
    status = git.run("status", "--porcelain", "--untracked-files=no", check=False)
    return {
        "schema": SCHEMA,
        "pin": layout.version,
        "git": {
            "commit": head.stdout.strip() if head.returncode == 0 else None,
            "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None,
        },
        "date": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "duration_s": round(now - started) if started is not None else None,
        # Written by the last line of make test's recipe: every target passed.
        "outcome": "passed",
        "suites": suites(layout, started),
    }


def read(layout: trees.Layout) -> dict[str, Any] | None:
    """The pin's record, or None when there is none (or it is unreadable)."""
    path = record_path(layout)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("pin") != layout.version:
        return None
    return data


def write(layout: trees.Layout, started: float | None, now: float) -> Path:
    """Replace the pin's record with this run's; its path."""
    path = record_path(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(build_record(layout, started, now), indent=1) + "\n"
    atomic.write_file(path, data.encode())
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tagma_fork.record", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pin", required=True, type=upstream.check_version)
    parser.add_argument(
        "--started", type=float, help="when make test started (epoch seconds)"
    )
    args = parser.parse_args(argv)
    path = write(trees.Layout.find(args.pin), args.started, time.time())
    print(f"make test record: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
