"""The `k8s_min` marker: a test that needs a newer Kubernetes than the cluster of a compatibility run.

    @pytest.mark.k8s_min("1.37", reason="Kubernetes' own gang scheduling, scheduling.k8s.io/v1beta1")

(or on one case of a parametrized test: `pytest.param(..., marks=pytest.mark.k8s_min("1.37", reason=...))`).

Such a test is skipped, with its reason, only where KUBETF_K8S_VERSION names an older control plane: `make
test-k8s-1.35` (tests/cluster/with-k8s.sh) exports it for the local cluster it brings up at 1.35. Without it (`make
test`, CI on 1.37, any other cluster) the marker changes nothing: nothing is skipped. A skipped test shows in pytest's
`-ra` lines with its reason and in the summary's skipped column, never left out silently. Only the minor version
counts ("1.37" is met by any 1.37.x).
"""

from __future__ import annotations

import os
import re

import pytest

ENV = "KUBETF_K8S_VERSION"


def minor_version(version: str) -> tuple[int, int]:
    """'v1.35.8', '1.35.8' or '1.37' -> (1, 35) / (1, 37)."""
    found = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", version.strip())
    if not found:
        raise ValueError(f"not a Kubernetes version: {version!r}")
    return int(found[1]), int(found[2])


def skip_reason(cluster: str | None, minimum: str, why: str) -> str | None:
    """Why a test that needs Kubernetes `minimum` (for `why`) cannot run against the `cluster` version, or None when
    it can (no version named: it always can)."""
    if not cluster or minor_version(cluster) >= minor_version(minimum):
        return None
    return f"needs Kubernetes {minimum} or newer ({why}); this run's control plane is {cluster} ({ENV})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cluster = os.environ.get(ENV) or None
    for item in items:
        for mark in item.iter_markers("k8s_min"):
            minimum = mark.args[0] if mark.args else mark.kwargs.get("version")
            why = mark.kwargs.get("reason")
            if not minimum or not why:
                usage = 'k8s_min("1.37", reason=...)'
                raise pytest.UsageError(f"{item.nodeid}: k8s_min takes a version and a reason: {usage}")
            reason = skip_reason(cluster, str(minimum), str(why))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
