#!/usr/bin/env bash
# FUSE side by side (issue: fusefs "Measure"): native disk vs a loomfs mount
# vs go-fuse's plain loopback vs bindfs, each layer alone, ROUNDS rounds,
# medians, unpinned and pinned to one CPU (taskset -c 0 for the daemon and
# the workload). Run as root: bash bench/run.sh fuse
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-5000}
FIO_SIZE=${FIO_SIZE:-1G}
PINS=${PINS:-"unpinned pinned"}
# loopback is go-fuse's loopback as it ships: it hands files to the kernel
# for passthrough, so its reads and writes skip the daemon; loopback-np is
# the same with passthrough off, every write served by the daemon as
# loomfs serves every write.
LAYERS=${LAYERS:-"native loomfs loopback loopback-np bindfs"}
# BEFORE=REV builds loomfs as it was at the git revision REV too, as the
# layer loomfs-before (add it to LAYERS): a change measured side by side
# with what it changed, in one run.
# LOOMFS_MOUNT_FLAGS adds flags to loomfs mount, e.g. --passthrough
# BENCH_TMP is where the backing directories live; BENCH_TMP=/dev/shm (tmpfs)
# takes the disk out, leaving what each FUSE layer itself costs.
# BENCH_TMP=ramdisk makes an ext4 on a loop device over a file in /dev/shm:
# a real block device and page cache, so a cold read goes through
# readahead and the block layer, but its blocks come from RAM, without this
# VM's disk, whose cold reads of one file range over 3x within minutes.
BENCH_TMP=${BENCH_TMP:-/var/tmp}
# fior reads one file written once, natively, before the rounds, and moved
# (renamed: its blocks stay where they are) into each layer's backing
# directory for its read: where a file lands on this VM's disk changes a
# cold read by a third, so every layer reads the same blocks.
# fiorw reads the file fiow wrote twice, the second time from the page
# cache: what the layer itself costs a reader, without the disk.
WORKLOADS=${WORKLOADS:-"meta untar rg fiow fior fiorw"}
has() { [[ " $WORKLOADS " == *" $1 "* ]]; }
for t in fio bindfs rg taskset; do command -v $t >/dev/null || { echo "$t missing: run scripts/setup" >&2; exit 1; }; done

