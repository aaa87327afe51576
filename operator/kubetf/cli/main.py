"""The `kubetf` command line (also `kubectl tf`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import yaml

from kubetf.cli import jobctl, local
from kubetf.cluster import kube
from kubetf.cluster.kube import Kube
from kubetf.core import api, builders
from kubetf.core.config import DEFAULTS, OperatorConfig
from kubetf.core.convert import GANG_SCHEDULERS, KUBEFLOW_API_VERSION, ConversionError, convert

T = TypeVar("T")


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise CliError(f"{path}: cannot read: {error.strerror}") from error


def _documents(path: str) -> list[Any]:
    try:
        documents = api.load_documents(_read(path))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise CliError(f"{path}: malformed YAML{where}: {problem}") from error
    if not documents:
        raise CliError(f"{path}: no YAML documents found")
    return documents


def _label(path: str, index: int, count: int, document: Any) -> str:
    name = document.get("metadata", {}).get("name") if isinstance(document, dict) else None
    where = f"{path} document {index + 1}" if count > 1 else path
    return f"{where} ({name})" if isinstance(name, str) else where


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no anchors/aliases even where the input shared a template between roles."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(objects: Sequence[Any], out: TextIO) -> None:
    yaml.dump_all(objects, out, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def cmd_validate(args: argparse.Namespace) -> int:
    documents = _documents(args.file)
    failed = False
    for i, document in enumerate(documents):
        for problem in api.validate(document):
            print(f"{_label(args.file, i, len(documents), document)}: {problem}")
            failed = True
    return 1 if failed else 0


def cmd_render(args: argparse.Namespace) -> int:
    documents = _documents(args.file)
    objects: list[Any] = []
    problems = []
    for i, document in enumerate(documents):
        found = api.validate(document)
        problems += [f"{_label(args.file, i, len(documents), document)}: {p}" for p in found]
        if not found:
            if args.namespace:
                document.setdefault("metadata", {})["namespace"] = args.namespace
            objects += builders.render(document)
    if problems:
        raise CliError("\n".join(problems))
    _dump(objects, sys.stdout)
    return 0


@dataclass
class _Converted:
    """What one `kubetf convert` run did, for its summary."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    clean: int = 0
    noted: int = 0
    failed: int = 0
    skipped: int = 0
    sources: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) -> where it came from

    def summary(self) -> str:
        total = self.clean + self.noted + self.failed
        line = (
            f"{total} TFJob(s): {self.clean} converted cleanly, {self.noted} converted with notes, "
            f"{self.failed} not converted"
        )
        return line + (f"; {self.skipped} other document(s) skipped" if self.skipped else "")


def _convert_one(label: str, document: Any, strategy: str | None, gang: str | None, done: _Converted) -> None:
    if isinstance(document, dict) and document.get("kind") == "List" and isinstance(document.get("items"), list):
        for i, item in enumerate(document["items"]):  # `kubectl get tfjobs -o yaml`
            _convert_one(_label(f"{label} item {i + 1}", 0, 1, item), item, strategy, gang, done)
        return
    if isinstance(document, dict) and document.get("kind") not in (None, "TFJob"):
        print(f"{label}: skipped: kind {document['kind']} is not a TFJob", file=sys.stderr)
        done.skipped += 1
        return
    try:
        conversion = convert(document, strategy, gang)
    except ConversionError as error:
        print(f"{label}: not converted: {error}", file=sys.stderr)
        done.failed += 1
        return
    problems = api.validate(conversion.job)
    for problem in problems:
        print(f"{label}: not converted: the TrainingJob would be invalid: {problem}", file=sys.stderr)
    metadata = conversion.job["metadata"]
    key = (str(metadata.get("namespace") or ""), str(metadata.get("name")))
    if not problems and key in done.sources:
        print(f"{label}: not converted: {'/'.join(filter(None, key))} was already converted from {done.sources[key]}",
              file=sys.stderr)  # fmt: skip
        problems = [api.Problem("metadata.name", "duplicate")]
    if problems:
        done.failed += 1
        return
    print(f"{label}: gang scheduling: {conversion.gang} ({conversion.gang_why})", file=sys.stderr)
    for note in conversion.notes:
        print(f"{label}: note: {note}", file=sys.stderr)
    done.sources[key] = label
    done.jobs.append(conversion.job)
    if conversion.notes:
        done.noted += 1
    else:
        done.clean += 1


