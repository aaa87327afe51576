"""The progress port against hostile and broken clients, on the real API server and real TokenReviews: each gets its
4xx within a second, the operator's memory does not grow past 50 MiB, TokenReviews stay within their budget, and a
job that loses a worker meanwhile has its replacement pods within 5 s. The numbers are printed."""

import base64
import http.client
import json
import os
import secrets
import socket
import subprocess
import threading
import time

import pytest

from kubetf.core.progress.identity import AUDIENCE
from tests.cluster.fixture import wait_for

from .conftest import TEST_FLAGS, UNSCHEDULED, Operator, free_port
from .test_progress import running_job, token_for

pytestmark = pytest.mark.integration

GIB = 1 << 30


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        lines = status.read().splitlines()
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def answer(sock: socket.socket) -> int:
    """The HTTP status the server answered on this connection (0: it closed without one)."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def raw_post(port: int, length: str | None, body: bytes = b"", token: str = "x") -> tuple[int, float]:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        head = ["POST /v1/progress HTTP/1.1", "Host: kubetf", f"Authorization: Bearer {token}"]
        if length is not None:
            head.append(f"Content-Length: {length}")
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return answer(sock), time.monotonic() - started


def stream_after_negative_length(port: int) -> tuple[int, float, int]:
    """`Content-Length: -1`, then 1 GiB as fast as the socket takes it: (status, seconds to it, bytes sent)."""
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"POST /v1/progress HTTP/1.1\r\nHost: kubetf\r\nContent-Length: -1\r\n\r\n")
    sent = [0]
    stop = threading.Event()

    def stream() -> None:
        chunk = os.urandom(1 << 16)
        try:
            while sent[0] < GIB and not stop.is_set():
                sock.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass  # the server closed: it read at most its head and a moment's linger

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    status = answer(sock)
    took = time.monotonic() - started
    stop.set()
    streamer.join(10)
    sock.close()
    return status, took, sent[0]


def forged(pod_uid: str) -> str:
    """A JWT that claims a real pod of ours, signed by no one: only a TokenReview can refuse it."""

    def part(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    claims = {"aud": [AUDIENCE], "exp": int(time.time()) + 600, "kubernetes.io": {"pod": {"uid": pod_uid}},
              "jti": secrets.token_hex(8)}  # fmt: skip
    return f"{part({'alg': 'RS256'})}.{part(claims)}.{secrets.token_urlsafe(32)}"


def post(port: int, token: str, body: bytes = b'{"epoch": 1}', source: str = "127.0.0.1") -> int:
    """A report with this token, from the address `source` (the loopback's 127.0.0.0/8: an attacker of its own, as a
    pod has its own address, each with its share of the port's connections)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        connection.request("POST", "/v1/progress", body=body, headers={"Authorization": f"Bearer {token}"})
        return connection.getresponse().status
    finally:
        connection.close()


def test_hostile_clients_get_4xx_at_once_cost_little_and_a_restart_meanwhile_goes_on(cluster, namespace, operator):
    port, pid = operator.progress_port, operator.process.pid
    victim = running_job(cluster, namespace, "victim")
    other = running_job(cluster, namespace, "other")
    chief_token = token_for(cluster, namespace, victim["victim-chief-0"])
    assert post(port, chief_token) == 204  # the job's own pod is heard
    rss_before = rss_mib(pid)
    reviews_before = operator.metric_total("kubetf_progress_token_reviews_total", exclude={"result": "over budget"})
    timings: dict[str, float] = {}

    # -- bad lengths: each refused before a byte of its body is read
    status, took, sent = stream_after_negative_length(port)
    assert status == 400 and took < 1.0, (status, took)
    timings[f"Content-Length -1 then 1 GiB (the client got {sent >> 20} MiB out before the close)"] = took
    for length, expected in ((None, 411), ("abc", 400), ("99999999", 413)):
        status, took = raw_post(port, length)
        assert status == expected and took < 1.0, (length, status, took)
        timings[f"Content-Length {length}"] = took

    # -- the attack, in the background, each from addresses of its own: 500 idle half-open connections, 3,000 random
    # tokens, forged ones
    idle_answers: list[tuple[int, float]] = []
    random_answers: list[int] = []
    forged_answers: list[int] = []
    stop = threading.Event()

    def idle_connections() -> None:
        sources = [f"127.0.1.{n}" for n in range(1, 11)]  # 50 from each: within an address's share
        sockets = [socket.create_connection(("127.0.0.1", port), 5, (sources[n % 10], 0)) for n in range(500)]
        opened = time.monotonic()
        for sock in sockets:
            sock.sendall(b"POST /v1/progress HTTP/1.1\r\n")  # half a request, never finished
        for sock in sockets:
            idle_answers.append((answer(sock), time.monotonic() - opened))
            sock.close()

    def random_tokens() -> None:
        for _ in range(3000):  # as fast as one client can
            random_answers.append(post(port, secrets.token_urlsafe(600), source="127.0.2.1"))

    def forged_tokens() -> None:
        """Forged tokens from 8 clients at once: more new tokens a second than the TokenReview budget allows (one
        client waits for each review, and a review takes longer than the budget's 20 ms)."""
        pod_uid = other["other-chief-0"]["metadata"]["uid"]  # a pod that stays: the victim's are replaced meanwhile
        while not stop.is_set() and len(forged_answers) < 1000:
            forged_answers.append(post(port, forged(pod_uid), source="127.0.3.1"))

    attackers = [threading.Thread(target=f, daemon=True) for f in (idle_connections, random_tokens)]
    attackers += [threading.Thread(target=forged_tokens, daemon=True) for _ in range(8)]
    attack_started = time.monotonic()
    for thread in attackers:
        thread.start()

    # -- meanwhile a worker of the victim is lost: its group's replacement pods within 5 s
    wait_for(lambda: len(random_answers) > 200, 30, "the attack under way")
    before = {p["metadata"]["uid"] for p in cluster.live_pods(namespace, "victim").values()}
    lost = time.monotonic()
    cluster.delete_pod(victim["victim-worker-1"])
    cluster.wait_pods(
        namespace, "victim", lambda pods: len(pods) == 3 and not {p["metadata"]["uid"] for p in pods.values()} & before,
        "the group's 3 replacement pods", timeout=30,
    )  # fmt: skip
    timings["worker lost -> replacements created (under attack)"] = replaced = time.monotonic() - lost

    for thread in attackers[:2]:
        thread.join(300)
    stop.set()
    for thread in attackers[2:]:
        thread.join(60)
    attack_seconds = time.monotonic() - attack_started

    # -- a pod named like one of the job's, not owned by it; a pod of another job of the namespace
    stranger = {
        "metadata": {
            "name": "victim-worker-7",
            "labels": {
                "app.kubernetes.io/managed-by": "kubetf",
                "kubetf.io/job-name": "victim",
                "kubetf.io/role": "worker",
                "kubetf.io/index": "7",
            },
        },
        "spec": {"schedulerName": UNSCHEDULED, "containers": [{"name": "tensorflow", "image": "example/x:1"}]},
    }
    made = cluster.raw(cluster.core.create_namespaced_pod(namespace, stranger, _preload_content=False))
    stranger_token = token_for(cluster, namespace, made)
    status = wait_for(lambda: (s := post(port, stranger_token)) in (401, 403) and s, 10, "the stranger refused")
    assert status == 403
    other_token = token_for(cluster, namespace, other["other-chief-0"])
    assert post(port, other_token, b'{"epoch": 3, "epochs": 4}') == 204
    wait_for(lambda: (cluster.status(namespace, "other").get("progress") or {}).get("epoch") == 3, 10, "other's own")
    assert (cluster.status(namespace, "victim").get("progress") or {}).get("epoch") in (None, 1)

    rss_after = rss_mib(pid)
    reviews = operator.metric_total("kubetf_progress_token_reviews_total", exclude={"result": "over budget"})
    reviews_made = reviews - reviews_before
    slow_idle = max(t for _, t in idle_answers)
    print(
        f"\nprogress port under attack ({attack_seconds:.1f} s): RSS {rss_before:.0f} -> {rss_after:.0f} MiB; "
        f"{len(random_answers)} random tokens answered {sorted(set(random_answers))}; {len(forged_answers)} forged "
        f"tokens answered {sorted(set(forged_answers))}, {reviews_made:.0f} TokenReviews made (budget 50/s, burst "
        f"100); 500 idle connections answered {sorted({s for s, _ in idle_answers})} within {slow_idle:.2f} s"
    )
    for what, seconds in timings.items():
        print(f"  {what}: {seconds:.3f} s")

    assert set(random_answers) == {401}  # junk costs no TokenReview: refused on what it claims
    assert set(forged_answers) <= {401, 429} and 429 in forged_answers
    assert reviews_made <= 100 + 50 * attack_seconds + 5  # the budget: a burst, then its rate
    assert {s for s, _ in idle_answers} == {408} and slow_idle < 1.0 + 1.0
    assert rss_after - rss_before < 50, (rss_before, rss_after)
    assert replaced < 5.0, replaced


def test_curl_sending_a_report_with_expect_100_continue_is_answered_204_at_once(cluster, namespace, operator, tmp_path):
    """A client that sends `Expect: 100-continue` (curl before 7.68 for any body over 1 KiB, and since then over 1 MiB
    or when told to, as here; other HTTP clients too) waits up to a second for the `100 Continue` before it sends the
    body: it gets one at once, and the body's deadline runs from the admission, not from the connection."""
    pods = running_job(cluster, namespace, "curl")
    token = token_for(cluster, namespace, pods["curl-chief-0"])
    big = tmp_path / "big.json"
    metrics = {f"validation_metric_{i}": i / 7 for i in range(32)}
    big.write_text(json.dumps({"epoch": 1, "epochs": 4, "metrics": metrics}))
    assert big.stat().st_size > 1024
    result = subprocess.run(
        ["curl", "-sS", "-v", "-o", "/dev/null", "-w", "%{http_code} %{time_total}",
         "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
         "-H", "Expect: 100-continue", "-d", f"@{big}",
         f"http://127.0.0.1:{operator.progress_port}/v1/progress"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    code, took = result.stdout.split()
    print(f"\ncurl -d @big.json ({big.stat().st_size} bytes): {code} in {float(took):.3f} s")
    assert "< HTTP/1.1 100" in result.stderr, result.stderr
    assert code == "204", result.stderr
    assert float(took) < 1.0  # curl would send the body after a second without the 100 Continue (then: 408)


@pytest.fixture
def patient_operator(cluster, operator, tmp_path):
    """In place of this worker's operator for one test, the same but waiting 60 s for a request's head (the default
    1 s): connections held open stay open while the test looks at them, however busy the machine is."""
    operator.stop()  # gives the lease up: the patient one takes it at once
    patient = Operator(cluster.kubeconfig, tmp_path / "patient-operator.log", metrics_port=free_port(),
                       flags=(*TEST_FLAGS, "--http-read-timeout", "60"))  # fmt: skip
    patient.start()
    try:
        yield patient
    finally:
        patient.stop()
        operator.start()


def test_a_client_past_its_share_of_connections_reads_503_with_retry_after_not_a_reset(patient_operator):
    """One address may hold 64 connections to the progress port (--http-connections-per-peer); the next one is
    answered 503 with Retry-After, and the client that sends its body in a second write reads that answer."""
    operator = patient_operator
    port = operator.progress_port
    statuses = []
    for _ in range(10):
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(64)]
        try:
            wait_for(
                lambda: operator.metric_total("kubetf_http_connections", only={"port": "progress"}) >= 64,
                5,
                "the 64 connections accepted",
            )
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"POST /v1/progress HTTP/1.1\r\nHost: kubetf\r\nContent-Length: 2000\r\n\r\n")
                time.sleep(0.01)  # the body in a second write, as a client that sends its head first does
                sock.sendall(b"x" * 2000)
                data = b""
                while chunk := sock.recv(4096):  # a reset raises here
                    data += chunk
            statuses.append(int(data.split(b" ", 2)[1]))
            assert b"\r\nRetry-After: 1\r\n" in data, data
        finally:
            for sock in held:
                sock.close()
        # The next round's 64 are counted only once the server has seen these go.
        wait_for(lambda: operator.metric_total("kubetf_http_connections", only={"port": "progress"}) == 0, 10,
                 "the 64 connections closed")  # fmt: skip
    assert statuses == [503] * 10
