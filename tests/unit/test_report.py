"""The trainer's progress client (kubetf_trainer.report) against a local stand-in for the operator's endpoint."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubetf_trainer import report as rp
from kubetf_trainer.env import task_info
from tests.progress_server import closed_port_url, progress_server

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_module(monkeypatch):
    """Each test gets its own module-level reporter, configured from the environment it sets."""
    for name in (
        "KUBETF_PROGRESS_URL",
        "KUBETF_PROGRESS_TOKEN_FILE",
        "KUBETF_PROGRESS_INTERVAL",
        "TF_CONFIG",
        "KUBETF_ROLE",
        "KUBETF_INDEX",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(rp, "_configured_pid", None)
    monkeypatch.setattr(rp, "_reporter", None)
    monkeypatch.setattr(rp, "_explicit", False)
    monkeypatch.setattr(rp, "URGENT_SPACING", 0.05)
    yield
    for r in [*_made, rp._reporter]:
        if r is not None:
            r.stop()
    _made.clear()


_made: list[rp.Reporter] = []


def fast(url, token_file=None, interval=0.3, **kw):
    kw.setdefault("backoff", 0.01)
    kw.setdefault("at_exit", False)
    _made.append(rp.Reporter(url, token_file, interval, **kw))
    return _made[-1]


def cluster(chief=0, worker=2, evaluator=0):
    c = {}
    if chief:
        c["chief"] = ["c:1"]
    if worker:
        c["worker"] = [f"w{i}:1" for i in range(worker)]
    if evaluator:
        c["evaluator"] = ["e:1"]
    return c


@pytest.mark.parametrize(
    "env,kind",
    [
        ({}, "training"),  # no TF_CONFIG: a standalone program
        ({"KUBETF_ROLE": "chief", "KUBETF_INDEX": "0"}, "training"),
        ({"TF_CONFIG": json.dumps({"cluster": cluster(chief=1), "task": {"type": "chief", "index": 0}})}, "training"),
        ({"TF_CONFIG": json.dumps({"cluster": cluster(chief=1), "task": {"type": "worker", "index": 0}})}, None),
        ({"TF_CONFIG": json.dumps({"cluster": cluster(), "task": {"type": "worker", "index": 0}})}, "training"),
        ({"TF_CONFIG": json.dumps({"cluster": cluster(), "task": {"type": "worker", "index": 1}})}, None),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}})},
            "evaluation",
        ),
        ({"KUBETF_ROLE": "ps", "KUBETF_INDEX": "0", "TF_CONFIG": json.dumps({"cluster": {"ps": ["p:1"]}})}, None),
        ({"TF_CONFIG": "not json"}, "training"),
    ],
)
def test_who_sends_is_the_librarys_chief_and_the_evaluator(env, kind):
    assert rp.task_kind(env) == kind
    try:
        info = task_info(env)
    except ValueError:
        return
    assert (kind == "training") == (info.is_chief and not info.is_evaluator)
    assert (kind == "evaluation") == info.is_evaluator


def test_without_a_url_report_does_nothing():
    assert rp.reporter() is None and not rp.enabled()
    rp.report(epoch=1, metrics={"loss": 1.0})  # no thread, no error
    assert rp.flush(final=True)


def test_other_workers_send_nothing(monkeypatch):
    with progress_server() as server:
        monkeypatch.setenv("KUBETF_PROGRESS_URL", server.url)
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster(), "task": {"type": "worker", "index": 1}}))
        rp.report(epoch=1)
        assert rp.reporter() is None
        time.sleep(0.2)
        assert server.requests == []


def test_first_report_at_once_then_one_post_per_interval_with_the_latest_state():
    with progress_server() as server:
        r = fast(server.url, interval=0.5)
        start = time.monotonic()
        for i in range(40):
            r.report(epoch=0, epochs=2, step=i + 1, steps=80, metrics={"loss": 1.0 / (i + 1)})
            time.sleep(0.01)
        assert time.monotonic() - start < 1.0  # report() never waited for the network
        first = server.wait_for(lambda s: s.accepted and s.requests[0])
        assert first["time"] - start < 0.3
        server.wait_for(lambda s: any(b["step"] == 40 for b in s.accepted), timeout=3)
        assert len(server.accepted) <= 3  # 40 reports in ~0.5 s: the first, then at most one per 0.5 s
        assert server.accepted[-1] == {
            "epoch": 0,
            "epochs": 2,
            "step": 40,
            "steps": 80,
            "metrics": {"loss": 0.025},
            "final": False,
        }
        assert server.errors == []


def test_a_new_epoch_goes_out_at_once():
    with progress_server() as server:
        r = fast(server.url, interval=30)
        r.report(epoch=0, step=1)
        server.wait_for(lambda s: len(s.accepted) == 1)
        r.report(epoch=0, step=2)  # waits for the interval (30 s)
        time.sleep(0.3)
        assert len(server.accepted) == 1
        r.report(epoch=1, step=3, metrics={"val_loss": 0.5})
        server.wait_for(lambda s: len(s.accepted) == 2, timeout=2)
        assert server.accepted[1] == {"epoch": 1, "step": 3, "metrics": {"val_loss": 0.5}, "final": False}


@pytest.mark.parametrize("statuses", [[503], [503, 503, 503], [429], [502]])
def test_not_the_leader_and_slow_down_are_retried(statuses):
    with progress_server(statuses=list(statuses)) as server:
        r = fast(server.url)
        r.report(step=7, metrics={"loss": 2.0})
        server.wait_for(lambda s: s.accepted)
        assert [q["status"] for q in server.requests] == [*statuses, 204]
        assert server.accepted == [{"step": 7, "metrics": {"loss": 2.0}, "final": False}]


def test_a_standby_answering_again_and_again_does_not_lose_the_final_report():
    """Behind the operator's Service, each connection may meet the standby (503). The exit-time flush has
    FINAL_TIMEOUT and the backoff doubles from half a second: without retrying a 503 at once, three standby answers
    in a row lost the job's final report (CI: Succeeded at 90%)."""
    with progress_server(statuses=[503] * 6) as server:
        r = rp.Reporter(server.url, None, 60, at_exit=False)
        _made.append(r)
        r.report(epoch=10, epochs=10, step=80, steps=80)
        assert r.flush(final=True) is True  # whichever of the sender and the flush met the standby
        assert server.accepted[-1] == {"epoch": 10, "epochs": 10, "step": 80, "steps": 80, "final": True}


