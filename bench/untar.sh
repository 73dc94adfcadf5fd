#!/usr/bin/env bash
# tar -x through a loomfs mount against directly on the same filesystem,
# on each root given, in alternating rounds: the wall time of the untar
# (medians of ROUNDS), the CPU time of the mount's daemon, and with
# STRACE=1 one more round under strace -f -c -w counting the daemon's
# system calls per extracted file and the wall time they took (the time
# from entry to return, waits on the backing filesystem's server
# included). BASELINE=BINARY adds a second loomfs (built
# from the revision before a change) to the same rounds, so before and
# after are measured side by side.
#
# Usage, as root:
#   bash bench/untar.sh ROOT...            e.g. /var/tmp and a CephFS mount
#   TREE=goroot bash bench/untar.sh /var/tmp   Go's src tree instead of 1,000 files
#   git worktree add /tmp/base HEAD~3 && (cd /tmp/base && go build -o /tmp/loomfs-base ./cmd/loomfs)
#   BASELINE=/tmp/loomfs-base STRACE=1 ROUNDS=5 bash bench/untar.sh /var/tmp "$(bash scripts/cephfs roots | cut -d, -f1)"
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: bench/untar.sh ROOT..." >&2; exit 2; }
ROUNDS=${ROUNDS:-5}
TREE=${TREE:-files}
work=$(mktemp -d /var/tmp/loomfs-untar-bench.XXXXXX)
name="untar-bench-$$"
daemon=""
roots=("$@")
cleanup() {
	if [ -n "$daemon" ]; then
		kill "$daemon" 2>/dev/null || true
		wait "$daemon" 2>/dev/null || true
	fi
	for r in "${roots[@]}"; do rm -rf "${r:?}/$name"; done
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/loomfs" ./cmd/loomfs
bins=(loomfs)
if [ -n "${BASELINE:-}" ]; then
	cp "$BASELINE" "$work/baseline"
	bins+=(baseline)
fi
command -v strace >/dev/null || [ -z "${STRACE:-}" ] || { echo "strace missing" >&2; exit 1; }

if [ "$TREE" = goroot ]; then
	tar -C "$(go env GOROOT)" -cf "$work/files.tar" src
else
	# 1,000 files of 4 KiB in 10 directories, as bench/dfs.sh.
	mkdir -p "$work/src"
	for d in $(seq 0 9); do
		mkdir -p "$work/src/d$d"
		for f in $(seq 0 99); do head -c 4096 /dev/urandom >"$work/src/d$d/f$f"; done
	done
	tar -cf "$work/files.tar" -C "$work/src" .
fi
files=$(tar -tf "$work/files.tar" | grep -vc '/$')

now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN {printf "%.3f", e - s}'; }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
untar() { tar --no-same-owner --no-same-permissions -xf "$work/files.tar" -C "$1"; }
# cpu PID: user+system seconds the process has used.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.3f", ($14 + $15) / hz}' "/proc/$1/stat"; }

# perfile FILE: an strace -c -w summary per extracted file: calls and the
# wall time they took.
perfile() {
	awk -v n="$files" '
		$NF ~ /^(openat2|openat|statx|fstat|newfstatat|fcntl|write|pwrite64|pread64|utimensat|fchmod|fchown|close|getdents64|mkdirat|mkdir|unlinkat|renameat|renameat2|fsync|lseek)$/ {
			c[$NF] = $4; total += $4 # $4: calls, whether or not errors has a column
			us[$NF] = $2 * 1e6; totus += $2 * 1e6 # $2: seconds, wall time with -w
		}
		END {
			for (k in c) printf "  %-11s %6.2f %8.1f µs\n", k, c[k] / n, us[k] / n
			printf "  %-11s %6.2f %8.1f µs (the calls above; futex, epoll, nanosleep and the FUSE channel'"'"'s read and writev left out)\n", "total", total / n, totus / n
		}' "$1" | sort
}

