"""status.progress: parsing the trainers' reports, folding them into the status, health, and the CLI's curve."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from kubetf.core.progress.curve import curve
from kubetf.core.progress.health import health
from kubetf.core.progress.merge import merge
from kubetf.core.progress.protocol import MAX_BODY, Report, ReportError, parse_report
from kubetf.core.progress.rates import duration
from kubetf.core.status import format_time

T0 = 1_700_000_000.0


def body(**fields):
    return json.dumps(fields).encode()


# -- parse_report ------------------------------------------------------------------------------------------------


def test_a_full_report():
    r = parse_report(
        b'{"epoch": 3, "epochs": 10, "step": 1200, "steps": 4000, "metrics": {"loss": 0.31, "accuracy": 0.91},'
        b' "stepsPerSecond": 12.5, "examplesPerSecond": 800.0, "final": false}'
    )
    assert r == Report(3, 10, 1200, 4000, {"loss": 0.31, "accuracy": 0.91}, 12.5, 800.0, False)


@pytest.mark.parametrize(
    "raw,expected",
    [
        (body(step=0), Report(step=0)),
        (body(epoch=1), Report(epoch=1)),
        (body(epoch=2.0, steps=10.0), Report(epoch=2, steps=10)),  # whole numbers written as floats
        (body(step=5, metrics={}), Report(step=5)),
        (body(step=5, metrics={"loss": 1}), Report(step=5, metrics={"loss": 1.0})),
        (body(step=5, final=True), Report(step=5, final=True)),
        (body(step=5, stepsPerSecond=0), Report(step=5, steps_per_second=0.0)),
        (body(step=5, epoch=None), Report(step=5)),
        (
            body(step=5, metrics={"a/b.c-d_e": 1.5, "x" * 64: 2}),
            Report(step=5, metrics={"a/b.c-d_e": 1.5, "x" * 64: 2.0}),
        ),
    ],
)
def test_valid_reports(raw, expected):
    assert parse_report(raw) == expected


def test_non_finite_metrics_travel_as_strings():
    r = parse_report(body(step=1, metrics={"loss": "NaN", "a": "Infinity", "b": "-Infinity"}))
    assert math.isnan(r.metrics["loss"]) and r.metrics["a"] == math.inf and r.metrics["b"] == -math.inf


@pytest.mark.parametrize(
    "raw,reason",
    [
        (b"", "body is not JSON"),
        (b"\xff\xfe", "body is not UTF-8"),
        (b"[1]", "body must be a JSON object"),
        (b'"step"', "body must be a JSON object"),
        (b'{"step": 1, "metrics": {"loss": NaN}}', 'NaN is not a JSON value (send the string "NaN")'),
        (body(), "epoch, step: at least one of them is required"),
        (body(metrics={"loss": 1}), "epoch, step: at least one of them is required"),
        (body(step=-1), "step: must be between 0 and"),
        (body(step=1.5), "step: must be a whole number"),
        (body(step="3"), "step: must be a whole number"),
        (body(step=True), "step: must be a whole number"),
        (body(epoch=1, epochs=0), "epochs: must be between 1 and"),
        (body(step=1, steps=0), "steps: must be between 1 and"),
        (body(step=2**60), "step: must be between 0 and"),
        (body(step=1, metrics=[1]), "metrics: must be an object"),
        (body(step=1, metrics={"loss": "0.3"}), 'metrics.loss: must be a number or "NaN"/"Infinity"/"-Infinity"'),
        (body(step=1, metrics={"loss": None}), 'metrics.loss: must be a number or "NaN"/"Infinity"/"-Infinity"'),
        (body(step=1, metrics={"loss": True}), 'metrics.loss: must be a number or "NaN"/"Infinity"/"-Infinity"'),
        (body(step=1, metrics={"loss": "nan"}), 'metrics.loss: must be a number or "NaN"/"Infinity"/"-Infinity"'),
        (body(step=1, metrics={"top 5": 1}), "metrics.top 5: a name must match [A-Za-z0-9_./-]{1,64}"),
        (body(step=1, metrics={"": 1}), "metrics.: a name must match"),
        (body(step=1, metrics={"x" * 65: 1}), "a name must match"),
        (body(step=1, metrics={f"m{i}": i for i in range(33)}), "metrics: at most 32 entries, got 33"),
        (body(step=1, stepsPerSecond=-1), "stepsPerSecond: must be a non-negative number"),
        (body(step=1, examplesPerSecond="fast"), "examplesPerSecond: must be a non-negative number"),
        (body(step=1, final="yes"), "final: must be true or false"),
        (body(step=1, stepPerSecond=3), "stepPerSecond: unknown field"),
    ],
)
def test_malformed_reports_say_what_is_wrong(raw, reason):
    with pytest.raises(ReportError) as err:
        parse_report(raw)
    assert err.value.status == 400
    assert reason in err.value.reason


def test_too_large_is_413():
    raw = body(step=1, metrics={"loss": 1}) + b" " * MAX_BODY
    with pytest.raises(ReportError) as err:
        parse_report(raw)
    assert err.value.status == 413 and "at most 16384" in err.value.reason


# -- merge -------------------------------------------------------------------------------------------------------


def run(reports, start=None, role="chief", coordinator=True, every=5.0, t0=T0):
    """Fold reports (dicts, or (seconds, dict)) given every `every` seconds."""
    status = start
    for i, r in enumerate(reports):
        at, fields = r if isinstance(r, tuple) else (t0 + i * every, r)
        status = merge(status, parse_report(body(**fields)), role, 0, coordinator, at)
    return status


def test_the_coordinators_report_becomes_the_status():
    s = run(
        [
            {
                "epoch": 3,
                "epochs": 10,
                "step": 1200,
                "steps": 4000,
                "metrics": {"loss": 0.31, "accuracy": 0.91},
                "stepsPerSecond": 12.5,
                "examplesPerSecond": 800.0,
            }
        ]
    )
    assert s == {
        "epoch": 3,
        "epochs": 10,
        "step": 1200,
        "steps": 4000,
        "percent": 30.0,
        "summary": "30%",
        "metrics": {"loss": 0.31, "accuracy": 0.91},
        "stepsPerSecond": 12.5,
        "examplesPerSecond": 800.0,
        "etaSeconds": 224,
        "eta": "4m",
        "lastReportTime": format_time(T0),
        "lastProgressTime": format_time(T0),
        "runStartTime": format_time(T0),  # the run's first report: goodput's first step (kubetf.core.goodput)
        "history": [{"step": 1200, "epoch": 3, "time": T0, "loss": 0.31, "accuracy": 0.91}],
    }
    json.dumps(s, allow_nan=False)


@pytest.mark.parametrize(
    "fields,percent,summary",
    [
        ({"step": 1680, "steps": 4000}, 42.0, "42%"),
        ({"step": 1, "steps": 3}, 33.3, "33%"),
        ({"step": 3999, "steps": 4000}, 99.9, "99%"),  # never 100% before the end
        ({"step": 4000, "steps": 4000}, 100.0, "100%"),
        ({"step": 4100, "steps": 4000}, 100.0, "100%"),
        ({"epoch": 3, "epochs": 10}, 30.0, "30%"),
        ({"epoch": 3, "epochs": 10, "step": 50, "steps": 1000}, 5.0, "5%"),  # steps win
        ({"epoch": 3, "epochs": 10, "step": 50}, 30.0, "30%"),  # epochs, when the steps' total is not known
        ({"epoch": 3}, None, "epoch 3"),
        ({"epoch": 3, "step": 1200}, None, "epoch 3"),
        ({"step": 1200}, None, "step 1200"),
    ],
)
def test_percent_and_summary(fields, percent, summary):
    s = run([fields])
    assert s.get("percent") == percent and s["summary"] == summary


def test_other_tasks_change_nothing():
    before = run([{"epoch": 1, "step": 10}])
    after = merge(before, parse_report(body(epoch=5, step=99)), "worker", 1, False, T0 + 100)
    assert after == before and after is not before
    assert merge(None, parse_report(body(step=1)), "ps", 0, False, T0) == {}


def test_the_evaluators_report_is_eval_metrics():
    s = run([{"epoch": 2, "step": 200, "metrics": {"loss": 0.5}}])
    s = merge(s, parse_report(body(epoch=2, metrics={"loss": 0.6, "accuracy": "NaN"})), "evaluator", 0, False, T0 + 9)
    assert s["evalMetrics"] == {"loss": 0.6, "accuracy": "NaN"} and s["evalEpoch"] == 2
    assert s["lastEvalTime"] == format_time(T0 + 9) and "evalStep" not in s
    assert s["metrics"] == {"loss": 0.5} and s["lastReportTime"] == format_time(T0)  # training untouched
    alone = merge(None, parse_report(body(step=7, metrics={"loss": 1})), "evaluator", 0, False, T0)
    assert alone == {"evalMetrics": {"loss": 1.0}, "evalStep": 7, "lastEvalTime": format_time(T0)}


def test_metrics_keep_the_latest_value_of_each_name():
    s = run(
        [
            {"epoch": 1, "step": 10, "metrics": {"loss": 1.0, "accuracy": 0.5, "val_loss": 1.2}},
            {"epoch": 1, "step": 15, "metrics": {"loss": 0.9, "accuracy": 0.6}},  # mid-epoch: no val_loss
            {"epoch": 1, "step": 18},
        ]
    )
    assert s["metrics"] == {"loss": 0.9, "accuracy": 0.6, "val_loss": 1.2}
    assert s["history"][-1] == {"step": 18, "epoch": 1, "time": T0 + 10}


def test_values_are_rounded_and_non_finite_kept_as_strings():
    s = run([{"step": 1, "metrics": {"loss": 0.123456789, "big": 123456789.0, "x": "-Infinity"}}])
    assert s["metrics"] == {"loss": 0.123457, "big": 123457000.0, "x": "-Infinity"}
    json.dumps(s, allow_nan=False)


def test_rates_are_computed_from_the_steps_when_not_reported():
    s = run([{"step": 0, "steps": 1000}, {"step": 50, "steps": 1000}, {"step": 100, "steps": 1000}], every=5.0)
    assert s["stepsPerSecond"] == 10.0 and s["etaSeconds"] == 90 and s["eta"] == "2m"
    # a sudden slowdown moves the rate over about a minute, not at once
    s = run([{"step": 110}], start=s, t0=T0 + 15)
    assert 9.0 < s["stepsPerSecond"] < 10.0
    s = run([{"step": 110 + i} for i in range(1, 30)], start=s, t0=T0 + 20)
    assert s["stepsPerSecond"] < 2.0


def test_examples_per_second_follows_the_steps_once_both_were_reported():
    s = run([{"step": 0, "stepsPerSecond": 10, "examplesPerSecond": 640}, {"step": 100}], every=5.0)
    assert 10.0 < s["stepsPerSecond"] < 20.0  # 20 steps/s since the last report, averaged in
    assert s["examplesPerSecond"] == pytest.approx(64 * s["stepsPerSecond"], abs=0.01)


def test_epoch_only_progress_gets_seconds_per_epoch_and_an_eta():
    s = run([{"epoch": 0, "epochs": 10}, {"epoch": 1, "epochs": 10}, {"epoch": 2, "epochs": 10}], every=60.0)
    assert s["secondsPerEpoch"] == 60.0 and s["etaSeconds"] == 480 and s["eta"] == "8m"
    assert "stepsPerSecond" not in s


def test_no_eta_without_a_total_or_a_rate():
    assert "eta" not in run([{"step": 100}, {"step": 200}])
    assert "eta" not in run([{"step": 100, "steps": 1000}])


def test_last_progress_time_moves_only_with_step_or_epoch():
    s = run([{"step": 10, "metrics": {"loss": 1}}, {"step": 10, "metrics": {"loss": 1}}, {"step": 10}], every=100)
    assert s["lastProgressTime"] == format_time(T0) and s["lastReportTime"] == format_time(T0 + 200)
    s = run([{"step": 11}], start=s, t0=T0 + 300)
    assert s["lastProgressTime"] == format_time(T0 + 300)


def test_a_restart_from_a_checkpoint_goes_back_sensibly():
    reports = [
        {"epoch": e, "epochs": 4, "step": 100 * e + k, "steps": 400, "metrics": {"loss": 2.0 - 0.1 * e}}
        for e in range(3)
        for k in (0, 50)
    ]
    s = run(reports, every=10)
    assert s["step"] == 250 and len(s["history"]) == 6
    # The job restarted and resumed from the epoch 2 backup (step 200), 5 minutes later
    s = run([{"epoch": 2, "epochs": 4, "step": 200, "steps": 400, "metrics": {"loss": 1.8}}], start=s, t0=T0 + 360)
    assert (s["step"], s["epoch"], s["percent"], s["summary"]) == (200, 2, 50.0, "50%")
    assert [p["step"] for p in s["history"]] == [0, 50, 100, 150, 200]  # the lost steps left the curve
    assert s["history"][-1]["time"] == T0 + 360 and s["history"][-1]["loss"] == 1.8
    assert s["lastProgressTime"] == format_time(T0 + 360)
    assert s["stepsPerSecond"] == 5.0  # the rate before the restart, not one across the pause
    s = run([{"epoch": 2, "step": 400}], start=s, t0=T0 + 370)
    assert s["stepsPerSecond"] > 5.0


def test_an_epoch_only_restart_forgets_the_step_it_cannot_know():
    s = run([{"epoch": 3, "step": 300}, {"epoch": 1}])
    assert s["epoch"] == 1 and "step" not in s and s["summary"] == "epoch 1"


def test_the_final_report():
    s = run([{"step": 400, "steps": 400, "stepsPerSecond": 5, "final": True}])
    assert s["final"] is True and s["etaSeconds"] == 0 and s["eta"] == "0s"
    s = run([{"step": 300, "steps": 400, "stepsPerSecond": 5, "final": True}])  # ended early (a crash, a SIGTERM)
    assert s["final"] is True and "eta" not in s and "etaSeconds" not in s
    # the next run's first report: no final, and no rate across the time in between
    s = run([{"step": 300, "steps": 400}], start=s, t0=T0 + 600)
    assert "final" not in s and s["stepsPerSecond"] == 5.0
    s = run([{"step": 400, "final": True}], start=s, t0=T0 + 610)
    assert len([p for p in s["history"] if p.get("step") == 400]) == 1


def test_the_history_spans_the_whole_run_in_at_most_60_points():
    s = run([{"epoch": i // 100, "step": i, "steps": 1000, "metrics": {"loss": 1.0 / (i + 1)}} for i in range(1000)])
    history = s["history"]
    assert len(history) == 60
    assert history[0]["step"] == 0 and history[-1]["step"] == 999
    gaps = [b["step"] - a["step"] for a, b in itertools.pairwise(history)]
    assert max(gaps) <= 3 * (1000 / 60)  # spread over the run, not the last 60 reports
    assert len(json.dumps(s)) < 6000


def test_history_points_carry_loss_and_the_first_few_metrics():
    metrics = {"accuracy": 0.5, "loss": 1.0, "auc": 0.7, "precision": 0.4, "recall": 0.3, "val_loss": 1.1}
    s = run([{"step": 1, "metrics": metrics}, {"step": 2, "metrics": {"recall": 0.2, "loss": 0.9}}])
    assert s["history"][0] == {"step": 1, "time": T0, "loss": 1.0, "accuracy": 0.5, "auc": 0.7, "precision": 0.4}
    assert s["history"][1] == {"step": 2, "time": T0 + 5, "loss": 0.9}


def test_merge_does_not_modify_its_input():
    s = run([{"step": 1, "metrics": {"loss": 1}}])
    copy = json.loads(json.dumps(s))
    run([{"step": 0}], start=s)
    assert s == copy


def test_a_status_someone_edited_into_nonsense_still_takes_reports():
    junk = {
        "step": "x",
        "epoch": True,
        "history": [{"step": 1, "time": "bad"}, "junk", {"step": 2, "time": T0}],
        "metrics": "no",
        "stepsPerSecond": "fast",
        "lastProgressTime": "yesterday",
        "extra": 1,
        "evalMetrics": {"loss": "NaN", "x": [1]},
    }
    s = merge(junk, parse_report(body(step=3, metrics={"loss": 1})), "chief", 0, True, T0 + 10)
    assert s["step"] == 3 and s["metrics"] == {"loss": 1.0} and s["evalMetrics"] == {"loss": "NaN"}
    assert [p["step"] for p in s["history"]] == [2, 3] and "extra" not in s
    assert [r for r, _ in health(junk, T0, 600)] == ["LossNotFinite"]
    assert merge("nonsense", parse_report(body(step=1)), "worker", 1, False, T0) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "seconds,text",
    [
        (0, "0s"),
        (45, "45s"),
        (59.4, "59s"),
        (60, "1m"),
        (359, "6m"),
        (3569, "59m"),
        (3590, "1h"),
        (3600, "1h"),
        (4800, "1h20m"),
        (86399, "24h"),
        (86400, "1d"),
        (2 * 86400 + 3 * 3600, "2d3h"),
        (-5, "0s"),
    ],
)
def test_duration(seconds, text):
    assert duration(seconds) == text


# -- health ------------------------------------------------------------------------------------------------------


def stall_case(progress_seconds_ago, report_seconds_ago, **extra):
    now = T0 + 10_000
    return {
        "step": 1200,
        "epoch": 3,
        "epochs": 10,
        "lastProgressTime": format_time(now - progress_seconds_ago),
        "lastReportTime": format_time(now - report_seconds_ago),
        **extra,
    }, now


@pytest.mark.parametrize(
    "progress,reasons",
    [
        (None, []),
        ({}, []),
        ({"metrics": {"loss": 0.3}}, []),
        ({"metrics": {"loss": "NaN"}, "step": 5}, ["LossNotFinite"]),
        ({"metrics": {"loss": 0.3, "val_loss": "Infinity"}}, ["LossNotFinite"]),
        ({"metrics": {"train_Loss": "-Infinity"}}, ["LossNotFinite"]),
        ({"metrics": {"accuracy": "NaN"}}, []),  # not a loss
        ({"evalMetrics": {"loss": "NaN"}}, ["LossNotFinite"]),
    ],
)
def test_loss_not_finite(progress, reasons):
    assert [r for r, _ in health(progress, T0, 600)] == reasons


def test_loss_not_finite_says_which_and_where():
    [(_, message)] = health(
        {"metrics": {"loss": "NaN", "val_loss": "NaN"}, "step": 5, "epoch": 1, "epochs": 4}, T0, 600
    )
    assert message == "loss is NaN, val_loss is NaN at step 5, epoch 1/4: the training diverged"


@pytest.mark.parametrize(
    "progress_ago,report_ago,extra,done,stalled,why",
    [
        (60, 5, {}, False, False, None),
        (599, 599, {}, False, False, None),
        (700, 5, {}, False, True, "no progress for 12m, still at step 1200, epoch 3/10: the program still reports"),
        (700, 700, {}, False, True, "no progress for 12m, still at step 1200, epoch 3/10: no report for 12m"),
        (7200, 7200, {"final": True}, True, False, None),  # the task that reports exited 0: the rest runs on
        # A final report is sent at every exit, a crash's too: the restarted program that then stops reporting is
        # stalled all the same.
        (7200, 7200, {"final": True}, False, True, "no progress for 2h, still at step 1200, epoch 3/10: no report"),
    ],
)
def test_training_stalled(progress_ago, report_ago, extra, done, stalled, why):
    progress_dict, now = stall_case(progress_ago, report_ago, **extra)
    found = dict(health(progress_dict, now, 600, done))
    assert ("TrainingStalled" in found) == stalled
    if why:
        assert found["TrainingStalled"].startswith(why)


def test_a_job_that_reports_through_merge_is_stalled_once_its_step_stops():
    s = run([{"step": i} for i in range(5)] + [{"step": 4}] * 3, every=100)
    assert health(s, T0 + 700, 600) == []
    assert [r for r, _ in health(s, T0 + 1100, 600)] == ["TrainingStalled"]


# -- curve -------------------------------------------------------------------------------------------------------


def test_curve_draws_the_metric_over_steps():
    history = [{"step": s, "time": T0 + s, "loss": 2.0 - s / 100} for s in range(0, 101, 10)]
    text = curve(history, "loss", width=20, height=5)
    assert text == "\n".join(
        [
            "loss by step",
            "  2 |***",
            "    |   *****",
            "1.5 |        ****",
            "    |            *****",
            "  1 |                 ***",
            "    +--------------------",
            "     0                100 step",
        ]
    )


def test_curve_falls_back_to_epochs_and_skips_what_is_not_a_number():
    history = [
        {"epoch": 1, "loss": 1.0, "time": 0},
        {"epoch": 2, "loss": "NaN", "time": 1},
        {"epoch": 3, "loss": 0.5, "time": 2},
        {"epoch": 4, "time": 3},
    ]
    text = curve(history, "loss", width=10, height=3)
    assert text.splitlines()[0] == "loss by epoch" and text.splitlines()[-1].endswith("3 epoch")
    assert text.splitlines()[1:4] == ["   1 |***", "0.75 |   ****", " 0.5 |       ***"]  # from epoch 1 to 3


def test_curve_of_nothing_and_of_a_flat_line():
    assert curve([], "loss") == "loss: no values yet"
    assert curve([{"step": 1, "accuracy": 0.5}], "loss") == "loss: no values yet"
    flat = curve([{"step": i, "loss": 1.0} for i in range(5)], "loss", width=10, height=3)
    assert flat.splitlines()[1:4] == ["1.1 |", "  1 |**********", "0.9 |"]
    assert all(len(line) <= 80 for line in curve([{"step": 1, "loss": 1}], "loss").splitlines())
