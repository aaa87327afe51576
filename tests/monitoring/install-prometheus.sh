#!/usr/bin/env bash
# Debian's prometheus package (2.42, with promtool), for the tests of the chart's dashboard and alert rules
# (tests/unit/test_monitoring.py: promtool; tests/e2e/test_monitoring.py: a real Prometheus). Its two binaries are
# unpacked under ~/.cache/kubetf/prometheus-VERSION and linked into ~/.cache/kubetf/bin, not installed: the
# package's service would start a Prometheus on :9090 (the operator's metrics port, which the integration tier's
# operators bind on this host) and keep a data directory the tests do not want. Idempotent; a no-op once cached.
set -euo pipefail
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kubetf"
if [[ -x "$CACHE/bin/prometheus" && -x "$CACHE/bin/promtool" ]]; then exit 0; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt() { apt-get -o DPkg::Lock::Timeout=600 -qq "$@"; }
apt download prometheus 2>/dev/null || { apt update && apt download prometheus; }
deb="$(echo prometheus_*.deb)"
version="$(dpkg-deb -f "$deb" Version)"
dpkg-deb -x "$deb" root
dir="$CACHE/prometheus-${version%%+*}"
mkdir -p "$dir" "$CACHE/bin"
cp root/usr/bin/prometheus root/usr/bin/promtool "$dir/"
ln -sf "$dir/prometheus" "$CACHE/bin/prometheus"
ln -sf "$dir/promtool" "$CACHE/bin/promtool"
echo "prometheus $version: $("$CACHE/bin/prometheus" --version 2>&1 | head -1)"
