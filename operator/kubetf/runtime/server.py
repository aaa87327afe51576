"""The operator's one HTTP server, for each of its ports (progress reports, /metrics, /healthz): bounded HTTP/1.1
for small requests, a POST with a Content-Length or a GET. The transport only: what a request must be to be taken
is the caller's (`admit` for the head, `accept` for the body).

Every resource a client can make it hold is bounded, and it refuses before it reads:
- connections: at most `max_connections` at once, at most `per_peer` from one address (a pod has one), and the last
  `reserved` of them only for peers `trusted` says were heard lately (the progress port: reporters whose token was
  reviewed). A connection past a limit is answered 503 with `Retry-After` at once, then lingers (below) so that the
  client reads it rather than a reset; at most `refusing` connections (`refusing_per_peer` from one address) are
  being refused at once, past that one is closed unanswered;
- time: a connection that has sent nothing is seen only DEFER_ACCEPT seconds later (the kernel holds it); the
  request's line and headers must arrive within `read_timeout` of its acceptance, its body within `read_timeout` of
  its admission (after a `100 Continue` when the client asked for one, as curl does when told to or for large
  bodies), else 408; the answer must be taken within `write_timeout`, else the connection is reset. No client holds
  anything for long, a slow reader no more than an idle one;
- the head: at most `max_head` bytes (431); its framing parsed by h11 (a missing, negative or non-integer
  Content-Length, chunked bodies, bad syntax: 411 or 400; a GET or HEAD has no body);
- the body: declared longer than `max_body`: 413 before a byte of it is read; read up to its length and no further,
  and only once `admit` accepted the head (who sends it, for which job);
- threads: `admit` and `accept` run on a pool of `threads`; what they hand back as `Slow` (it may wait on the API
  server) on another of `slow_threads`, so a request that needs no API call never waits behind one that does;
- buffers: the server reads into buffers of at most 4 KiB and writes each answer straight from its bytes (a
  /metrics page shared by every scrape is never copied per connection).
One request per connection (the answer says `Connection: close`). After a refusal the connection lingers a
moment, reading and dropping what the client still sends (at most `linger_bytes`), so the client reads the answer
instead of a reset. The server runs its own event loop on its own thread, on plain sockets (asyncio's `sock_*`
calls): nothing it does can block kopf's, and a closed connection leaves no reference cycle behind (Python 3.11's
asyncio transports do, about 2 KiB each, which the operator's frozen heap (runtime.heap) would keep).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11

from kubetf.cluster import metrics

log = logging.getLogger("kubetf.server")

READ_CHUNK = 4096
SMALL_ANSWER = 16 * 1024  # an answer up to this size goes out in one send, its head and body together
ACCEPT_BATCH = 256  # connections taken from the listener before the requests under way get a turn
# Seconds a connection that has sent nothing waits in the kernel before the server sees it (Linux's
# TCP_DEFER_ACCEPT, nginx's `deferred`): a client that speaks first (every HTTP client) is seen at once; one that
# only connects costs the operator nothing for that long, so a pod that holds idle connections and opens another as
# each is closed opens about as many a second as it holds, where it opened 15,000 a second on this machine.
DEFER_ACCEPT = 1


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

    def body(self) -> bytes:
        return json.dumps({"error": self.error}).encode() if self.error else self.content

    def head(self, length: int) -> bytes:
        reason = HTTPStatus(self.status).phrase
        headers = [f"HTTP/1.1 {self.status} {reason}", f"Content-Length: {length}", "Connection: close"]
        if length:
            headers.append(f"Content-Type: {'application/json' if self.error else self.content_type}")
        if self.retry_after is not None:
            headers.append(f"Retry-After: {self.retry_after}")
        return ("\r\n".join(headers) + "\r\n\r\n").encode()

    def encode(self) -> bytes:
        body = self.body()
        return self.head(len(body)) + body


@dataclass(frozen=True)
class Slow:
    """What `admit` or `accept` hands back when the rest may wait on the API server: `work()` runs on the port's
    slow pool, and its result stands for theirs (an Answer, or from `admit` a ticket)."""

    work: Callable[[], Any]


@dataclass(frozen=True)
class Wait:
    """What `admit` hands back to answer with something shared that is not ready yet (a /metrics page being built):
    `answer()` is awaited on the server's event loop, and cancelled when the client goes away meanwhile."""

    answer: Callable[[], Awaitable[Answer]]


