#!/usr/bin/env bash
# Fork bombs in a session sandbox (issue 43): three shapes, each under
# `timeout 3`, which ends the bomb's first process and leaves the rest at
# the session's pids limit: a shell function that forks in a loop, a
# Python loop that retries failed forks, and yes piped to xargs -P0. For
# each, the time from the bomb's end (its timeout) to the next
# workspace_process_start that answers, with no operator; the session's
# own healing does it (process.TestForkBombHeals, which fails only when a
# session does not heal at all). ROUNDS rounds under each runtime of
# RUNTIMES; prints every figure, then the median and the maximum per
# runtime and shape, and how many rounds missed the issue's 10 s.
# Needs the engine, loomfs-sandbox-dev and, for runsc, gVisor.
# Usage: bash bench/forkbomb.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
RUNTIMES=${RUNTIMES:-"runc runsc"}
uptime
for rt in $RUNTIMES; do
	rtenv=AGENT_LOOM_SANDBOX_RUNTIME=
	[ "$rt" = runc ] || rtenv=AGENT_LOOM_SANDBOX_RUNTIME=$rt
	env "$rtenv" go test -count="$ROUNDS" -timeout 60m -run '^TestForkBombHeals$' -v ./process/ |
		grep -E 'fork bomb "|^(ok|FAIL)' | sed "s/^ */$rt /"
done | tee /dev/stderr | awk '
	/fork bomb "/ {
		split($0, q, "\""); rt = $1
		for (i = 1; i <= NF; i++) if ($i == "started") t = $(i + 1)
		k = rt " / " q[2]; n[k]++; v[k, n[k]] = t
	}
	END {
		print "runtime / shape: median, max seconds from the bomb'"'"'s end to the next process start"
		for (k in n) {
			m = n[k]
			for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[k, j] < v[k, i]) { x = v[k, i]; v[k, i] = v[k, j]; v[k, j] = x }
			med = (m % 2) ? v[k, (m + 1) / 2] : (v[k, m / 2] + v[k, m / 2 + 1]) / 2
			over = 0
			for (i = 1; i <= m; i++) if (v[k, i] > 10) over++
			printf "%s: %.2f, %.2f (%d rounds, %d over 10 s)\n", k, med, v[k, m], m, over
		}
	}'
