# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Run vLLM's own tests from the patched tree on CPU, under one KV backend.

    build/venv/bin/python tests/conformance/run.py [--backend paged|tagma]
        [--suite tests/v1/core ...] [--out build/results/conformance]

The suites run from build/tree with the CPU platform plugin, no model hub
(test model names are redirected to config-only folders in models/), and the
tests listed in deselect.toml left out with their reason. Any other failure
fails the run. Counts (collected, passed, failed, errors, skipped,
deselected) go to `<out>/<backend>.json` and are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_SUITES = ("tests/v1/core",)


def redirect_file(out: Path) -> Path:
    """Write VLLM_MODEL_REDIRECT_PATH's JSON: model name -> local folder."""
    mapping = {
        d.name.replace("--", "/"): str(d)
        for d in sorted((HERE / "models").iterdir())
        if (d / "config.json").exists()
    }
    path = out / "model-redirect.json"
    path.write_text(json.dumps(mapping, indent=1))
    return path


def deselected(backend: str) -> list[tuple[str, str]]:
    """(node id, reason) of every test the manifest leaves out for `backend`."""
    with open(HERE / "deselect.toml", "rb") as f:
        manifest = tomllib.load(f)
    out = []
    for entry in manifest.get("deselect", []):
        if backend in entry.get("backends", ["paged", "tagma"]):
            for test in entry["tests"]:
                out.append((test, entry["reason"]))
    return out


def count(junit: Path) -> dict[str, int]:
    suite = ET.parse(junit).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    total = int(suite.get("tests", 0))
    failed = int(suite.get("failures", 0))
    errors = int(suite.get("errors", 0))
    skipped = int(suite.get("skipped", 0))
    return {
        "run": total,
        "passed": total - failed - errors - skipped,
        "failed": failed,
        "errors": errors,
        "skipped": skipped,
    }


def failures(junit: Path) -> list[str]:
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            out.append(f"{case.get('classname')}::{case.get('name')}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="paged", choices=["paged", "tagma"])
    parser.add_argument("--suite", action="append", help="default: tests/v1/core")
    parser.add_argument("--tree", default=str(ROOT / "build" / "tree"))
    parser.add_argument(
        "--out", default=str(ROOT / "build" / "results" / "conformance")
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments")
    args = parser.parse_args()

    tree, out = Path(args.tree), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suites = args.suite or list(DEFAULT_SUITES)
    skip = deselected(args.backend)
    junit = out / f"{args.backend}.xml"
    env = {
        **os.environ,
        "VLLM_KV_CACHE_BACKEND": args.backend,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_MODEL_REDIRECT_PATH": str(redirect_file(out)),
        "CUDA_VISIBLE_DEVICES": "",
        "TRITON_INTERPRET": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    cmd = [
        sys.executable, "-m", "pytest", *suites, "-q", "-p", "no:cacheprovider",
        "-o", "addopts=", f"--junitxml={junit}", "--timeout=600",
        *(f"--deselect={t}" for t, _ in skip), *args.pytest_args,
    ]  # fmt: skip
    print(
        f"==> {' '.join(suites)} under --kv-cache-backend {args.backend} "
        f"({len(skip)} deselected, see tests/conformance/deselect.toml)",
        flush=True,
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    summary = ""
    for line in proc.stdout:
        print(line, end="", flush=True)
        if " in " in line and ("passed" in line or "failed" in line):
            summary = line
    proc.wait()
    wall = time.monotonic() - t0
    if not junit.exists():
        print(f"pytest produced no report (exit {proc.returncode})")
        return 1
    match = re.search(r"(\d+) deselected", summary)
    counts = count(junit) | {"deselected": int(match.group(1)) if match else 0}
    counts["collected"] = counts["run"] + counts["deselected"]
    result = {
        "schema": 1,
        "backend": args.backend,
        "suites": suites,
        "wall_s": round(wall, 1),
        "counts": counts,
        "failures": failures(junit),
        "deselect_manifest": [{"test": t, "reason": r} for t, r in skip],
    }
    (out / f"{args.backend}.json").write_text(json.dumps(result, indent=1))
    print(
        f"\n{args.backend}: collected {counts['collected']}, "
        f"passed {counts['passed']}, failed {counts['failed']}, "
        f"errors {counts['errors']}, "
        f"skipped {counts['skipped']}, deselected {counts['deselected']} "
        f"in {wall:.0f} s -> {out / (args.backend + '.json')}"
    )
    return 0 if counts["failed"] == 0 and counts["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
