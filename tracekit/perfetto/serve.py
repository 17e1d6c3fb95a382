"""`--open`: serve one .pftrace once on 127.0.0.1 so ui.perfetto.dev can load it.

The Perfetto UI fetches trace URLs from http://127.0.0.1:9001 (the port its content
security policy allows) and needs a CORS header naming its origin. Only the one file's
path is served; any other path gets 404 and the server keeps waiting; after the file has
been sent once the server stops. Nothing is uploaded: the browser reads from this machine.
"""

from __future__ import annotations

import http.server
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from tracekit.errors import TracekitError

UI_ORIGIN = "https://ui.perfetto.dev"
DEFAULT_PORT = 9001
HOST = "127.0.0.1"


def ui_link(port: int, name: str) -> str:
    """The Perfetto UI link that makes the browser fetch the served file."""
    url = f"http://{HOST}:{port}/{urllib.parse.quote(name)}"
    return f"{UI_ORIGIN}/#!/?url={url}"


def _handler(path: Path, served: list[bool]) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler class that knows only PATH."""
    wanted = "/" + urllib.parse.quote(path.name)

    class OneFile(http.server.BaseHTTPRequestHandler):
        """Answers GET of the one file; everything else is refused."""

        def do_GET(self) -> None:
            """Send the file if asked for by its name, else 404."""
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
            served.append(True)

        def do_POST(self) -> None:
            """Refuse: nothing is accepted here."""
            self.send_error(405, "only GET of the exported trace")

        def log_message(self, format: str, *args: object) -> None:
            """Keep the terminal quiet; the CLI prints what matters."""

    return OneFile


def serve_once(
    path: str | os.PathLike[str],
    port: int = DEFAULT_PORT,
    on_ready: Callable[[str, int], None] | None = None,
) -> None:
    """Serve PATH on 127.0.0.1:PORT until it has been downloaded once.

    ON_READY gets the UI link and the bound port (PORT 0 picks a free one, for tests).
    """
    file = Path(path)
    if not file.is_file():
        raise TracekitError(f"{file}: no such trace file to serve")
    served: list[bool] = []
    try:
        server = http.server.HTTPServer((HOST, port), _handler(file, served))
    except OSError as err:
        raise TracekitError(
            f"cannot listen on {HOST}:{port} ({err.strerror}); is another --open still "
            "running? Stop it, or open the file in the UI with 'Open trace file'"
        ) from None
    with server:
        bound = server.server_address[1]
        if on_ready is not None:
            on_ready(ui_link(bound, file.name), bound)
        while not served:
            server.handle_request()
