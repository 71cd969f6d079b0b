"""A small reverse proxy for the system tier: serves an upstream HTTP server under a path prefix
only, as a company's proxy serves Airflow at ``https://host/airflow``. A request whose path is
not under the prefix gets 404 from the proxy itself, so a link or fetch that leaves the prefix
fails in the test as it would behind the real proxy. Paths are forwarded unchanged (Airflow,
told its ``[api] base_url``, serves under the prefix itself), and the ``Host`` header is kept, so
the upstream's redirects point at the proxy.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["prefix_proxy"]

#: Headers that belong to one hop, not passed on (RFC 9110 section 7.6.1), and the body's length
#: (the proxy sends the body whole, with its own).
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


class _Handler(BaseHTTPRequestHandler):
    server: _ProxyServer
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        prefix = self.server.prefix
        if not (self.path == prefix or self.path.startswith(prefix + "/") or self.path.startswith(prefix + "?")):
            body = f"not under {prefix}/ (the proxy serves only that path)".encode()
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.server.refused.append(self.path)
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=300)
        try:
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
            except OSError as exc:  # the upstream is not up (yet), or went away
                message = f"upstream: {exc}".encode()
                self.send_response(502)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(message)))
                self.end_headers()
                self.wfile.write(message)
                return
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError):  # the browser went away mid-answer
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests say what failed
        pass


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, prefix: str, upstream_port: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.prefix = prefix.rstrip("/")
        self.upstream_port = upstream_port
        self.refused: list[str] = []


@contextmanager
def prefix_proxy(prefix: str, upstream_port: int) -> Iterator[_ProxyServer]:
    """Serve ``127.0.0.1:<upstream_port>`` under ``prefix`` until the block ends; the server's
    ``server_address[1]`` is its port (bound at once, so the upstream can be told its address
    before it starts), ``refused`` the paths it answered 404 for."""
    server = _ProxyServer(prefix, upstream_port)
    thread = threading.Thread(target=server.serve_forever, name="prefix-proxy", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
