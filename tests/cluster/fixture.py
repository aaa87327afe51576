"""The `kube_cluster` pytest fixture: the one way integration and e2e tests get a Kubernetes cluster.

- `$KUBECONFIG` set: that cluster is used as it is (kind, a real cluster, a local cluster already up).
- otherwise `tests/cluster/local-cluster.sh up` brings the project's single-node cluster up (cached binaries and
  images make that about a minute; a cold machine builds everything first) and the session uses its kubeconfig.
  The cluster is left up at the end of the session: `local-cluster.sh down` (or `.ci/run`) tears it down.

Either way `KUBECONFIG` is set in `os.environ` for the session and `~/.cache/kubetf/bin` (kubectl, helm) is put
first on `PATH`. A cluster that cannot be had fails the session loudly; it never skips.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.kwok import is_local
from tests.cluster.session import once

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "local-cluster.sh"
CACHE = Path(os.environ.get("KUBETF_CACHE", str(Path.home() / ".cache" / "kubetf")))
BIN_DIR = CACHE / "bin"
UP_TIMEOUT = float(os.environ.get("KUBETF_CLUSTER_UP_TIMEOUT", "4800"))


@dataclasses.dataclass(frozen=True)
class KubeCluster:
    kubeconfig: str
    local: bool  # True when this session's cluster is the one local-cluster.sh runs

    @property
    def on_local_cluster(self) -> bool:
        """This session's cluster, or the one KUBECONFIG names, is local-cluster.sh's (its script can install)."""
        return self.local or is_local(self.kubeconfig)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """Run kubectl against this cluster; fail the test with its output when it exits non-zero and check."""
        kubectl = shutil.which("kubectl", path=f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}")
        if not kubectl:
            pytest.fail("kubectl not found (tests/cluster/local-cluster.sh up puts it in ~/.cache/kubetf/bin)")
        result = subprocess.run(
            [kubectl, "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def install_kueue(self) -> None:
        """Make sure Kueue runs and its webhooks answer (idempotent; a few seconds when it already does).

        On the local cluster (`local` or KUBECONFIG naming its kubeconfig) this is `local-cluster.sh kueue`, which
        builds Kueue on first use (about 5 min cold). On another cluster Kueue must already be installed
        (`tests/cluster/kind.sh kueue`): the test fails otherwise.
        """
        if self.on_local_cluster:
            _run_script("kueue")
            return
        rollout = ("-n", "kueue-system", "rollout", "status", "deployment/kueue-controller-manager", "--timeout=5s")
        result = self.kubectl(*rollout, check=False)
        if result.returncode != 0:
            pytest.fail(
                f"Kueue is not running on the cluster of KUBECONFIG={self.kubeconfig} (kind: tests/cluster/kind.sh "
                f"kueue):\n{result.stderr}",
                pytrace=False,
            )

    def install_multikueue(self) -> dict[str, str]:
        """MultiKueue's two more control planes beside the local cluster, which is worker1 (`local-cluster.sh
        multikueue`: idempotent, seconds when they run): their kubeconfigs by name ("manager", "worker2"). Only on
        the local cluster: elsewhere a test that needs them fails, saying so."""
        if not self.on_local_cluster:
            pytest.fail(
                "MultiKueue's test clusters run beside the local cluster only (tests/cluster/README.md)", pytrace=False
            )
        lines = _run_script("multikueue")
        found = {}
        for line in _run_script("env"):
            for plane in ("manager", "worker2"):
                prefix = f"export KUBETF_{plane.upper()}_KUBECONFIG="
                if line.startswith(prefix):
                    found[plane] = line[len(prefix) :].strip().strip("'\"")
        if set(found) != {"manager", "worker2"}:
            pytest.fail("local-cluster.sh env names no MultiKueue kubeconfigs:\n" + "".join(lines[-30:]), pytrace=False)
        return found

    def remove_multikueue(self) -> None:
        """MultiKueue's two control planes stopped (`local-cluster.sh multikueue-down`): idle, they still took a share
        of the machine's two cores from every test after theirs."""
        _run_script("multikueue-down")

    def install_volcano(self) -> None:
        """Make sure Volcano's scheduler and queue-controller run (idempotent; ~2 s when they already do).

        On the local cluster this is `local-cluster.sh volcano` (built on first use, ~4 min cold). On another cluster
        Volcano must already be installed, its scheduler named `volcano`: the test fails otherwise.
        """
        if self.on_local_cluster:
            _run_script("volcano")
            return
        rollout = ("-n", "volcano-system", "rollout", "status", "deployment/volcano-scheduler", "--timeout=5s")
        result = self.kubectl(*rollout, check=False)
        if result.returncode != 0:
            pytest.fail(
                f"Volcano's scheduler does not run in volcano-system on the cluster of KUBECONFIG={self.kubeconfig} "
                f"(install Volcano there, its scheduler named volcano):\n{result.stderr}",
                pytrace=False,
            )


def wait_for(predicate: Any, timeout: float = 15.0, what: Any = "condition", interval: float | None = None) -> Any:
    """Poll until `predicate()` is truthy and return it; fail the test with the last value seen. `what` may be a
    callable: it then describes the state at the time of the failure, not at the start of the wait.

    Without an `interval`, polls every 50 ms at first, then every tenth of the time waited so far (at most every
    second): what comes at once is seen at once, and a wait of minutes (a job training) costs the API server and the
    test a few hundred requests, not thousands, and at most a tenth more time."""
    start = time.monotonic()
    deadline = start + timeout
    last = None
    while (now := time.monotonic()) < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval if interval is not None else min(max(0.05, (now - start) / 10), 1.0))
    pytest.fail(f"timed out after {timeout}s waiting for {what() if callable(what) else what}; last value: {last!r}")


def _add_bin_dir_to_path() -> None:
    path = os.environ.get("PATH", "")
    if str(BIN_DIR) not in path.split(os.pathsep):
        os.environ["PATH"] = f"{BIN_DIR}{os.pathsep}{path}"


def _run_up() -> str:
    """Run `local-cluster.sh up`, echoing its progress lines; return the kubeconfig path it exports."""
    lines = _run_script("up")
    for line in lines:
        if line.startswith("export KUBECONFIG="):
            return line.split("=", 1)[1].strip()
    pytest.fail("local-cluster.sh up did not print the KUBECONFIG to use:\n" + "".join(lines[-30:]), pytrace=False)


def _run_script(*args: str) -> list[str]:
    """Run `local-cluster.sh ARGS...`, echoing its progress lines; fail the session when it fails; return its lines."""
    start = time.monotonic()
    out = sys.__stderr__
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if out:
            out.write(line)
            out.flush()
        if time.monotonic() - start > UP_TIMEOUT:
            proc.kill()
            break
    rc = proc.wait()
    if rc != 0:
        pytest.fail(
            f"tests/cluster/local-cluster.sh {' '.join(args)} exited {rc} after {time.monotonic() - start:.0f}s:\n"
            + "".join(lines[-60:]),
            pytrace=False,
        )
    return lines


def ensure_cluster() -> KubeCluster:
    """A reachable cluster: `$KUBECONFIG` when set, else the local one brought up (also for scripts: make bench)."""
    _add_bin_dir_to_path()
    kubeconfig = os.environ.get("KUBECONFIG", "")
    local = False
    if kubeconfig:
        first = kubeconfig.split(os.pathsep)[0]
        if not Path(first).is_file():
            pytest.fail(f"KUBECONFIG={kubeconfig} does not name a file", pytrace=False)
    else:
        kubeconfig = _run_up()
        local = True
        os.environ["KUBECONFIG"] = kubeconfig
    cluster = KubeCluster(kubeconfig=kubeconfig, local=local)
    deadline = time.monotonic() + 60
    while True:
        result = cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=20)
        if result.returncode == 0:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the cluster at KUBECONFIG={kubeconfig} is not ready:\n{result.stderr}", pytrace=False)
        time.sleep(1)
    return cluster


@pytest.fixture(scope="session")
def kube_cluster() -> KubeCluster:
    """A reachable Kubernetes cluster for the whole session (see the module docstring)."""
    return ensure_cluster()


@pytest.fixture(scope="session")
def kueue(kube_cluster, request) -> KubeCluster:
    """Kueue in the cluster: installed once per run (on the local cluster: built on first use) and left installed,
    as a shared cluster has it all the time. Its pod webhook is then in the path of every test's pods, as it would
    be there; the operator and the tests cope with it restarting (local-cluster.sh apiserver-restart waits for it)."""
    with once(request.config, "kueue") as first:
        if first:
            kube_cluster.install_kueue()
    return kube_cluster
