#!/usr/bin/env bash
# Build the Kubernetes server binaries (and kubectl) from the Go module proxy, offline from any registry.
# Usage: build.sh [VERSION]   (default: the version pinned in go.mod)
# Output: ~/.cache/kubetf/k8s-$VERSION/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kube-proxy,kubectl}
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
VERSION="${1:-$(grep -oE 'k8s\.io/kubernetes v1\.[0-9]+\.[0-9]+' "$here/go.mod" | head -1 | cut -d' ' -f2)}"
[[ -n "$VERSION" ]] || { echo "cannot find the k8s.io/kubernetes version in $here/go.mod" >&2; exit 1; }
CACHE="${KUBETF_CACHE:-$HOME/.cache/kubetf}"
OUT="$CACHE/k8s-$VERSION/bin"
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
done_all=1
for b in "${BINS[@]}"; do [[ -x "$OUT/$b" ]] || done_all=0; done
if [[ $done_all == 1 ]]; then echo "k8s $VERSION: cached in $OUT"; exit 0; fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
work="$(mktemp -d /tmp/kubetf-k8s-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cp "$here/tools.go" "$work/"
cd "$work"
if grep -q "^require k8s.io/kubernetes $VERSION\$" "$here/go.mod" && [[ -s "$here/go.sum" ]]; then
  # the pinned wrapper module kept in the repo
  cp "$here/go.mod" "$here/go.sum" .
else
  # Wrapper module for another version: require k8s.io/kubernetes plus one replace per staging module (as
  # upstream's go.mod, pointing at the published v0.X.Y modules instead of ./staging).
  stg="v0.${VERSION#v1.}"
  modfile="$(go mod download -json "k8s.io/kubernetes@$VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')"
  {
    echo "module kubetf.local/k8s-build"
    echo
    grep -E '^go ' "$modfile"
    grep -E '^godebug ' "$modfile" || true
    echo
    echo "require k8s.io/kubernetes $VERSION"
    echo
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "$modfile" | awk -v v="$stg" '/=> \.\/staging\/src\//{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > go.mod
  go mod tidy
  echo "generated the wrapper module for $VERSION: copy $work/go.mod and go.sum into $here to pin it"
fi

maj="${VERSION#v}"; maj="${maj%%.*}"; min="${VERSION#v*.}"; min="${min%%.*}"
date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $p.gitVersion=$VERSION -X $p.gitMajor=$maj -X $p.gitMinor=$min -X $p.gitTreeState=clean"
  ld+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.buildDate=$date"
done
mkdir -p "$OUT.tmp"
for b in "${BINS[@]}"; do
  [[ -x "$OUT/$b" ]] && { cp "$OUT/$b" "$OUT.tmp/$b"; continue; }
  t0=$SECONDS
  go build -p "${GOBUILD_P:-2}" -trimpath -ldflags "$ld" -o "$OUT.tmp/$b" "k8s.io/kubernetes/cmd/$b"
  echo "built $b in $((SECONDS-t0))s"
done
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "k8s $VERSION: built into $OUT"
