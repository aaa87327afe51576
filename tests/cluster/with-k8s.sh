#!/usr/bin/env bash
# Run a command against the local cluster at another Kubernetes version, then put the cluster back as it was.
#
#   tests/cluster/with-k8s.sh VERSION [KUBELET_VERSION] -- COMMAND...
#
# `make test-k8s-1.35` is `with-k8s.sh v1.35.8 -- make test-cluster-staged`. Step by step:
#  1. remembers the local cluster: the versions, feature gates and runtime config it was started with (its
#     cluster.stamp), whether Kueue and Volcano are installed and MultiKueue's planes run (local-cluster.sh
#     multikueue), its fake kwok nodes and the GPUs its nodes advertise;
#  2. reserves the cluster (local-cluster.sh RESERVED): meanwhile an `up` or `down` for any other cluster, e.g.
#     another checkout's test session, waits until this run ends instead of replacing the cluster under it;
#  3. `local-cluster.sh down`, then `up --kueue --fake-nodes N` (N: KUBETF_FAKE_NODES, else 4 as in CI) with the
#     control plane at VERSION and the kubelet and kube-proxy at KUBELET_VERSION (default VERSION: the skew policy
#     allows no kubelet newer than the API server), then Volcano; the binaries are built first if not cached
#     (k8s-build/build.sh: v1.35.8 took 13 min cold); checks that the API server and the node report those versions;
#  4. runs COMMAND with the cluster's environment (local-cluster.sh env) and KUBETF_K8S_VERSION,
#     KUBETF_KUBELET_VERSION exported: every local-cluster.sh call the tests make then finds this cluster up, and
#     tests marked k8s_min("1.37", reason=...) are skipped with their reason (tests/cluster/k8s_version.py);
#  5. always (COMMAND failed, a step failed, Ctrl-C): `down`, the reservation released, and the cluster brought up
#     again as remembered (with Kueue, Volcano, MultiKueue's planes, its fake nodes); nothing if no cluster was up
#     before. Objects in the cluster (namespaces, the chart, jobs) are not carried over: `down` wipes etcd, and
#     etcd's data is not downgradable anyway.
# Prints each step's time. Exits with COMMAND's status, or 1 when a step of its own failed.
set -euo pipefail
# Under `make -n` (make runs a recipe line naming $(MAKE) even then): say what would run, change nothing.
flags=${MAKEFLAGS:-}; flags=${flags%% *}
if [[ $flags != -* && $flags == *n* ]]; then echo "with-k8s.sh $* (make -n: not run)"; exit 0; fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRIPT="$HERE/local-cluster.sh"
STATE="${KUBETF_CLUSTER_DIR:-/var/lib/kubetf-cluster}"
usage() { sed -n '4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

VERSION=${1:-}; KUBELET=${VERSION}
[[ $VERSION =~ ^v1\.[0-9]+\.[0-9]+$ ]] || usage
shift
if [[ ${1:-} =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then KUBELET=$1; shift; fi
[[ ${1:-} == -- ]] || usage
shift
(($#)) || usage
[[ $EUID -eq 0 ]] || { echo "with-k8s.sh: must run as root (it runs the local cluster)" >&2; exit 2; }

log() { printf '[with-k8s %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
T0=$SECONDS
TIMES=()
step() {  # step NAME CMD...: run and time one step (its failure is the caller's to handle)
  local name=$1 t=$SECONDS rc=0; shift
  log "$name"
  "$@" || rc=$?
  TIMES+=("$(printf '%-64s %6ss%s' "$name" $((SECONDS - t)) "$( ((rc == 0)) || echo "  (exit $rc)")")")
  return $rc
}
# The stamp local-cluster.sh writes for the environment given (it reads its versions from the environment only)
# shellcheck disable=SC2016  # expanded by the inner bash
stamp_for() { env "$@" bash -c 'source "$1" && echo "$CLUSTER_STAMP"' with-k8s "$SCRIPT"; }
field() { local key=$1 word; for word in $2; do [[ $word == "$key="* ]] && echo "${word#"$key"=}" && return 0; done; }
kubectl_() { "$HOME/.cache/kubetf/bin/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

# One run at a time: a second one would share the cluster with the first and then lose it at the first's restore.
RESERVED=/run/kubetf-cluster-reserved  # "PID STAMP" (local-cluster.sh reads it)
reserved_by() { local pid rest; [[ -f $RESERVED ]] && read -r pid rest <"$RESERVED" && [[ $pid =~ ^[0-9]+$ ]] \
  && kill -0 "$pid" 2>/dev/null && echo "pid $pid for '$rest'"; }
if held="$(reserved_by)"; then echo "with-k8s.sh: the local cluster is reserved by $held" >&2; exit 1; fi

# 1. What to put back.
WAS_UP=0 OLD_STAMP="" KUEUE=0 VOLCANO=0 MULTIKUEUE=0 FAKE=0 GPUS="" FAKE_GPUS=""
if [[ -f $STATE/cluster.stamp ]]; then
  WAS_UP=1; OLD_STAMP="$(cat "$STATE/cluster.stamp")"
  if kubectl_ get --raw /readyz >/dev/null 2>&1; then
    kubectl_ -n kueue-system get deployment kueue-controller-manager >/dev/null 2>&1 && KUEUE=1
    kubectl_ -n volcano-system get deployment volcano-scheduler >/dev/null 2>&1 && VOLCANO=1
    [[ ! -f $STATE/multikueue/stamp ]] || MULTIKUEUE=1  # `local-cluster.sh multikueue`'s planes, where it has them
    FAKE="$(kubectl_ get nodes -o name 2>/dev/null | sed -n 's|^node/kwok-node-\([0-9]\+\)$|\1|p' | sort -n | tail -1)"
    FAKE=$((${FAKE:--1} + 1))
    GPUS="$(kubectl_ get node kubetf-node -o jsonpath='{.status.capacity.nvidia\.com/gpu}' 2>/dev/null || true)"
    ((FAKE == 0)) || FAKE_GPUS="$(kubectl_ get node kwok-node-0 -o jsonpath='{.status.capacity.nvidia\.com/gpu}' 2>/dev/null || true)"
  else
    log "a cluster was started ('$OLD_STAMP') but does not answer: it is brought up again afterwards, without extras"
  fi
fi
# Its versions and gates, as the environment local-cluster.sh reads (equal to the defaults for a default cluster)
OLD_ENV=()
if ((WAS_UP)); then
  OLD_ENV=(KUBETF_K8S_VERSION="$(field k8s "$OLD_STAMP")" KUBETF_KUBELET_VERSION="$(field kubelet "$OLD_STAMP")"
    KUBETF_KUBE_PROXY_VERSION="$(field kube-proxy "$OLD_STAMP")"
    KUBETF_FEATURE_GATES="$(field feature-gates "$OLD_STAMP")" KUBETF_RUNTIME_CONFIG="$(field runtime-config "$OLD_STAMP")")
  if [[ "$(stamp_for "${OLD_ENV[@]}")" != "$OLD_STAMP" ]]; then
    # etcd or CoreDNS of another script version, or a stamp from before these fields: the defaults then
    log "the cluster's stamp ('$OLD_STAMP') cannot be reproduced: it comes back at this script's defaults"
    OLD_ENV=(-u KUBETF_K8S_VERSION -u KUBETF_KUBELET_VERSION -u KUBETF_KUBE_PROXY_VERSION -u KUBETF_FEATURE_GATES
      -u KUBETF_RUNTIME_CONFIG)
  fi
  [[ -z $GPUS ]] || OLD_ENV+=(KUBETF_FAKE_GPUS="$GPUS")
  [[ -z $FAKE_GPUS ]] || OLD_ENV+=(KUBETF_FAKE_NODE_GPUS="$FAKE_GPUS")
  log "to put back afterwards: $OLD_STAMP; Kueue $( ((KUEUE)) && echo yes || echo no), Volcano" \
    "$( ((VOLCANO)) && echo yes || echo no), MultiKueue's planes $( ((MULTIKUEUE)) && echo yes || echo no)," \
    "$FAKE fake nodes${GPUS:+, $GPUS GPUs on the node}"
else
  log "no local cluster was up: none is left up afterwards"
fi

# The environment of this run: the versions, nothing inherited that would change its stamp
export KUBETF_K8S_VERSION=$VERSION KUBETF_KUBELET_VERSION=$KUBELET
unset KUBETF_KUBE_PROXY_VERSION
NEW_STAMP="$(stamp_for)"

TOOK=0  # the cluster is ours to put back (reserved by this run)
restore() {
  local rc=$?
  trap - EXIT
  ((TOOK)) || exit "$rc"
  set +e  # every step of it is tried
  # Putting the cluster back is not to be interrupted (the machine is shared): Ctrl-C reaches this script only, its
  # steps run in sessions of their own (setsid), out of the terminal's reach.
  trap 'log "putting the cluster back first (Ctrl-C does not stop that)"' INT TERM
  failed() { ((rc)) || rc=1; }
  ((rc == 0)) || log "ending with status $rc: putting the cluster back"
  step "down (the cluster at $VERSION)" setsid -w "$SCRIPT" down || failed
  rm -f "$RESERVED"
  if ((WAS_UP)); then
    local args=(up --fake-nodes "$FAKE"); ((KUEUE == 0)) || args+=(--kueue)
    step "up as before: $(field k8s "$OLD_STAMP")$( ((KUEUE)) && echo ", Kueue")$( ((FAKE)) && echo ", $FAKE fake nodes")" \
      setsid -w env "${OLD_ENV[@]}" "$SCRIPT" "${args[@]}" >/dev/null || failed
    if ((VOLCANO)); then step "Volcano as before" setsid -w env "${OLD_ENV[@]}" "$SCRIPT" volcano || failed; fi
    if ((MULTIKUEUE)); then
      step "MultiKueue's planes as before" setsid -w env "${OLD_ENV[@]}" "$SCRIPT" multikueue >/dev/null || failed
    fi
  fi
  echo "::: with-k8s.sh: Kubernetes $VERSION (kubelet and kube-proxy $KUBELET), total $((SECONDS - T0))s"
  printf '  %s\n' "${TIMES[@]}"
  if ((WAS_UP)); then echo "::: the cluster is back: $(cat "$STATE/cluster.stamp" 2>/dev/null || echo "NOT UP")"; fi
  exit "$rc"
}
trap restore EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# The terminal or the pipe it wrote to is gone: the rest goes to a file, the cluster is put back all the same
ORPHAN_LOG="${KUBETF_CACHE:-$HOME/.cache/kubetf}/logs/with-k8s.log"
trap 'exec >>"$ORPHAN_LOG" 2>&1; exit 129' HUP
trap 'exec >>"$ORPHAN_LOG" 2>&1; exit 141' PIPE

# 2. Reserve (local-cluster.sh waits on this for any other cluster; noclobber: exactly one run gets it), then
# 3. the cluster at VERSION
[[ -n "$(reserved_by)" ]] || rm -f "$RESERVED"  # a dead run's
(set -C; echo "$$ $NEW_STAMP" >"$RESERVED") 2>/dev/null \
  || { echo "with-k8s.sh: the local cluster was reserved meanwhile by $(reserved_by)" >&2; exit 1; }
TOOK=1
step "down (the cluster as it was)" "$SCRIPT" down
UP=(up --kueue --fake-nodes "${KUBETF_FAKE_NODES:-4}")
step "up at $VERSION (kubelet $KUBELET; Kueue, ${KUBETF_FAKE_NODES:-4} fake nodes; builds what is not cached)" \
  "$SCRIPT" "${UP[@]}" >/dev/null
step "Volcano" "$SCRIPT" volcano
eval "$("$SCRIPT" env)"
server="$(kubectl version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
node="$(kubectl get node kubetf-node -o jsonpath='{.status.nodeInfo.kubeletVersion}')"
[[ $server == "$VERSION" && $node == "$KUBELET" ]] \
  || { log "the cluster reports API server $server, kubelet $node: not $VERSION and $KUBELET"; exit 1; }
gates="$(field feature-gates "$NEW_STAMP")" config="$(field runtime-config "$NEW_STAMP")"
log "the cluster runs Kubernetes $server (kubelet $node; feature gates ${gates:-none}, runtime config ${config:-none})"

# 4. The command
step "$*" "$@"
