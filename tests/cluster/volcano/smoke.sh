#!/usr/bin/env bash
# Smoke test of Volcano on a cluster (local-cluster.sh volcano first), with plain pods the way kubetf makes them: a
# scheduling.volcano.sh/v1beta1 PodGroup (minMember, minResources, queue, priorityClassName) and pods with
# schedulerName: volcano and the annotation scheduling.k8s.io/group-name. Each pod asks for nvidia.com/gpu:
#   A (the free GPUs but 5, in two pods) runs whole; B (low priority, 4+3) and then C (high priority, 4+3) wait with
#   no pod bound although each of their pods would fit alone in the 5 A leaves, and their PodGroups say why
#   (condition Unschedulable);
#   A deleted: C is placed whole (priority; B instead where only B had been enqueued, see step 3), the other still
#   waits with no pod bound, and is deleted;
#   one pod of the running gang deleted and created again: it is placed alone;
#   both its pods deleted, then created again one at a time: the first waits (gang), both run once the second exists.
# Needs 8 to 12 free nvidia.com/gpu on one node (the local node advertises 12) and no other pod taking GPUs meanwhile.
# Usage: smoke.sh   (KUBECONFIG, else the local cluster's; kubectl on PATH, else ~/.cache/kubetf/bin)
# Prints each step with its time and the PodGroup statuses Volcano wrote; exit 0 when every check held, 1 when one
# did not, 2 when one did not while other pods took or freed GPUs on the node (inconclusive: run it again).
set -euo pipefail
export KUBECONFIG="${KUBECONFIG:-${KUBETF_CLUSTER_DIR:-/var/lib/kubetf-cluster}/admin.kubeconfig}"
export PATH="$PATH:${KUBETF_CACHE:-$HOME/.cache/kubetf}/bin"
NS="volcano-smoke-$$"
HIGH=kubetf-volcano-smoke-high
LOW=kubetf-volcano-smoke-low
IMAGE=kubetf/pause:3.10   # the local node's pause image (catatonit -P): runs until stopped
T0=$SECONDS

