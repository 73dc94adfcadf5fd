#!/usr/bin/env bash
# Warm workloads side by side (issue: "warm workloads at native speed"):
# native disk vs loomfs under "cache: strict" (one-second kernel caching,
# as before the change journals were followed) vs loomfs as it ships (long
# caching kept coherent by the journals) vs go-fuse's loopback vs bindfs.
# Go's src tree is put in each layer's backing directory (a git repository
# of it too), then each round mounts the layer, runs every workload WARMUPS
# times (default 2) to warm it and once timed; rounds go around the layers,
# so a change in the machine's load hits every layer alike. Medians of
# ROUNDS, unpinned and pinned (taskset -c 0 for the daemon and the
# workload).
# SECTIONS picks what runs: warm (the table above), cmd (workspace_command
# true under commands: fresh, over the session's pooled projection in the
# container prepared for it, and right after another one, and under
# commands: session, against docker run --rm and docker exec of the same
# image: a Go benchmark in process/, with the load average around it),
# limit (a writer in a scope whose policy sets io_bytes_per_s, while a
# writer in another scope of the same volume has none; then two mounts of
# the limited scope writing at once, which share its one limit).
# BASELINE=PATH (a loomfs binary of another build) adds the layer
# "before": that build's mount as it ships, in the same rounds. The layer
# "journal" is loomfs under "cache: journal" (every opendir and owner-bit
# check in the daemon, the default until issue 44); "loomfs" is the default
# ("cache: journal-dirs").
# Run as root: ROUNDS=5 bash bench/warm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
PINS=${PINS:-"unpinned pinned"}
BASELINE=${BASELINE:-}
LAYERS=${LAYERS:-"native strict journal ${BASELINE:+before }loomfs loopback bindfs"}
WORKLOADS=${WORKLOADS:-"status rg find stat untar clone build rebuild"}
SECTIONS=${SECTIONS:-"warm cmd limit"}
LIMIT=${LIMIT:-20}         # MiB/s of the limited scope
LIMIT_MB=${LIMIT_MB:-200}  # MiB each writer writes
section() { [[ " $SECTIONS " == *" $1 "* ]]; }
PATTERN=${PATTERN:-func}
BENCH_TMP=${BENCH_TMP:-/var/tmp}
has() { [[ " $WORKLOADS " == *" $1 "* ]]; }
for t in bindfs rg taskset git; do command -v $t >/dev/null || { echo "$t missing: run scripts/setup" >&2; exit 1; }; done

daemon_pid="" work="" mnt=""
cleanup() {
	[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
	[ -n "$mnt" ] && mountpoint -q "$mnt" 2>/dev/null && umount -l "$mnt" || true
	[ -n "$work" ] && rm -rf "$work"
	true
}
trap cleanup EXIT
work=$(mktemp -d "$BENCH_TMP"/loomfs-warm.XXXXXX)
chmod 700 "$work"
mnt=$work/mnt
bin=$work/bin; mkdir -p "$bin"
go build -o "$bin/loomfs" ./cmd/loomfs
go build -o "$bin/loopback" ./bench/loopback
srctar=$work/src.tar
tar -C "$(go env GOROOT)" -cf "$srctar" src
printf 'cache: strict\n' >"$work/strict.yaml"
printf 'cache: journal\n' >"$work/journal.yaml"
SCOPE=bench/agent/s
export GIT_CONFIG_GLOBAL=$work/gitconfig GIT_CONFIG_NOSYSTEM=1
git config --global user.email bench@example.invalid
git config --global user.name bench
git config --global safe.directory '*'
export GOFLAGS=-mod=mod GOPROXY=off GOCACHE=$work/gocache GOTOOLCHAIN=local

# fill DIR: Go's src tree as a git repository, and a small Go module.
fill() {
	tar --no-same-owner -C "$1" -xf "$srctar"
	git -C "$1/src" init -q && git -C "$1/src" add -A && git -C "$1/src" commit -qm src
	mkdir -p "$1/mod"
	printf 'module warm\n\ngo 1.22\n' >"$1/mod/go.mod"
	for p in a b c d; do
		mkdir -p "$1/mod/$p"
		for f in 1 2 3 4 5; do
			printf 'package %s\n\nfunc F%s(x int) int { return x + %s }\n' $p $f $f >"$1/mod/$p/f$f.go"
		done
	done
	printf 'package main\n\nimport (\n\t"fmt"\n\t"warm/a"\n\t"warm/b"\n\t"warm/c"\n\t"warm/d"\n)\n\nfunc main() { fmt.Println(a.F1(1), b.F2(2), c.F3(3), d.F4(4)) }\n' >"$1/mod/main.go"
}

# Each layer's backing directory is filled once, natively.
declare -A BACK
section warm || LAYERS=""
for layer in $LAYERS; do
	case $layer in
	strict | loomfs | before | journal)
		root=$work/root-$layer
		"$bin/loomfs" --root "$root" tool workspace_list --scope $SCOPE >/dev/null
		BACK[$layer]=$root/spaces/bench/agents/agent/sessions/s/main ;;
	*) BACK[$layer]=$work/back-$layer; mkdir -p "${BACK[$layer]}" ;;
	esac
	fill "${BACK[$layer]}"
