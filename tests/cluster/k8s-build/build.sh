#!/usr/bin/env bash
# Build the Kubernetes server binaries (and kubectl) from the Go module proxy, offline from any registry.
# Usage: build.sh [VERSION [BINARY...]]   (default: the version pinned in go.mod, all six binaries)
#   e.g. build.sh v1.34.4 kubelet: only the kubelet of another version (the local cluster runs a kubelet older than
#   its control plane on cgroup v1 machines: see local-cluster.sh KUBELET_VERSION)
# Output: ~/.cache/kubetf/k8s-$VERSION/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kube-proxy,kubectl}
# (each binary cached on its own: a later call for more binaries of the same version builds only the missing ones)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
VERSION="${1:-$(grep -oE 'k8s\.io/kubernetes v1\.[0-9]+\.[0-9]+' "$here/go.mod" | head -1 | cut -d' ' -f2)}"
[[ -n "$VERSION" ]] || { echo "cannot find the k8s.io/kubernetes version in $here/go.mod" >&2; exit 1; }
[[ $VERSION =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "not a Kubernetes version: $VERSION (want v1.MINOR.PATCH)" >&2; exit 1; }
CACHE="${KUBETF_CACHE:-$HOME/.cache/kubetf}"
OUT="$CACHE/k8s-$VERSION/bin"
ALL=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
BINS=("${@:2}")
((${#BINS[@]})) || BINS=("${ALL[@]}")
for b in "${BINS[@]}"; do
  [[ " ${ALL[*]} " == *" $b "* ]] || { echo "unknown binary $b (one of: ${ALL[*]})" >&2; exit 1; }
done
cached() { local b; for b in "${BINS[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done; }
if cached; then echo "k8s $VERSION (${BINS[*]}): cached in $OUT"; exit 0; fi
# One build of a version at a time (two would share $OUT.tmp and replace each other's $OUT): a second caller
# waits, then finds the binaries cached.
mkdir -p "$CACHE"
exec 8>"$CACHE/k8s-$VERSION.build.lock"
flock 8
if cached; then echo "k8s $VERSION (${BINS[*]}): cached in $OUT (built meanwhile by another caller)"; exit 0; fi

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
for b in "${ALL[@]}"; do
  # binaries of this version built earlier are kept, whichever were asked for this time
  if [[ -x "$OUT/$b" ]]; then cp "$OUT/$b" "$OUT.tmp/$b"; continue; fi
  # not asked for: nothing of it goes into $OUT (a file left by an interrupted build may be half written)
  if [[ " ${BINS[*]} " != *" $b "* ]]; then rm -f "$OUT.tmp/$b"; continue; fi
  t0=$SECONDS
  go build -p "${GOBUILD_P:-2}" -trimpath -ldflags "$ld" -o "$OUT.tmp/$b" "k8s.io/kubernetes/cmd/$b"
  echo "built $b in $((SECONDS-t0))s"
done
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "k8s $VERSION (${BINS[*]}): built into $OUT"
