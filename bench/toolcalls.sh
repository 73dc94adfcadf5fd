#!/usr/bin/env bash
# A warm workload between tool calls, as an agent alternates them: Go's
# src tree in a scope, one loomfs mount of it, rg -uuu over it twice to
# warm the kernel's caches, then CALLS rounds of one `loomfs tool
# workspace_write` (a process of its own, whose change journal it ends)
# followed, once the mount's follower has had a pass, by a timed rg.
# Each tool call's change should drop the one path it names from the
# mount's kernel cache and nothing else, so every timed rg stays warm.
# BASELINE=BINARY runs the same with a second loomfs (built from the
# revision before a change) after it; ROUNDS repeats both.
#
# Usage, as root:   ROUNDS=2 BASELINE=/tmp/loomfs-base bash bench/toolcalls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-1}
CALLS=${CALLS:-4}
PATTERN=${PATTERN:-func}
command -v rg >/dev/null || { echo "rg missing: run scripts/setup" >&2; exit 1; }
work=$(mktemp -d /var/tmp/loomfs-toolcalls.XXXXXX)
daemon=""
cleanup() {
	if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/loomfs" ./cmd/loomfs
bins=(loomfs)
if [ -n "${BASELINE:-}" ]; then cp "$BASELINE" "$work/baseline"; bins+=(baseline); fi
scope=bench/agent/s
now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN {printf "%.3f", e - s}'; }

for r in $(seq "$ROUNDS"); do
	for b in "${bins[@]}"; do
		root=$work/root-$b-$r mnt=$work/mnt
		L=("$work/$b" --root "$root" --data "$work/data-$b-$r")
		"${L[@]}" tool workspace_list --scope $scope >/dev/null
		tar -C "$(go env GOROOT)" -cf - src | tar --no-same-owner -x -C "$root/spaces/bench/agents/agent/sessions/s/main"
		mkdir -p "$mnt"
		"${L[@]}" mount --scope $scope --self-check 0 "$mnt" >"$work/mount.log" 2>&1 &
		daemon=$!
		for _ in $(seq 1 300); do grep -qs "mounted " "$work/mount.log" && break; sleep 0.1; done
		rg -uuu "$PATTERN" "$mnt" >/dev/null
		s=$(now); rg -uuu "$PATTERN" "$mnt" >/dev/null; line="warm $(since "$s") s; after each tool call:"
		for i in $(seq "$CALLS"); do
			"${L[@]}" tool workspace_write --scope $scope --input "{\"path\":\"notes/n$i.txt\",\"content\":\"x\"}" >/dev/null
			sleep 1.2 # past the follower's poll, which an ended writer's lines may wait for
			s=$(now); rg -uuu "$PATTERN" "$mnt" >/dev/null; line+=" $(since "$s")"
		done
		echo "round $r $b: $line"
		kill "$daemon"; wait "$daemon" || true; daemon=""
		rm -rf "$root"
	done
done
