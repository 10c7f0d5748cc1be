# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The package index and downloads: every call times out, every failure is a
one-line FetchError naming the URL.

Local servers only: one that accepts and never answers, a port that refuses,
and a small simple-index server.
"""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tagma_fork import upstream

VERSION = "9.9.9"
SDIST = f"vllm-{VERSION}.tar.gz"
WHEEL = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
SDIST_BYTES = b"not really a tarball\n"
TIMEOUT = 0.3
# Far above TIMEOUT, far below a hang: the old code never returned.
GUARD = 10.0


def within(seconds: float, call: Callable[[], object]) -> tuple[BaseException, float]:
    """Run `call`, failing the test if it does not finish in time; return
    what it raised and how long it took."""
    result: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result[0] = e

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still waiting on the network after {seconds} s")
    error = result[0]
    assert error is not None, "expected a failure"
    return error, time.monotonic() - start


@pytest.fixture
def silent() -> Iterator[int]:
    """A port that accepts connections and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    done.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def refused() -> Iterator[int]:
    """A port that refuses connections: bound (so no one else takes it), not
    listening."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


class Index:
    """A simple-index server; `links` maps file names to URLs (default: its own)."""

    def __init__(self) -> None:
        self.links: dict[str, str] = {}
        self.status = 200
        self.stall = threading.Event()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/simple/vllm/" and index.status == 200:
                    self._send(200, index.page(), "text/html")
                elif self.path == "/simple/vllm/":
                    self._send(index.status, b"", "text/plain")
                elif self.path == f"/files/{SDIST}":
                    self._send(200, SDIST_BYTES, "application/octet-stream")
                elif self.path == "/files/stall":
                    # Headers and a first byte, then nothing.
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    index.stall.wait(GUARD)
                else:
                    self._send(404, b"", "text/plain")

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def page(self) -> bytes:
        digest = hashlib.sha256(SDIST_BYTES).hexdigest()
        links = {
            SDIST: f"{self.url}/files/{SDIST}",
            WHEEL: f"{self.url}/files/{WHEEL}",
            **self.links,
        }
        anchors = "".join(
            f'<a href="{url}#sha256={digest}">{name}</a>\n'
            for name, url in links.items()
        )
        return f"<html><body>\n{anchors}</body></html>\n".encode()

    def close(self) -> None:
        self.stall.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    served = Index()
    monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple/")
    yield served
    served.close()


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAGMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TAGMA_NET_TIMEOUT", str(TIMEOUT))
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


def assert_fetch_error(error: BaseException, *parts: str) -> None:
    assert isinstance(error, upstream.FetchError), repr(error)
    message = str(error)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


def test_index_that_never_answers_times_out(
    silent: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{silent}/simple/"
    monkeypatch.setenv("PIP_INDEX_URL", url)
    error, took = within(GUARD, lambda: upstream.pin_for(VERSION))
    assert_fetch_error(error, f"{url}vllm/", f"timed out after {TIMEOUT:g} s")
    assert took < 5


def test_refused_index_is_a_fetch_error(
    refused: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{refused}/simple/"
    monkeypatch.setenv("PIP_INDEX_URL", url)
    error, took = within(GUARD, lambda: upstream.index_files(VERSION))
    assert_fetch_error(error, f"{url}vllm/", "connection refused")
    assert took < 5


def test_fetch_from_a_silent_index_times_out(
    silent: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{silent}/simple/")
    sha = hashlib.sha256(SDIST_BYTES).hexdigest()
    error, _ = within(GUARD, lambda: upstream.fetch(SDIST, sha, VERSION))
    assert_fetch_error(error, f"127.0.0.1:{silent}", "timed out after")


def test_download_that_never_answers_times_out(
    index: Index, silent: int, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{silent}/{SDIST}"
    index.links[SDIST] = url
    sha = hashlib.sha256(SDIST_BYTES).hexdigest()
    error, took = within(GUARD, lambda: upstream.fetch(SDIST, sha, VERSION))
    assert_fetch_error(error, f"downloading {url}", "timed out after 0.3 s")
    assert took < 5
    assert list((tmp_path / "cache").iterdir()) == []


def test_download_that_stalls_midway_times_out(index: Index, tmp_path: Path) -> None:
    index.links[SDIST] = f"{index.url}/files/stall"
    sha = hashlib.sha256(SDIST_BYTES).hexdigest()
    error, took = within(GUARD, lambda: upstream.fetch(SDIST, sha, VERSION))
    assert_fetch_error(error, f"{index.url}/files/stall", "timed out after")
    assert took < 5
    assert list((tmp_path / "cache").iterdir()) == []


def test_http_errors_name_status_and_url(index: Index) -> None:
    index.status = 503
    error, _ = within(GUARD, lambda: upstream.index_files(VERSION))
    assert_fetch_error(error, f"{index.url}/simple/vllm/", "HTTP 503")
    index.status = 200
    index.links[SDIST] = f"{index.url}/files/gone"
    sha = hashlib.sha256(SDIST_BYTES).hexdigest()
    error, _ = within(GUARD, lambda: upstream.fetch(SDIST, sha, VERSION))
    assert_fetch_error(error, f"{index.url}/files/gone", "HTTP 404")


def test_a_live_index_still_works(index: Index) -> None:
    pin = upstream.pin_for(VERSION)
    assert (pin.sdist, pin.wheel) == (SDIST, WHEEL)
    path = upstream.fetch(pin.sdist, pin.sdist_sha256, VERSION)
    assert path.read_bytes() == SDIST_BYTES


def test_bad_timeout_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAGMA_NET_TIMEOUT", "soon")
    with pytest.raises(upstream.FetchError, match="TAGMA_NET_TIMEOUT"):
        upstream.net_timeout()
    monkeypatch.setenv("TAGMA_NET_TIMEOUT", "")
    assert upstream.net_timeout() == upstream.NET_TIMEOUT
