#!/usr/bin/env bash
# Benchmarks, side by side in one run. Prints figures; BENCHMARKS.md
# records them with this command. Usage: bash bench/run.sh [section...]
# Sections (all by default): go (Go benchmarks of the store, the tools and
# the FUSE audit overhead), grep (loomfs grep vs rg on a 10k-file tree),
# fuse (bench/fuse.sh: native vs loomfs vs go-fuse loopback vs bindfs),
# snapshot (bench/snapshot.sh: snapshots vs cp -a and rsync -a); and, only
# when named, runtime (bench/runtime.sh: workspace_command under runc vs
# runsc), firstday (bench/firstday.sh: a coding agent's first-day
# workloads in loomfs run vs a plain bind mount) and mcp (bench/mcp.sh:
# loomfs mcp vs the reference MCP filesystem server, needs npm) and
# processes (bench/processes.sh: process sessions vs one-shot commands).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(go grep fuse snapshot)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/loomfs" ./cmd/loomfs
go build -o "$work/gentree" ./bench/gentree

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# elapsed CMD...: wall seconds of one run
elapsed() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); awk -v s="$s" -v e="$e" 'BEGIN {printf "%.4f", e - s}'; }

for s in "${sections[@]}"; do
	case $s in
	runtime)
		bash bench/runtime.sh
		;;
	processes)
		bash bench/processes.sh
		;;
	go)
		echo "## Go benchmarks (store, tools)"
		go test -run='^$' -bench=. -benchmem -count=3 ./store/ ./tools/ | grep -E '^(Benchmark|ok)'
		go test -run='^$' -bench=BenchmarkAudit -count=5 ./fusefs/ | grep -E '^(Benchmark|ok)'
		;;
	grep)
		echo "## grep: 10,000 files, ~80 MB; loomfs workspace_grep vs rg, $ROUNDS rounds, medians"
		root="$work/root"
		"$work/loomfs" --root "$root" tool workspace_list --scope b/a/s >/dev/null
		dir="$root/spaces/b/agents/a/sessions/s/main"
		"$work/gentree" -dir "$dir/tree" -files 10000 -size 8192
		du -sh "$dir/tree" | sed 's/^/tree size: /'
		command -v rg >/dev/null || { echo "rg not installed (scripts/setup installs ripgrep)"; exit 1; }
		cat "$dir"/tree/*/*/* >/dev/null # warm the page cache for both
		for pat in loomneedle 'wor[kl]space +pol[a-z]+'; do
			l=(); r=()
			for _ in $(seq "$ROUNDS"); do
				l+=("$(elapsed "$work/loomfs" --root "$root" tool workspace_grep --scope b/a/s --input "{\"pattern\":\"$pat\",\"limit\":500}")")
				r+=("$(elapsed rg -n --no-config "$pat" "$dir/tree")")
			done
			lm=$(printf '%s\n' "${l[@]}" | median); rm_=$(printf '%s\n' "${r[@]}" | median)
			printf 'pattern %-28s loomfs %.3fs  rg %.3fs  ratio %.2fx\n' "'$pat'" "$lm" "$rm_" "$(awk -v a="$lm" -v b="$rm_" 'BEGIN {print a / b}')"
		done
		;;
	*)
		if [ -f "bench/$s.sh" ]; then bash "bench/$s.sh"; else echo "unknown section $s" >&2; exit 2; fi
		;;
	esac
done
