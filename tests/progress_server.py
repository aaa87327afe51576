"""A stand-in for the operator's progress endpoint (protocol v1), for the unit and trainer tiers: it checks each report
with the operator's own `kubetf.core.progress.protocol.parse_report` and folds the accepted ones with
`kubetf.core.progress.merge.merge`, as the endpoint will."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubetf.core.progress import merge, protocol


class ProgressServer:
    """Answers each POST with the next of ``statuses`` (then 204) and keeps what it accepted."""

    def __init__(self, statuses: list[int] | None = None, token: str | None = None):
        self.statuses = list(statuses or [])
        self.token = token
        self.accepted: list[dict[str, Any]] = []  # bodies answered 204
        self.requests: list[dict[str, Any]] = []  # every request: time, status, headers, body
        self.errors: list[str] = []  # 400s this server gave (a client bug)
        self.status: dict[str, Any] | None = None  # status.progress as the operator would have it
        self.cond = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = outer._answer(dict(self.headers), raw, self.path)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1/progress"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def _answer(self, headers: dict[str, str], raw: bytes, path: str) -> int:
        with self.cond:
            status = self.statuses.pop(0) if self.statuses else 204
            record: dict[str, Any] = {"time": time.monotonic(), "status": status, "headers": headers, "path": path}
            try:
                report = protocol.parse_report(raw)
                record["body"] = json.loads(raw)
            except protocol.ReportError as exc:
                self.errors.append(exc.reason)
                status = record["status"] = exc.status
                report = None
            if self.token is not None and headers.get("Authorization") != f"Bearer {self.token}":
                status = record["status"] = 401
            if headers.get("Content-Type") != "application/json":
                status = record["status"] = 400
            self.requests.append(record)
            if status == 204 and report is not None:
                self.accepted.append(record["body"])
                self.status = merge.merge(self.status, report, "chief", 0, True, time.time())
            self.cond.notify_all()
            return status

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                result = predicate(self)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; accepted: {self.accepted}; errors: {self.errors}")
                self.cond.wait(min(left, 0.2))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def progress_server(statuses: list[int] | None = None, token: str | None = None) -> Iterator[ProgressServer]:
    server = ProgressServer(statuses, token)
    try:
        yield server
    finally:
        server.close()


def closed_port_url() -> str:
    """A URL where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/progress"
