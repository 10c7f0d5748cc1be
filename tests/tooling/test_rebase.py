# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""rebase onto a synthetic new upstream: clean, 3-way, conflict, abort."""

from __future__ import annotations

from conftest import BASE_FILES, Project, make_sdist

from tagma_fork import rebase, stack, upstream
from tagma_fork.git import Git


def _release(project: Project, version: str, **changes: str):
    files = dict(BASE_FILES)
    files.update(changes)
    return make_sdist(project.cache, version, files)


def _shifted_cache(extra_top: int) -> str:
    """cache.py with lines added at the top: the patch's hunk moves."""
    head = "".join(f"new {i}\n" for i in range(extra_top))
    return head + BASE_FILES["vllm/config/cache.py"]


def test_rebase_dry_run_reports_each_patch(two_patches: Project) -> None:
    pin = _release(two_patches, "9.1.0", **{"vllm/config/cache.py": _shifted_cache(5)})
    before = two_patches.snapshot()
    rows = rebase.dry_run(two_patches.layout, pin)
    assert [(r[0], r[1]) for r in rows] == [
        ("cache-field.patch", "applies"),
        ("new-module.patch", "applies"),
    ]
    conflict = _release(
        two_patches,
        "9.2.0",
        **{"vllm/config/cache.py": BASE_FILES["vllm/config/cache.py"].replace(
            "line 10\n", "line ten\n")},
    )  # fmt: skip
    rows = rebase.dry_run(two_patches.layout, conflict)
    assert rows[0] == ("cache-field.patch", "conflicts", ["vllm/config/cache.py"])
    assert rows[1][1] == "applies"
    assert two_patches.snapshot() == before


def test_rebase_three_way_succeeds_and_moves_the_pin(two_patches: Project) -> None:
    # Upstream rewrote the lines around the hunk: plain apply fails, the
    # 3-way merge (with the old preimage blob) succeeds.
    text = BASE_FILES["vllm/config/cache.py"]
    text = text.replace("line 8\n", "line eight\n").replace(
        "line 12\n", "line twelve\n"
    )
    pin = _release(two_patches, "9.1.0", **{"vllm/config/cache.py": text})
    rows = rebase.dry_run(two_patches.layout, pin)
    assert rows[0][:2] == ("cache-field.patch", "applies with 3-way")

    before = two_patches.snapshot()
    assert rebase.start(two_patches.layout, pin) == 0
    new_stack = two_patches.layout.for_version("9.1.0").patches
    assert upstream.read_pin(new_stack) == pin
    assert stack.read_series(new_stack) == [
        "cache-field.patch",
        "new-module.patch",
    ]
    # The source stack is untouched; the new one carries its manifest.
    after = two_patches.snapshot()
    assert {k: v for k, v in after.items() if k.startswith("vllm-9.0.0/")} == {
        k: v for k, v in before.items() if k.startswith("vllm-9.0.0/")
    }
    assert after["vllm-9.1.0/conformance.toml"] == before["vllm-9.0.0/conformance.toml"]
    assert not two_patches.layout.rebase.exists()
    new = (new_stack / "cache-field.patch").read_text()
    assert " line eight\n" in new  # context now comes from the new release
    assert rebase.load_state(two_patches.layout) is None
    out = two_patches.layout.build / "results/rebase/9.0.0-to-9.1.0"
    lines = (out / "range-diff.txt").read_text().splitlines()
    assert lines[0].startswith("1:") and "config: tag line 10" in lines[0]
    assert any(line.startswith("2:") and "= 2:" in line for line in lines)
    report = (out / "report.md").read_text()
    assert "| cache-field.patch | applied with 3-way | - |" in report
    assert "| new-module.patch | applied cleanly | - |" in report