@dataclass(frozen=True)
class Head:
    """A request's line and headers (names lower-case), its body's declared length, and the peer's address."""

    method: str
    target: str
    headers: dict[str, str]
    length: int
    peer: str = ""


@dataclass(frozen=True)
class Limits:
    max_connections: int = 1024
    per_peer: int = 64
    reserved: int = 0  # of max_connections, only for peers `trusted` says were heard lately
    refusing: int = 256
    refusing_per_peer: int = 8
    read_timeout: float = 1.0
    write_timeout: float = 5.0
    max_head: int = 8 * 1024
    max_body: int = 16 * 1024
    threads: int = 2
    slow_threads: int = 2
    linger_seconds: float = 0.5
    linger_bytes: int = 64 * 1024
    # Connections the kernel holds for the server to take (at most net.core.somaxconn): past it, a connecting client's
    # SYN is dropped and it tries again a second later. A flood fills it while the server thread waits for the CPU.
    backlog: int = 4096


class _Counts:
    """Connections by peer address: an entry only while it has some (bounded by the connections themselves)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_peer: dict[str, int] = {}

    def of(self, peer: str) -> int:
        return self.by_peer.get(peer, 0)

    def add(self, peer: str) -> None:
        self.total += 1
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1

    def remove(self, peer: str) -> None:
        self.total -= 1
        left = self.by_peer[peer] - 1
        if left:
            self.by_peer[peer] = left
        else:
            del self.by_peer[peer]


@dataclass
class Server:
    """`admit(head)` answers a request from its head alone, or returns a ticket (anything but an `Answer`, `Slow` or
    `Wait`) to read its body for; `accept(ticket, body)` answers it. `trusted(peer)`: whether a peer address may use
    the reserved connections."""

    port: int
    admit: Callable[[Head], Any]
    accept: Callable[[Any, bytes], Any]
    limits: Limits = field(default_factory=Limits)
    host: str = "0.0.0.0"
    name: str = "http"
    trusted: Callable[[str], bool] = lambda peer: False

    def __post_init__(self) -> None:
        self.connections = _Counts()  # being served
        self.refusals = _Counts()  # being answered 503 and closed
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=self.limits.threads, thread_name_prefix=f"kubetf-{self.name}")
        self.slow_pool = ThreadPoolExecutor(
            max_workers=self.limits.slow_threads, thread_name_prefix=f"kubetf-{self.name}-slow"
        )
        self.listener: socket.socket | None = None
        self.tasks: set[asyncio.Task[None]] = set()  # the connections' (a task with no reference may be collected)
        self.error: BaseException | None = None

    @property
    def open(self) -> int:
        """Connections being served (not those being refused)."""
        return self.connections.total

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Server:
        """Listen (on its own thread); returns once the port is bound, raising what kept it from binding."""
        threading.Thread(target=self._run, name=f"kubetf-{self.name}-server", daemon=True).start()
        self.ready.wait()
        if self.error is not None:
            raise self.error
        return self

    def _run(self) -> None:
        loop = self.loop = asyncio.new_event_loop()
        try:
            listener = self.listener = socket.create_server((self.host, self.port), backlog=self.limits.backlog)
            listener.setblocking(False)
            if hasattr(socket, "TCP_DEFER_ACCEPT"):  # Linux
                listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT)
            self.port = listener.getsockname()[1]
        except BaseException as error:
            self.error = error
            self.ready.set()
            return
        self.ready.set()
        loop.add_reader(listener, self._acceptable, loop, listener)
        try:
            loop.run_forever()
        finally:  # stopped: every connection closed, then the port
            loop.remove_reader(listener)
            tasks = list(self.tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks))
            listener.close()
            loop.close()

    def stop(self) -> None:
        loop = self.loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # stopped before
            loop.call_soon_threadsafe(loop.stop)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.slow_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ connections

    def _acceptable(self, loop: asyncio.AbstractEventLoop, listener: socket.socket) -> None:
        """The listener has connections waiting: take them (ACCEPT_BATCH at most, then the requests under way run),
        each served, refused or dropped at once."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of file descriptors, say: the backlog holds the next ones meanwhile
                log.warning("the %s port could not accept a connection: %s", self.name, error)
                loop.remove_reader(listener)
                loop.call_later(0.1, loop.add_reader, listener, self._acceptable, loop, listener)
                return
            self._take(loop, sock, str(address[0]))

    def _take(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, peer: str) -> None:
        refusal = self._refusal(peer)
        if refusal is None:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connections.add(peer)
            metrics.CONNECTIONS.labels(port=self.name).set(self.connections.total)
            self._spawn(loop, self._serve(sock, peer, loop.time()))
        elif self.refusals.total < self.limits.refusing and self.refusals.of(peer) < self.limits.refusing_per_peer:
            sock.setblocking(False)
            self.refusals.add(peer)
            self._spawn(loop, self._refuse(sock, peer, refusal))
        else:
            metrics.CLOSED.labels(port=self.name, reason="unanswered").inc()
            _abort(sock)

    def _refusal(self, peer: str) -> Answer | None:
        """Why a new connection from `peer` is refused now (None: it is served)."""
        limits = self.limits
        if self.connections.of(peer) >= limits.per_peer:
            return Answer(503, f"more than {limits.per_peer} connections at once from {peer}: retry", retry_after=1)
        room = limits.max_connections - (0 if limits.reserved == 0 or self.trusted(peer) else limits.reserved)
        if self.connections.total >= room:
            return Answer(503, "too many connections: retry", retry_after=1)
        return None

    def _spawn(self, loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]) -> None:
        task = loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _refuse(self, sock: socket.socket, peer: str, answer: Answer) -> None:
        try:
            await self._answer(sock, answer, linger=True)
        finally:
            sock.close()
            self.refusals.remove(peer)

    async def _serve(self, sock: socket.socket, peer: str, accepted: float) -> None:
        try:
            try:
                answer = await self._request(sock, peer, accepted)
            except TimeoutError:
                answer = Answer(408, f"the request did not arrive within {self.limits.read_timeout:g}s")
            except (ConnectionError, h11.RemoteProtocolError):
                answer = None  # the client went away, or sent a second request: no one to answer
            except Exception:
                log.exception("a request to the %s port failed", self.name)
                answer = Answer(500, "the operator failed to handle the request: retry")
            if answer is not None:
                await self._answer(sock, answer, linger=answer.status >= 400)
        finally:
            sock.close()
            self.connections.remove(peer)
            metrics.CONNECTIONS.labels(port=self.name).set(self.connections.total)

    # ------------------------------------------------------------------ a request

    async def _request(self, sock: socket.socket, peer: str, accepted: float) -> Answer | None:
        """Read the head within `read_timeout` of the acceptance, the body within `read_timeout` of its admission
        (TimeoutError past either); the caller's `admit` and `accept` are not the client's time."""
        loop = asyncio.get_running_loop()
        limits = self.limits
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head)
        try:
            async with asyncio.timeout_at(accepted + limits.read_timeout):
                event = await self._next(connection, sock, limits.max_head)
        except h11.RemoteProtocolError as error:
            return Answer(error.error_status_hint or 400, f"malformed request: {error}")
        except HeadTooLarge:
            return Answer(431, f"the request's line and headers are more than {limits.max_head} bytes")
        if not isinstance(event, h11.Request):
            return None
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in event.headers}
        method = event.method.decode("latin-1")
        if method in ("GET", "HEAD") and "transfer-encoding" not in headers:
            length = int(headers.get("content-length", "0"))
        elif "transfer-encoding" in headers or "content-length" not in headers:
            return Answer(411, f"send a Content-Length (at most {limits.max_body} bytes), not a chunked body")
        else:
            length = int(headers["content-length"])  # h11 refused any that is not a non-negative integer
        if length > limits.max_body:
            return Answer(413, f"a request body is at most {limits.max_body} bytes, this one has {length}")
        head = Head(method, event.target.decode("latin-1"), headers, length, peer)
        ticket = await self._outcome(sock, await loop.run_in_executor(self.pool, self.admit, head))
        if ticket is None or isinstance(ticket, Answer):
            return ticket
        if connection.they_are_waiting_for_100_continue:
            await self._send(sock, connection.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = bytearray()
        try:
            async with asyncio.timeout(limits.read_timeout):  # from the admission: the client had to wait for it
                while len(body) < length:
                    event = await self._next(connection, sock, length - len(body))
                    if isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return None
        except h11.RemoteProtocolError as error:
            return Answer(400, f"malformed body: {error}")
        answer = await self._outcome(sock, await loop.run_in_executor(self.pool, self.accept, ticket, bytes(body)))
        return answer if answer is None or isinstance(answer, Answer) else Answer(500, "no answer to the request")

    async def _outcome(self, sock: socket.socket, outcome: Any) -> Any:
        """What `admit` or `accept` handed back, once its slow part ran or what it waits for came; None when the
        client went away meanwhile."""
        if isinstance(outcome, Slow):
            return await asyncio.get_running_loop().run_in_executor(self.slow_pool, outcome.work)
        if not isinstance(outcome, Wait):
            return outcome
        answer = asyncio.ensure_future(outcome.answer())
        gone = asyncio.ensure_future(self._until_gone(sock))
        try:
            await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            answer.cancel()  # nothing when it is done; else its client left (or the server stops): nobody waits
        return answer.result() if answer.done() and not answer.cancelled() else None

    async def _until_gone(self, sock: socket.socket) -> None:
        """Returns when the client closes its side (or sends more than the request it may have)."""
        left = self.limits.linger_bytes
        while left > 0:
            data = await asyncio.get_running_loop().sock_recv(sock, min(left, READ_CHUNK))
            if not data:
                return
            left -= len(data)

    async def _next(self, connection: h11.Connection, sock: socket.socket, limit: int) -> Any:
        """The next h11 event, reading no more than `limit` bytes for it (HeadTooLarge past that)."""
        loop = asyncio.get_running_loop()
        while True:
            event = connection.next_event()
            if event is not h11.NEED_DATA:
                return event
            if limit <= 0:
                raise HeadTooLarge
            data = await loop.sock_recv(sock, min(READ_CHUNK, limit))
            if not data:
                raise ConnectionError("the client closed the connection")
            limit -= len(data)
            connection.receive_data(data)

    # ------------------------------------------------------------------ the answer

    async def _answer(self, sock: socket.socket, answer: Answer, linger: bool) -> None:
        metrics.REQUESTS.labels(port=self.name, code=str(answer.status)).inc()
        body = answer.body()
        head = answer.head(len(body))
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                if len(body) <= SMALL_ANSWER:
                    await self._send(sock, head + body)
                else:
                    await self._send(sock, head)
                    await self._send(sock, body)
                if linger:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.limits.linger_seconds):
                            await self._linger(sock)
        except TimeoutError:
            metrics.CLOSED.labels(port=self.name, reason="write timeout").inc()
            _abort(sock)
        except OSError:
            pass  # the client went away: nothing more to say

    async def _send(self, sock: socket.socket, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(sock, data)

    async def _linger(self, sock: socket.socket) -> None:
        """Half-close, then read and drop what the client still sends, up to linger_bytes: closing with unread data
        would reset the connection, and the client could lose the answer."""
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        await self._until_gone(sock)


def _abort(sock: socket.socket) -> None:
    """Close with a reset: what the kernel still held to send (an answer the client never took) goes at once, rather
    than for the minutes it would keep trying to deliver it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
