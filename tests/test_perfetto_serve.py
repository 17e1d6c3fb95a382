"""--open's server: one GET of the one file on 127.0.0.1, with the UI's CORS header."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.perfetto import serve
from tracekit.perfetto.serve import UI_ORIGIN, serve_once, ui_link


def _start(
    path: Path, wait_s: float = 60.0
) -> tuple[threading.Thread, int, str, list[BaseException]]:
    """Run serve_once on an ephemeral port in a thread; wait until it listens."""
    ready = threading.Event()
    info: dict[str, object] = {}
    errors: list[BaseException] = []

    def on_ready(link: str, port: int) -> None:
        """Remember where the server listens."""
        info.update(link=link, port=port)
        ready.set()

    def run() -> None:
        """Serve, keeping any error for the test."""
        try:
            serve_once(path, port=0, on_ready=on_ready, wait_s=wait_s)
        except BaseException as err:  # surfaced to the test below
            errors.append(err)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "server did not start"
    assert not errors, errors
    return thread, int(info["port"]), str(info["link"]), errors  # type: ignore[call-overload]


def _get(
    port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    """One request to the local server (a Host header given replaces http.client's)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = headers or {}
    conn.putrequest(method, path, skip_host="Host" in headers)
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    response = conn.getresponse()
    response.read()
    return response


def _trace(tmp_path: Path) -> Path:
    """A small file to serve."""
    trace = tmp_path / "t.pftrace"
    trace.write_bytes(b"\x0a\x00" * 10)
    return trace


def test_serves_the_file_once_with_cors_and_refuses_other_paths(tmp_path: Path) -> None:
    """Other paths get 404 (server keeps waiting); the file's GET has the headers; then it stops."""
    trace = tmp_path / "my trace.pftrace"
    trace.write_bytes(b"\x0a\x00" * 10)
    (tmp_path / "secret.txt").write_text("not to be served")
    thread, port, link, errors = _start(trace)
    assert link == ui_link(port, trace.name)
    assert link.startswith(f"{UI_ORIGIN}/#!/?url=http://127.0.0.1:{port}/my%20trace.pftrace")
    for other in ("/secret.txt", "/", "/../secret.txt", "/my%20trace.pftrace/x"):
        assert _get(port, other).status == 404
    assert _get(port, "/my%20trace.pftrace", "POST").status == 405
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/my%20trace.pftrace")
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200
    assert response.getheader("Access-Control-Allow-Origin") == UI_ORIGIN
    assert response.getheader("Content-Length") == str(len(body))
    assert body == trace.read_bytes()
    thread.join(10)
    assert not thread.is_alive() and not errors


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    """Serving a file that does not exist fails before listening."""
    with pytest.raises(TracekitError, match="no such trace file"):
        serve_once(tmp_path / "nope.pftrace", port=0)


def test_nobody_fetching_is_a_clear_error_after_the_wait(tmp_path: Path) -> None:
    """No fetch within the wait ends the server with one line saying what to do."""
    started = time.monotonic()
    with pytest.raises(TracekitError, match=r"nobody fetched t\.pftrace within 0\.5 s") as err:
        serve_once(_trace(tmp_path), port=0, wait_s=0.5)
    assert time.monotonic() - started < 10
    assert "Open trace file" in str(err.value) and "\n" not in str(err.value)


def test_an_idle_half_open_connection_does_not_block_the_real_fetch(tmp_path: Path) -> None:
    """A connection that sends half a request and waits is served beside, not before."""
    trace = _trace(tmp_path)
    thread, port, _, errors = _start(trace)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        idle.sendall(b"GET /t.pftrace HTTP/1.1\r\n")  # and never the rest
        started = time.monotonic()
        response = _get(port, "/t.pftrace", headers={"Origin": UI_ORIGIN})
        assert response.status == 200
        # Well within the idle connection's own timeout: it was not waited for.
        assert time.monotonic() - started < serve.CONNECTION_TIMEOUT_S / 2
        thread.join(10)
    assert not thread.is_alive() and not errors


def test_an_idle_connection_is_dropped_after_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes a connection that sends nothing, instead of holding it forever."""
    monkeypatch.setattr(serve, "CONNECTION_TIMEOUT_S", 0.5)
    thread, port, _, errors = _start(_trace(tmp_path))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""  # closed by the server
        assert time.monotonic() - started < 5
    assert _get(port, "/t.pftrace").status == 200
    thread.join(10)
    assert not thread.is_alive() and not errors


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "attacker.example:9001"},  # a page whose name was rebound to 127.0.0.1
        {"Host": "127.0.0.1:1"},  # another port
        {"Origin": "https://attacker.example"},
        {"Origin": "null"},
    ],
)
def test_other_hosts_and_origins_are_refused_and_the_server_keeps_waiting(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    """DNS rebinding and other sites' pages get 403; the UI's fetch still works after."""
    thread, port, _, errors = _start(_trace(tmp_path))
    refused = _get(port, "/t.pftrace", headers=headers)
    assert refused.status == 403
    assert thread.is_alive()
    good = {"Host": f"localhost:{port}", "Origin": UI_ORIGIN}
    assert _get(port, "/t.pftrace", headers=good).status == 200
    thread.join(10)
    assert not thread.is_alive() and not errors
