#!/usr/bin/env bash
# Smoke test of MultiKueue on the local clusters (local-cluster.sh up, kueue, multikueue first), with plain batch/v1
# Jobs (Kueue's built-in MultiKueue adapter, the same dispatch path the generic adapter takes for TrainingJobs):
#   queues: on the manager a ClusterQueue whose admission check is MultiKueue (AdmissionCheck -> MultiKueueConfig with
#   worker1 and worker2), on worker1 (the local cluster) a ClusterQueue with quota, on worker2 one with none; the same
#   LocalQueue name in the same namespace on all three (MultiKueue copies the Workload there under its own name);
#   A: a Job that prints 1, submitted on the manager (spec.managedBy: kueue.x-k8s.io/multikueue): its Workload is
#   copied to both workers, admitted on worker1 only (worker2's copy is then deleted), the Job runs on worker1's real
#   node and completes, its status is mirrored onto the manager's Job (succeeded 1, Complete); deleted on the
#   manager: gone from worker1 too (Job and Workload);
#   B: a Job that sleeps: running on worker1, its status mirrored (active 1); deleted on the manager while it runs:
#   its copy on worker1 and the copy's pod are deleted;
#   C: a TrainingJob (MultiKueue's generic adapter, multiKueue.externalFrameworks) with the Workload kubetf's operator
#   will create for it on the manager, made here by hand (no operator runs on the manager): dispatched to worker1 as
#   a copy without spec.managedBy, with the annotation kueue.x-k8s.io/prebuilt-workload-name and the origin label;
#   a status written on worker1's copy is mirrored onto the manager's TrainingJob; deleted on the manager: the copy
#   and its Workload are gone from worker1. (Whatever kubetf operator runs on worker1 may act on the copy: its
#   chief sleeps, and only the written field is compared.)
# Usage: multikueue-smoke.sh   (kubeconfigs: KUBETF_MANAGER_KUBECONFIG, KUBETF_WORKER1_KUBECONFIG,
# KUBETF_WORKER2_KUBECONFIG, else the local ones; kubectl on PATH, else ~/.cache/kubetf/bin)
# Prints each step with its time; exit 0 when every check held, 1 when one did not. Everything it creates is named
# mk-smoke-<pid> and deleted at the end (cluster-scoped objects included).
set -euo pipefail
STATE="${KUBETF_CLUSTER_DIR:-/var/lib/kubetf-cluster}"
MANAGER="${KUBETF_MANAGER_KUBECONFIG:-$STATE/manager.kubeconfig}"
WORKER1="${KUBETF_WORKER1_KUBECONFIG:-$STATE/admin.kubeconfig}"
WORKER2="${KUBETF_WORKER2_KUBECONFIG:-$STATE/worker2.kubeconfig}"
export PATH="$PATH:${KUBETF_CACHE:-$HOME/.cache/kubetf}/bin"
NAME="mk-smoke-$$"          # namespace, ResourceFlavor, ClusterQueues, AdmissionCheck, MultiKueueConfig
QUEUE=user-queue            # the LocalQueue, in $NAME on all three
IMAGE=kubetf/python-base:bookworm
NODE=kubetf-node            # worker1's real node (its fake kwok nodes are tainted: the Jobs' pods cannot go there)
T0=$SECONDS

log() { printf '[multikueue-smoke %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
km() { kubectl --kubeconfig "$MANAGER" "$@"; }
k1() { kubectl --kubeconfig "$WORKER1" "$@"; }
k2() { kubectl --kubeconfig "$WORKER2" "$@"; }
show() {  # what each cluster holds of the test, for a failure
  local c
  for c in km k1 k2; do
    echo "--- $c" >&2
    "$c" -n "$NAME" get jobs,workloads.kueue.x-k8s.io,pods -o wide >&2 2>&1 || true
  done
  km -n "$NAME" get workloads.kueue.x-k8s.io -o yaml >&2 2>&1 | grep -A40 '^  status:' >&2 || true
}
fail() { show; log "FAIL: $*"; exit 1; }
cleanup() {
  local c
  [[ -z ${WATCH:-} ]] || kill "$WATCH" 2>/dev/null || true
  for c in km k1 k2; do
    "$c" delete namespace "$NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  done
  # cluster-scoped: once the namespaces' Workloads are gone (a ClusterQueue with Workloads waits for them)
  for c in km k1 k2; do
    "$c" delete clusterqueue "$NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    "$c" delete resourceflavor "$NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  done
  km delete admissioncheck "$NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  km delete multikueueconfig "$NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT
wait_until() {  # wait_until SECONDS WHAT CMD...: seconds it took on stdout
  local t0=$SECONDS timeout=$1 what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < timeout)) || fail "timed out after ${timeout}s waiting for $what"
    sleep 0.25
  done
  echo $((SECONDS - t0))
}

