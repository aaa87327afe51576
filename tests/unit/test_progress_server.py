"""The progress endpoint's transport (kubetf.runtime.server) on loopback: what a hostile or broken client
can make it hold (bytes, time, connections) and that each gets its answer without the body being read."""

import socket
import threading
import time

import pytest

from kubetf.runtime.server import Answer, Head, Limits, Server

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


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


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
    with connect(server) as idle, connect(server) as trickle:
        trickle.sendall(b"POST /v1/progress HTTP/1.1\r\n")  # a head that never ends
        statuses = [answer_of(idle)[0], answer_of(trickle)[0]]
    assert statuses == [408, 408]
    assert time.monotonic() - started < 0.5 + 1.0  # the deadline, and a second


def test_a_body_shorter_than_its_length_is_answered_408_at_the_deadline(served):
    server, recorder = served
    with connect(server) as sock:
        sock.sendall(post("100") + b"{}")
        assert answer_of(sock)[0] == 408
    assert recorder.bodies == []


def test_connections_beyond_the_limit_are_answered_503_at_once_and_the_rest_served(served):
    server, _ = served
    idle = [connect(server) for _ in range(20)]  # the limit
    try:
        until(lambda: server.open == 20)  # all accepted before the next one comes
        status, data, took = request(server, post("2"), b"{}")
        assert status == 503 and b"Retry-After: 1" in data and took < 0.5
    finally:
        for sock in idle:
            sock.close()
    until(lambda: server.open == 0)  # the idle ones are answered 408 and closed: room again
    assert request(server, post("2"), b"{}")[0] == 204
