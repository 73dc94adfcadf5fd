#!/usr/bin/env bash
# Process sessions (SPEC §5.1) against one-shot commands, side by side in
# one run: workspace_process_start of true with a warm session sandbox
# against workspace_command true, a Python REPL's write/read round trip
# (in-process and over the node service's socket), and a session sandbox's
# cold start against docker run --rm of the same image. Go benchmarks with
# p50/p90 of $ROUNDS calls each. Needs the engine and loomfs-sandbox-dev.
# Usage: bash bench/processes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-20}
uptime
go test -count=1 -run '^$' -bench . -benchtime "${ROUNDS}x" ./process/ ./nodeservice/ | grep -E '^(Benchmark|ok|FAIL)'