# ---------------------------------------------------------------- queues
queues() {  # queues KUBECTL CPU [ADMISSION_CHECK]: flavor, ClusterQueue (this namespace only), LocalQueue
  local checks=""
  [[ -z ${3:-} ]] || checks="admissionChecksStrategy: {admissionChecks: [{name: $3}]}"
  "$1" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $NAME}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: $NAME}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: $NAME}
spec:
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $NAME}}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors: [{name: $NAME, resources: [{name: cpu, nominalQuota: "$2"}, {name: memory, nominalQuota: 1Gi}]}]
  $checks
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: $QUEUE, namespace: $NAME}
spec: {clusterQueue: $NAME}
EOF
}
multikueue_check() {  # on the manager: the MultiKueue admission check over both workers
  km apply -f - >/dev/null <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: MultiKueueConfig
metadata: {name: $NAME}
spec: {clusters: [worker1, worker2]}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: AdmissionCheck
metadata: {name: $NAME}
spec:
  controllerName: kueue.x-k8s.io/multikueue
  parameters: {apiGroup: kueue.x-k8s.io, kind: MultiKueueConfig, name: $NAME}
EOF
}
check_active() { [[ "$(km get admissioncheck "$NAME" -o jsonpath='{.status.conditions[?(@.type=="Active")].status}')" == True ]]; }
cq_active() { [[ "$("$1" get clusterqueue "$NAME" -o jsonpath='{.status.conditions[?(@.type=="Active")].status}')" == True ]]; }
job() {  # job NAME PYTHON: a queued Job for MultiKueue, created on the manager
  km create -f - >/dev/null <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
  namespace: $NAME
  labels: {kueue.x-k8s.io/queue-name: $QUEUE}
spec:
  managedBy: kueue.x-k8s.io/multikueue
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: $IMAGE
        imagePullPolicy: IfNotPresent
        command: [python3, -c, "$2"]
        resources: {requests: {cpu: 100m, memory: 64Mi}}
EOF
}
jsonpath() { local c=$1 kind=$2 name=$3 path=$4; "$c" -n "$NAME" get "$kind" "$name" -o jsonpath="$path" 2>/dev/null; }
manager_wl() { km -n "$NAME" get workloads.kueue.x-k8s.io -o jsonpath="{.items[?(@.metadata.ownerReferences[0].name==\"$1\")].metadata.name}"; }
dispatched_to_worker1() {
  local wl; wl="$(manager_wl "$1")"; [[ -n $wl ]] || return 1
  [[ "$(jsonpath km workloads.kueue.x-k8s.io "$wl" '{.status.clusterName}')" == worker1 ]]
}
pod_of() { k1 -n "$NAME" get pods -l "batch.kubernetes.io/job-name=$1" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
pod_phase() { local p; p="$(pod_of "$1")" && [[ -n $p ]] && [[ "$(jsonpath k1 pod "$p" '{.status.phase}')" == "$2" ]]; }
mirrored() {  # mirrored JOB FIELD VALUE: the manager's Job status says so
  [[ "$(jsonpath km job "$1" "{.status.$2}")" == "$3" ]]
}
complete() { [[ "$(jsonpath km job "$1" '{.status.conditions[?(@.type=="Complete")].status}')" == True ]]; }
gone_from_worker1() {  # the Job, its Workload and its pods are gone from worker1
  ! k1 -n "$NAME" get job "$1" >/dev/null 2>&1 || return 1
  [[ -z "$(k1 -n "$NAME" get workloads.kueue.x-k8s.io -o name 2>/dev/null | grep -F "job-$1-" || true)" ]] || return 1
  [[ -z "$(pod_of "$1")" ]]
}
gone_from_manager() { ! km -n "$NAME" get job "$1" >/dev/null 2>&1; }

for c in km k1 k2; do "$c" get --raw /readyz >/dev/null || { log "FAIL: $c does not answer"; exit 1; }; done
for w in worker1 worker2; do
  [[ "$(km get multikueuecluster "$w" -o jsonpath='{.status.conditions[?(@.type=="Active")].status}')" == True ]] \
    || { log "FAIL: MultiKueueCluster $w is not Active (local-cluster.sh multikueue)"; exit 1; }
done

log "queues: worker1 cpu 1, worker2 cpu 0, manager cpu 1 with the MultiKueue admission check $NAME"
queues k1 1
queues k2 0
multikueue_check
queues km 1 "$NAME"
t="$(wait_until 60 "AdmissionCheck $NAME Active" check_active)"
for c in km k1 k2; do wait_until 60 "ClusterQueue $NAME Active ($c)" cq_active "$c" >/dev/null; done
log "AdmissionCheck and ClusterQueues Active (the check after ${t}s)"

# ---------------------------------------------------------------- A: runs on worker1 and completes
EVENTS="$(mktemp)"
k2 -n "$NAME" get workloads.kueue.x-k8s.io -w --output-watch-events \
  -o jsonpath='{.type} {.object.metadata.name}{"\n"}' >"$EVENTS" 2>/dev/null &
WATCH=$!
job a "print(1)"
t="$(wait_until 120 "A's Workload admitted on worker1" dispatched_to_worker1 a)"
log "A created on the manager; dispatched to worker1 (the Workload's clusterName) after ${t}s"
t="$(wait_until 120 "A's pod on worker1 to succeed" pod_phase a Succeeded)"
log "A's pod Succeeded on worker1 after ${t}s more"
pod="$(pod_of a)"
node="$(jsonpath k1 pod "$pod" '{.spec.nodeName}')"
[[ $node == "$NODE" ]] || fail "A ran on $node, not on $NODE"
out="$(k1 -n "$NAME" logs "$pod" 2>/dev/null || true)"
[[ $out == 1 ]] || fail "A printed '$out', not 1"
log "A ran on worker1's node $node (pod $pod) and printed $out"
t="$(wait_until 60 "A's status on the manager" complete a)"
log "A mirrored on the manager (succeeded 1, Complete) after ${t}s more"
mirrored a succeeded 1 || fail "the manager's A says succeeded=$(jsonpath km job a '{.status.succeeded}')"
[[ -z "$(k2 -n "$NAME" get workloads.kueue.x-k8s.io -o name 2>/dev/null)" ]] \
  || fail "worker2 still holds a copy of A's Workload: $(k2 -n "$NAME" get workloads.kueue.x-k8s.io -o name)"
kill "$WATCH" 2>/dev/null || true; WATCH=""
{ grep -q '^ADDED ' "$EVENTS" && grep -q '^DELETED ' "$EVENTS"; } \
  || fail "worker2's copy of A's Workload was not seen created then deleted: $(tr '\n' ' ' <"$EVENTS")"
log "worker2 (no quota) got a copy of A's Workload, deleted once worker1 admitted A: $(tr '\n' ' ' <"$EVENTS")"
rm -f "$EVENTS"
if k1 -n "$NAME" get job a >/dev/null 2>&1; then
  log "A's copy still on worker1 after it completed"
else
  log "A's copy already gone from worker1 once it completed (MultiKueue removes the remote objects of a finished Workload)"
fi
km -n "$NAME" delete job a --wait=false >/dev/null
t="$(wait_until 60 "A gone from the manager" gone_from_manager a)"
t1="$(wait_until 120 "A gone from worker1" gone_from_worker1 a)"
log "A deleted on the manager: gone from the manager after ${t}s, from worker1 (Job, Workload, pods) after ${t1}s"

# ---------------------------------------------------------------- B: deleted on the manager while it runs on worker1
job b "import time; time.sleep(600)"
t="$(wait_until 120 "B's pod Running on worker1" pod_phase b Running)"
log "B created on the manager; its pod Running on worker1 after ${t}s"
t="$(wait_until 60 "B's status on the manager" mirrored b active 1)"
log "B's status mirrored on the manager (active 1) after ${t}s more"
pod="$(pod_of b)"
km -n "$NAME" delete job b --wait=false >/dev/null
t="$(wait_until 120 "B gone from worker1" gone_from_worker1 b)"
log "B deleted on the manager while running: its copy and pod $pod gone from worker1 after ${t}s"

# ---------------------------------------------------------------- C: a TrainingJob through the generic adapter
km apply -f - >/dev/null <<EOF
apiVersion: kubetf.io/v1alpha1
kind: TrainingJob
metadata: {name: c, namespace: $NAME, labels: {kueue.x-k8s.io/queue-name: $QUEUE}}
spec:
  managedBy: kueue.x-k8s.io/multikueue
  strategy: MultiWorkerMirrored
  runPolicy: {suspend: true}
  replicaSpecs:
    chief:
      replicas: 1
      template:
        spec:
          terminationGracePeriodSeconds: 1
          containers:
          - {name: tensorflow, image: $IMAGE, imagePullPolicy: IfNotPresent, command: [python3, -c, "import time; time.sleep(600)"],
             resources: {requests: {cpu: 100m, memory: 64Mi}}}
EOF
uid="$(jsonpath km trainingjob c '{.metadata.uid}')"
km apply -f - >/dev/null <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata:
  name: trainingjob-c-smoke
  namespace: $NAME
  labels: {kueue.x-k8s.io/job-uid: "$uid"}
  ownerReferences: [{apiVersion: kubetf.io/v1alpha1, kind: TrainingJob, name: c, uid: "$uid", controller: true, blockOwnerDeletion: true}]
spec:
  queueName: $QUEUE
  podSets:
  - name: chief
    count: 1
    template:
      spec:
        restartPolicy: Never
        containers:
        - {name: tensorflow, image: $IMAGE, command: [python3, -c, "import time; time.sleep(600)"],
           resources: {requests: {cpu: 100m, memory: 64Mi}}}
EOF
tj_copied() { k1 -n "$NAME" get trainingjob c >/dev/null 2>&1; }
t="$(wait_until 120 "C's copy on worker1" tj_copied)"
prebuilt="$(jsonpath k1 trainingjob c '{.metadata.annotations.kueue\.x-k8s\.io/prebuilt-workload-name}')"
origin="$(jsonpath k1 trainingjob c '{.metadata.labels.kueue\.x-k8s\.io/multikueue-origin}')"
managed="$(jsonpath k1 trainingjob c '{.spec.managedBy}')"
[[ $prebuilt == trainingjob-c-smoke && -n $origin && -z $managed ]] \
  || fail "C's copy on worker1: prebuilt-workload-name '$prebuilt', origin '$origin', managedBy '$managed'"
[[ "$(jsonpath km workloads.kueue.x-k8s.io trainingjob-c-smoke '{.status.clusterName}')" == worker1 ]] \
  || fail "the manager's Workload of C is not admitted on worker1"
log "C (TrainingJob) copied to worker1 after ${t}s: annotation prebuilt-workload-name=$prebuilt, origin $origin, no managedBy"
k1 -n "$NAME" patch trainingjob c --subresource=status --type=merge \
  -p '{"status":{"restarts":{"lastReason":"mk-smoke: written on worker1"}}}' >/dev/null
tj_mirrored() { [[ "$(jsonpath km trainingjob c '{.status.restarts.lastReason}')" == "mk-smoke: written on worker1" ]]; }
t="$(wait_until 60 "C's status on the manager" tj_mirrored)"
log "C's status written on worker1 mirrored onto the manager's TrainingJob after ${t}s"
km -n "$NAME" delete trainingjob c --wait=false >/dev/null
tj_gone() {
  ! k1 -n "$NAME" get trainingjob c >/dev/null 2>&1 && ! k1 -n "$NAME" get workloads.kueue.x-k8s.io trainingjob-c-smoke >/dev/null 2>&1
}
t="$(wait_until 120 "C gone from worker1" tj_gone)"
log "C deleted on the manager: its copy and Workload gone from worker1 after ${t}s"
log "PASS"
