"""The operator's HTTP server (kubetf.runtime.server) on loopback: what a hostile or broken client can make it hold
(bytes, time, connections, threads, memory) and that each gets its answer without the body being read; what a real
client meets (Expect: 100-continue, a 503 before it sent its body)."""

import asyncio
import gc
import socket
import threading
import time

import pytest

from kubetf.runtime.server import DEFER_ACCEPT, Answer, Head, Limits, Server, Slow, Wait

pytestmark = pytest.mark.unit


class Recorder:
    """admit: a ticket for `Authorization: ok`, else 401; accept: 204. Records what reached them."""

    def __init__(self) -> None:
        self.heads: list[Head] = []
        self.bodies: list[bytes] = []

    def admit(self, head: Head):
        self.heads.append(head)
        return "ticket" if head.headers.get("authorization") == "ok" else Answer(401, "no")

    def accept(self, ticket, body: bytes) -> Answer:
        self.bodies.append(body)
        return Answer(204)


@pytest.fixture
def served():
    recorder = Recorder()
    server = Server(0, recorder.admit, recorder.accept, Limits(max_connections=20, read_timeout=0.5), host="127.0.0.1")
    server.start()
    yield server, recorder
    server.stop()


def connect(server: Server, peer: str = "127.0.0.1") -> socket.socket:
    """A connection from `peer` (any address of 127.0.0.0/8: each is a peer of its own)."""
    return socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(peer, 0))


