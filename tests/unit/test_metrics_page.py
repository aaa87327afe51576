"""The /metrics page: the whole registry, or only the samples a scrape names (`?name[]=`)."""

import pytest

from kubetf.cluster import metrics
from kubetf.runtime.progress.gauges import JobSeries
from kubetf.runtime.runner import metrics_page

pytestmark = pytest.mark.unit


def test_a_scrape_that_names_samples_gets_those_alone_not_every_jobs_series():
    series = JobSeries()
    series.publish(("team-a", "mnist"), {"metrics": {"loss": 0.5}})
    metrics.QUEUE_DEPTH.set(3)
    try:
        whole = metrics_page({}).content.decode()
        named = metrics_page({"name[]": ["kubetf_workqueue_depth"]}).content.decode()
        jobs = metrics_page({"name[]": ["kubetf_job_metric"]}).content.decode()
    finally:
        series.remove(("team-a", "mnist"))
    assert 'kubetf_job_metric{job="mnist",metric="loss",namespace="team-a"} 0.5' in whole
    assert "kubetf_workqueue_depth 3.0" in whole
    assert [line for line in named.splitlines() if not line.startswith("#")] == ["kubetf_workqueue_depth 3.0"]
    assert [line for line in jobs.splitlines() if not line.startswith("#")] == [
        'kubetf_job_metric{job="mnist",metric="loss",namespace="team-a"} 0.5'
    ]