log() { printf '[volcano-smoke %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
fail() {  # other tenants' GPU pods that came or went meanwhile make the outcome inconclusive (exit 2), not a failure
  local now; now="$(others_gpus 2>/dev/null || echo "?")"
  kubectl -n "$NS" get podgroups.scheduling.volcano.sh,pods -o wide >&2 || true
  if [[ -n ${OTHERS:-} && $now != "$OTHERS" ]]; then
    log "INCONCLUSIVE: $* (other pods' nvidia.com/gpu on $NODE went from $OTHERS to $now meanwhile: run again)"
    exit 2
  fi
  log "FAIL: $*"
  exit 1
}
cleanup() {
  kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  kubectl delete priorityclass "$HIGH" "$LOW" --ignore-not-found >/dev/null 2>&1 || true
}
trap cleanup EXIT

podgroup() {  # podgroup NAME GPUS PRIORITYCLASS
  kubectl apply -f - >/dev/null <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: $1, namespace: $NS}
spec:
  minMember: 2
  minResources: {cpu: 20m, memory: 16Mi, nvidia.com/gpu: "$2"}
  queue: default
  priorityClassName: $3
EOF
}
pod() {  # pod NAME GROUP GPUS PRIORITYCLASS
  kubectl create -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $NS
  annotations: {scheduling.k8s.io/group-name: $2}
spec:
  schedulerName: volcano
  priorityClassName: $4
  nodeSelector: {kubernetes.io/hostname: $NODE}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $IMAGE
    imagePullPolicy: IfNotPresent
    resources:
      requests: {cpu: 10m, memory: 8Mi, nvidia.com/gpu: "$3"}
      limits: {nvidia.com/gpu: "$3"}
EOF
}
node_of() { kubectl -n "$NS" get pod "$1" -o jsonpath='{.spec.nodeName}' 2>/dev/null; }
all_bound() { local p; for p in "$@"; do [[ -n "$(node_of "$p")" ]] || return 1; done; }
none_bound() { local p; for p in "$@"; do [[ -z "$(node_of "$p")" ]] || return 1; done; }
gone() { local p; for p in "$@"; do ! kubectl -n "$NS" get pod "$p" >/dev/null 2>&1 || return 1; done; }
wait_until() {  # wait_until SECONDS WHAT CMD...: seconds it took on stdout
  local timeout=$1 what=$2 t0=$SECONDS; shift 2
  until "$@"; do
    ((SECONDS - t0 < timeout)) || fail "not within ${timeout}s: $what"
    sleep 0.5
  done
  echo $((SECONDS - t0))
}
hold() {  # hold SECONDS WHAT CMD...: CMD must stay true the whole time
  local t0=$SECONDS what=$2 secs=$1; shift 2
  while ((SECONDS - t0 < secs)); do "$@" || fail "$what"; sleep 0.5; done
}
pg_status() { kubectl -n "$NS" get podgroups.scheduling.volcano.sh "$1" -o jsonpath='{.status}'; }
pg_unschedulable() {  # the message of the PodGroup's Unschedulable=True condition, if any
  kubectl -n "$NS" get podgroups.scheduling.volcano.sh "$1" \
    -o jsonpath='{range .status.conditions[?(@.type=="Unschedulable")]}{.status} {.message}{end}' | sed -n 's/^True //p'
}
both_unschedulable() { [[ -n "$(pg_unschedulable "$1")" && -n "$(pg_unschedulable "$2")" ]]; }
pg_phase() { kubectl -n "$NS" get podgroups.scheduling.volcano.sh "$1" -o jsonpath='{.status.phase}'; }
pg_waiting() { [[ "$(pg_phase "$1")" =~ ^(Pending|Inqueue)$ ]]; }
gpu_use() {  # "NODE FREE OTHERS" for the untainted schedulable node with the most free nvidia.com/gpu (allocatable
  # minus what live pods there request), OTHERS: what pods outside this test's namespace hold there; with NODE set,
  # that node's
  kubectl get nodes,pods -A -o json | python3 -c '
import json, sys
items, ns, want = json.load(sys.stdin)["items"], sys.argv[1], sys.argv[2]
free = {n["metadata"]["name"]: int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", 0))
        for n in items if n["kind"] == "Node" and not n["spec"].get("unschedulable") and not n["spec"].get("taints")}
others = dict.fromkeys(free, 0)
for p in items:
    node = p["kind"] == "Pod" and p["spec"].get("nodeName")
    if node in free and p["status"].get("phase") not in ("Succeeded", "Failed"):
        gpus = sum(int((c.get("resources") or {}).get("requests", {}).get("nvidia.com/gpu", 0)) for c in p["spec"]["containers"])
        free[node] -= gpus
        others[node] += gpus if p["metadata"]["namespace"] != ns else 0
node = want or max(free, key=free.get, default="-")
print(node, free.get(node, 0), others.get(node, 0))' "$NS" "${NODE:-}"
}
others_gpus() { gpu_use | cut -d' ' -f3; }

kubectl get crd podgroups.scheduling.volcano.sh >/dev/null 2>&1 || fail "Volcano is not installed (local-cluster.sh volcano)"
[[ "$(kubectl get queues.scheduling.volcano.sh default -o jsonpath='{.status.state}')" == Open ]] || fail "Volcano's default queue is not Open"
read -r NODE free OTHERS < <(gpu_use)
((free >= 8 && free < 14)) || fail "needs 8 to 13 free nvidia.com/gpu on one untainted node, the most is $free ($NODE)"
A=$((free - 5)); A0=$(((A + 1) / 2)); A1=$((A / 2))   # A leaves 5: room for b-0 (4) or b-1 (3) alone, not both
log "free nvidia.com/gpu on $NODE: $free (other pods hold $OTHERS); A takes $A0+$A1"
kubectl create namespace "$NS" >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: $HIGH}
value: 1000
preemptionPolicy: Never
description: "tests/cluster/volcano/smoke.sh"
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: $LOW}
value: 100
preemptionPolicy: Never
description: "tests/cluster/volcano/smoke.sh"
EOF

# 1. A gang that fits runs whole.
podgroup a "$A" "$LOW"; pod a-0 a "$A0" "$LOW"; pod a-1 a "$A1" "$LOW"
s="$(wait_until 60 "both pods of A bound" all_bound a-0 a-1)"
log "A ($A0+$A1 GPUs) bound whole in ${s}s; PodGroup a: $(pg_status a)"

