"""What a tenant's pod can throw at the operator's ports: run inside a pod (standard library only, `python3 -c` this
file's text), one attack per run, and one line of JSON at the end saying what it met.

    python3 attacker.py slow-readers|idle|forged

Settings from the environment: TARGET (the operator's address), PORT, SECONDS (how long), CONNECTIONS (idle:
held at once; slow-readers: opened), RATE (forged: requests a second), THREADS (forged), POD_UID (forged: the uid
the forged tokens claim: the pod's own, the one a tenant knows).

- slow-readers: CONNECTIONS connections each send `GET /metrics` and never read; each is watched (without reading)
  until the server closes it: when, after the request was sent;
- idle: CONNECTIONS connections held open, sending nothing, each opened again as soon as the server answers or
  closes it, for SECONDS: how many were opened, and what each got (an HTTP status, a reset, a close);
- forged: THREADS threads POST reports with forged tokens (a JWT claiming POD_UID, signed by no one) at RATE a
  second in all, for SECONDS: the statuses.
"""

import base64
import collections
import json
import os
import secrets
import select
import selectors
import socket
import sys
import threading
import time

TARGET = os.environ.get("TARGET", "127.0.0.1")
PORT = int(os.environ.get("PORT", "8090"))
SECONDS = float(os.environ.get("SECONDS", "10"))
CONNECTIONS = int(os.environ.get("CONNECTIONS", "200"))
RATE = float(os.environ.get("RATE", "300"))
THREADS = int(os.environ.get("THREADS", "16"))
AUDIENCE = "kubetf.io/progress"


def status_of(data: bytes) -> str:
    return data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "closed"


def slow_readers() -> dict:
    poller = select.poll()
    sent: dict[int, float] = {}
    sockets = {}
    closed: dict[int, float] = {}
    refused = 0
    for _ in range(CONNECTIONS):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's writes block
        try:
            sock.connect((TARGET, PORT))
        except OSError:
            refused += 1
            sock.close()
            continue
        sockets[sock.fileno()] = sock
        sent[sock.fileno()] = time.monotonic()
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: kubetf\r\n\r\n")
        except OSError:  # reset before the request went out: closed by the server at once
            closed[sock.fileno()] = 0.0
            continue
        poller.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)  # never POLLIN: nothing is read
    deadline = time.monotonic() + SECONDS
    while len(closed) < len(sockets) and time.monotonic() < deadline:
        for fd, _events in poller.poll(100):
            closed[fd] = time.monotonic() - sent[fd]
            poller.unregister(fd)
    took = sorted(closed.values())
    for sock in sockets.values():
        sock.close()
    return {
        "attack": "slow-readers",
        "connections": len(sockets),
        "not connected": refused,
        "closed by the server": len(closed),
        "closed within p50": took[len(took) // 2] if took else None,
        "closed within max": took[-1] if took else None,
    }


def idle() -> dict:
    selector = selectors.DefaultSelector()
    counts: collections.Counter = collections.Counter()
    held = 0

    def open_one() -> None:
        nonlocal held
        sock = socket.socket()
        sock.setblocking(False)
        if sock.connect_ex((TARGET, PORT)) not in (0, 115):  # 115: EINPROGRESS
            counts["could not connect"] += 1
            sock.close()
            return
        selector.register(sock, selectors.EVENT_READ)
        held += 1
        counts["opened"] += 1

    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        while held < CONNECTIONS:
            open_one()
        for key, _ in selector.select(0.1):
            sock = key.fileobj
            try:
                counts[status_of(sock.recv(4096))] += 1
            except OSError:
                counts["reset"] += 1
            selector.unregister(sock)
            sock.close()
            held -= 1
    return {"attack": "idle", "held at once": CONNECTIONS, "seconds": SECONDS, **counts}


def forged_token(uid: str) -> str:
    def part(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    claims = {"aud": [AUDIENCE], "exp": int(time.time()) + 600, "kubernetes.io": {"pod": {"uid": uid}},
              "jti": secrets.token_hex(8)}  # fmt: skip
    return f"{part({'alg': 'RS256'})}.{part(claims)}.{secrets.token_urlsafe(32)}"


def forged() -> dict:
    uid = os.environ["POD_UID"]
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()
    start = time.monotonic()
    interval = THREADS / RATE  # each thread's spacing

    def run() -> None:
        due = time.monotonic()
        while (now := time.monotonic()) < start + SECONDS:
            if now < due:
                time.sleep(due - now)
            due += interval
            body = b'{"epoch": 1}'
            head = (f"POST /v1/progress HTTP/1.1\r\nHost: kubetf\r\nAuthorization: Bearer {forged_token(uid)}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
            try:
                with socket.create_connection((TARGET, PORT), timeout=10) as sock:
                    sock.sendall(head + body)
                    status = status_of(sock.recv(4096))
            except OSError as error:
                status = type(error).__name__
            with lock:
                counts[status] += 1

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - start
    return {"attack": "forged", "requests": sum(counts.values()), "per second": sum(counts.values()) / took, **counts}


if __name__ == "__main__":
    result = {"slow-readers": slow_readers, "idle": idle, "forged": forged}[sys.argv[1]]()
    print(json.dumps(result), flush=True)
