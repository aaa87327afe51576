"""The operator's one HTTP server, for each of its ports (progress reports, /metrics, /healthz): bounded HTTP/1.1
for small requests, a POST with a Content-Length or a GET. The transport only: what a request must be to be taken
is the caller's (`admit` for the head, `accept` for the body).

Every resource a client can make it hold is bounded, and it refuses before it reads:
- connections: at most `max_connections` at once; past that a connection is answered 503 and closed unread;
- time: the whole request (head and body) must arrive within `read_timeout` of the connection (408 otherwise), so an
  idle or trickling connection holds nothing for long;
- the head: at most `max_head` bytes (431); its framing parsed by h11 (a missing, negative or non-integer
  Content-Length, chunked bodies, bad syntax: 411 or 400; a GET or HEAD has no body);
- the body: declared longer than `max_body`: 413 before a byte of it is read; read up to its length and no further,
  and only once `admit` accepted the head (who sends it, for which job);
- threads: `admit` and `accept` (which may call the API server) run on a fixed pool of `threads`.
One request per connection (the answer says `Connection: close`). After a refusal the connection lingers a
moment, reading and dropping what the client still sends (at most `linger_bytes`), so the client reads the answer
instead of a reset. The server runs its own event loop on its own thread: nothing it does can block kopf's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11

from kubetf.cluster import metrics

log = logging.getLogger("kubetf.server")


class HeadTooLarge(Exception):
    """More bytes than the head may have, and it has not ended."""


@dataclass(frozen=True)
class Answer:
    """`error` goes out as a JSON object; `content` as it is, of `content_type`."""

    status: int
    error: str | None = None
    retry_after: int | None = None
    content: bytes = b""
    content_type: str = "text/plain; charset=utf-8"

    def encode(self) -> bytes:
        body, kind = (
            (json.dumps({"error": self.error}).encode(), "application/json")
            if self.error
            else (self.content, self.content_type)
        )
        reason = HTTPStatus(self.status).phrase
        headers = [f"HTTP/1.1 {self.status} {reason}", f"Content-Length: {len(body)}", "Connection: close"]
        if body:
            headers.append(f"Content-Type: {kind}")
        if self.retry_after is not None:
            headers.append(f"Retry-After: {self.retry_after}")
        return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Head:
    """A request's line and headers (names lower-case), and its body's declared length."""

    method: str
    target: str
    headers: dict[str, str]
    length: int


@dataclass(frozen=True)
class Limits:
    max_connections: int = 1024
    read_timeout: float = 1.0
    max_head: int = 8 * 1024
    max_body: int = 16 * 1024
    threads: int = 4
    linger_seconds: float = 0.5
    linger_bytes: int = 64 * 1024


@dataclass
class Server:
    """`admit(head)` answers a request from its head alone, or returns a ticket (anything but an `Answer`) to read its
    body for; `accept(ticket, body)` answers it."""

    port: int
    admit: Callable[[Head], Any]
    accept: Callable[[Any, bytes], Answer]
    limits: Limits = field(default_factory=Limits)
    host: str = "0.0.0.0"
    name: str = "http"

    def __post_init__(self) -> None:
        self.open = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=self.limits.threads, thread_name_prefix=f"kubetf-{self.name}")
        self.server: asyncio.Server | None = None
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Server:
        """Listen (on its own thread); returns once the port is bound, raising what kept it from binding."""
        threading.Thread(target=self._run, name=f"kubetf-{self.name}-server", daemon=True).start()
        self.ready.wait()
        if self.error is not None:
            raise self.error
        return self

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.server = self.loop.run_until_complete(
                asyncio.start_server(self._connection, self.host, self.port, limit=self.limits.max_head)
            )
            if self.port == 0:
                self.port = self.server.sockets[0].getsockname()[1]
        except BaseException as error:
            self.error = error
            self.ready.set()
            return
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        loop, server = self.loop, self.server
        if loop is None or server is None:
            return
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ a connection

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.limits.max_connections:
            await self._answer(writer, Answer(503, "too many connections: retry", retry_after=1), linger=None)
            return
        self.open += 1
        metrics.CONNECTIONS.labels(port=self.name).set(self.open)
        try:
            try:
                answer = await self._request(reader)
            except TimeoutError:
                answer = Answer(408, f"the request did not arrive within {self.limits.read_timeout:g}s")
            except (ConnectionError, asyncio.IncompleteReadError):
                answer = None  # the client went away: no one to answer
            except Exception:
                log.exception("a request to the %s port failed", self.name)
                answer = Answer(500, "the operator failed to handle the report: retry")
            if answer is None:
                writer.close()
            else:
                await self._answer(writer, answer, linger=reader if answer.status >= 400 else None)
        finally:
            self.open -= 1
            metrics.CONNECTIONS.labels(port=self.name).set(self.open)

    async def _request(self, reader: asyncio.StreamReader) -> Answer | None:
        """Read within the deadline (`read_timeout` from the connection, raising TimeoutError past it); the caller's
        `admit` and `accept` are not the client's time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.read_timeout
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head)
        try:
            async with asyncio.timeout_at(deadline):
                event = await self._next(connection, reader, self.limits.max_head)
        except h11.RemoteProtocolError as error:
            return Answer(error.error_status_hint or 400, f"malformed request: {error}")
        except HeadTooLarge:
            return Answer(431, f"the request's line and headers are more than {self.limits.max_head} bytes")
        if not isinstance(event, h11.Request):
            return None
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in event.headers}
        method = event.method.decode("latin-1")
        if method in ("GET", "HEAD") and "transfer-encoding" not in headers:
            length = int(headers.get("content-length", "0"))
        elif "transfer-encoding" in headers or "content-length" not in headers:
            return Answer(411, f"send a Content-Length (at most {self.limits.max_body} bytes), not a chunked body")
        else:
            length = int(headers["content-length"])  # h11 refused any that is not a non-negative integer
        if length > self.limits.max_body:
            return Answer(413, f"a report is at most {self.limits.max_body} bytes, this one has {length}")
        head = Head(method, event.target.decode("latin-1"), headers, length)
        ticket = await loop.run_in_executor(self.pool, self.admit, head)
        if isinstance(ticket, Answer):
            return ticket
        body = bytearray()
        try:
            async with asyncio.timeout_at(deadline):
                while len(body) < length:
                    event = await self._next(connection, reader, length - len(body))
                    if isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return None
        except h11.RemoteProtocolError as error:
            return Answer(400, f"malformed body: {error}")
        return await loop.run_in_executor(self.pool, self.accept, ticket, bytes(body))

    async def _next(self, connection: h11.Connection, reader: asyncio.StreamReader, limit: int) -> Any:
        """The next h11 event, reading no more than `limit` bytes for it (HeadTooLarge past that)."""
        while True:
            event = connection.next_event()
            if event is not h11.NEED_DATA:
                return event
            if limit <= 0:
                raise HeadTooLarge
            data = await reader.read(min(4096, limit))
            if not data:
                raise ConnectionError("the client closed the connection")
            limit -= len(data)
            connection.receive_data(data)

    async def _answer(self, writer: asyncio.StreamWriter, answer: Answer, linger: asyncio.StreamReader | None) -> None:
        metrics.REQUESTS.labels(port=self.name, code=str(answer.status)).inc()
        with contextlib.suppress(ConnectionError, OSError):
            writer.write(answer.encode())
            await writer.drain()
            if linger is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drain(writer, linger), self.limits.linger_seconds)
        writer.close()

    async def _drain(self, writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
        """Half-close, then read and drop what the client still sends, up to linger_bytes: closing with unread data
        would reset the connection, and the client could lose the answer."""
        if writer.can_write_eof():
            writer.write_eof()
        left = self.limits.linger_bytes
        while left > 0:
            data = await reader.read(min(left, 4096))
            if not data:
                return
            left -= len(data)
