"""The k8s_min marker (tests/cluster/k8s_version.py): a compatibility run at an older Kubernetes skips, with the
reason, only the tests that need a newer one; without KUBETF_K8S_VERSION (CI, `make test`) nothing is skipped."""

from __future__ import annotations

import pytest

from tests.cluster import k8s_version
from tests.cluster.k8s_version import minor_version, skip_reason

WHY = "Kubernetes' own gang scheduling, scheduling.k8s.io/v1beta1"


def test_versions_compare_by_minor():
    assert minor_version("v1.35.8") == (1, 35)
    assert minor_version("1.37") == (1, 37)
    assert minor_version(" v1.37.2 ") == (1, 37)
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        minor_version("latest")


def test_an_older_control_plane_skips_with_the_reason():
    reason = skip_reason("v1.35.8", "1.37", WHY)
    assert reason == f"needs Kubernetes 1.37 or newer ({WHY}); this run's control plane is v1.35.8 (KUBETF_K8S_VERSION)"


@pytest.mark.parametrize("cluster", [None, "", "v1.37.2", "v1.37.0", "v1.38.1"])
def test_without_an_older_control_plane_nothing_is_skipped(cluster):
    assert skip_reason(cluster, "1.37", WHY) is None


class Item:
    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self.nodeid = "tests/e2e/test_x.py::test_x"
        self.marks = [m.mark for m in marks]
        self.added: list[pytest.Mark] = []

    def iter_markers(self, name: str):
        return (m for m in self.marks if m.name == name)

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.added.append(marker.mark)


def collect(monkeypatch, version: str | None, *items: Item) -> None:
    if version is None:
        monkeypatch.delenv(k8s_version.ENV, raising=False)
    else:
        monkeypatch.setenv(k8s_version.ENV, version)
    k8s_version.pytest_collection_modifyitems(None, list(items))  # type: ignore[arg-type]


def test_the_hook_marks_only_the_tests_that_need_more(monkeypatch):
    needs, plain = Item(pytest.mark.k8s_min("1.37", reason=WHY)), Item(pytest.mark.serial)
    collect(monkeypatch, "v1.35.8", needs, plain)
    assert [(m.name, m.kwargs["reason"].split(";")[0]) for m in needs.added] == [
        ("skip", f"needs Kubernetes 1.37 or newer ({WHY})")
    ]
    assert plain.added == []


@pytest.mark.parametrize("version", [None, "v1.37.2"])
def test_ci_skips_nothing(monkeypatch, version):
    needs = Item(pytest.mark.k8s_min("1.37", reason=WHY))
    collect(monkeypatch, version, needs)
    assert needs.added == []


def test_a_marker_without_its_reason_is_refused_everywhere(monkeypatch):
    with pytest.raises(pytest.UsageError, match="k8s_min takes a version and a reason"):
        collect(monkeypatch, None, Item(pytest.mark.k8s_min("1.37")))