def _files(path: str) -> list[str]:
    """A path's YAML/JSON files: itself, or every *.yaml, *.yml, *.json under a directory, sorted."""
    if path == "-" or not os.path.isdir(path):
        return [path]
    found = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        found += [os.path.join(root, n) for n in sorted(names) if n.endswith((".yaml", ".yml", ".json"))]
    if not found:
        raise CliError(f"{path}: no .yaml, .yml or .json files in this directory")
    return found


def _cluster_tfjobs(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """Every TFJob of the cluster (or of -n), as (label, object)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    kube.load_config(args.kubeconfig)
    namespaces = [args.namespace] if args.namespace else []
    try:
        items = list(
            Kube(DEFAULTS.qps, DEFAULTS.burst).list_paged("tfjobs", namespaces, api_version=KUBEFLOW_API_VERSION)
        )
    except ApiException as error:
        if error.status == 404:
            raise CliError(
                f"the cluster serves no {KUBEFLOW_API_VERSION} tfjobs (Kubeflow's TFJob CRD is not installed): "
                "nothing to convert"
            ) from error
        where = f" in namespace {args.namespace}" if args.namespace else " in all namespaces (try -n NAMESPACE)"
        raise CliError(f"cannot list tfjobs{where}: {error.status} {error.reason}") from error
    except HTTPError as error:
        raise CliError(f"cannot reach the cluster: {error}") from error
    return [(f"tfjob {(i.get('metadata') or {}).get('namespace')}/{(i.get('metadata') or {}).get('name')}", i)
            for i in items]  # fmt: skip


def _write_jobs(jobs: list[dict[str, Any]], directory: str | None) -> None:
    if directory is None:
        _dump(jobs, sys.stdout)
        return
    for job in jobs:
        metadata = job["metadata"]
        folder = os.path.join(directory, metadata["namespace"]) if metadata.get("namespace") else directory
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, f"{metadata['name']}.yaml")
        with open(target, "w", encoding="utf-8") as handle:
            _dump([job], handle)
        print(f"wrote {target}", file=sys.stderr)


def cmd_convert(args: argparse.Namespace) -> int:
    if bool(args.file) == bool(args.from_cluster):
        raise CliError("give the TFJobs to convert with -f FILE|DIRECTORY|- (repeatable) or --from-cluster")
    if not args.from_cluster and (args.namespace or args.kubeconfig):
        raise CliError("-n/--namespace and --kubeconfig choose what --from-cluster reads: add --from-cluster")
    sources: list[tuple[str, Any]] = []
    done = _Converted()
    if args.from_cluster:
        sources = _cluster_tfjobs(args)
    for path in [f for given in args.file or [] for f in _files(given)]:
        try:
            documents = _documents(path)
        except CliError as error:
            print(f"{error}; not converted", file=sys.stderr)
            done.failed += 1
            continue
        sources += [(_label(path, i, len(documents), d), d) for i, d in enumerate(documents)]
    for label, document in sources:
        _convert_one(label, document, args.strategy, args.gang_scheduler, done)
    _write_jobs(done.jobs, args.output_dir)
    print(done.summary(), file=sys.stderr)
    return 1 if done.failed else 0


def operator_config(args: argparse.Namespace) -> OperatorConfig:
    settings = {setting: getattr(args, setting) for _, setting, _, _ in OPERATOR_SETTINGS}
    return OperatorConfig(
        namespaces=tuple(args.namespace or ()), leader_election=args.leader_election, verbose=args.verbose, **settings
    )


def cmd_operator(args: argparse.Namespace) -> int:
    from kubetf.runtime import runner

    kube.load_config(args.kubeconfig)
    config = operator_config(args)
    problem = config.problem()
    if problem:
        print(f"kubetf operator: {problem}", file=sys.stderr)
        return 2
    return runner.run(config, args.liveness_port, args.metrics_port, log_format=args.log_format)


def _cluster(args: argparse.Namespace) -> Kube:
    kube.load_config(args.kubeconfig)
    return Kube(DEFAULTS.qps, DEFAULTS.burst)


def _namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return str(args.namespace)
    try:
        from kubernetes import config

        _, context = config.list_kube_config_contexts(config_file=args.kubeconfig)
        return str(context["context"].get("namespace") or "default")
    except Exception:  # no kubeconfig (in-cluster) or no current context: the default namespace
        return "default"


def _job_command(run: Callable[[], T]) -> T:
    try:
        return run()
    except jobctl.JobError as error:
        raise CliError(str(error)) from error


def cmd_submit(args: argparse.Namespace) -> int:
    documents = _documents(args.file)
    if len(documents) != 1:
        raise CliError(f"{args.file}: expected one TrainingJob, found {len(documents)} documents")
    (job,) = documents
    problems = api.validate(job)
    if problems:
        raise CliError("\n".join(f"{args.file}: {p}" for p in problems))
    client = _cluster(args)
    created = _job_command(lambda: jobctl.submit(client, job, args.namespace))
    meta = created["metadata"]
    print(f"trainingjob {meta['namespace']}/{meta['name']} submitted")
    if args.detach:
        return 0
    return _job_command(lambda: jobctl.follow(client, meta["namespace"], meta["name"], sys.stdout, args.timeout))


def cmd_status(args: argparse.Namespace) -> int:
    client = _cluster(args)
    if args.watch:
        clear = sys.stdout.isatty()
        return _job_command(
            lambda: jobctl.watch_status(client, _namespace(args), args.name, sys.stdout, args.interval, clear)
        )
    return _job_command(lambda: jobctl.print_status(client, _namespace(args), args.name, sys.stdout))


def cmd_logs(args: argparse.Namespace) -> int:
    client = _cluster(args)
    return _job_command(
        lambda: jobctl.print_logs(client, _namespace(args), args.name, sys.stdout, args.follow, args.role)
    )


def cmd_tensorboard(args: argparse.Namespace) -> int:
    from kubetf.cli import tensorboard

    client = _cluster(args)
    return _job_command(lambda: tensorboard.run(client, _namespace(args), args.name, args.port, args.image, sys.stdout))


def cmd_delete(args: argparse.Namespace) -> int:
    client = _cluster(args)
    return _job_command(lambda: jobctl.delete(client, _namespace(args), args.name, sys.stdout))


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else default)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")


def _file_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("-f", "--filename", dest="file", required=True, metavar="FILE", help=help_text)


def _seconds_pair(text: str) -> tuple[float, float]:
    try:
        connect, read = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CONNECT,READ seconds (like 5,30), got {text!r}") from None
    return connect, read


# The settings a cluster's operator tunes: (flag, OperatorConfig field, type, help). Defaults come from DEFAULTS.
OPERATOR_SETTINGS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--qps", "qps", float, "client-side API rate limit, requests/s"),
    ("--burst", "burst", int, "requests allowed above --qps in a burst"),
    ("--workers", "workers", int, "jobs reconciled in parallel"),
    ("--urgent-workers", "urgent_workers", int, "more, for urgent reconciles only: a pod ended or is taken away"),
    ("--lease-namespace", "lease_namespace", str, "namespace of the leader Lease (in a pod: the pod's own namespace)"),
    ("--lease-name", "lease_name", str, "name of the leader Lease"),
    (
        "--lease-duration",
        "lease_duration",
        float,
        "seconds a standby waits for an unrenewed lease before it takes over",
    ),
    (
        "--renew-deadline",
        "renew_deadline",
        float,
        "seconds the leader goes on writing without a renewal (less than --lease-duration)",
    ),
    ("--retry-period", "retry_period", float, "seconds between renewals and attempts"),
    (
        "--resync-seconds",
        "resync_seconds",
        float,
        "re-list every job, pod and Workload this often, in case a watch missed an event",
    ),
    (
        "--queue-position-seconds",
        "queue_position_seconds",
        float,
        "read Kueue's queue positions this often (its visibility API)",
    ),
    ("--queue-position-writes", "queue_position_writes", float, "status writes of queue positions allowed per second"),
    (
        "--expectations-timeout",
        "expectations_timeout",
        float,
        "seconds a reconcile waits for the watch to show the operator's own creates and deletes",
    ),
    (
        "--pod-batch-seconds",
        "pod_batch_seconds",
        float,
        "seconds a job's reconcile waits after a pod started or turned ready (its peers' changes in one reconcile)",
    ),
    (
        "--admitted-shape-seconds",
        "admitted_shape_seconds",
        float,
        "a new job's pod shaped like one that passed a dry run this recently is not dry-run (0: every job is)",
    ),
    ("--api-timeout", "api_timeout", _seconds_pair, "CONNECT,READ seconds of every API request"),
    (
        "--log-timeout",
        "log_timeout",
        _seconds_pair,
        "CONNECT,READ seconds of a pod log read (through the node's kubelet, which may not answer)",
    ),
    (
        "--node-monitor-grace-period",
        "node_monitor_grace",
        float,
        "the cluster's kube-controller-manager --node-monitor-grace-period: how long before Unknown a node went silent",
    ),
    ("--progress-port", "progress_port", int, "serve the training pods' progress reports here (0: off)"),
    (
        "--progress-url",
        "progress_url",
        str,
        "the URL training pods report their progress to (the chart sets its Service's; empty: pods report nothing)",
    ),
    (
        "--progress-write-seconds",
        "progress_write_seconds",
        float,
        "write a job's status.progress at most this often (its first and final report at once)",
    ),
    (
        "--progress-writes-per-second",
        "progress_writes_per_second",
        float,
        "status.progress writes per second for all jobs together",
    ),
    (
        "--progress-stall-seconds",
        "progress_stall_seconds",
        float,
        "a running job whose step has not moved this long is TrainingStalled",
    ),
    (
        "--http-connections",
        "http_connections",
        int,
        "connections each of the operator's ports holds open at once (past that: 503, retry)",
    ),
    (
        "--http-connections-per-peer",
        "http_connections_per_peer",
        int,
        "connections the progress port holds open at once from one address (a pod has one; past that: 503, retry)",
    ),
    (
        "--http-read-timeout",
        "http_read_timeout",
        float,
        "seconds a request's line and headers may take to arrive at any of the operator's ports, and its body from "
        "its admission (past that: 408)",
    ),
    (
        "--http-write-timeout",
        "http_write_timeout",
        float,
        "seconds a client of any of the operator's ports has to take its answer (past that: the connection is closed)",
    ),
    (
        "--metrics-cpu-share",
        "metrics_cpu_share",
        float,
        "the share of a core /metrics pages may take to build: a page is served again, unbuilt, until its build's CPU "
        "is at most this share of the time since it began",
    ),
    (
        "--progress-api-qps",
        "progress_api_qps",
        float,
        "API requests per second the progress port may make (TokenReviews, first reads; past that: 429)",
    ),
    ("--progress-api-burst", "progress_api_burst", int, "the progress port's API requests allowed in a burst"),
    (
        "--progress-api-namespace-qps",
        "progress_api_namespace_qps",
        float,
        "TokenReviews per second for the pods of one namespace, within --progress-api-qps (past that: 429)",
    ),
    (
        "--progress-api-namespace-burst",
        "progress_api_namespace_burst",
        int,
        "TokenReviews for the pods of one namespace allowed in a burst",
    ),
    (
        "--reconcile-error-after",
        "reconcile_error_after",
        int,
        "failed reconciles in a row after which a job gets the ReconcileError condition",
    ),
    (
        "--node-monitor-period",
        "node_monitor_period",
        float,
        "the cluster's kube-controller-manager --node-monitor-period: how often it checks the nodes' heartbeats",
    ),
    (
        "--scheduling-grace",
        "scheduling_grace",
        float,
        "seconds a pod may stay unscheduled before it is worth a warning",
    ),
    (
        "--stuck-margin",
        "stuck_margin",
        float,
        "seconds past its grace period after which a terminating pod is reported stuck",
    ),
    (
        "--in-place-grace",
        "in_place_grace",
        float,
        "seconds a MultiWorkerMirrored group restarting in place has for its members to exit by themselves",
    ),
)


def _operator_arguments(operator: argparse.ArgumentParser) -> None:
    operator.add_argument(
        "-n", "--namespace", action="append", help="watch this namespace (repeatable); default: all namespaces"
    )
    operator.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else KUBECONFIG)")
    operator.add_argument("--liveness-port", type=int, default=8080, help="serve /healthz here (0: off)")
    operator.add_argument("--metrics-port", type=int, default=9090, help="serve Prometheus /metrics here (0: off)")
    operator.add_argument(
        "--log-format", choices=["json", "plain", "full"], default="json", help="full: plain with timestamps"
    )
    operator.add_argument(
        "--no-leader-election", dest="leader_election", action="store_false",
        help="act at once, without the Lease (only when no other kubetf operator can run)",
    )  # fmt: skip
    for flag, setting, kind, text in OPERATOR_SETTINGS:
        default = getattr(DEFAULTS, setting)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        metavar = "CONNECT,READ" if kind is _seconds_pair else None
        operator.add_argument(
            flag, dest=setting, type=kind, default=default, metavar=metavar, help=f"{text} (default: {shown})"
        )
    operator.add_argument("-v", "--verbose", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubetf", description="Run distributed TensorFlow training on Kubernetes with TrainingJobs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _offline_commands(commands)
    _job_commands(commands)
    operator = commands.add_parser("operator", help="run the operator (in a cluster or against a kubeconfig)")
    _operator_arguments(operator)
    operator.set_defaults(handler=cmd_operator)
    return parser


def _offline_commands(commands: Any) -> None:
    """The commands that need no cluster."""
    render = commands.add_parser("render", help="print the objects the operator would create, offline")
    _file_argument(render, "TrainingJob YAML ('-' for stdin)")
    render.add_argument("-n", "--namespace", help="namespace to render into (default: the job's, else default)")
    render.set_defaults(handler=cmd_render)

    validate = commands.add_parser("validate", help="check TrainingJobs offline, one line per problem")
    _file_argument(validate, "TrainingJob YAML, one or more documents ('-' for stdin)")
    validate.set_defaults(handler=cmd_validate)

    conv = commands.add_parser(
        "convert",
        help="turn Kubeflow TFJobs (kubeflow.org/v1) into TrainingJobs",
        description="Convert Kubeflow TFJobs to TrainingJobs: the jobs go to stdout (or --output-dir), notes on what "
        "did not carry over as is and a summary to stderr. Exit 1 when any TFJob could not be converted.",
    )
    conv.add_argument(
        "-f", "--filename", dest="file", action="append", metavar="PATH",
        help="a YAML stream, a directory of .yaml/.yml/.json files, or '-' for stdin (repeatable)",
    )  # fmt: skip
    conv.add_argument("--from-cluster", action="store_true", help="convert the TFJobs of the cluster")
    conv.add_argument("-n", "--namespace", help="with --from-cluster: only this namespace (default: all namespaces)")
    conv.add_argument(
        "--kubeconfig", help="with --from-cluster: kubeconfig file (default: KUBECONFIG or ~/.kube/config)"
    )
    conv.add_argument(
        "--strategy", choices=api.STRATEGIES,
        help="the strategy of every converted job (default: chosen from each TFJob's layout, ambiguity noted)",
    )  # fmt: skip
    conv.add_argument(
        "--gang-scheduler", choices=sorted(GANG_SCHEDULERS),
        help="the gang scheduler Kubeflow's --gang-scheduler-name named (the TFJob does not say it; default: Volcano "
        "when its pods name it or its schedulingPolicy has a queue, Kueue when it is queued, else Auto)",
    )  # fmt: skip
    conv.add_argument("-o", "--output-dir", metavar="DIR", help="write DIR/NAMESPACE/NAME.yaml per job, not stdout")
    conv.set_defaults(handler=cmd_convert)

    local_run = commands.add_parser("local", help="run a TrainingJob's replicas as local processes, no cluster")
    local.add_arguments(local_run)
    local_run.set_defaults(handler=local.run_from_args)


def _job_commands(commands: Any) -> None:
    """The commands on one job of the cluster."""
    submit_cmd = commands.add_parser("submit", help="create a TrainingJob and follow it to the end")
    _file_argument(submit_cmd, "TrainingJob YAML ('-' for stdin)")
    _cluster_arguments(submit_cmd)
    submit_cmd.add_argument("-d", "--detach", action="store_true", help="return once submitted")
    submit_cmd.add_argument("--timeout", type=float, help="stop following after this many seconds")
    submit_cmd.set_defaults(handler=cmd_submit)

    status_cmd = commands.add_parser(
        "status", help="a job's phase, replicas, restarts, progress with its curves, and recent events"
    )
    status_cmd.add_argument("name")
    _cluster_arguments(status_cmd)
    status_cmd.add_argument("-w", "--watch", action="store_true", help="show it again until the job finishes")
    status_cmd.add_argument("--interval", type=float, default=5.0, help="with --watch: seconds between updates")
    status_cmd.set_defaults(handler=cmd_status)

    logs_cmd = commands.add_parser("logs", help="logs of every replica, prefixed by role and index")
    logs_cmd.add_argument("name")
    _cluster_arguments(logs_cmd)
    logs_cmd.add_argument("-f", "--follow", action="store_true", help="stream until the job finishes")
    logs_cmd.add_argument("--role", choices=api.ROLES, help="only this role")
    logs_cmd.set_defaults(handler=cmd_logs)

    board = commands.add_parser(
        "tensorboard", help="TensorBoard on a job's logs (its checkpoint volume), forwarded to a local port"
    )
    board.add_argument("name")
    _cluster_arguments(board)
    board.add_argument("--port", type=int, default=6006, help="local port (0: any free one)")
    board.add_argument("--image", help="image with TensorBoard (default: the job's training image)")
    board.set_defaults(handler=cmd_tensorboard)

    delete_cmd = commands.add_parser("delete", help="delete a job (the checkpoint PVC follows retainOnDelete)")
    delete_cmd.add_argument("name")
    _cluster_arguments(delete_cmd)
    delete_cmd.set_defaults(handler=cmd_delete)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kubetf render ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
