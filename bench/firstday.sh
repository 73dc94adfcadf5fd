#!/usr/bin/env bash
# The coding agent's first-day workloads (test/firstday_test.go), each timed
# in `loomfs run` and in the same container over a plain bind mount, median
# of RUNS (default 3), as a Markdown table for BENCHMARKS.md. Needs root,
# the Docker engine and loomfs-sandbox-dev:latest (scripts/setup).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOMFS_FIRSTDAY_BENCH=${RUNS:-3} go test -v -count=1 -timeout 60m -run '^TestFirstDayBench$' ./test/ | grep '^|'
