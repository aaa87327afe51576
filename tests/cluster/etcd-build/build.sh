#!/usr/bin/env bash
# Build etcd from the Go module proxy. Usage: build.sh [VERSION]; output ~/.cache/kubetf/etcd-$VERSION/etcd
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
VERSION="${1:-$(grep -oE 'go\.etcd\.io/etcd/server/v3 v3\.[0-9]+\.[0-9]+' "$here/go.mod" | head -1 | cut -d' ' -f2)}"
[[ -n "$VERSION" ]] || { echo "cannot find the etcd version in $here/go.mod" >&2; exit 1; }
CACHE="${KUBETF_CACHE:-$HOME/.cache/kubetf}"
OUT="$CACHE/etcd-$VERSION"
if [[ -x "$OUT/etcd" ]]; then echo "etcd $VERSION: cached in $OUT"; exit 0; fi
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
work="$(mktemp -d /tmp/kubetf-etcd-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cp "$here/main.go" "$here/go.mod" "$work/"; [[ -f "$here/go.sum" ]] && cp "$here/go.sum" "$work/"
cd "$work"
go mod edit -require="go.etcd.io/etcd/server/v3@$VERSION"
go mod tidy
if [[ -w "$here" ]]; then cp go.mod go.sum "$here/"; fi
mkdir -p "$OUT"
go build -p "${GOBUILD_P:-2}" -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" .
mv "$OUT/etcd.tmp" "$OUT/etcd"
echo "etcd $VERSION: built into $OUT"
