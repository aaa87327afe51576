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
