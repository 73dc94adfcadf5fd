#!/usr/bin/env bash
# workspace_command under gVisor (runsc) against runc, side by side in one
# run: `true`, and a small compile-and-run (python3 byte-compiles a short
# program to /tmp and runs the compiled file; the sandbox image has no C
# compiler). Wall time of the whole `loomfs run` call: projection mount and
# probe, container create/start/wait/remove, unmount. Median of $ROUNDS.
# Needs scripts/setup (the runsc runtime, the sandbox image).
# Usage: bash bench/runtime.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/loomfs" ./cmd/loomfs

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# elapsed RUNTIME CMD: wall seconds of one loomfs run under RUNTIME
elapsed() {
	local s e
	s=$(date +%s.%N)
	env -i PATH="$PATH" AGENT_LOOM_SANDBOX_RUNTIME="$1" "$work/loomfs" --root "$work/root" run --scope b/a/s -- "$2" >/dev/null 2>&1 ||
		{ echo "loomfs run under $1 failed" >&2; exit 1; }
	e=$(date +%s.%N)
	awk -v s="$s" -v e="$e" 'BEGIN {printf "%.3f", e - s}'
}

prog='def primes(n):
    s = bytearray([1]) * (n + 1)
    s[0:2] = b"\0\0"
    for i in range(2, int(n ** 0.5) + 1):
        if s[i]:
            s[i * i :: i] = bytearray(len(s[i * i :: i]))
    return [i for i, v in enumerate(s) if v]
print(len(primes(200000)))'
"$work/loomfs" --root "$work/root" tool workspace_write --scope b/a/s \
	--input "$(python3 -c 'import json,sys; print(json.dumps({"path": "prog.py", "content": sys.argv[1]}))' "$prog")" >/dev/null
compile='python3 -c "import py_compile; py_compile.compile(\"prog.py\", cfile=\"/tmp/prog.pyc\", doraise=True)" && python3 /tmp/prog.pyc'

echo "## workspace_command: runc vs runsc (gVisor), $ROUNDS rounds, median wall seconds of loomfs run"
printf '%-28s %8s %8s\n' workload runc runsc
for w in true compile; do
	cmd=true
	[ "$w" = compile ] && cmd=$compile
	row=()
	for rt in runc runsc; do
		elapsed "$rt" "$cmd" >/dev/null # warm: page cache, image layers
		t=()
		for _ in $(seq "$ROUNDS"); do t+=("$(elapsed "$rt" "$cmd")"); done
		row+=("$(printf '%s\n' "${t[@]}" | median)")
	done
	label=$w
	[ "$w" = compile ] && label="compile-and-run (python3)"
	printf '%-28s %8s %8s\n' "$label" "${row[0]}" "${row[1]}"
done