def answer_of(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the whole answer, read until the server closes."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def until(condition, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def request(server: Server, head: bytes, body: bytes = b"") -> tuple[int, bytes, float]:
    started = time.monotonic()
    with connect(server) as sock:
        sock.sendall(head + body)
        status, data = answer_of(sock)
    return status, data, time.monotonic() - started


def post(length: str | None, authorization: str = "ok", extra: str = "") -> bytes:
    lines = ["POST /v1/progress HTTP/1.1", "Host: kubetf", f"Authorization: {authorization}"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + extra + "\r\n\r\n").encode()


def test_a_good_report_reaches_admit_then_accept(served):
    server, recorder = served
    status, data, _ = request(server, post("2"), b"{}")
    assert status == 204 and b"Connection: close" in data
    assert recorder.bodies == [b"{}"] and recorder.heads[0].length == 2


@pytest.mark.parametrize(
    "length,status",
    [("-1", 400), ("abc", 400), ("1e3", 400), (None, 411), ("20000", 413)],
)
def test_a_bad_or_oversized_length_is_refused_before_any_body_is_read(served, length, status):
    server, recorder = served
    got, data, took = request(server, post(length))
    assert got == status and took < 1.0
    assert recorder.bodies == []  # nothing read, nothing accepted
    if status == 413:
        assert b"at most 16384 bytes" in data


def test_a_client_streaming_a_gigabyte_after_a_negative_length_gets_its_answer_and_costs_nothing():
    recorder = Recorder()
    server = Server(0, recorder.admit, recorder.accept, Limits(read_timeout=0.5), host="127.0.0.1").start()
    try:
        with connect(server) as sock:
            sock.sendall(post("-1"))
            stop = threading.Event()

            def stream() -> None:
                chunk = b"x" * 65536
                try:
                    for _ in range(16384):  # 1 GiB
                        if stop.is_set():
                            return
                        sock.sendall(chunk)
                except OSError:
                    return  # the server closed: what the server read of it was at most its linger

            threading.Thread(target=stream, daemon=True).start()
            status, _ = answer_of(sock)
            stop.set()
        assert status == 400
        assert recorder.heads == [] and recorder.bodies == []
    finally:
        server.stop()


def test_chunked_bodies_are_refused(served):
    server, _ = served
    assert request(server, post(None, extra="\r\nTransfer-Encoding: chunked"))[0] == 411


def test_a_head_larger_than_its_limit_is_refused(served):
    server, recorder = served
    status, _, _ = request(server, post("2", extra="\r\nX-Junk: " + "a" * 10_000))
    assert status == 431 and recorder.heads == []


def test_the_body_is_read_only_once_the_head_is_admitted(served):
    server, recorder = served
    status, _, _ = request(server, post("2", authorization="stranger"), b"{}")
    assert status == 401 and recorder.bodies == []


def test_an_idle_or_trickling_connection_is_answered_408_at_the_deadline(served):
    server, _ = served
    started = time.monotonic()
    with connect(server) as trickle:
        trickle.sendall(b"POST /v1/progress HTTP/1.1\r\n")  # a head that never ends
        assert answer_of(trickle)[0] == 408
    assert time.monotonic() - started < 0.5 + 0.5  # the deadline, and half a second
    started = time.monotonic()
    with connect(server) as idle:  # nothing sent: the kernel holds it for DEFER_ACCEPT, then the deadline runs
        assert answer_of(idle)[0] == 408
    assert time.monotonic() - started < DEFER_ACCEPT + 0.5 + 1.0


def test_a_body_shorter_than_its_length_is_answered_408_at_the_deadline(served):
    server, recorder = served
    with connect(server) as sock:
        sock.sendall(post("100") + b"{}")
        assert answer_of(sock)[0] == 408
    assert recorder.bodies == []


def test_connections_beyond_the_limit_are_answered_503_at_once_and_the_rest_served(served):
    server, _ = served
    idle = [connect(server, f"127.0.0.{2 + i}") for i in range(20)]  # the limit, from as many peers
    try:
        until(lambda: server.open == 20)  # all accepted before the next one comes
        status, data, took = request(server, post("2"), b"{}")
        assert status == 503 and b"Retry-After: 1" in data and took < 0.5
    finally:
        for sock in idle:
            sock.close()
    until(lambda: server.open == 0)  # the idle ones are answered 408 and closed: room again
    assert request(server, post("2"), b"{}")[0] == 204


def serve(admit=None, accept=None, trusted=lambda peer: False, **limits) -> Server:
    recorder = Recorder()
    limits.setdefault("read_timeout", 0.5)
    server = Server(
        0, admit or recorder.admit, accept or recorder.accept, Limits(**limits), host="127.0.0.1", trusted=trusted
    )
    return server.start()


def test_one_peer_gets_its_share_of_the_connections_and_the_others_theirs():
    server = serve(max_connections=20, per_peer=4)
    try:
        hog = [connect(server, "127.0.0.2") for _ in range(4)]
        until(lambda: server.open == 4)
        status, data, _ = request_from(server, "127.0.0.2", post("2"), b"{}")
        assert status == 503 and b"more than 4 connections at once from 127.0.0.2" in data
        assert b"Retry-After: 1" in data
        assert request_from(server, "127.0.0.3", post("2"), b"{}")[0] == 204  # another peer: served
        for sock in hog:
            sock.close()
    finally:
        server.stop()


def request_from(server: Server, peer: str, head: bytes, body: bytes = b"") -> tuple[int, bytes, float]:
    started = time.monotonic()
    with connect(server, peer) as sock:
        sock.sendall(head + body)
        status, data = answer_of(sock)
    return status, data, time.monotonic() - started


def test_the_reserved_connections_are_kept_for_trusted_peers():
    server = serve(max_connections=8, per_peer=8, reserved=4, trusted=lambda peer: peer == "127.0.0.9")
    try:
        crowd = [connect(server, "127.0.0.2") for _ in range(4)]  # all but the reserved ones
        until(lambda: server.open == 4)
        assert request_from(server, "127.0.0.3", post("2"), b"{}")[0] == 503  # a stranger: no room for it
        assert request_from(server, "127.0.0.9", post("2"), b"{}")[0] == 204  # a peer heard before: its room
        for sock in crowd:
            sock.close()
    finally:
        server.stop()


def test_a_refused_client_that_sends_its_body_in_a_second_write_reads_its_503_not_a_reset():
    server = serve(max_connections=20, per_peer=1)
    try:
        with connect(server, "127.0.0.2"):
            until(lambda: server.open == 1)
            for _ in range(20):
                with connect(server, "127.0.0.2") as sock:
                    sock.sendall(post("2000"))
                    time.sleep(0.01)  # the body in a second write, as a client that sends its head first
                    sock.sendall(b"x" * 2000)
                    status, data = answer_of(sock)
                assert status == 503 and b"Retry-After: 1" in data
    finally:
        server.stop()


def test_past_the_refusals_it_can_answer_a_connection_is_closed_unanswered_and_counted():
    server = serve(max_connections=1, per_peer=1, refusing=2, refusing_per_peer=2, linger_seconds=2.0)
    try:
        with connect(server, "127.0.0.2"):
            until(lambda: server.open == 1)
            lingering = [connect(server, "127.0.0.3") for _ in range(2)]  # refused, and kept lingering
            until(lambda: server.refusals.total == 2)
            with connect(server, "127.0.0.3") as third, pytest.raises(ConnectionResetError):
                third.recv(100)  # reset without an answer
            for sock in lingering:
                assert answer_of(sock)[0] == 503
                sock.close()
    finally:
        server.stop()


def test_a_client_that_does_not_read_its_answer_is_closed_at_the_write_deadline():
    page = b"x" * (32 << 20)  # more than the socket buffers on both sides hold

    def admit(head: Head) -> Answer:
        return Answer(200, content=page)

    server = serve(admit=admit, write_timeout=0.5)
    try:
        started = time.monotonic()
        with connect(server) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            until(lambda: server.open == 0, timeout=5)  # never read: closed
        assert time.monotonic() - started < 0.5 + 1.0
    finally:
        server.stop()


def test_expect_100_continue_is_answered_and_the_body_has_its_deadline_from_the_admission():
    def slow_admit(head: Head):
        return Slow(lambda: time.sleep(0.4) or "ticket")  # a review that takes a while

    server = serve(admit=slow_admit, read_timeout=0.5)
    try:
        with connect(server) as sock:
            sock.sendall(post("2", extra="\r\nExpect: 100-continue"))
            interim = sock.recv(100)  # curl waits for this (up to 1 s) before it sends a body over 1 KiB
            assert interim == b"HTTP/1.1 100 \r\n\r\n" or interim.startswith(b"HTTP/1.1 100 Continue")
            time.sleep(0.3)  # 0.7 s after the connection: past its deadline, within the body's own
            sock.sendall(b"{}")
            assert answer_of(sock)[0] == 204
    finally:
        server.stop()


def test_a_refused_head_gets_its_answer_and_no_100_continue():
    server = serve()
    try:
        with connect(server) as sock:
            sock.sendall(post("2", authorization="stranger", extra="\r\nExpect: 100-continue"))
            status, data = answer_of(sock)
        assert status == 401 and b" 100 " not in data
    finally:
        server.stop()


def test_work_that_waits_on_the_api_server_never_holds_up_a_request_that_does_not():
    release = threading.Event()

    def admit(head: Head):
        if head.headers.get("authorization") == "new":
            return Slow(lambda: release.wait(5) and "ticket")  # a TokenReview the API server is slow to answer
        return "ticket"

    server = serve(admit=admit, threads=1, slow_threads=1, read_timeout=5)
    try:
        waiting = [connect(server, f"127.0.0.{2 + i}") for i in range(3)]
        for sock in waiting:
            sock.sendall(post("2", authorization="new") + b"{}")
        status, _, took = request(server, post("2"), b"{}")  # a reporter already reviewed
        assert status == 204 and took < 0.5
        release.set()
        assert [answer_of(sock)[0] for sock in waiting] == [204, 204, 204]
        for sock in waiting:
            sock.close()
    finally:
        server.stop()


def test_what_a_request_waits_for_is_cancelled_when_its_client_goes_away():
    cancelled = threading.Event()

    async def forever() -> Answer:
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()
        return Answer(200)

    server = serve(admit=lambda head: Wait(forever))
    try:
        with connect(server) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            until(lambda: server.open == 1)
        assert cancelled.wait(2)
        until(lambda: server.open == 0)
    finally:
        server.stop()


def test_a_closed_connection_leaves_nothing_for_the_garbage_collector_whatever_its_end():
    """What a connection held goes when it closes, by reference counting alone: the operator freezes its heap
    (kubetf.runtime.heap), so a reference cycle it left would be kept for minutes, and a flood of connections grew
    the operator by hundreds of MiB (Python 3.11's asyncio transports leave one of about 2 KiB each)."""
    server = serve(max_connections=4, per_peer=2, refusing_per_peer=64, read_timeout=0.2, write_timeout=0.2)
    page = b"x" * (8 << 20)

    def kinds() -> None:
        request(server, post("2"), b"{}")  # taken
        request(server, post("2", authorization="stranger"), b"{}")  # refused from its head
        with connect(server) as sock:  # a head that never ends: answered at its deadline
            sock.sendall(b"POST /v1/progress HTTP/1.1\r\n")
            answer_of(sock)
        with connect(server) as sock:  # gone before its head ended
            sock.sendall(b"POST /v1/pro")
        with connect(server, "127.0.0.2") as one, connect(server, "127.0.0.2") as two:  # past its peer's share
            for sock in (one, two):
                sock.sendall(b"POST /v1/progress HTTP/1.1\r\n")  # seen at once (an idle one waits in the kernel)
            until(lambda: server.open == 2)
            request_from(server, "127.0.0.2", post("2"), b"{}")
            one.close()
            two.close()

    kinds()  # whatever the first connections make once (h11's and asyncio's caches)
    until(lambda: server.open == 0)
    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            kinds()
        until(lambda: server.open == 0 and server.refusals.total == 0)
        assert gc.collect() == 0
    finally:
        gc.enable()
    del page
