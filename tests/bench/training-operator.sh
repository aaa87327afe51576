#!/usr/bin/env bash
# Kubeflow's training-operator v1.9.4, built from the Go module proxy and cached, for `make bench-compare`.
#   training-operator.sh build   -> the binary under $CACHE/bin (cached; log in $CACHE/build.log)
#   training-operator.sh crd     -> path of the TFJob CRD from the module (downloads the module if needed)
# Nothing here touches the cluster.
set -euo pipefail
VERSION=${TRAINING_OPERATOR_VERSION:-v1.9.4}
MODULE=github.com/kubeflow/training-operator
CACHE=${KUBETF_CACHE:-$HOME/.cache/kubetf}/training-operator-$VERSION
BIN=$CACHE/bin/training-operator.v1
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

build() {
    if [[ -x $BIN ]]; then echo "$BIN"; return; fi
    mkdir -p "$CACHE/bin"
    echo "building $MODULE/cmd/training-operator.v1@$VERSION (about 5 min on 2 cores; log $CACHE/build.log)" >&2
    local start=$SECONDS
    if ! GOBIN=$CACHE/bin.tmp nice -n 10 go install -p 2 -trimpath \
            "$MODULE/cmd/training-operator.v1@$VERSION" >"$CACHE/build.log" 2>&1; then
        tail -20 "$CACHE/build.log" >&2
        echo "build failed, see $CACHE/build.log" >&2
        exit 1
    fi
    mv "$CACHE/bin.tmp/training-operator.v1" "$BIN"
    rmdir "$CACHE/bin.tmp"
    echo "built in $((SECONDS - start)) s" >>"$CACHE/build.log"
    echo "$BIN"
}

crd() {
    local dir
    dir=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
    local f=$dir/manifests/base/crds/kubeflow.org_tfjobs.yaml
    [[ -f $f ]] || { echo "no TFJob CRD at $f" >&2; exit 1; }
    echo "$f"
}

case ${1:-build} in
    build) build ;;
    crd) crd ;;
    *) echo "usage: $0 build|crd" >&2; exit 2 ;;
esac
