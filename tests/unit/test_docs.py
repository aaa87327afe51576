"""The documentation: links that resolve, a short README, and a catalog of status reasons that matches both the
code (every reason it can write is in `kubetf.reasons`) and docs/status-reasons.md (the same tables)."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "kubetf"
DOCS = REPO / "docs"
README_MAX_LINES = 160
# Every Markdown file a reader is sent to: the README, docs/, and the READMEs that stay beside their code.
MARKDOWN = sorted(
    [
        REPO / "README.md",
        *DOCS.glob("*.md"),
        REPO / "helm" / "kubetf" / "README.md",
        REPO / "trainer_image" / "README.md",
        REPO / "tests" / "cluster" / "README.md",
    ]
)
EXPECTED_DOCS = {
    "api.md",
    "restarts.md",
    "kueue.md",
    "migrating-from-tfjob.md",
    "operating.md",
    "development.md",
    "status-reasons.md",
    "troubleshooting.md",
    "compatibility.md",
}


def reasons_module() -> ModuleType:
    """kubetf.reasons, wherever the package keeps it (kubetf.core.reasons once the package is split up)."""
    for name in ("kubetf.core.reasons", "kubetf.reasons"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise AssertionError("no kubetf.reasons module")


# ---------------------------------------------------------------------- Markdown: links and headings

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, INLINE_CODE.sub("", line)


def headings(text: str) -> list[str]:
    fenced, found = False, []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(match.group(1))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (links and code by their text, emphasis marks
    dropped), lowercased, punctuation but '-' and '_' removed, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(path.read_text()):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(path.read_text()):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: ...
                yield number, target


def test_slugs_follow_githubs_rules() -> None:
    assert slug("What counts time") == "what-counts-time"
    assert slug("Moving from Kubeflow's `TFJob`") == "moving-from-kubeflows-tfjob"
    assert slug("HA and the Lease (flags)") == "ha-and-the-lease-flags"
    assert slug("`make test`: stages, serial tests") == "make-test-stages-serial-tests"
    assert slug("Status: `kubectl get tj`") == "status-kubectl-get-tj"
    assert slug("runPolicy.startupTimeoutSeconds") == "runpolicystartuptimeoutseconds"
    assert slug("clean_pod_policy") == "clean_pod_policy"


def test_the_documentation_pages_exist() -> None:
    assert {p.name for p in DOCS.glob("*.md")} >= EXPECTED_DOCS


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}:{number}: {target}"
        if not destination.exists():
            broken.append(f"{where}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{where}: no heading #{anchor} in {destination.relative_to(REPO)}")
        elif anchor and destination.suffix != ".md":
            broken.append(f"{where}: an anchor into a file that is not Markdown")
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_links_and_broken_ones(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n## Two words\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#two-words) [web](https://example.com) `[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
        "[bad](a.md#three) [gone](missing.md)\n"
    )
    assert list(relative_links(page)) == [(1, "a.md#two-words"), (5, "a.md#three"), (5, "missing.md")]
    assert anchors(tmp_path / "a.md") == {"top", "two-words"}


def test_the_readme_stays_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/"


def test_the_readme_starts_with_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    first = text.split("\n## ", 1)[0]
    assert "make demo" in first and "make test" in first, "`make demo` and `make test` come first"
    for page in sorted(EXPECTED_DOCS):
        assert f"docs/{page}" in text, f"the README links docs/{page}"


# ---------------------------------------------------------------------- the catalog against docs/status-reasons.md


def tables_by_heading(text: str) -> dict[str, list[list[str]]]:
    """The rows of the first table under each `## ` heading, as lists of cells (header and rule left out)."""
    tables: dict[str, list[list[str]]] = {}
    heading = None
    in_table = False
    for line in text.splitlines():
        if line.startswith("## "):
            heading, in_table = line[3:].strip(), False
            continue
        if heading is None or (heading in tables and not in_table):
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if not in_table:
                in_table = True
                tables[heading] = []
                continue  # the header
            if set(line.replace("|", "").strip()) <= set("-: "):
                continue  # the rule
            tables[heading].append(cells)
        elif in_table:
            in_table = False
    return tables


def test_the_status_reasons_page_shows_the_catalog() -> None:
    reasons = reasons_module()
    tables = tables_by_heading((DOCS / "status-reasons.md").read_text())
    for title, catalog in reasons.GROUPS:
        assert title in tables, f"docs/status-reasons.md has no table under '## {title}'"
        documented = {}
        for cells in tables[title]:
            assert len(cells) == len(reasons.HEADER), f"a row of '{title}' has {len(cells)} cells: {cells}"
            documented[cells[0].strip("`")] = reasons.Reason(*cells[1:])
        missing = sorted(set(catalog) - set(documented))
        extra = sorted(set(documented) - set(catalog))
        assert not missing and not extra, (
            f"'{title}': in kubetf.reasons only: {missing}; in docs/status-reasons.md only: {extra}. "
            "`python -m kubetf.reasons` prints the tables"
        )
        differ = [name for name in catalog if catalog[name] != documented[name]]
        assert not differ, f"'{title}': texts differ for {differ}. `python -m kubetf.reasons` prints the tables"


def test_catalog_texts_fit_in_a_table() -> None:
    reasons = reasons_module()
    for _title, catalog in reasons.GROUPS:
        for name, reason in catalog.items():
            for text in (name, reason.seen, reason.meaning, reason.action):
                assert text and "|" not in text and "\n" not in text, f"{name}: {text!r}"


def test_the_catalog_is_pure() -> None:
    tree = ast.parse(Path(reasons_module().__file__ or "").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    outside = {name for name in imported if name.split(".")[0] not in {*sys.stdlib_module_names, "__future__"}}
    assert not outside, f"kubetf.reasons imports {outside}: it is to need the standard library only"


# ---------------------------------------------------------------------- the catalog against the code


class Scope:
    """What a name can hold: module-level constants, and a function's local assignments (`x = ...`,
    `a, b = ...`), each as the expressions assigned to it."""

    def __init__(self, body: list[ast.stmt], parent: Scope | None = None, function: bool = False) -> None:
        self.parent = parent
        self.values: dict[str, list[ast.expr]] = {}
        statements = [n for s in body for n in ast.walk(s)] if function else body
        for node in statements:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(target, node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                self._bind(node.target, node.value)

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.values.setdefault(target.id, []).append(value)
        elif isinstance(target, ast.Tuple):
            for i, element in enumerate(target.elts):
                if isinstance(element, ast.Name):
                    self.values.setdefault(element.id, []).append(ast.Subscript(value, ast.Constant(i)))

    def lookup(self, name: str) -> list[ast.expr]:
        if name in self.values:
            return self.values[name]
        return self.parent.lookup(name) if self.parent else []


TRIMS = {"strip", "rstrip"}


def strings(node: ast.expr, scope: Scope, seen: frozenset[int] = frozenset()) -> list[str]:
    """The strings `node` can evaluate to, as far as the source says; an f-string gives its literal start."""
    if id(node) in seen:
        return []
    seen = seen | {id(node)}
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        return [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []
    if isinstance(node, ast.IfExp):
        body = strings(node.body, scope, seen)
        test = node.test  # `x if x == NAME else ...`: the body is NAME
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
            and ast.dump(test.left) == ast.dump(node.body)
        ):
            body = strings(test.comparators[0], scope, seen)
        return body + strings(node.orelse, scope, seen)
    if isinstance(node, ast.BoolOp):
        return [s for value in node.values for s in strings(value, scope, seen)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TRIMS:
        return strings(node.func.value, scope, seen)  # f"Word: {...}".rstrip(": ") starts as the f-string does
    if isinstance(node, ast.Name):
        return [s for value in scope.lookup(node.id) for s in strings(value, scope, seen)]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
        index = node.slice.value  # one element of a tuple: `a, b = ("X", ...)`
        return [s for element in elements(node.value, index, scope) for s in strings(element, scope, seen)]
    return []


def elements(node: ast.expr, index: int, scope: Scope) -> list[ast.expr]:
    if isinstance(node, ast.Tuple) and index < len(node.elts):
        return [node.elts[index]]
    if isinstance(node, ast.IfExp):
        return elements(node.body, index, scope) + elements(node.orelse, index, scope)
    return []


def called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[position] if len(call.args) > position else None


# Where the operator writes a reason: (the function called, the reason's position among its arguments).
REASON_ARGUMENTS = {"transition": 1, "fail": 0, "set_phase": 2, "set_condition": 2, "Event": 1, "event": 2,
                    "update": 99, "Waiting": 0, "Gate": 0}  # fmt: skip
# Functions whose appended (reason, message) tuples become a condition (kubetf.core.progress.health).
APPENDING_FUNCTIONS = {"health"}
# Functions whose returned (reason, message) tuples become a condition.
WAITING_FUNCTIONS = {"waiting", "waiting_message"}
# A decision's reason is split at its first ': ' into the condition's reason and its message (reconcile._restart).
DECISIONS = {"Decision": 1}
# What ended a task: the word before the first ':' of a termination's reason, as restarts.lastReason shows it.
TERMINATIONS = {"Termination": 1}
CAUSE_RETURNS = {"disruption_reason"}
PREFIX = re.compile(r"^([A-Z][A-Za-z]+):")
WORD = re.compile(r"^[A-Z][A-Za-z]+$")


@dataclass
class Written:
    reasons: set[str] = field(default_factory=set)  # a condition's or an Event's reason
    decisions: set[str] = field(default_factory=set)  # a Failed or Restarting condition's, from a Decision
    causes: set[str] = field(default_factory=set)  # words of restarts.lastReason (Kubernetes', Kueue's, ours)

    def __ior__(self, other: Written) -> Written:
        self.reasons |= other.reasons
        self.decisions |= other.decisions
        self.causes |= other.causes
        return self


def operator_sources() -> list[Path]:
    reasons_file = Path(reasons_module().__file__ or "").resolve()
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.resolve() != reasons_file]


def shallow_walk(nodes: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of these statements outside the functions (and methods) they define."""
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stack.extend(ast.iter_child_nodes(node))