def test_rebase_conflict_stops_then_abort_loses_nothing(
    two_patches: Project, capsys
) -> None:
    text = BASE_FILES["vllm/config/cache.py"].replace("line 10\n", "line ten\n")
    pin = _release(two_patches, "9.2.0", **{"vllm/config/cache.py": text})
    before = two_patches.snapshot()
    assert rebase.start(two_patches.layout, pin) == rebase.EXIT_CONFLICT
    out = capsys.readouterr().out
    assert "STOPPED: cache-field.patch conflicts" in out
    assert "vllm/config/cache.py" in out and "rebase-continue" in out
    assert two_patches.snapshot() == before
    assert rebase.abort(two_patches.layout) == 0
    assert two_patches.snapshot() == before
    assert not two_patches.layout.rebase.exists()


def test_rebase_conflict_resolved_and_continued(two_patches: Project) -> None:
    text = BASE_FILES["vllm/config/cache.py"].replace("line 10\n", "line ten\n")
    pin = _release(two_patches, "9.2.0", **{"vllm/config/cache.py": text})
    assert rebase.start(two_patches.layout, pin) == rebase.EXIT_CONFLICT
    wt = two_patches.layout.rebase
    # Still unmerged: continue refuses.
    assert rebase.resume(two_patches.layout) == rebase.EXIT_CONFLICT
    resolved = text.replace("line ten\n", "line ten tagma\n")
    (wt / "vllm/config/cache.py").write_text(resolved)
    Git(wt).run("add", "vllm/config/cache.py")
    assert rebase.resume(two_patches.layout) == 0
    new_stack = two_patches.layout.for_version("9.2.0").patches
    assert upstream.read_pin(new_stack).version == "9.2.0"
    patch = (new_stack / "cache-field.patch").read_text()
    assert "+line ten tagma\n" in patch and "-line ten\n" in patch
    assert stack.lint(new_stack) == []


def test_rebase_report_times_the_resolution_and_rerere_replays_it(
    two_patches: Project, monkeypatch
) -> None:
    text = BASE_FILES["vllm/config/cache.py"].replace("line 10\n", "line ten\n")
    pin = _release(two_patches, "9.2.0", **{"vllm/config/cache.py": text})
    before = two_patches.snapshot()
    clock = [1000.0]
    monkeypatch.setattr(rebase.time, "time", lambda: clock[0])
    assert rebase.start(two_patches.layout, pin) == rebase.EXIT_CONFLICT
    clock[0] += 7 * 60  # seven minutes to resolve
    wt = two_patches.layout.rebase
    (wt / "vllm/config/cache.py").write_text(
        text.replace("line ten\n", "line ten tagma\n")
    )
    Git(wt).run("add", "vllm/config/cache.py")
    assert rebase.resume(two_patches.layout) == 0
    out = two_patches.layout.build / "results/rebase/9.0.0-to-9.2.0"
    report = (out / "report.md").read_text()
    assert (
        "| cache-field.patch | conflicted, resolved by hand "
        "| `vllm/config/cache.py` | 7 |" in report
    )
    assert "| new-module.patch | applied cleanly | - | 0 |" in report
    resolved = two_patches.snapshot()

    # The same rebase again from the old stack: rerere replays the recorded
    # resolution, so it runs through without stopping, to the same patches.
    two_patches.restore(before)
    assert rebase.start(two_patches.layout, pin) == 0
    assert two_patches.snapshot() == resolved
    report = (out / "report.md").read_text()
    assert (
        "| cache-field.patch | conflicted, resolved by rerere "
        "| `vllm/config/cache.py` |" in report
    )


def test_rebase_carries_the_build_table_over(two_patches: Project) -> None:
    old = two_patches.layout.pin()
    upstream.write_pin(
        two_patches.patches,
        upstream.Pin(
            old.version, old.sdist, old.sdist_sha256, old.wheel, old.wheel_sha256,
            cpu_torch="torch==2.14.1", relax={"certifi": "post1 only"},
        ),
    )  # fmt: skip
    pin = _release(two_patches, "9.1.0")
    assert rebase.start(two_patches.layout, pin) == 0
    moved = two_patches.layout.for_version("9.1.0").pin()
    assert moved.version == "9.1.0" and moved.sdist_sha256 == pin.sdist_sha256
    assert moved.cpu_torch == "torch==2.14.1"
    assert moved.relax == {"certifi": "post1 only"}
