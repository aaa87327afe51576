"""The table `make test` ends with: each tier's tests passed, failed and skipped, each stage's wall time, and the
slowest tests, read from the JUnit XML files the stages wrote and the stage times the Makefile recorded.

    python -m tests.summary RESULTS_DIR
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TIERS = ("unit", "trainer", "integration", "e2e")


def tier_of(classname: str) -> str:
    """tests.integration.test_operator -> integration (the tiers are the test directories)."""
    parts = classname.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tests" and parts[1] in TIERS else "other"


def outcome(case: ET.Element) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    if case.find("skipped") is not None:
        return "skipped"
    return "passed"


def main(results: Path) -> int:
    counts: dict[str, Counter[str]] = {tier: Counter() for tier in (*TIERS, "other")}
    seconds: Counter[str] = Counter()
    cases: list[tuple[float, str]] = []
    for path in sorted(results.glob("*.xml")):
        for case in ET.parse(path).getroot().iter("testcase"):
            tier = tier_of(case.get("classname", ""))
            counts[tier][outcome(case)] += 1
            took = float(case.get("time") or 0)
            seconds[tier] += took
            cases.append((took, f"{case.get('classname', '').removeprefix('tests.')}::{case.get('name')}"))
    print("\n::: tests by tier (test seconds: the tests' own time, summed; they overlap when run in parallel)")
    print(f"  {'tier':<12} {'passed':>7} {'failed':>7} {'skipped':>8} {'test seconds':>13}")
    for tier, counted in counts.items():
        if counted:
            print(
                f"  {tier:<12} {counted['passed']:>7} {counted['failed']:>7} {counted['skipped']:>8} "
                f"{seconds[tier]:>13.0f}"
            )
    stages = results / "stages.tsv"
    if stages.exists():
        print("::: stages (wall seconds; CPU busy: the share of all cores in use meanwhile)")
        for line in stages.read_text().splitlines():
            name, took, *busy = line.split("\t")
            print(f"  {name:<48} {int(took):>5}s  {''.join(busy):>4}".rstrip())
    print("::: the 10 slowest tests")
    for took, name in sorted(cases, reverse=True)[:10]:
        print(f"  {took:>7.1f}s  {name}")
    failed = sum(c["failed"] for c in counts.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".test-results")))