def test_what_failed_goes_again_with_the_next_report():
    with progress_server(statuses=[502] * 4) as server:  # more than the retries
        r = fast(server.url, interval=0.2)
        r.report(epoch=1, metrics={"accuracy": 0.5})
        server.wait_for(lambda s: s.accepted, timeout=5)
        assert server.accepted == [{"epoch": 1, "metrics": {"accuracy": 0.5}, "final": False}]


def test_a_refused_report_is_logged_once_and_not_retried(caplog):
    with progress_server(statuses=[401, 401, 401]) as server, caplog.at_level(logging.WARNING, "kubetf_trainer"):
        r = fast(server.url, interval=0.05)
        for step in range(3):
            r.report(epoch=step, step=step)
            server.wait_for(lambda s, n=step + 1: len(s.requests) == n)
        r.report(epoch=9, step=9)
        server.wait_for(lambda s: s.accepted)
    assert [q["status"] for q in server.requests] == [401, 401, 401, 204]
    assert len([m for m in caplog.messages if "401" in m]) == 1


def test_forbidden_stops_all_reports_from_the_process(caplog):
    with progress_server(statuses=[403]) as server, caplog.at_level(logging.WARNING, "kubetf_trainer"):
        r = fast(server.url, interval=0.05)
        r.report(step=1)
        server.wait_for(lambda s: s.requests)
        r.report(step=2, final=True)
        assert r.flush(final=True) is False
        time.sleep(0.2)
        assert len(server.requests) == 1
    assert any("403" in m and "no more reports" in m for m in caplog.messages)


