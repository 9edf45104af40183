#!/usr/bin/env bash
# Render a report JSON (perftracker report --format json, or reports/<session>.json of the
# embedded localizer) as HTML and take a screenshot of it in headless Chromium (Debian: apt-get
# install -y chromium).
#   docs/screenshot.sh REPORT.json OUT.png [HEIGHT_PX]
set -euo pipefail
report=$1 out=$2 height=${3:-1400}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m perftracker report --file "$report" --format html -o "$tmp/report.html"
chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --disable-quic --user-data-dir="$tmp/profile" --hide-scrollbars \
  --window-size=1200,"$height" --screenshot="$out" "file://$tmp/report.html" 2>/dev/null
echo "wrote $out"
