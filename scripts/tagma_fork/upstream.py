# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The upstream pin: which vLLM release the stack sits on, and its bytes.

Each pin is one stack folder, `patches/vllm-<version>/`, whose `pin.toml`
records the version, the sdist and x86_64 wheel file names and their sha256;
`patches/default` names the default pin. Files are fetched through the
package index that pip is configured with (pypi-simple reads the index's own
digests), cached, and refused when their sha256 differs from the pin.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pypi_simple import ProjectPage, PyPISimple

PIN_FILE = "pin.toml"
STACKS = Path("patches")
DEFAULT_FILE = STACKS / "default"
# A release version as the tools accept it (no shell metacharacters, no
# path separators): 0.26.0, 0.27.0rc1, 1.0.0.post1.
VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.(post|dev)[0-9]+)?$")
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
            "# The pinned upstream release of this stack. Written by `make"
            " rebase`; read by every verb.\n"
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


def check_version(version: str) -> str:
    """`version` if it is a release version, else a clear error."""
    if not VERSION_RE.match(version):
        raise ValueError(f"{version!r} is not a vLLM release version (e.g. 0.26.0)")
    return version


def stack_dir(root: Path, version: str) -> Path:
    """The folder of the stack pinned to `version`."""
    return root / STACKS / f"vllm-{check_version(version)}"


def default_version(root: Path) -> str:
    """The default pin, as `patches/default` names it."""
    path = root / DEFAULT_FILE
    if not path.exists():
        raise ValueError(f"{path} does not exist: it names the default pin")
    return check_version(path.read_text().strip())


def versions(root: Path) -> list[str]:
    """Every pinned version (each folder with a pin.toml), oldest first."""
    found = [
        p.name.removeprefix("vllm-")
        for p in (root / STACKS).glob("vllm-*")
        if (p / PIN_FILE).is_file()
    ]
    from packaging.version import Version

    return sorted(found, key=Version)


def read_pin(stack: Path) -> Pin:
    """The pin of one stack folder."""
    path = stack / PIN_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    data = doc["vllm"]
    build = doc.get("build", {})
    unknown = set(build) - {"cpu_torch", "relax"}
    if unknown:
        raise ValueError(f"{path}: unknown [build] keys {sorted(unknown)}")
    relax = build.get("relax", {})
    if not all(isinstance(v, str) and v.strip() for v in relax.values()):
        raise ValueError(f"{path}: every [build.relax] entry needs a reason")
    if stack.name != f"vllm-{data.get('version')}":
        raise ValueError(
            f"{path}: version {data.get('version')!r} is not {stack.name}'s"
        )
    return Pin(
        **{k: str(data[k]) for k in ("version", "sdist", "sdist_sha256", "wheel",
                                     "wheel_sha256")},
        cpu_torch=str(build.get("cpu_torch", "")),
        relax={str(k).lower(): str(v) for k, v in relax.items()},
    )  # fmt: skip


def write_pin(stack: Path, pin: Pin) -> None:
    # Written into a staging folder (rebase): its switch is the atomic step.
    (stack / PIN_FILE).write_text(pin.dump())


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


# Every network call has a connect and a read timeout: an index that accepts
# the connection and never answers must fail, not hang. Seconds; the
# TAGMA_NET_TIMEOUT environment variable overrides it.
NET_TIMEOUT = 30.0
NET_TIMEOUT_ENV = "TAGMA_NET_TIMEOUT"


def net_timeout() -> float:
    """Seconds one connect, or one read, may take before it fails."""
    raw = os.environ.get(NET_TIMEOUT_ENV, "").strip()
    if not raw:
        return NET_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):  # NaN fails too
        raise FetchError(f"{NET_TIMEOUT_ENV}={raw!r} is not a number of seconds > 0")
    return value


def _index_url() -> str | None:
    """The index pip is configured with, if the user set one."""
    if url := os.environ.get("PIP_INDEX_URL"):
        return url
    cmd = [sys.executable, "-m", "pip", "config", "get", "global.index-url"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        # Falling back to the default index would bypass the user's one.
        raise FetchError("`pip config get global.index-url` hung for 60 s") from None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _client() -> PyPISimple:
    from pypi_simple import PyPISimple

    url = _index_url()
    return PyPISimple(url) if url else PyPISimple()


@contextmanager
def _network(what: str, url: str, timeout: float) -> Iterator[None]:
    """Turn a failed network call into a one-line FetchError naming `url`."""
    import requests
    from pypi_simple import (
        NoSuchProjectError,
        UnsupportedContentTypeError,
        UnsupportedRepoVersionError,
    )

    try:
        yield
    except NoSuchProjectError as e:
        raise FetchError(f"{what} {url}: HTTP 404 (no such project)") from e
    except requests.HTTPError as e:
        r = e.response
        status = f"HTTP {r.status_code} {r.reason}" if r is not None else str(e)
        raise FetchError(f"{what} {url}: {_one_line(status)}") from e
    except (
        requests.RequestException,
        OSError,
        UnsupportedContentTypeError,
        UnsupportedRepoVersionError,
    ) as e:
        raise FetchError(f"{what} {url}: {_why(e, timeout)}") from e


def _why(exc: BaseException, timeout: float) -> str:
    """What went wrong, in a few words, from an exception and its causes."""
    import socket

    import requests
    import urllib3.exceptions

    # requests wraps urllib3's errors, which wrap the socket's: look at all.
    chain: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e in chain:
            continue
        chain.append(e)
        links = [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
        todo += [x for x in links if isinstance(x, BaseException)]

    def has(*kinds: type[BaseException]) -> bool:
        return any(isinstance(e, kinds) for e in chain)

    # The socket's own errors first: urllib3's NewConnectionError (refused,
    # unknown host) subclasses its ConnectTimeoutError.
    if has(ConnectionRefusedError):
        return "connection refused"
    if has(ConnectionResetError):
        return "connection reset by the server"
    if has(socket.gaierror):
        return "host name not found"
    if has(requests.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError):
        return f"timed out after {timeout:g} s connecting"
    if has(requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError):
        return f"timed out after {timeout:g} s waiting for an answer"
    return _one_line(f"{type(exc).__name__}: {exc}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def index_files(version: str) -> dict[str, str]:
    """The index's file names and sha256 for one vLLM release.

    Raises:
        FetchError: the index did not answer in time, refused the
            connection, answered with an HTTP error, or lacks the release.
    """
    timeout = net_timeout()
    with _client() as client:
        page = _project_page(client, timeout)
    files = {
        p.filename: p.digests.get("sha256", "")
        for p in page.packages
        if p.version == version
    }
    if not files:
        raise FetchError(f"vllm {version} is not on the package index")
    return files


def _project_page(client: PyPISimple, timeout: float) -> ProjectPage:
    url = client.get_project_url("vllm")
    with _network("package index", url, timeout):
        return client.get_project_page("vllm", timeout=(timeout, timeout))


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
        FetchError: the download failed (timed out, refused, HTTP error: the
            message names the URL) or its sha256 is not the pinned one. A
            mismatching file is never left in the cache.
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
    timeout = net_timeout()
    print(f"fetching {filename} ...", flush=True)
    with _client() as client:
        page = _project_page(client, timeout)
        found = [p for p in page.packages if p.filename == filename]
        if not found:
            raise FetchError(f"{filename} is not on the package index ({version})")
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        os.close(fd)
        try:
            # The read timeout bounds each wait for data, not the whole
            # download: a slow but live mirror still gets there.
            with _network("downloading", found[0].url, timeout):
                client.download_package(
                    found[0], path=tmp, verify=False, timeout=(timeout, timeout)
                )
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