# mount BIN ROOT SCOPE MNT [strace -o FILE]: serve SCOPE at MNT in the
# background (daemon: its pid).
mount_scope() {
	local bin=$1 root=$2 scope=$3 mnt=$4
	shift 4
	local L=("$work/$bin" --backend shared_posix --root "$root" --volume-id vol-bench --data "$work/data")
	"${L[@]}" tool workspace_list --scope "$scope" >/dev/null # the layout, not timed
	: >"$work/mount.log"
	"$@" "${L[@]}" mount --scope "$scope" --self-check 0 "$mnt" >"$work/mount.log" 2>&1 &
	daemon=$!
	for _ in $(seq 1 300); do grep -qs "mounted " "$work/mount.log" && return; sleep 0.1; done
	echo "mount did not come up:" >&2
	cat "$work/mount.log" >&2
	exit 1
}
unmount_scope() {
	kill "$daemon"
	wait "$daemon" || true
	daemon=""
}

for root in "${roots[@]}"; do
	base="$root/$name"
	mkdir -p "$base"
	echo vol-bench >"$base/.agentloom-volume"
	mnt="$work/mnt"
	mkdir -p "$mnt"
	fstype=$(findmnt -no FSTYPE -T "$root")
	echo "### $root ($fstype), $files files, $ROUNDS rounds"
	declare -A T=() C=()
	layers=(direct "${bins[@]}")
	for r in $(seq 1 "$ROUNDS"); do
		# Each round in another order, and every tree kept to the end: a
		# removal, or the writeback of the tree before, slows whatever runs
		# next on the same disk.
		line=""
		for i in "${!layers[@]}"; do
			l=${layers[$(((i + r) % ${#layers[@]}))]}
			sync
			if [ "$l" = direct ]; then
				mkdir -p "$base/direct-$r"
				s=$(now); untar "$base/direct-$r"; T[direct]+="$(since "$s") "
			else
				mount_scope "$l" "$base" "bench/$l/r$r" "$mnt"
				c0=$(cpu "$daemon")
				s=$(now); untar "$mnt"; T[$l]+="$(since "$s") "
				C[$l]+="$(awk -v a="$c0" -v b="$(cpu "$daemon")" 'BEGIN {printf "%.3f", b - a}') "
				unmount_scope
			fi
			line+="$l $(echo ${T[$l]} | awk '{print $NF}') "
		done
		echo "  round $r: $line" >&2
	done
	d=$(median ${T[direct]})
	echo "tar -x directly: median $d s (${T[direct]% })"
	for b in "${bins[@]}"; do
		m=$(median ${T[$b]})
		echo "tar -x through $b: median $m s (${T[$b]% }), $(awk -v l="$m" -v d="$d" 'BEGIN {printf "%.2f", l / d}')x direct; daemon CPU median $(median ${C[$b]}) s (${C[$b]% })"
		# Each round's ratio to direct in the same round, whose median
		# the drift between rounds weighs on less.
		paired=$(awk -v l="${T[$b]}" -v d="${T[direct]}" 'BEGIN {n = split(l, a, " "); split(d, b, " "); for (i = 1; i <= n; i++) printf "%.3f ", a[i] / b[i]}')
		echo "  $b ÷ direct, round by round: median $(median $paired)x ($paired)"
	done
	if [ -n "${STRACE:-}" ]; then
		# System calls of the daemon per file, over a whole untar (the mount's
		# own start and stop included, a few hundred calls), then tar's own,
		# directly and through each mount: where tar waits.
		for b in "${bins[@]}"; do
			mount_scope "$b" "$base" "bench/$b/strace" "$mnt" strace -f -c -w -o "$work/strace-$b.txt"
			untar "$mnt"
			kill "$(pgrep -P "$daemon")"
			wait "$daemon" || true
			daemon=""
			echo "system calls of the daemon per file through $b, and µs they took per file (strace -f -c -w):"
			perfile "$work/strace-$b.txt"
		done
		mkdir -p "$base/direct-strace"
		strace -f -c -w -o "$work/strace-tar-direct.txt" tar --no-same-owner --no-same-permissions -xf "$work/files.tar" -C "$base/direct-strace"
		echo "system calls of tar per file directly (strace -f -c -w):"
		perfile "$work/strace-tar-direct.txt"
		for b in "${bins[@]}"; do
			mount_scope "$b" "$base" "bench/$b/strace-tar" "$mnt"
			strace -f -c -w -o "$work/strace-tar-$b.txt" tar --no-same-owner --no-same-permissions -xf "$work/files.tar" -C "$mnt"
			unmount_scope
			echo "system calls of tar per file through $b (strace -f -c -w):"
			perfile "$work/strace-tar-$b.txt"
		done
	fi
	rm -rf "${base:?}"
done