def prefixes(node: ast.expr, scope: Scope) -> set[str]:
    return {m.group(1) for s in strings(node, scope) if (m := PREFIX.match(s))}


def is_reason_lookup(node: ast.expr) -> bool:
    """`something.get("reason", ...)`: a Kubernetes object's reason, read with a default."""
    return (
        isinstance(node, ast.Call)
        and called(node) == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "reason"
    )


def written_reasons(source: str) -> Written:
    tree = ast.parse(source)
    # The values every layer shares (kubetf.core.types: a refusal's cause) are constants of every module.
    module = Scope(tree.body, Scope(ast.parse((PACKAGE / "core" / "types.py").read_text()).body))
    written = Written()
    scopes: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, Scope, Iterator[ast.AST]]] = [
        (None, module, shallow_walk(tree.body))
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scopes.append((node, Scope(node.body, module, function=True), shallow_walk(node.body)))
    for function, scope, nodes in scopes:
        for node in nodes:
            if isinstance(node, ast.Call):
                name = called(node)
                if name == "event" and ast.unparse(node.func).startswith("kopf."):
                    continue  # kopf.on.event: a watch handler, not an Event
                if name in REASON_ARGUMENTS and (arg := argument(node, REASON_ARGUMENTS[name], "reason")) is not None:
                    written.reasons.update(strings(arg, scope))
                if name in DECISIONS and (arg := argument(node, DECISIONS[name], "reason")) is not None:
                    written.decisions |= prefixes(arg, scope)
                if name in TERMINATIONS and (arg := argument(node, TERMINATIONS[name], "reason")) is not None:
                    written.causes |= prefixes(arg, scope)
                if name == "append" and function is not None and function.name in APPENDING_FUNCTIONS and node.args:
                    written.reasons.update(s for e in elements(node.args[0], 0, scope) for s in strings(e, scope))
                if is_reason_lookup(node) and len(node.args) > 1:  # `.get("reason", "Default")`
                    written.causes.update(s for s in strings(node.args[1], scope) if WORD.match(s))
            elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and is_reason_lookup(node.values[0]):
                # `.get("reason") or "Default"`
                written.causes.update(s for v in node.values[1:] for s in strings(v, scope) if WORD.match(s))
            elif isinstance(node, ast.Return) and node.value is not None and function is not None:
                if function.name in WAITING_FUNCTIONS:
                    written.reasons.update(s for e in elements(node.value, 0, scope) for s in strings(e, scope))
                if function.name in CAUSE_RETURNS:
                    written.causes |= prefixes(node.value, scope)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Tuple) and t.elts and isinstance(t.elts[0], ast.Name) and t.elts[0].id == "reason"
                for t in node.targets
            ):  # `reason, message = ... if ... else ("Queued", "...")`
                written.reasons.update(s for e in elements(node.value, 0, scope) for s in strings(e, scope))
    return written


