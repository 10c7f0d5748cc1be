# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The upstream pin: which vLLM release the stack sits on, and its bytes.

`upstream/vllm.toml` records the version, the sdist and x86_64 wheel file
names and their sha256. Files are fetched through the package index that
pip is configured with (pypi-simple reads the index's own digests), cached,
and refused when their sha256 differs from the pin.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PIN_FILE = Path("upstream/vllm.toml")
WHEEL_PLATFORM = "manylinux_2_28_x86_64"


@dataclass(slots=True, frozen=True)
class Pin:
    """One pinned vLLM release."""

    # Release version, e.g. "0.25.1".
    version: str
    # Source distribution file name and its sha256.
    sdist: str
    sdist_sha256: str
    # x86_64 wheel (precompiled kernels) file name and its sha256.
    wheel: str
    wheel_sha256: str
    # [build] cpu_torch: the torch requirement `make build-fork` installs on a
    # machine without a GPU; empty means build.CPU_TORCH.
    cpu_torch: str = ""
    # [build.relax]: lock pins of requirements/test/cpu.txt that build-fork
    # loosens from `==V` to `==V.*` (V's post-releases match), each with the
    # reason it is needed. An explicit list, never a blanket override.
    relax: dict[str, str] = field(default_factory=dict)

    def dump(self) -> str:
        text = (
            "# The pinned upstream release. Written by `make rebase`; read by"
            " every verb.\n"
            "# The sdist is the source; the wheel is the source of precompiled"
            " kernels.\n"
            "[vllm]\n"
            f'version = "{self.version}"\n'
            f'sdist = "{self.sdist}"\n'
            f'sdist_sha256 = "{self.sdist_sha256}"\n'
            f'wheel = "{self.wheel}"\n'
            f'wheel_sha256 = "{self.wheel_sha256}"\n'
        )
        if self.cpu_torch or self.relax:
            text += (
                "\n# How `make build-fork` installs this release (see"
                " scripts/tagma_fork/build.py).\n[build]\n"
            )
        if self.cpu_torch:
            text += f"cpu_torch = {_toml_str(self.cpu_torch)}\n"
        if self.relax:
            text += "\n[build.relax]\n"
            for name, reason in sorted(self.relax.items()):
                text += f"{name} = {_toml_str(reason)}\n"
        return text


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class FetchError(RuntimeError):
    """A file could not be fetched or failed its checksum."""


def read_pin(root: Path) -> Pin:
    with open(root / PIN_FILE, "rb") as f:
        doc = tomllib.load(f)
    data = doc["vllm"]
    build = doc.get("build", {})
    unknown = set(build) - {"cpu_torch", "relax"}
    if unknown:
        raise ValueError(f"{PIN_FILE}: unknown [build] keys {sorted(unknown)}")
    relax = build.get("relax", {})
    if not all(isinstance(v, str) and v.strip() for v in relax.values()):
        raise ValueError(f"{PIN_FILE}: every [build.relax] entry needs a reason")
    return Pin(
        **{k: str(data[k]) for k in ("version", "sdist", "sdist_sha256", "wheel",
                                     "wheel_sha256")},
        cpu_torch=str(build.get("cpu_torch", "")),
        relax={str(k).lower(): str(v) for k, v in relax.items()},
    )  # fmt: skip


def write_pin(root: Path, pin: Pin) -> None:
    path = root / PIN_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(pin.dump())
    tmp.replace(path)


def cache_dir() -> Path:
    """Where downloads are kept between runs and between clones."""
    default = Path.home() / ".cache" / "tagma-vllm"
    path = Path(os.environ.get("TAGMA_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _index_url() -> str | None:
    """The index pip is configured with, if the user set one."""
    if url := os.environ.get("PIP_INDEX_URL"):
        return url
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def index_files(version: str) -> dict[str, str]:
    """The index's file names and sha256 for one vLLM release."""
    from pypi_simple import PyPISimple

    url = _index_url()
    client = PyPISimple(url) if url else PyPISimple()
    with client:
        page = client.get_project_page("vllm")
    files = {
        p.filename: p.digests.get("sha256", "")
        for p in page.packages
        if p.version == version
    }
    if not files:
        raise FetchError(f"vllm {version} is not on the package index")
    return files


def pin_for(version: str) -> Pin:
    """A new pin for `version`, with the digests the index publishes."""
    files = index_files(version)
    sdist = f"vllm-{version}.tar.gz"
    wheels = [f for f in files if f.endswith(f"-{WHEEL_PLATFORM}.whl")]
    if sdist not in files or not wheels:
        raise FetchError(f"vllm {version}: no sdist or no {WHEEL_PLATFORM} wheel")
    return Pin(version, sdist, files[sdist], wheels[0], files[wheels[0]])


def fetch(filename: str, sha256: str, version: str) -> Path:
    """Return the cached file, downloading it first if needed.

    Raises:
        FetchError: the download failed or its sha256 is not the pinned one.
            A mismatching file is never left in the cache.
    """
    path = cache_dir() / filename
    if path.exists():
        got = sha256_of(path)
        if got == sha256:
            return path
        raise FetchError(
            f"{path}: sha256 {got} does not match the pin {sha256}; "
            "remove the file to fetch it again"
        )
    from pypi_simple import PyPISimple

    url = _index_url()
    print(f"fetching {filename} ...", flush=True)
    with PyPISimple(url) if url else PyPISimple() as client:
        page = client.get_project_page("vllm")
        found = [p for p in page.packages if p.filename == filename]
        if not found:
            raise FetchError(f"{filename} is not on the package index ({version})")
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        os.close(fd)
        try:
            client.download_package(found[0], path=tmp, verify=False)
            got = sha256_of(Path(tmp))
            if got != sha256:
                raise FetchError(
                    f"{filename}: downloaded sha256 {got} does not match the "
                    f"pin {sha256}; refusing it"
                )
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def extract_sdist(sdist: Path, dest: Path) -> None:
    """Unpack an sdist's single top folder into `dest` (which must not exist).

    The sdist's `vllm.egg-info` is dropped: with the tree root on sys.path it
    would override the installed version.
    """
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="tar")
        (top,) = Path(tmp).iterdir()
        shutil.rmtree(top / "vllm.egg-info", ignore_errors=True)
        top.rename(dest)
