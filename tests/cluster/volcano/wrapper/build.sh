#!/usr/bin/env bash
# Build Volcano's vc-scheduler and vc-controller-manager from the Go module proxy, through the wrapper module next
# to this script (go.mod/go.sum pinned here; `go install volcano.sh/volcano/cmd/...` fails: replace directives, and
# Volcano's own go.mod takes volcano.sh/apis from a ./staging directory its module zip does not carry).
# Usage: build.sh OUTDIR
# Output: OUTDIR/{vc-scheduler,vc-controller-manager} (static, CGO_ENABLED=0) and OUTDIR/crd/ (the CRDs
# local-cluster.sh installs, copied from the module's installer/helm/chart/volcano/crd/bases/), written to
# OUTDIR.tmp first and moved into place at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: build.sh OUTDIR}"
VERSION="$(grep -oE '^require volcano\.sh/volcano v[0-9]+\.[0-9]+\.[0-9]+$' "$here/go.mod" | cut -d' ' -f3)"
[[ -n $VERSION ]] || { echo "no 'require volcano.sh/volcano vX.Y.Z' line in $here/go.mod" >&2; exit 1; }
# What the scheduler watches (podgroups, queues; numatopologies: gate ResourceTopology, on by default; hypernodes:
# always) and what the queue-controller watches besides (commands: gate QueueCommandSync, on by default).
CRDS=(scheduling.volcano.sh_podgroups scheduling.volcano.sh_queues nodeinfo.volcano.sh_numatopologies
  topology.volcano.sh_hypernodes bus.volcano.sh_commands)

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly"
work="$(mktemp -d /tmp/kubetf-volcano-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cp "$here/go.mod" "$here/go.sum" "$here/tools.go" "$work/"
cd "$work"

t0=$SECONDS
go mod download -json volcano.sh/volcano >module.json
module="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Dir"])' module.json)"
info="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Info"])' module.json)"
commit="$(python3 -c 'import json,sys; print((json.load(open(sys.argv[1])).get("Origin") or {}).get("Hash", "unknown"))' "$info")"
echo "downloaded volcano.sh/volcano $VERSION ($commit) in $((SECONDS - t0))s"

ld="-s -w -X volcano.sh/volcano/pkg/version.Version=$VERSION -X volcano.sh/volcano/pkg/version.GitSHA=$commit"
ld+=" -X volcano.sh/volcano/pkg/version.Built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/crd"
for cmd in scheduler controller-manager; do
  t0=$SECONDS
  go build -p "${GOBUILD_P:-2}" -trimpath -ldflags "$ld" -o "$OUT.tmp/vc-$cmd" "volcano.sh/volcano/cmd/$cmd"
  echo "built vc-$cmd in $((SECONDS - t0))s"
done
for c in "${CRDS[@]}"; do
  cp "$module/installer/helm/chart/volcano/crd/bases/$c.yaml" "$OUT.tmp/crd/"
done
chmod -R u+w "$OUT.tmp"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "volcano $VERSION: built into $OUT"