def test_a_server_that_is_down_costs_the_program_nothing(caplog):
    with caplog.at_level(logging.WARNING, "kubetf_trainer"):
        r = fast(closed_port_url(), interval=0.05)
        start = time.monotonic()
        for i in range(200):
            r.report(epoch=i // 50, step=i, metrics={"loss": 1.0})
        assert time.monotonic() - start < 0.5
        time.sleep(0.5)
        flushed_in = time.monotonic()
        assert r.flush(timeout=0.5, final=True) is False
        assert time.monotonic() - flushed_in < 2
    assert len([m for m in caplog.messages if "cannot deliver" in m]) == 1


def test_the_token_is_read_again_for_every_request(tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    with progress_server(token="first") as server:
        r = fast(str(server.url), str(token), interval=0.05)
        r.report(epoch=1)
        server.wait_for(lambda s: s.accepted)
        token.write_text("second")  # the kubelet rotated it
        server.token = "second"
        r.report(epoch=2)
        server.wait_for(lambda s: len(s.accepted) == 2)
        assert [q["headers"]["Authorization"] for q in server.requests] == ["Bearer first", "Bearer second"]
        assert {q["headers"]["Content-Type"] for q in server.requests} == {"application/json"}


def test_metrics_are_made_valid_for_the_protocol():
    metrics = {
        "loss": float("nan"),
        "val_loss": float("inf"),
        "neg": float("-inf"),
        "top-5 acc": 0.5,
        "x" * 80: 1.0,
        "flag": True,
        "text": "high",
    }
    metrics.update({f"m{i}": i for i in range(40)})
    with progress_server() as server:
        r = fast(server.url)
        r.report(step=1, metrics=metrics)
        server.wait_for(lambda s: s.accepted)
    sent = server.accepted[0]["metrics"]
    assert server.errors == []  # the operator's parser accepts it
    assert (sent["loss"], sent["val_loss"], sent["neg"], sent["top-5_acc"]) == ("NaN", "Infinity", "-Infinity", 0.5)
    assert sent["x" * 64] == 1.0 and "flag" not in sent and "text" not in sent
    assert len(sent) == 32


def test_numpy_scalars_and_rates():
    np = pytest.importorskip("numpy")
    with progress_server() as server:
        r = fast(server.url)
        r.report(
            epoch=np.int64(2),
            step=np.int32(10),
            metrics={"loss": np.float32(0.5)},
            stepsPerSecond=np.float64(3),
            examples_per_second=96.0,
            bogus=1,
            epochs=-1,
        )
        server.wait_for(lambda s: s.accepted)
    assert server.accepted[0] == {
        "epoch": 2,
        "step": 10,
        "metrics": {"loss": 0.5},
        "stepsPerSecond": 3.0,
        "examplesPerSecond": 96.0,
        "final": False,
    }


def test_a_report_without_a_position_is_dropped():
    with progress_server() as server:
        r = fast(server.url)
        r.report(metrics={"loss": 1.0})
        time.sleep(0.2)
        assert server.requests == []
        r.report(step=3)  # later reports keep the position, so metrics alone are fine
        server.wait_for(lambda s: s.accepted)
        r.report(metrics={"loss": 0.5}, final=True)
        server.wait_for(lambda s: len(s.accepted) == 2)
        assert server.accepted[1] == {"step": 3, "metrics": {"loss": 0.5}, "final": True}


def test_the_programs_own_reports_stop_the_automatic_ones(monkeypatch):
    with progress_server() as server:
        monkeypatch.setenv("KUBETF_PROGRESS_URL", server.url)
        monkeypatch.setenv("KUBETF_PROGRESS_INTERVAL", "0.05")
        rp.auto_report(step=1)
        server.wait_for(lambda s: len(s.accepted) == 1)
        rp.report(epoch=5, step=100)
        server.wait_for(lambda s: len(s.accepted) == 2)
        rp.auto_report(step=2)
        time.sleep(0.3)
        assert [b["step"] for b in server.accepted] == [1, 100]


def _child(server_url: str, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETF_", "TF_CONFIG"))}
    child_env.update({"KUBETF_PROGRESS_URL": server_url, "KUBETF_PROGRESS_INTERVAL": "60", **env})
    child_env["PYTHONPATH"] = str(REPO / "trainer_image")
    return subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=30)


def test_the_last_state_goes_out_at_exit_marked_final():
    with progress_server() as server:
        out = _child(
            server.url,
            "from kubetf_trainer.report import report\n"
            "report(epoch=0, step=1)\n"
            "import time; time.sleep(0.3)\n"
            "report(epoch=0, step=2, metrics={'loss': 0.1})\n"
            "report(epoch=0, step=3)\n",
        )
        assert out.returncode == 0, out.stderr
        assert [b["step"] for b in server.accepted] == [1, 3]  # the interval is 60 s: only exit sent step 3
        assert server.accepted[-1] == {"epoch": 0, "step": 3, "metrics": {"loss": 0.1}, "final": True}


def test_exit_is_not_held_up_by_a_server_that_is_down():
    start = time.monotonic()
    out = _child(closed_port_url(), "from kubetf_trainer.report import report\nreport(step=1)\nreport(step=2)\n")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - start < 10
    assert out.stderr.count("cannot deliver") == 1
