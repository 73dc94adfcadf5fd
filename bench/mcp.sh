#!/usr/bin/env bash
# The tool door against the reference MCP filesystem server: one MCP client
# session over stdio per server and round (the official TypeScript SDK
# client, bench/mcp/client.mjs), $PAIRS write+read pairs of a 1 KiB file
# (write new content, read it back) after $WARMUP untimed pairs, against
# "loomfs mcp" and @modelcontextprotocol/server-filesystem side by side.
# Servers take turns within a round, the order swapped every round; each
# session gets a fresh root. Prints every round, then per server the medians
# over rounds of read p50/p99 and write p50/p99 (ms).
#
# Needs go, node and npm; the client and the reference server are installed
# from npm (versions pinned in bench/mcp/package.json) into a temporary
# directory, or into $NODE_DIR if set (kept, so later runs reuse it).
#
# Usage: [ROUNDS=3] [PAIRS=500] [WARMUP=10] bash bench/mcp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
PAIRS=${PAIRS:-500}
WARMUP=${WARMUP:-10}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/loomfs" ./cmd/loomfs

node_dir=${NODE_DIR:-$work/node}
mkdir -p "$node_dir"
cp bench/mcp/package.json bench/mcp/client.mjs "$node_dir/"
(cd "$node_dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
ref="$node_dir/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
ver() { node -p "require('$node_dir/node_modules/$1/package.json').version"; }

echo "## MCP over stdio: $PAIRS write+read pairs of 1 KiB ($WARMUP untimed first), $ROUNDS rounds"
echo "# node $(node --version), @modelcontextprotocol/sdk $(ver @modelcontextprotocol/sdk)," \
	"@modelcontextprotocol/server-filesystem $(ver @modelcontextprotocol/server-filesystem)," \
	"loomfs $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' || echo +changes)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# session SERVER ROUND: one client session; prints "SERVER rp50 rp99 wp50 wp99".
session() {
	local dir="$work/$1-$2"
	mkdir -p "$dir"
	case $1 in
	loomfs)
		node "$node_dir/client.mjs" loomfs "$PAIRS" "$WARMUP" bench.txt -- \
			"$work/loomfs" --data "$dir/data" --root "$dir/root" mcp --scope bench/client/s1
		;;
	reference)
		node "$node_dir/client.mjs" reference "$PAIRS" "$WARMUP" "$dir/bench.txt" -- \
			node "$ref" "$dir" 2>/dev/null
		;;
	esac
	rm -rf "$dir"
}

out="$work/rounds"
for r in $(seq 1 "$ROUNDS"); do
	order="loomfs reference"
	[ $((r % 2)) -eq 0 ] && order="reference loomfs"
	for s in $order; do
		printf 'round %d ' "$r"
		session "$s" "$r" | tee -a "$out"
	done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| server | read p50 | read p99 | write p50 | write p99 |"
echo "|---|---|---|---|---|"
for s in loomfs reference; do
	row="| $s"
	for col in 2 3 4 5; do
		row="$row | $(awk -v s="$s" -v c="$col" '$1 == s {print $c}' "$out" | median) ms"
	done
	echo "$row |"
done
