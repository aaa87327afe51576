#!/usr/bin/env bash
# The Prometheus operator's ServiceMonitor and PrometheusRule CRDs (monitoring.coreos.com/v1), which the chart's
# `metrics.serviceMonitor` and `metrics.prometheusRule` need on the cluster: taken from the operator's own Go module
# (its example/prometheus-operator-crd/) and kept under ~/.cache/kubetf/prometheus-operator-VERSION. Prints that
# directory. The e2e tier applies them before it installs the chart with both turned on (tests/e2e/conftest.py).
set -euo pipefail
VERSION=v0.85.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kubetf"
dir="$CACHE/prometheus-operator-$VERSION"
crds=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)
if [[ ! -f "$dir/${crds[1]}" ]]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  module="$(cd "$work" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$module" ]] || { echo "could not download the Prometheus operator $VERSION from the Go module proxy" >&2; exit 1; }
  mkdir -p "$dir.tmp"
  for crd in "${crds[@]}"; do cp "$module/example/prometheus-operator-crd/$crd" "$dir.tmp/"; done
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
echo "$dir"
