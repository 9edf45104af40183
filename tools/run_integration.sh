#!/usr/bin/env bash
# The integration tier once (tests/integration: FSDP2, TP, pipeline 2/4 stages, FSDP x TP, the DP2 x PP2
# gloo job, the hang in a TP group, the raising pipeline stage, the clean twins), each slowdown case on
# the host as it is ("quiet") and beside one busy loop ("busy"), then each case's report headline.
#
#   tools/run_integration.sh [LOG] [-- extra pytest args, e.g. -k fsdp2]
#
# Run it on a quiet host: the cases are wall-time jobs on CPU, and another test run on the same cores
# is a fault of its own. Prints the host's load before and after, each case's pass/fail, and the
# headline lines the tests print ("[case load, load a b c, N s] headline"). Takes about 20-25 min on
# 2 cores. Exit status: pytest's.
set -u
cd "$(dirname "$0")/.."
log=${1:-${TMPDIR:-/tmp}/perftracker-integration-$(date -u +%Y%m%dT%H%M%SZ).log}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
start=$(date +%s)
{
  echo "# $(date -u) $(git rev-parse --short HEAD 2>/dev/null)  before: $(uptime)"
  python -m pytest -q -s -rA -p no:cacheprovider tests/integration "$@"
  rc=$?
  echo "# after: $(uptime)  wall $(( $(date +%s) - start )) s  pytest rc $rc"
  exit $rc
} > "$log" 2>&1
rc=$?
echo "== headlines (${log}) =="
grep -E '^\[|^  headline:' "$log"
echo "== results =="
grep -E '^(PASSED|FAILED|ERROR) |^# ' "$log"
tail -n 1 "$log" | grep -q "wall" || tail -n 3 "$log"
exit $rc
