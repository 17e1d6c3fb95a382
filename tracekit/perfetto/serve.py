"""`--open`: serve one .pftrace once on 127.0.0.1 so ui.perfetto.dev can load it.

The Perfetto UI fetches trace URLs from http://127.0.0.1:9001 (the port its content
security policy allows) and needs a CORS header naming its origin. Only the one file's
path is served; any other path gets 404 and the server keeps waiting; after the file has
been sent once the server stops. Nothing is uploaded: the browser reads from this machine.

Each connection has a thread of its own and a read timeout, so an idle or half-open
connection (a browser's speculative one, a port scanner) never holds up the real fetch.
A request is answered only if its Host is this server's own address (a page whose
domain was rebound to 127.0.0.1 sends its own name: DNS rebinding) and, when it has an
Origin, only if that is the UI's. Nobody fetching within the wait is one clear error.
"""

from __future__ import annotations

import http.server
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from tracekit.errors import TracekitError

UI_ORIGIN = "https://ui.perfetto.dev"
DEFAULT_PORT = 9001
HOST = "127.0.0.1"
# How long --open waits for the UI to fetch the file before giving up.
DEFAULT_WAIT_S = 300.0
# How long one connection may sit without sending its request (or reading the answer).
CONNECTION_TIMEOUT_S = 10.0
# How often the wait loop looks at the clock and at whether the file was sent.
POLL_S = 0.2


def ui_link(port: int, name: str) -> str:
    """The Perfetto UI link that makes the browser fetch the served file."""
    url = f"http://{HOST}:{port}/{urllib.parse.quote(name)}"
    return f"{UI_ORIGIN}/#!/?url={url}"


def _handler(path: Path, served: threading.Event) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler class that knows only PATH."""
    wanted = "/" + urllib.parse.quote(path.name)

    class OneFile(http.server.BaseHTTPRequestHandler):
        """Answers GET of the one file from the expected Host and Origin; refuses the rest."""

        timeout = CONNECTION_TIMEOUT_S  # per connection: an idle one is dropped

        def do_GET(self) -> None:
            """Send the file if asked for by its name, else 404."""
            if not self._trusted():
                return
            if self.path.split("?", 1)[0] != wanted:
                self.send_error(404, "only the exported trace is served here")
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Access-Control-Allow-Origin", UI_ORIGIN)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            served.set()

        def do_POST(self) -> None:
            """Refuse: nothing is accepted here."""
            self.send_error(405, "only GET of the exported trace")

        def _trusted(self) -> bool:
            """Whether Host and Origin are the expected ones; answers 403 when not."""
            port = self.server.server_address[1]
            host = self.headers.get("Host", "")
            origin = self.headers.get("Origin")
            if host not in allowed_hosts(port):
                self.send_error(403, f"Host {host!r} is not this server (127.0.0.1:{port})")
                return False
            if origin is not None and origin != UI_ORIGIN:
                self.send_error(403, f"Origin {origin!r} is not {UI_ORIGIN}")
                return False
            return True

        def log_message(self, format: str, *args: object) -> None:
            """Keep the terminal quiet; the CLI prints what matters."""

    return OneFile


def allowed_hosts(port: int) -> set[str]:
    """The Host header values of a request meant for this server."""
    return {f"{HOST}:{port}", f"localhost:{port}"}


class _Server(http.server.ThreadingHTTPServer):
    """One thread per connection; none of them keeps the process alive at the end."""

    daemon_threads = True
    block_on_close = False


def serve_once(
    path: str | os.PathLike[str],
    port: int = DEFAULT_PORT,
    on_ready: Callable[[str, int], None] | None = None,
    wait_s: float = DEFAULT_WAIT_S,
) -> None:
    """Serve PATH on 127.0.0.1:PORT until it has been downloaded once, or WAIT_S passed.

    ON_READY gets the UI link and the bound port (PORT 0 picks a free one, for tests).
    """
    file = Path(path)
    if not file.is_file():
        raise TracekitError(f"{file}: no such trace file to serve")
    served = threading.Event()
    try:
        server = _Server((HOST, port), _handler(file, served))
    except OSError as err:
        raise TracekitError(
            f"cannot listen on {HOST}:{port} ({err.strerror}); is another --open still "
            "running? Stop it, or open the file in the UI with 'Open trace file'"
        ) from None
    with server:
        server.timeout = POLL_S  # handle_request returns at least this often
        bound = server.server_address[1]
        if on_ready is not None:
            on_ready(ui_link(bound, file.name), bound)
        deadline = time.monotonic() + wait_s
        while not served.is_set():
            if time.monotonic() >= deadline:
                raise TracekitError(
                    f"nobody fetched {file.name} within {wait_s:g} s; open the link above "
                    "in a browser on this machine while tracekit waits, or load the file in "
                    "the Perfetto UI with 'Open trace file'"
                )
            server.handle_request()
