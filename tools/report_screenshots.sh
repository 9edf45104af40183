#!/usr/bin/env bash
# Regenerate docs/img/report-*.png from the current code (issue 47): the offline reports of two real
# multi-rank GPU trace sets and the demo's report (localized from its recorded patterns,
# tests/fixtures/demo_cpu_slow_rank2.patterns.json), rendered as HTML in headless Chromium
# (docs/screenshot.sh; Debian: apt-get install -y chromium).
#   tools/report_screenshots.sh DATA_DIR     DATA_DIR holds the real trace sets dlrm_kineto/ and sa_se_kineto/
set -euo pipefail
data=${1:?usage: tools/report_screenshots.sh DATA_DIR (the folder that holds dlrm_kineto/ and sa_se_kineto/)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
perftracker analyze "$data/dlrm_kineto" -o "$tmp/dlrm.json" 2>/dev/null
perftracker analyze "$data/sa_se_kineto" -o "$tmp/sa_se.json" 2>/dev/null
python - "$tmp/demo.json" <<'PY'
import json, sys
from pathlib import Path
from perftracker.localizer.diagnose.localize import localize
from perftracker.model import PatternSet
sets = [PatternSet.from_dict(d) for d in json.loads(Path("tests/fixtures/demo_cpu_slow_rank2.patterns.json").read_text())]
Path(sys.argv[1]).write_text(json.dumps(localize(sets).to_dict()))
PY
bash docs/screenshot.sh "$tmp/dlrm.json" docs/img/report-dlrm-kineto.png 2550
bash docs/screenshot.sh "$tmp/sa_se.json" docs/img/report-sa-se-kineto.png 1780
bash docs/screenshot.sh "$tmp/demo.json" docs/img/report-demo.png 1780