def constant_sets(names: set[str]) -> dict[str, set[str]]:
    """Module-level sets of Kubernetes' words in the operator's source, by name (wherever the modules live)."""
    found: dict[str, set[str]] = {}
    for path in operator_sources():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in names:
                        found[target.id] = set(ast.literal_eval(node.value))
    return found


def scan() -> Written:
    written = Written()
    for path in operator_sources():
        written |= written_reasons(path.read_text())
    return written


def test_every_reason_the_code_writes_is_in_the_catalog() -> None:
    catalog = reasons_module()
    written = scan()
    missing = sorted((written.reasons | written.decisions) - set(catalog.REASONS))
    assert not missing, f"reasons the operator writes with no entry in kubetf.reasons: {missing}"
    unknown = sorted(written.causes - set(catalog.REASONS) - set(catalog.CAUSES))
    assert not unknown, f"causes of a restart with no entry in kubetf.reasons: {unknown}"


def test_every_reason_of_the_operators_own_is_written_somewhere() -> None:
    """The other way round: the catalog lists no reason the code stopped writing (and the scan still finds them)."""
    catalog = reasons_module()
    written = scan()
    stale = sorted(set(catalog.OPERATOR) - written.reasons - written.decisions)
    assert not stale, f"kubetf.reasons lists reasons the operator never writes (or the scan lost them): {stale}"


