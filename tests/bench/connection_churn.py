"""Connection churn against the operator's HTTP server with its heap frozen as the operator's is: prints numbers,
asserts nothing, needs no cluster.

    python -m tests.bench.connection_churn [--held 1075] [--seconds 60] [--objects 60000] [--speak]

A server process runs kubetf.runtime.server on a port answering every request 401 (as the progress port answers
junk), with --objects long-lived objects (a cache's worth) and kubetf.runtime.heap's freezing started, as in the
operator. A client process holds --held idle connections to it for --seconds, opening another as each is answered
or closed (what a tenant's pod did to the leader in issue 49); with --speak each sends the start of a request at
once (the kernel then hands it to the server at once, where one that only connects waits there a second first).
Every 10 s: the server's RSS, the objects frozen, its full collections and the longest; at the end: the connections
opened and what they met, the server's CPU per 1,000 connections, and how many unreachable objects a complete
collection then finds (what freezing would have kept) and how long it took.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import selectors
import socket
import subprocess
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def serve(port_file: str, seconds: float, objects: int) -> None:
    from kubetf.runtime import heap
    from kubetf.runtime.server import Answer, Limits, Server

    ballast = [{"key": [i, str(i)], "value": {"n": i}} for i in range(objects)]
    pauses: list[float] = []
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] == 2:
            pauses.append(time.perf_counter() - started[0])

    server = Server(0, lambda head: Answer(401, "no token"), lambda ticket, body: Answer(204), Limits(),
                    host="127.0.0.1").start()  # fmt: skip
    with open(port_file, "w") as handle:
        handle.write(str(server.port))
    gc.callbacks.append(timed)
    heap.ShortFullCollections().start()
    cpu0, start = time.process_time(), time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        time.sleep(min(10.0, seconds - elapsed))
        print(json.dumps({"seconds": round(time.monotonic() - start), "rss_mib": round(rss_mib(), 1),
                          "frozen": gc.get_freeze_count(), "full_collections": len(pauses),
                          "longest_ms": round(max(pauses, default=0) * 1000, 1)}), flush=True)  # fmt: skip
    cpu = time.process_time() - cpu0
    begun = time.perf_counter()
    found = heap.collect_completely()
    print(json.dumps({"server_cpu_s": round(cpu, 2), "unreachable_found": found,
                      "complete_collection_ms": round((time.perf_counter() - begun) * 1000),
                      "rss_mib": round(rss_mib(), 1), "objects": len(ballast)}), flush=True)  # fmt: skip


def churn(port: int, held: int, seconds: float, speak: bool) -> dict:
    selector = selectors.DefaultSelector()
    counts: collections.Counter = collections.Counter()
    open_ = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        while open_ < held:
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            selector.register(sock, selectors.EVENT_WRITE if speak else selectors.EVENT_READ)
            open_ += 1
            counts["opened"] += 1
        for key, events in selector.select(0.1):
            sock = key.fileobj  # type: ignore[assignment]
            if events & selectors.EVENT_WRITE:  # connected: the first bytes of a request, then nothing more
                try:
                    sock.send(b"POST /v1/progress HTTP/1.1\r\n")
                    selector.modify(sock, selectors.EVENT_READ)
                    continue
                except OSError:
                    pass
            try:
                data = sock.recv(4096)
                counts[data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "closed"] += 1
            except OSError:
                counts["reset"] += 1
            selector.unregister(sock)
            sock.close()
            open_ -= 1
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=1075, help="idle connections held at once (default 1075)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--objects", type=int, default=60_000, help="the server's long-lived objects (default 60000)")
    parser.add_argument(
        "--speak", action="store_true", help="each connection sends the start of a request at once (not held back)"
    )
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)  # the server process's own run
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.seconds + 10, args.objects)
        return
    port_file = f"/tmp/kubetf-churn-{time.time_ns()}.port"
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.connection_churn", "--serve", port_file, "--seconds", str(args.seconds),
         "--objects", str(args.objects)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            with open(port_file) as handle:
                port = int(handle.read())
            break
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start") from None
            time.sleep(0.05)
    counts = churn(port, args.held, args.seconds, args.speak)
    lines = [json.loads(line) for line in server.communicate(timeout=120)[0].splitlines() if line.strip()]
    for line in lines[:-1]:
        print(f"  t={line['seconds']:>3}s  RSS {line['rss_mib']:6.1f} MiB  frozen {line['frozen']:>8}  "
              f"full collections {line['full_collections']:>3} (longest {line['longest_ms']} ms)")  # fmt: skip
    end = lines[-1]
    opened = counts.get("opened", 0)
    print(f"{opened} connections in {args.seconds:.0f} s ({opened / args.seconds:.0f}/s), {args.held} held at once: "
          f"{ {k: v for k, v in counts.items() if k != 'opened'} }")  # fmt: skip
    print(f"server CPU {end['server_cpu_s']} s ({1e6 * end['server_cpu_s'] / max(1, opened):.0f} ms per 1,000 "
          f"connections); then a complete collection found {end['unreachable_found']} unreachable objects in "
          f"{end['complete_collection_ms']} ms; RSS {end['rss_mib']} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
