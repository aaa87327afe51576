"""The benchmarks are scripts no tier runs; each `make bench-*` target must at least start (a helper renamed in
one benchmark once broke another's imports unseen: `make bench-progress`, until 2026-11-27)."""

import importlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
BENCHES = sorted(set(re.findall(r"-m (tests\.bench\.\w+)", MAKEFILE.read_text())))


def test_the_makefile_names_the_benchmarks():
    assert len(BENCHES) >= 7


@pytest.mark.parametrize("module", BENCHES)
def test_every_benchmark_the_makefile_runs_imports(module):
    assert callable(importlib.import_module(module).main)


def test_the_machines_cpu_is_split_by_process_named_by_pid_where_two_share_a_name():
    from tests.bench.common import machine_cpu

    before = {1: ("kube-apiserver", 10.0), 2: ("python", 5.0), 3: ("python", 1.0), 4: ("etcd", 2.0), 9: ("old", 1.0)}
    after = {1: ("kube-apiserver", 16.0), 2: ("python", 6.0), 3: ("python", 4.0), 4: ("sh", 0.5), 5: ("kwok", 1.0)}
    shown = machine_cpu(before, after, 10.0, {2: "operator", 3: "bench"})
    # pid 4 reused by a new process: counted from 0; pid 9 ended: not counted
    assert shown.endswith("over 10s: kube-apiserver 0.60, bench 0.30, operator 0.10, kwok 0.10, sh 0.05")
    assert shown.startswith("1.15 of ")