def test_kubernetes_words_are_in_the_catalog() -> None:
    catalog = reasons_module()
    sets = constant_sets({"STUCK_WAITING_REASONS", "DISRUPTION_POD_REASONS", "NODE_REJECTION_REASONS"})
    assert set(sets) == {"STUCK_WAITING_REASONS", "DISRUPTION_POD_REASONS", "NODE_REJECTION_REASONS"}, sets
    # A pod that cannot start: a container's waiting reason, or the PodScheduled condition's (Kubernetes' v1 API).
    scheduled = {"Unschedulable", "SchedulingGated", "SchedulerError"}
    assert set(catalog.KUBERNETES) == sets["STUCK_WAITING_REASONS"] | scheduled
    causes = sets["DISRUPTION_POD_REASONS"] | sets["NODE_REJECTION_REASONS"] | {"OutOf<resource>"}
    # DisruptionTarget's reasons (Kubernetes); the reasons Kueue evicts a Workload for (its Evicted condition's,
    # apis/kueue/v1beta2/workload_types.go) and those the operator stops a queued job for (kueue.Admission.eviction).
    causes |= {"PreemptionByScheduler", "EvictionByEvictionAPI", "DeletionByTaintManager", "DeletionByPodGC"}
    causes |= {"TerminationByKubelet", "Preempted", "PodsReadyTimeout", "AdmissionCheck", "ClusterQueueStopped"}
    causes |= {"NodeFailures", "Deactivated", "WorkloadDeleted", "NotAdmitted", "NoWorkload"}
    assert causes <= set(catalog.CAUSES), sorted(causes - set(catalog.CAUSES))


def test_the_scan_catches_a_new_reason() -> None:
    source = """
NAMED = "FromAConstant"
def plan(status, result, transition, admission, job, refusal):
    transition("Failed", "BrandNew", "message", "Warning")
    set_phase(status, "Pending", refusal.cause if refusal.cause == NAMED else "OtherBranch", "m", 0, 1)
    decision.fail("FailedHere", "message", pods)
    result.events.append(Event("Normal", reason="ByKeyword", message="m"))
    reason, message = admission.waiting(job) if admission else ("FromATuple", "m")
    self.kube.event(job, "Normal", "PostedDirectly", "m")
    kopf.on.event("group", "v1", "workloads")
    Termination(Outcome.DISRUPTED, "Gone: the pod went")
    x = condition.get("reason") or "Unnamed"
    y = condition.get("reason", "Defaulted") or "not a word"
    return Decision(False, f"DecidedHere: {message}")
def waiting(self, job):
    return "Returned", "message"
def health(progress):
    out.append(("Appended", "message"))
    condition.update(status="False", reason="Updated")
def disruption_reason(pod):
    return f"Trimmed: {pod}".rstrip(": ")
"""
    written = written_reasons(source)
    assert written.reasons == {"BrandNew", "FromAConstant", "OtherBranch", "ByKeyword", "FromATuple",
                               "PostedDirectly", "Returned", "FailedHere", "Appended", "Updated"}  # fmt: skip
    assert written.decisions == {"DecidedHere"}
    assert written.causes == {"Gone", "Unnamed", "Defaulted", "Trimmed"}


def test_removing_a_catalog_entry_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = reasons_module()
    for name in ("SigtermIgnored", "NameInUse", "Queued", "PodsStarting", "BackoffLimitExceeded"):
        monkeypatch.setattr(catalog, "REASONS", {k: v for k, v in catalog.REASONS.items() if k != name})
        with pytest.raises(AssertionError, match=name):
            test_every_reason_the_code_writes_is_in_the_catalog()
        monkeypatch.undo()


def test_every_flag_of_the_operator_is_in_the_operating_guide() -> None:
    from kubetf.cli.main import build_parser

    operator = next(
        parser
        for action in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
        for name, parser in action.choices.items()
        if name == "operator"
    )
    flags = {option for action in operator._actions for option in action.option_strings if option.startswith("--")}
    documented = set(re.findall(r"`(--[a-z-]+)`", (DOCS / "operating.md").read_text()))
    assert flags - {"--help"} <= documented, f"docs/operating.md lacks {sorted(flags - documented - {'--help'})}"


def test_every_module_of_the_decisions_fits_in_a_reading() -> None:
    """The house (issue 46): no file in core/ over 500 lines; a concern that outgrows it gets a module of its own."""
    long = {
        str(path.relative_to(REPO)): n
        for path in (REPO / "operator" / "kubetf" / "core").rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
