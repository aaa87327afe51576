#!/usr/bin/env bash
# Build the test cluster's hostPath provisioner. Output: ~/.cache/kubetf/hostpath-provisioner-$VERSION/hostpath-provisioner
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# Keyed by the sources' content only (sha256sum of the files would print their paths too: every checkout rebuilt it)
VERSION="$(cat "$here/main.go" "$here/go.mod" | sha256sum | cut -c1-12)"
CACHE="${KUBETF_CACHE:-$HOME/.cache/kubetf}"
OUT="$CACHE/hostpath-provisioner-$VERSION"
if [[ -x "$OUT/hostpath-provisioner" ]]; then echo "$OUT/hostpath-provisioner"; exit 0; fi
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
work="$(mktemp -d /tmp/kubetf-hpp-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cp "$here/main.go" "$here/go.mod" "$work/"; [[ -f "$here/go.sum" ]] && cp "$here/go.sum" "$work/"
cd "$work"
go mod tidy >&2
mkdir -p "$OUT"
go build -p "${GOBUILD_P:-2}" -trimpath -ldflags "-s -w" -o "$OUT/hostpath-provisioner.tmp" . >&2
mv "$OUT/hostpath-provisioner.tmp" "$OUT/hostpath-provisioner"
echo "$OUT/hostpath-provisioner"
