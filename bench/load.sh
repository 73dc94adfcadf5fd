#!/usr/bin/env bash
# A busy worker (issue 49): N agents (default 50) on scopes of their own on
# this node, each looping for M minutes (default 10) through an agent's
# work as separate loomfs processes (writes, a read, an edit, a patch, grep,
# glob, a build-like workspace_command, two calls refused on purpose, and
# in every fourth agent a Python REPL in its session sandbox), then checks
# that nothing failed or was quarantined, nothing is left, the audit
# verifies and every scope holds what its agent wrote. Prints p50/p99 per
# operation. It is test/load_test.go's TestLoad at full size (make test
# runs it at 20 agents for 60 s). Needs the engine and loomfs-sandbox-dev.
# Usage: bash bench/load.sh [N] [M]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-${N:-50}}
M=${2:-${M:-10}}
uptime
LOOMFS_LOAD_AGENTS=$N LOOMFS_LOAD_DURATION=${M}m \
	go test -count=1 -v -run '^TestLoad$' -timeout "$((M + 20))m" ./test/ |
	grep -E 'load_test.go|^(--- |ok|FAIL|PASS)'
uptime