# 2. B (low priority) and C (high priority) wait: each of their pods would fit beside A alone, not both.
podgroup b 7 "$LOW"; pod b-0 b 4 "$LOW"; pod b-1 b 3 "$LOW"
sleep 2
podgroup c 7 "$HIGH"; pod c-0 c 4 "$HIGH"; pod c-1 c 3 "$HIGH"
s="$(wait_until 30 "PodGroups b and c marked Unschedulable" both_unschedulable b c)"
hold 10 "a pod of B or C was bound beside A" none_bound b-0 b-1 c-0 c-1
log "B and C wait with no pod bound (Unschedulable after ${s}s, held 10 s more)"
log "PodGroup b: $(pg_status b)"
log "PodGroup c: $(pg_status c)"
log "pod b-0 PodScheduled: $(kubectl -n "$NS" get pod b-0 -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')"

# 3. A goes: one of B and C is placed whole, the other keeps waiting with no pod bound. Which one: the higher
# priority (C) among the PodGroups enqueued (phase Inqueue) by then; Volcano's enqueue is first come first served
# within what overcommit lets in (cluster capacity x 1.2, fake nodes counted), so where C was still Pending and B
# Inqueue, B goes first, as on any Volcano cluster.
phase_b="$(pg_phase b)" phase_c="$(pg_phase c)"
log "before A goes: PodGroup b $phase_b, c $phase_c"
kubectl -n "$NS" delete pod a-0 a-1 --wait=false >/dev/null
kubectl -n "$NS" delete podgroups.scheduling.volcano.sh a >/dev/null
placed() { all_bound b-0 b-1 || all_bound c-0 c-1; }
s="$(wait_until 60 "B or C bound whole after A was deleted" placed)"
if all_bound c-0 c-1; then W=c L=b WP=$HIGH; else W=b L=c WP=$LOW; fi
none_bound "$L-0" "$L-1" || fail "both B and C were placed: gang not honoured"
if [[ $W == b && $phase_c == Inqueue ]]; then fail "B (priority $LOW) was placed before C (priority $HIGH), both Inqueue"; fi
if [[ $W == c ]]; then why="the higher priority"; else why="enqueued first: C was $phase_c when A went"; fi
log "A deleted: ${W^^} ($why) bound whole ${s}s later"
hold 10 "a pod of ${L^^} was bound beside ${W^^}" none_bound "$L-0" "$L-1"
log "${L^^} still waits with no pod bound; PodGroup $L: $(pg_unschedulable "$L")"
kubectl -n "$NS" delete pod "$L-0" "$L-1" --wait=false >/dev/null
kubectl -n "$NS" delete podgroups.scheduling.volcano.sh "$L" >/dev/null
wait_until 60 "${L^^}'s pods gone" gone "$L-0" "$L-1" >/dev/null

# 4. One pod of the running gang replaced: scheduled alone (the other still runs and counts).
kubectl -n "$NS" delete pod "$W-1" --wait=true >/dev/null
pod "$W-1" "$W" 3 "$WP"
s="$(wait_until 60 "the replacement $W-1 bound alone" all_bound "$W-1")"
log "$W-1 deleted and created again: bound alone ${s}s later ($W-0 kept running); PodGroup $W: $(pg_status "$W")"

# 5. The whole gang gone and created again (same PodGroup): gang-scheduled again, not one pod at a time.
kubectl -n "$NS" delete pod "$W-0" "$W-1" --wait=true >/dev/null
wait_until 30 "PodGroup $W back to Pending or Inqueue with no pod" pg_waiting "$W" >/dev/null
log "both pods of ${W^^} deleted: PodGroup $W phase $(pg_phase "$W")"
pod "$W-0" "$W" 4 "$WP"
hold 8 "$W-0 was bound alone after the whole gang had gone" none_bound "$W-0"
log "$W-0 alone: not bound (8 s); PodGroup $W: $(pg_unschedulable "$W")"
pod "$W-1" "$W" 3 "$WP"
s="$(wait_until 60 "$W-0 and $W-1 bound together" all_bound "$W-0" "$W-1")"
log "$W-1 created: both bound ${s}s later; PodGroup $W: $(pg_status "$W")"

log "PASS ($((SECONDS - T0))s)"
