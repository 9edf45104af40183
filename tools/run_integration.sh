#!/usr/bin/env bash
# The integration tier once (tests/integration: FSDP2, TP, pipeline 2/4 stages, FSDP x TP, the DP2 x PP2
# gloo job, the hang in a TP group, the raising pipeline stage, the clean twins), each slowdown case on
# the host as it is ("quiet") and beside one busy loop ("busy"), then each case's report headline.
#
#   tools/run_integration.sh [LOG] [-- extra pytest args, e.g. -k fsdp2]
#
# Run it on a quiet host: the cases are wall-time jobs on CPU, and another test run on the same cores
# is a fault of its own. Prints the host's load before and after, each case's pass/fail, and the
# headline lines the tests print ("[case load, load a b c, N s] headline"). Took 16 min (967 s) on
# 2 cores at load 6-10. Exit status: pytest's.
set -u
cd "$(dirname "$0")/.."
log=${TMPDIR:-/tmp}/perftracker-integration-$(date -u +%Y%m%dT%H%M%SZ).log
if [ $# -gt 0 ] && [ "$1" != "--" ]; then log=$1; shift; fi
[ "${1:-}" = "--" ] && shift
start=$(date +%s)
echo "# $(date -u) $(git rev-parse --short HEAD 2>/dev/null)  before: $(uptime)" > "$log"
python -m pytest -q -s -rA -p no:cacheprovider tests/integration "$@" >> "$log" 2>&1
rc=$?
echo "# after: $(uptime)  wall $(( $(date +%s) - start )) s  pytest rc $rc" >> "$log"
echo "== headlines (${log}) =="
grep -E '^\[|^  headline:' "$log"
echo "== results =="
grep -E '^(PASSED|FAILED|ERROR|SKIPPED) |^# ' "$log"
exit $rc