done

mount_layer() {
	local layer=$1
	mkdir -p "$mnt"
	case $layer in
	native) dir=${BACK[native]}; return ;;
	strict | loomfs | before | journal)
		local pol=() exe=$bin/loomfs
		[ "$layer" = strict ] && pol=(--policy "$work/strict.yaml")
		[ "$layer" = journal ] && pol=(--policy "$work/journal.yaml")
		[ "$layer" = before ] && exe=$BASELINE
		"${pre[@]}" "$exe" --root "$work/root-$layer" "${pol[@]}" mount --scope $SCOPE "$mnt" >/dev/null 2>"$work/daemon.log" &
		daemon_pid=$! ;;
	loopback)
		"${pre[@]}" "$bin/loopback" "${BACK[$layer]}" "$mnt" >/dev/null 2>"$work/daemon.log" &
		daemon_pid=$! ;;
	bindfs)
		"${pre[@]}" bindfs -f "${BACK[$layer]}" "$mnt" >/dev/null 2>"$work/daemon.log" &
		daemon_pid=$! ;;
	esac
	for _ in $(seq 200); do mountpoint -q "$mnt" && break; sleep 0.05; done
	mountpoint -q "$mnt" || { cat "$work/daemon.log" >&2; echo "mount $layer failed" >&2; exit 1; }
	dir=$mnt
}
unmount_layer() {
	if [ -n "$daemon_pid" ]; then
		kill "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
		daemon_pid=""
	fi
	mountpoint -q "$mnt" && umount -l "$mnt" || true
}

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# timed CMD...: seconds CMD takes, its output dropped
timed() { local s e; s=$(now); "${pre[@]}" "$@" >/dev/null 2>&1 || true; e=$(now); awk -v s="$s" -v e="$e" 'BEGIN {printf "%.4f", e - s}'; }

# Each workload runs in the directory the layer shows; the warm ones run
# WARMUPS times untimed first. Twice, because the kernel marks a FUSE
# directory's access time stale whenever it reads its listing from the
# daemon (fuse_invalidate_atime), so the first run after a mount reads
# every listing and the second asks again for every directory's attributes
# (a GETATTR each, 1,340 for Go's src in git status); only the third runs
# as every later one does. The workloads that write work in a fresh directory
# of the round, removed natively after the unmount.
w_status() { timed git -C "$1/src" status --porcelain; }
w_rg() { timed rg -uuu -c --no-config "$PATTERN" "$1/src"; }
w_find() { timed find "$1/src" -type f -size +1k; }
w_stat() { (cd "$1/src" && timed sh -c 'find . -type f -print0 | xargs -0 stat --format=%s'); }
w_untar() { mkdir -p "$1/x$round"; timed tar --no-same-owner --no-same-permissions -C "$1/x$round" -xf "$srctar"; }
w_clone() { timed git clone -q --no-hardlinks "$1/src" "$1/c$round"; }
w_build() { (cd "$1/mod" && timed go build -o /dev/null .); }
w_rebuild() { printf '\n// touched %s %s %s\n' "$round" "$layer" "$pin" >>"$1/mod/a/f1.go"; (cd "$1/mod" && timed go build -o /dev/null .); }
WARMUPS=${WARMUPS:-2}
warm() {
	local i
	case $1 in status | rg | find | stat | build)
		for i in $(seq "$WARMUPS"); do "w_$1" "$2" >/dev/null; done ;;
	esac
}

declare -A R
section warm || PINS=""
for pin in $PINS; do
	for round in $(seq "$ROUNDS"); do
		for layer in $LAYERS; do
			pre=(); [ "$pin" = pinned ] && pre=(taskset -c 0)
			mount_layer "$layer"
			line=""
			for w in $WORKLOADS; do
				warm "$w" "$dir"
				v=$("w_$w" "$dir")
				R[$pin,$layer,$w]+="$v "
				line+="$w=$v "
			done
			unmount_layer
			rm -rf "${BACK[$layer]:?}/x$round" "${BACK[$layer]:?}/c$round"
			echo "  $pin $layer round $round: $line" >&2
		done
	done
done

