#!/usr/bin/env bash
# The kind path, for machines WITH internet access (kind pulls its node image; cannot run offline).
# Same shape as local-cluster.sh: one node, fake nvidia.com/gpu, a default `standard` class binding RWO and RWX.
#   kind.sh up | down | env | images | load IMAGE... | kueue | kueue-delete
# kueue: Kueue's released manifests (the version of tests/cluster/kueue/kustomization.yaml, as local-cluster.sh)
# with the project's Configuration and TrainingJob RBAC from tests/cluster/kueue/ (kubetf as an external framework,
# no pod integration); waits for the controller and its webhooks.
# Then: eval "$(tests/cluster/kind.sh env)"; the tests' kube_cluster fixture uses $KUBECONFIG.
set -euo pipefail
NAME="${KUBETF_KIND_NAME:-kubetf}"
NODE="$NAME-control-plane"
KCFG="${KUBETF_KIND_KUBECONFIG:-$HOME/.kube/kind-$NAME.config}"
GPUS="${KUBETF_FAKE_GPUS:-8}"
k() { kubectl --kubeconfig "$KCFG" "$@"; }

images() {  # the same two image names as local-cluster.sh, built with plain docker from Debian's image
  docker build -q -t kubetf/python-base:bookworm - >/dev/null <<'DOCKERFILE'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* /usr/lib/python3*/EXTERNALLY-MANAGED && useradd -u 1000 -m -s /bin/bash kubetf
ENV LANG=C.UTF-8 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python3"]
DOCKERFILE
  kind load docker-image --name "$NAME" kubetf/python-base:bookworm
}

up() {
  mkdir -p "$(dirname "$KCFG")"
  kind get clusters 2>/dev/null | grep -x "$NAME" >/dev/null || kind create cluster --name "$NAME" --kubeconfig "$KCFG" --wait 180s
  kind get kubeconfig --name "$NAME" >"$KCFG"
  images
  # fake GPUs: the scheduler honours extended resources in the node's status (re-applied on every `up`)
  k patch node "$NODE" --subresource=status --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$GPUS\"}]" >/dev/null
  # storage: kind's local-path provisioner, switched to a shared path (RWO and RWX) and immediate binding
  k -n local-path-storage patch configmap local-path-config --type merge \
    -p '{"data":{"config.json":"{\"sharedFileSystemPath\":\"/var/local-path-provisioner\"}"}}' >/dev/null
  k -n local-path-storage rollout restart deployment/local-path-provisioner >/dev/null
  k -n local-path-storage rollout status deployment/local-path-provisioner --timeout=120s >/dev/null
  k delete storageclass standard --ignore-not-found >/dev/null
  k apply -f - >/dev/null <<'YAML'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: standard, annotations: {storageclass.kubernetes.io/is-default-class: "true"}}
provisioner: rancher.io/local-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
YAML
  kind_env
}

kind_env() { echo "export KUBECONFIG=$KCFG"; }

KUEUE_OVERLAY="$(dirname "${BASH_SOURCE[0]}")/kueue"
KUEUE_VERSION="$(awk '$1 == "newTag:" {print $2; exit}' "$KUEUE_OVERLAY/kustomization.yaml")"
KUEUE_MANIFESTS="https://github.com/kubernetes-sigs/kueue/releases/download/$KUEUE_VERSION/manifests.yaml"
kueue_webhooks_answer() {  # a queued batch Job must come back from the mutating webhook suspended
  k create --dry-run=server -o jsonpath='{.spec.suspend}' -f - <<'YAML' | grep -x true >/dev/null
apiVersion: batch/v1
kind: Job
metadata: {generateName: kueue-probe-, namespace: default, labels: {kueue.x-k8s.io/queue-name: kueue-probe}}
spec:
  suspend: false
  template: {spec: {restartPolicy: Never, containers: [{name: c, image: kubetf/python-base:bookworm, command: ["true"]}]}}
YAML
  k create --dry-run=server -o name -f - >/dev/null <<'YAML'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: kueue-probe}
YAML
}
kueue() {  # idempotent
  k apply --server-side --force-conflicts -f "$KUEUE_MANIFESTS" >/dev/null
  # the project's Configuration (as local-cluster.sh's overlay) and RBAC; the file's hash on the pod template
  # restarts Kueue when it changes
  k -n kueue-system create configmap kueue-manager-config --dry-run=client -o yaml \
    --from-file=controller_manager_config.yaml="$KUEUE_OVERLAY/controller_manager_config.yaml" \
    | k apply --server-side --force-conflicts --field-manager=kubetf-kind -f - >/dev/null
  k apply --server-side --force-conflicts --field-manager=kubetf-kind -f "$KUEUE_OVERLAY/kubetf_rbac.yaml" >/dev/null
  local hash; hash="$(sha256sum "$KUEUE_OVERLAY/controller_manager_config.yaml" | cut -c1-16)"
  k -n kueue-system patch deployment kueue-controller-manager --type=merge \
    -p "{\"spec\":{\"template\":{\"metadata\":{\"annotations\":{\"kubetf.io/config-hash\":\"$hash\"}}}}}" >/dev/null
  k -n kueue-system rollout status deployment/kueue-controller-manager --timeout=300s
  for _ in $(seq 1 120); do
    kueue_webhooks_answer 2>/dev/null && { echo "Kueue $KUEUE_VERSION ready"; return 0; }
    sleep 1
  done
  echo "Kueue's webhooks do not answer after 120s" >&2; return 1
}
kueue_delete() {  # webhook configurations first: pod creation must never call a webhook that is gone
  k delete mutatingwebhookconfiguration kueue-mutating-webhook-configuration --ignore-not-found
  k delete validatingwebhookconfiguration kueue-validating-webhook-configuration --ignore-not-found
  k delete apiservice v1beta1.visibility.kueue.x-k8s.io v1beta2.visibility.kueue.x-k8s.io --ignore-not-found
  k delete --ignore-not-found --timeout=180s -f "$KUEUE_MANIFESTS"
  k delete --ignore-not-found -f "$KUEUE_OVERLAY/kubetf_rbac.yaml"
}

case "${1:-}" in
  up) up ;;
  down) kind delete cluster --name "$NAME"; rm -f "$KCFG" ;;
  env) kind_env ;;
  images) images ;;
  load) shift; for img in "$@"; do kind load docker-image --name "$NAME" "$img"; done ;;
  kueue) kueue ;;
  kueue-delete) kueue_delete ;;
  *) sed -n '2,8p' "$0"; exit 2 ;;
esac
