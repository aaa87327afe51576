"""docs/security.md's tables held to what they describe: its RBAC table row for row to the chart's RBAC (rendered by
helm, in every shape the values give it), its table of what the operator deletes to the chart's `delete` rights and to
the deletes the operator's code calls. A right added to the chart, or a delete to the code, fails here until the page
says so."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from tests.unit.test_helm import NAMESPACE, REPO, Obj, by_kind, helm, template  # noqa: F401 (helm: a fixture)

pytestmark = pytest.mark.unit

SECURITY = REPO / "docs" / "security.md"
PACKAGE = REPO / "operator" / "kubetf"
DELETES = "## What the operator deletes, and how it knows it is the job's"

Right = tuple[str, str, str, str | None]  # (API group, resource, verb, the one name it is limited to)

VARIANTS = {
    "every namespace served": (),
    "named namespaces": ("--set", "watchNamespaces={team-a,team-b}"),
    "no progress port": ("--set", "progress.enabled=false"),
    "a MultiKueue manager": ("--set", "kueue.multiKueue=true"),
    "no rights for Kueue": ("--set", "kueue.rbac=false"),
}


def table(markdown: str, heading: str, index: int = 0) -> list[list[str]]:
    """The rows (cells stripped) of the `index`th table under `heading`, up to the next heading."""
    section = markdown.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    tables: list[list[list[str]]] = [[]]
    for line in section.splitlines():
        if line.startswith("|"):
            tables[-1].append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif tables[-1]:
            tables.append([])
    found = [t for t in tables if t]
    assert len(found) > index, f"{SECURITY.name}: no table {index + 1} under {heading!r}"
    return [row for row in found[index][2:]]  # past the header and its rule


def quoted(cell: str) -> list[str]:
    """The `code` spans of a cell, `""` being the core API group."""
    return ["" if span == '""' else span for span in re.findall(r"`([^`]*)`", cell)]


# ---------------------------------------------------------------------- RBAC


def documented_rights(values: tuple[str, ...]) -> dict[str, set[Right]]:
    """What the RBAC table says each role of a release rendered with `values` grants, by role: `cluster`,
    `namespace` (each served namespace's Role, with watchNamespaces), `lease`, `kueue`."""
    named = "watchNamespaces" in " ".join(values)
    settings = {
        "`progress.enabled`": "progress.enabled=false" not in values,
        "`watchNamespaces`": named,
        "`kueue.rbac`": "kueue.rbac=false" not in values,
        "`kueue.multiKueue`": "kueue.rbac=false" not in values and "kueue.multiKueue=true" in values,
    }
    roles: dict[str, set[Right]] = {"cluster": set(), "namespace": set(), "lease": set(), "kueue": set()}
    for who, groups, resources, verbs, _why in table(SECURITY.read_text(), "## Rights (RBAC)"):
        condition = re.search(r"with (`[^`]+`)", who)
        if condition and not settings[condition.group(1)]:
            continue
        if "serving every namespace" in who and named:
            continue
        name = re.search(r"named `([^`]+)`", resources)
        limited = name.group(1).replace("<release>", "kubetf") if name else None
        kinds = quoted(resources.split(" named ")[0])
        if who.startswith("Kueue's ServiceAccount"):
            role = "kueue"
        elif "in its own namespace" in who:
            role = "lease"
        elif "in each served namespace" in who:
            role = "namespace" if named else "cluster"
        else:
            assert "cluster-wide" in who, f"{SECURITY.name}: whose rights, and where? {who!r}"
            role = "cluster"
        verbs_ = [verb.strip() for verb in verbs.split(",")]
        roles[role] |= {(group, kind, verb, limited) for group in quoted(groups) for kind in kinds for verb in verbs_}
    return roles


def rights(role: Obj) -> set[Right]:
    granted: set[Right] = set()
    for rule in role.get("rules") or []:
        for name in rule.get("resourceNames") or [None]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted |= {(group, resource, verb, name) for verb in rule["verbs"]}
    return granted


def rendered_rights(objects: list[Obj]) -> dict[str, set[Right]]:
    roles: dict[str, set[Right]] = {"cluster": set(), "namespace": set(), "lease": set(), "kueue": set()}
    namespaced = [r for r in by_kind(objects, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    for role in by_kind(objects, "ClusterRole"):
        roles["kueue" if role["metadata"]["name"].endswith("-kueue") else "cluster"] |= rights(role)
    for role in by_kind(objects, "Role"):
        if role["metadata"]["name"].endswith("-leader-election"):
            assert role["metadata"]["namespace"] == NAMESPACE
            roles["lease"] |= rights(role)
    if namespaced:
        each = [rights(r) for r in namespaced]
        assert all(r == each[0] for r in each), "the served namespaces' Roles differ"
        roles["namespace"] = each[0]
    return roles


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_rbac_table_is_the_charts_rbac_row_for_row(helm: str, variant: str) -> None:  # noqa: F811
    values = VARIANTS[variant]
    documented, granted = documented_rights(values), rendered_rights(template(helm, *values))
    for role in documented:
        missing, extra = granted[role] - documented[role], documented[role] - granted[role]
        assert not missing and not extra, (
            f"docs/security.md's RBAC table and the chart ({variant}) differ for the {role} role: the chart grants "
            f"{sorted(missing, key=str)} that the table does not list, the table lists {sorted(extra, key=str)} that "
            "the chart does not grant. Make the table say what the chart grants (and why), or the chart what it says."
        )


def test_the_rbac_check_fails_on_a_right_the_table_leaves_out(helm: str) -> None:  # noqa: F811
    granted = rendered_rights(template(helm))
    documented = documented_rights(())
    documented["cluster"].discard(("", "nodes", "get", None))
    assert granted["cluster"] - documented["cluster"] == {("", "nodes", "get", None)}


# ---------------------------------------------------------------------- deletes

# The Kubernetes client's delete methods the operator may call, and what each deletes. A generic one (custom objects)
# deletes the custom kinds of the table, which the chart's `delete` rights bound.
CUSTOM = "the custom kinds the chart may delete"
CLIENT_DELETES: dict[str, tuple[str, str] | str] = {
    "delete_namespaced_pod": ("", "pods"),
    "delete_namespaced_custom_object": CUSTOM,
}


def documented_deletes() -> set[tuple[str, str]]:
    found = set()
    for _what, kinds, _when, _proof in table(SECURITY.read_text(), DELETES):
        spans = quoted(kinds)
        assert len(spans) % 2 == 0, f"{SECURITY.name}: the deletes table names (API group, resource) pairs: {kinds!r}"
        found |= set(zip(spans[::2], spans[1::2], strict=True))
    return found


def client_delete_methods() -> set[str]:
    """Every delete method of the Kubernetes client's API classes."""
    classes = [getattr(kubernetes.client, name) for name in dir(kubernetes.client) if name.endswith("Api")]
    return {name for cls in classes if isinstance(cls, type) for name in vars(cls) if name.startswith("delete_")}


def deletes_called(package: Path = PACKAGE) -> Iterator[tuple[str, str]]:
    """(file:line, method) of each mention of a Kubernetes client's delete method in the package: a call, or the
    method handed to a wrapper (`self._call("delete", "pods", self.core.delete_namespaced_pod, ...)`)."""
    methods = client_delete_methods()
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in methods:
                yield f"{path}:{node.lineno}", node.attr


def test_the_deletes_table_is_what_the_chart_lets_the_operator_delete(helm: str) -> None:  # noqa: F811
    granted = rendered_rights(template(helm))
    may_delete = {(group, resource) for group, resource, verb, _ in granted["cluster"] if verb == "delete"}
    documented = documented_deletes()
    assert documented == may_delete, (
        f"docs/security.md's deletes table names {sorted(documented)}; the chart lets the operator delete "
        f"{sorted(may_delete)}"
    )


def test_the_deletes_table_is_what_the_operators_code_deletes() -> None:
    called = list(deletes_called())
    unknown = [(where, method) for where, method in called if method not in CLIENT_DELETES]
    assert not unknown, (
        f"the operator calls deletes that docs/security.md's table does not account for: {unknown}: add what they "
        "delete to the table (and to CLIENT_DELETES here)"
    )
    documented = documented_deletes()
    deleted = {CLIENT_DELETES[method] for _, method in called}
    core = {kind for kind in deleted if kind != CUSTOM}
    assert core == {(group, resource) for group, resource in documented if group == ""}
    assert (CUSTOM in deleted) == any(group != "" for group, _ in documented)


def test_the_code_scan_finds_a_delete_of_another_kind(tmp_path: Path) -> None:
    (tmp_path / "rogue.py").write_text("def clean(core, name):\n    core.delete_namespaced_service(name, 'ns')\n")
    assert [method for _, method in deletes_called(tmp_path)] == ["delete_namespaced_service"]
