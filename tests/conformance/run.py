# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Run vLLM's own tests from the patched tree on CPU, under one KV backend.

    build/vllm-<v>/venv/bin/python tests/conformance/run.py
        --tree build/vllm-<v>/tree --manifest patches/vllm-<v>/conformance.toml
        [--backend paged|tagma] [--suite tests/v1/core ...] [--out DIR]

(`make test-conformance` passes these for the selected pin.) The suites run
from the pin's tree with the CPU platform plugin, no model hub (test model
names are redirected to config-only folders in models/), and the tests the
pin's manifest lists left out with their reason. Any other failure
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
# vLLM's core scheduler/KV suites (the plug-in point's test among them), plus
# the stack's own tests in the tree.
DEFAULT_SUITES = (
    "tests/v1/core",
    "tests/config/test_kv_cache_backend.py",
    "tests/v1/worker/gpu/test_tagma_block_table.py",
    "tests/v1/worker/test_block_tables_plugin.py",
    "tests/entrypoints/test_api_server_listener.py",
)


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


def manifest(path: Path, backend: str) -> tuple[list[tuple[str, str]], list[dict]]:
    """(node id, reason) of every test left out for `backend`, and the
    expected failures (tests, match, reason) for `backend`."""
    with open(path, "rb") as f:
        data = tomllib.load(f)

    def applies(entry: dict) -> bool:
        return backend in entry.get("backends", ["paged", "tagma"])

    skip = [
        (test, entry["reason"])
        for entry in data.get("deselect", [])
        if applies(entry)
        for test in entry["tests"]
    ]
    expect = [e for e in data.get("expect_failure", []) if applies(e)]
    return skip, expect


def within(test: str, suites: list[str]) -> bool:
    """Whether node id `test` lies in one of `suites` (files or folders)."""
    path = test.split("::")[0]
    return any(path == s or path.startswith(s.rstrip("/") + "/") for s in suites)


def check_expected_failures(junit: Path, expect: list[dict]) -> list[str]:
    """Problems with the expected failures: a test that passed, or failed
    for another reason than the manifest's message."""
    cases = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        node = f"{module}::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        cases[node] = (
            "" if bad is None else (bad.get("message") or "") + (bad.text or "")
        )
    problems = []
    for entry in expect:
        for test in entry["tests"]:
            hits = {n: m for n, m in cases.items() if n.startswith(test)}
            if not hits:
                problems.append(f"{test}: expected to fail, but did not run")
            for node, message in hits.items():
                if entry["match"] not in message:
                    problems.append(
                        f"{node}: expected to fail with {entry['match']!r}, "
                        f"got: {message.strip()[:200] or 'passed'}"
                    )
    return problems


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
    parser.add_argument("--suite", action="append", help="default: DEFAULT_SUITES")
    parser.add_argument("--tree", required=True, help="the pin's patched tree")
    parser.add_argument("--manifest", required=True, help="the pin's conformance.toml")
    parser.add_argument(
        "--out", default=str(ROOT / "build" / "results" / "conformance")
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments")
    args = parser.parse_args()

    # pytest runs with the tree as its working directory: every path handed
    # to it (junit file, model redirect) must not depend on ours.
    tree, out = Path(args.tree).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    suites = args.suite or list(DEFAULT_SUITES)
    skip, expect = manifest(Path(args.manifest), args.backend)
    # A run of some suites checks only their expected failures.
    expect = [
        e | {"tests": [t for t in e["tests"] if within(t, suites)]} for e in expect
    ]
    expect = [e for e in expect if e["tests"]]
    expected_tests = [t for e in expect for t in e["tests"]]
    junit = out / f"{args.backend}.xml"
    env = {
        **os.environ,
        # tagma_default.py, the plugin that makes tagma CacheConfig's default.
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(HERE), os.environ.get("PYTHONPATH")])
        ),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_MODEL_REDIRECT_PATH": str(redirect_file(out)),
        "CUDA_VISIBLE_DEVICES": "",
        "TRITON_INTERPRET": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    backend_plugin = ["-p", "tagma_default"] if args.backend == "tagma" else []
    cmd = [
        sys.executable, "-m", "pytest", *suites, "-q", "-p", "no:cacheprovider",
        "-o", "addopts=", f"--junitxml={junit}", "--timeout=600",
        *backend_plugin,
        *(f"--deselect={t}" for t, _ in skip),
        *(f"--deselect={t}" for t in expected_tests), *args.pytest_args,
    ]  # fmt: skip
    print(
        f"==> {' '.join(suites)} under --kv-cache-backend {args.backend} "
        f"({len(skip)} deselected, see {args.manifest})",
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
    problems: list[str] = []
    if expected_tests and not args.pytest_args:
        print(f"==> {len(expected_tests)} tests that must fail with tagma's error")
        xfail_junit = out / f"{args.backend}-expected-failures.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", *expected_tests, "-q",
             "-p", "no:cacheprovider", "-o", "addopts=", *backend_plugin,
             f"--junitxml={xfail_junit}"],
            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        problems = check_expected_failures(xfail_junit, expect)
        ran = count(xfail_junit)["run"]
        counts["rejected_as_expected"] = ran - len(problems)
        # Those were deselected from the main run; count them once.
        counts["deselected"] -= ran
    result = {
        "schema": 1,
        "backend": args.backend,
        "suites": suites,
        "wall_s": round(wall, 1),
        "counts": counts,
        "failures": failures(junit),
        "deselect_manifest": [{"test": t, "reason": r} for t, r in skip],
        "expected_failure_problems": problems,
    }
    (out / f"{args.backend}.json").write_text(json.dumps(result, indent=1))
    print(
        f"\n{args.backend}: collected {counts['collected']}, "
        f"passed {counts['passed']}, failed {counts['failed']}, "
        f"errors {counts['errors']}, "
        f"skipped {counts['skipped']}, deselected {counts['deselected']} "
        f"in {wall:.0f} s -> {out / (args.backend + '.json')}"
    )
    if "rejected_as_expected" in counts:
        n = counts["rejected_as_expected"]
        print(f"  + {n} failed with tagma's clear error, as expected")
    for p in problems:
        print(f"  UNEXPECTED: {p}")
    ok = counts["failed"] == 0 and counts["errors"] == 0 and not problems
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
