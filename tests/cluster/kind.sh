#!/usr/bin/env bash
# The kind path, for machines WITH internet access (kind pulls its node image; cannot run offline).
# Same shape as local-cluster.sh: one node, fake nvidia.com/gpu, a default `standard` class binding RWO and RWX.
#   kind.sh up | down | env | images | load IMAGE...
# Then: eval "$(tests/cluster/kind.sh env)"; the tests' kube_cluster fixture uses $KUBECONFIG.
set -euo pipefail
NAME="${KUBETF_KIND_NAME:-kubetf}"
NODE="$NAME-control-plane"
KCFG="${KUBETF_KIND_KUBECONFIG:-$HOME/.kube/kind-$NAME.config}"
GPUS="${KUBETF_FAKE_GPUS:-2}"
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
  kind get clusters 2>/dev/null | grep -qx "$NAME" || kind create cluster --name "$NAME" --kubeconfig "$KCFG" --wait 180s
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

case "${1:-}" in
  up) up ;;
  down) kind delete cluster --name "$NAME"; rm -f "$KCFG" ;;
  env) kind_env ;;
  images) images ;;
  load) shift; for img in "$@"; do kind load docker-image --name "$NAME" "$img"; done ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