printf '\n%-9s %-28s' "pin" "workload (s)"; for l in $LAYERS; do printf '%15s' "$l"; done; printf '   (ratios to native)\n'
for pin in $PINS; do
	for w in $WORKLOADS; do
		case $w in
		status) label="git status (warm)" ;; rg) label="rg -uuu $PATTERN (warm)" ;; find) label="find -type f -size +1k (warm)" ;;
		stat) label="stat every file (warm)" ;; untar) label="tar -x GOROOT/src" ;; clone) label="git clone --no-hardlinks" ;;
		build) label="go build, no-op" ;; rebuild) label="go build, one file touched" ;;
		esac
		printf '%-9s %-28s' "$pin" "$label"
		base=$(echo ${R[$pin,native,$w]:-0} | tr ' ' '\n' | median)
		for l in $LAYERS; do
			m=$(echo ${R[$pin,$l,$w]} | tr ' ' '\n' | median)
			printf '%15s' "$m($(awk -v a="$m" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'))"
		done
		echo
	done
done

if section cmd; then
	img=${AGENT_LOOM_SANDBOX_IMAGE:-loomfs-sandbox:latest}
	echo
	echo "## workspace_command true: commands: fresh (pooled projection, container prepared ahead) and session, vs docker run --rm and docker exec ($img${AGENT_LOOM_SANDBOX_RUNTIME:+, runtime $AGENT_LOOM_SANDBOX_RUNTIME}), $ROUNDS rounds, medians"
	# One of each per round (process.BenchmarkWorkspaceCommandModes): the
	# machine's load hits all five alike. fresh-next runs right after
	# fresh, so it waits for the container prepared after fresh's answer.
	echo "load average before: $(cat /proc/loadavg)"
	AGENT_LOOM_SANDBOX_IMAGE=$img go test -run '^$' -bench BenchmarkWorkspaceCommandModes -benchtime "${ROUNDS}x" -count 1 ./process/ | grep -E '^Benchmark'
	echo "load average after: $(cat /proc/loadavg)"
fi

if section limit; then
	echo
	echo "## io_bytes_per_s: $LIMIT MiB/s in one scope, none in another of the same volume; $LIMIT_MB MiB each, dd bs=1M, fsync"
	root=$work/root-limit
	printf 'limits:\n  io_bytes_per_s: %s MiB\n' "$LIMIT" >"$work/limit.yaml"
	pids=()
	for s in slow fast; do
		"$bin/loomfs" --root "$root" tool workspace_list --scope bench/agent/$s >/dev/null
		mkdir -p "$work/m-$s"
		pol=(); [ $s = slow ] && pol=(--policy "$work/limit.yaml")
		"$bin/loomfs" --root "$root" "${pol[@]}" mount --scope bench/agent/$s "$work/m-$s" >/dev/null 2>"$work/daemon-$s.log" &
		pids+=($!)
	done
	for s in slow fast; do for _ in $(seq 200); do mountpoint -q "$work/m-$s" && break; sleep 0.05; done; done
	# dd_rate DIR NAME: MiB/s of one writer
	dd_rate() { local s e; s=$(now); dd if=/dev/zero of="$1/$2" bs=1M count="$LIMIT_MB" conv=fsync status=none; e=$(now); awk -v s="$s" -v e="$e" -v n="$LIMIT_MB" 'BEGIN {printf "%.1f", n / (e - s)}'; }
	alone=$(dd_rate "$work/m-fast" alone); rm -f "$work/m-fast/alone"
	dd_rate "$work/m-slow" w >"$work/slow.rate" &
	slowpid=$!
	both=$(dd_rate "$work/m-fast" w)
	wait $slowpid
	echo "limited scope: $(cat "$work/slow.rate") MiB/s (limit $LIMIT MiB/s); other scope alone: $alone MiB/s, beside the limited writer: $both MiB/s"
	# A second mount of the limited scope (another process, as another
	# node's would be): both writers at once share the one limit.
	mkdir -p "$work/m-slow2"
	"$bin/loomfs" --root "$root" --policy "$work/limit.yaml" mount --scope bench/agent/slow "$work/m-slow2" >/dev/null 2>"$work/daemon-slow2.log" &
	pids+=($!)
	for _ in $(seq 200); do mountpoint -q "$work/m-slow2" && break; sleep 0.05; done
	s=$(now)
	dd if=/dev/zero of="$work/m-slow/s1" bs=1M count="$LIMIT_MB" conv=fsync status=none &
	d1=$!
	dd if=/dev/zero of="$work/m-slow2/s2" bs=1M count="$LIMIT_MB" conv=fsync status=none
	wait $d1
	e=$(now)
	echo "limited scope, two mounts (two processes) writing at once: $(awk -v s="$s" -v e="$e" -v n="$LIMIT_MB" 'BEGIN {printf "%.1f", 2 * n / (e - s)}') MiB/s together (limit $LIMIT MiB/s)"
	for p in "${pids[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
	for s in slow slow2 fast; do mountpoint -q "$work/m-$s" && umount -l "$work/m-$s"; done
fi
