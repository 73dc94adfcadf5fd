#!/usr/bin/env bash
# The audit log at scale: bench/auditgen writes RECORDS records (default
# 1,000,000) over DAYS days (30) from NODES nodes (4) with the real writer;
# then ROUNDS rounds of "loomfs audit verify" and of
# "loomfs audit query --scope S --since 1h", wall and CPU seconds each; then
# the same for a signed month (verify --keys); the append benchmarks of the
# audit package. BENCHMARKS.md records the
# figures with this command.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/loomfs" ./cmd/loomfs
go build -o "$work/auditgen" ./bench/auditgen
s=$(date +%s.%N)
"$work/auditgen" -root "$work/vol" -records "${RECORDS:-1000000}" -days "${DAYS:-30}" -nodes "${NODES:-4}"
e=$(date +%s.%N)
echo "generate: $(awk -v s="$s" -v e="$e" 'BEGIN {printf "%.1f", e - s}') s; $(ls "$work/vol/.agentloom-audit" | wc -l) files, $(du -sh "$work/vol/.agentloom-audit" | cut -f1)"
for _ in $(seq "$ROUNDS"); do
	/usr/bin/time -f "verify: %e s wall, %U s user, %S s sys" "$work/loomfs" --root "$work/vol" audit verify >/dev/null
done
for _ in $(seq "$ROUNDS"); do
	/usr/bin/time -f "query --scope acme/agent3/s3 --since 1h: %e s wall, %U s user, %S s sys" \
		"$work/loomfs" --root "$work/vol" audit query --scope acme/agent3/s3 --since 1h >/dev/null
done
# The same month signed (SIGNED=0 skips it): a key per node, every seal
# checked by verify --keys.
if [ "${SIGNED:-1}" = 1 ]; then
	mkdir -m 0700 "$work/keys"
	for n in $(seq "${NODES:-4}"); do
		"$work/loomfs" audit keygen --dir "$work/keys" --node "node-$n" >/dev/null
	done
	"$work/auditgen" -root "$work/svol" -records "${RECORDS:-1000000}" -days "${DAYS:-30}" -nodes "${NODES:-4}" -keys "$work/keys"
	for _ in $(seq "$ROUNDS"); do
		/usr/bin/time -f "verify --keys: %e s wall, %U s user, %S s sys" "$work/loomfs" --root "$work/svol" audit verify --keys "$work/keys" >/dev/null
	done
fi
go test -run '^$' -bench 'BenchmarkRecord' -benchtime 20000x -count "$ROUNDS" ./audit/
