#!/usr/bin/env bash
# The agent's other tools: one workspace_apply_patch of 20 files against
# 20 workspace_edit calls (Go benchmark), and the change feed's latency
# from a write in a container to the long poll returning it.
# Usage: bash bench/changes.sh   (ROUNDS, WRITES from the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
WRITES=${WRITES:-50}
go test -run '^$' -bench BenchmarkPatch20Files -benchtime 30x -count "$ROUNDS" ./tools/ | grep Benchmark
LOOMFS_CHANGES_BENCH=$WRITES go test -count=1 -run TestChangesLatencyBench -v ./test/ | grep '^|'