daemon_pid="" work="" mnt="" ramdisk="" ramimg="" ramdir=""
cleanup() {
	[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
	[ -n "$mnt" ] && mountpoint -q "$mnt" 2>/dev/null && umount -l "$mnt" || true
	[ -n "$work" ] && rm -rf "$work"
	if [ -n "$ramdir" ]; then umount "$ramdir" && rmdir "$ramdir"; fi
	[ -n "$ramdisk" ] && losetup -d "$ramdisk"
	[ -n "$ramimg" ] && rm -f "$ramimg"
	true
}
trap cleanup EXIT
if [ "$BENCH_TMP" = ramdisk ]; then
	ramimg=$(mktemp /dev/shm/loomfs-bench-disk.XXXXXX)
	truncate -s "${RAMDISK_SIZE:-6G}" "$ramimg"
	ramdisk=$(losetup -f --show "$ramimg")
	mkfs.ext4 -q "$ramdisk"
	ramdir=$(mktemp -d /tmp/loomfs-bench-disk.XXXXXX)
	mount "$ramdisk" "$ramdir"
	BENCH_TMP=$ramdir
fi
work=$(mktemp -d "$BENCH_TMP"/loomfs-bench.XXXXXX)
chmod 700 "$work"
mnt=$work/mnt
bin=$work/bin; mkdir -p "$bin"
go build -o "$bin/loomfs" ./cmd/loomfs
if [ -n "${BEFORE:-}" ]; then
	mkdir -p "$work/before"
	git archive "$BEFORE" | tar -x -C "$work/before"
	(cd "$work/before" && go build -o "$bin/loomfs-before" ./cmd/loomfs)
fi
go build -o "$bin/loopback" ./bench/loopback
go build -o "$bin/metaops" ./bench/metaops
srctar=$work/src.tar
tar -C "$(go env GOROOT)" -cf "$srctar" src
root=$work/root
SCOPE=bench/agent/s

# mount_layer LAYER PIN: mounts LAYER and sets dir to the directory to work
# in and backing to the directory it shows
mount_layer() {
	local layer=$1 pin=$2
	mkdir -p "$mnt"
	case $layer in
	native)
		rm -rf "$work/native"; mkdir -p "$work/native"; dir=$work/native; backing=$dir; return ;;
	loomfs | loomfs-before)
		rm -rf "$root"
		"$bin/$layer" --root "$root" tool workspace_list --scope $SCOPE >/dev/null
		"${pre[@]}" "$bin/$layer" --root "$root" mount --scope $SCOPE ${LOOMFS_MOUNT_FLAGS:-} "$mnt" >/dev/null 2>"$work/daemon.log" &
		daemon_pid=$!
		backing=$root/spaces/bench/agents/agent/sessions/s/main
		;;
	loopback | loopback-np)
		rm -rf "$work/lb"; mkdir -p "$work/lb"
		local np=(); [ "$layer" = loopback-np ] && np=(-no-passthrough)
		"${pre[@]}" "$bin/loopback" "${np[@]}" "$work/lb" "$mnt" >/dev/null 2>"$work/daemon.log" &
		daemon_pid=$!
		backing=$work/lb
		;;
	bindfs)
		rm -rf "$work/bf"; mkdir -p "$work/bf"
		"${pre[@]}" bindfs -f "$work/bf" "$mnt" >/dev/null 2>"$work/daemon.log" &
		daemon_pid=$!
		backing=$work/bf
		;;
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
secs() { awk -v s="$1" -v e="$2" 'BEGIN {printf "%.3f", e - s}'; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# each workload prints one number: seconds, or MB/s for fio rows
w_meta() { # create/stat/delete FILES small files
	mkdir -p "$1/meta"
	"${pre[@]}" "$bin/metaops" -n "$FILES" "$1/meta"
	rmdir "$1/meta"
}
# Ownership is the projection's to decide: tar keeps the files as created.
w_untar() { local s e; s=$(now); "${pre[@]}" tar --no-same-owner --no-same-permissions -C "$1" -xf "$srctar"; e=$(now); secs "$s" "$e"; }
w_rg() { local s e; s=$(now); "${pre[@]}" rg -c --no-config 'func main' "$1/src" >/dev/null || true; e=$(now); secs "$s" "$e"; }
w_fio_warm() { # prints MB/s of a read with the file in the page cache
	"${pre[@]}" fio --name=seq --directory="$1" --rw=read --bs=1M --size="$FIO_SIZE" --numjobs=1 --ioengine=psync \
		--invalidate=0 --output-format=terse --terse-version=3 >/dev/null 2>&1
	"${pre[@]}" fio --name=seq --directory="$1" --rw=read --bs=1M --size="$FIO_SIZE" --numjobs=1 --ioengine=psync \
		--invalidate=0 --output-format=terse --terse-version=3 2>/dev/null | awk -F';' '{print $7/1024}'
}

w_fior() { # prints MB/s of a cold read of the file made before the rounds
	local v
	mv "$work/coldread" "$backing/coldread"
	sync; echo 3 >/proc/sys/vm/drop_caches
	v=$("${pre[@]}" fio --name=seq --filename="$1/coldread" --rw=read --bs=1M --size="$FIO_SIZE" --numjobs=1 --ioengine=psync \
		--output-format=terse --terse-version=3 2>/dev/null | awk -F';' '{print $7/1024}')
	mv "$backing/coldread" "$work/coldread"
	echo "$v"
}

w_fiow() { # prints MB/s of a sequential write, fsynced at the end
	"${pre[@]}" fio --name=seq --directory="$1" --rw=write --bs=1M --size="$FIO_SIZE" --numjobs=1 --ioengine=psync \
		--end_fsync=1 --output-format=terse --terse-version=3 2>/dev/null | awk -F';' '{print $48/1024}'
}

if has fior; then
	fio --name=cold --filename="$work/coldread" --rw=write --bs=1M --size="$FIO_SIZE" --ioengine=psync \
		--end_fsync=1 --output-format=terse >/dev/null 2>&1
fi

declare -A R
# Rounds go around the layers (round 1 of each layer, then round 2…), so a
# change in the machine's load during the run hits every layer alike.
for pin in $PINS; do
	for round in $(seq "$ROUNDS"); do
		for layer in $LAYERS; do
			pre=(); [ "$pin" = pinned ] && pre=(taskset -c 0)
			mount_layer "$layer" "$pin"
			has meta && R[$pin,$layer,meta]+="$(w_meta "$dir") "
			has untar && R[$pin,$layer,untar]+="$(w_untar "$dir") "
			sync; echo 3 >/proc/sys/vm/drop_caches
			has rg && R[$pin,$layer,rg]+="$(w_rg "$dir") "
			has fiow && R[$pin,$layer,fiow]+="$(w_fiow "$dir") "
			has fior && R[$pin,$layer,fior]+="$(w_fior "$dir") "
			has fiorw && R[$pin,$layer,fiorw]+="$(w_fio_warm "$dir") "
			rm -rf "${dir:?}"/* 2>/dev/null || true
			# Finish the removal (journal commit, discards) here, not
			# during the next layer's round.
			sync
			unmount_layer
			echo "  $pin $layer round $round: $(for w in $WORKLOADS; do printf '%s=%s ' $w "$(echo ${R[$pin,$layer,$w]} | awk '{print $NF}')"; done)" >&2
		done
	done
done

printf '\n%-9s %-24s' "pin" "workload"; for l in $LAYERS; do printf '%14s' "$l"; done; printf '   (ratios to native)\n'
for pin in $PINS; do
	for w in $WORKLOADS; do
		case $w in meta) label="create/stat/rm $FILES (s)";; untar) label="tar -x GOROOT/src (s)";; rg) label="rg cold (s)";; fiow) label="fio seq write (MB/s)";; fior) label="fio seq read (MB/s)";; fiorw) label="fio read, cached (MB/s)";; esac
		printf '%-9s %-24s' "$pin" "$label"
		base=$(echo ${R[$pin,native,$w]:-0} | tr ' ' '\n' | median)
		for l in $LAYERS; do
			m=$(echo ${R[$pin,$l,$w]} | tr ' ' '\n' | median)
			printf '%14s' "$m($(awk -v a="$m" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'))"
		done
		echo
	done
done
