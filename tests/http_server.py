"""A real HTTP server on 127.0.0.1 for the downloader tests, with Range support and faults.

Serves in-memory files; can cut a transfer after N bytes, ignore Range, or fail with 503.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class ServedFile:
    """Bytes served at one path, and the faults to inject."""

    data: bytes
    cut_after: int | None = None  # first request: send only this many body bytes, then close
    ignore_range: bool = False  # always answer 200 with the whole body
    fail_first: int = 0  # answer the first N requests with 503


@dataclass
class Request:
    path: str
    range: str | None
    status: int


@dataclass
class FileServer:
    """Context manager running a ThreadingHTTPServer in a thread; `url(name)` gives its URL."""

    files: dict[str, ServedFile] = field(default_factory=dict)
    log: list[Request] = field(default_factory=list)

    def __enter__(self) -> FileServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def url(self, name: str) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/{name}"


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) of 'bytes=a-' or 'bytes=a-b'; None if malformed."""
    if not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes="):].partition("-")
    try:
        return int(first), int(last) if last else size - 1
    except ValueError:
        return None


def _make_handler(server: FileServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def _reply(self, status: int, body: bytes, headers: dict[str, str],
                   send: int | None = None) -> None:
            server.log.append(Request(self.path, self.headers.get("Range"), status))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body if send is None else body[:send])
            self.wfile.flush()
            self.close_connection = True

        def do_GET(self) -> None:
            served = server.files.get(self.path.lstrip("/"))
            if served is None:
                return self._reply(404, b"not found", {})
            if served.fail_first > 0:
                served.fail_first -= 1
                return self._reply(503, b"busy", {})
            data, size = served.data, len(served.data)
            cut, served.cut_after = served.cut_after, None
            span = _parse_range(self.headers.get("Range", ""), size)
            if span is None or served.ignore_range:
                return self._reply(200, data, {}, send=cut)
            first, last = span
            if first >= size:
                return self._reply(416, b"", {"Content-Range": f"bytes */{size}"})
            body = data[first:last + 1]
            headers = {"Content-Range": f"bytes {first}-{first + len(body) - 1}/{size}"}
            return self._reply(206, body, headers, send=cut)

    return Handler
