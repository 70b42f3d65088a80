"""A real HTTP server on 127.0.0.1 for the downloader tests, with Range support and faults.

Serves in-memory files; can cut a transfer after N bytes, ignore Range, or fail with 503; can
send an ETag / Last-Modified (and honour If-Range), send no length (close-delimited body), send
the body chunked, answer a Range request from the wrong byte, or fail every later request.
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
    etag: str | None = None  # sent with 200/206/416; If-Range must equal it for a 206
    last_modified: str | None = None  # likewise (used by If-Range when there is no etag)
    no_length: bool = False  # no Content-Length: the body ends when the connection closes
    chunked: bool = False  # Transfer-Encoding: chunked (a cut one lacks the final 0-chunk)
    wrong_start: bool = False  # answer Range requests with a 206 from byte 0
    later_status: int | None = None  # after the first request, answer this status (e.g. 403)
    requests: int = 0  # how many requests this file had


@dataclass
class Request:
    path: str
    range: str | None
    status: int
    if_range: str | None = None


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
                   send: int | None = None, served: ServedFile | None = None) -> None:
            server.log.append(Request(self.path, self.headers.get("Range"), status,
                                      self.headers.get("If-Range")))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if served is not None and served.etag:
                self.send_header("ETag", served.etag)
            if served is not None and served.last_modified:
                self.send_header("Last-Modified", served.last_modified)
            chunked = served is not None and served.chunked and status in (200, 206)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            elif served is None or not served.no_length or status not in (200, 206):
                self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            data = body if send is None else body[:send]
            if chunked:
                for k in range(0, len(data), 8192):
                    piece = data[k:k + 8192]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                if send is None:
                    self.wfile.write(b"0\r\n\r\n")
            else:
                self.wfile.write(data)
            self.wfile.flush()
            self.close_connection = True

        def do_GET(self) -> None:
            served = server.files.get(self.path.lstrip("/"))
            if served is None:
                return self._reply(404, b"not found", {})
            served.requests += 1
            if served.later_status is not None and served.requests > 1:
                return self._reply(served.later_status, b"failing", {})
            if served.fail_first > 0:
                served.fail_first -= 1
                return self._reply(503, b"busy", {})
            data, size = served.data, len(served.data)
            cut, served.cut_after = served.cut_after, None
            span = _parse_range(self.headers.get("Range", ""), size)
            if_range = self.headers.get("If-Range")
            if if_range is not None and if_range != (served.etag or served.last_modified):
                span = None  # the validator does not match: the whole (changed) file
            if span is None or served.ignore_range:
                return self._reply(200, data, {}, send=cut, served=served)
            first, last = span
            if first >= size:
                return self._reply(416, b"", {"Content-Range": f"bytes */{size}"}, served=served)
            if served.wrong_start:
                first = 0
            body = data[first:last + 1]
            headers = {"Content-Range": f"bytes {first}-{first + len(body) - 1}/{size}"}
            return self._reply(206, body, headers, send=cut, served=served)

    return Handler
