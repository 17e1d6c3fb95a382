"""--open's server: one GET of the one file on 127.0.0.1, with the UI's CORS header."""

from __future__ import annotations

import http.client
import threading
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.perfetto.serve import UI_ORIGIN, serve_once, ui_link


def _start(path: Path) -> tuple[threading.Thread, int, str, list[BaseException]]:
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
            serve_once(path, port=0, on_ready=on_ready)
        except BaseException as err:  # surfaced to the test below
            errors.append(err)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "server did not start"
    assert not errors, errors
    return thread, int(info["port"]), str(info["link"]), errors  # type: ignore[call-overload]


def _get(port: int, path: str, method: str = "GET") -> http.client.HTTPResponse:
    """One request to the local server."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path)
    response = conn.getresponse()
    response.read()
    return response


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
