#!/usr/bin/env bash
# Fork and merge (issue 47): "loomfs fork" of a scope holding Go's source
# tree (TREE, default $(go env GOROOT)/src, ~11,500 files) on the ext4 that
# holds /var/tmp (copied), on an ext4 made with mkfs.ext4's defaults on a
# loop device (copied), and on an XFS with reflink=1 on a loop device
# (cloned, and copied with --no-clone), then "loomfs merge" of 20 changed
# files back into the 11,500-file scope on the first, with 0 and with 5
# conflicts. Prints medians of $ROUNDS rounds: the command's wall time and
# the in-process figures it reports (data_s: moving file data; the rest of
# duration_s is the metadata walk and the swap), with the load average
# beside each line. Every round forks into a fresh scope and nothing is
# removed until the end: on an ext4 without a journal each new inode skips
# the inodes freed in the last minute or more, so a removal just before a
# measured fork would slow it. Needs root (loop devices, mount), mkfs.xfs
# (xfsprogs) and mkfs.ext4. BIN= a loomfs binary to use instead of
# building one, or several separated by spaces (a before and an after),
# measured side by side: each round runs each in turn, and every figure is
# given per binary, named by its file name (the first one sets up the
# trees and snapshots, so all must read its records); TMPDIR= where to
# work (default /var/tmp: its filesystem is the first one measured).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
TREE=${TREE:-$(go env GOROOT)/src}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/loomfs-fork-bench.XXXXXX")
xfs="$work/xfs"
ext4loop="$work/ext4loop"
cleanup() {
	mountpoint -q "$xfs" && umount "$xfs"
	mountpoint -q "$ext4loop" && umount "$ext4loop"
	rm -rf "$work"
}
trap cleanup EXIT
read -ra bins <<<"${BIN:-}"
if [ ${#bins[@]} -eq 0 ]; then
	go build -o "$work/loomfs" ./cmd/loomfs
	bins=("$work/loomfs")
fi
L=${bins[0]}
name() { basename "${bins[$1]}"; }
command -v mkfs.xfs >/dev/null || { echo "mkfs.xfs not installed (scripts/setup installs xfsprogs)"; exit 1; }
command -v mkfs.ext4 >/dev/null || { echo "mkfs.ext4 not installed (e2fsprogs)"; exit 1; }

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN {printf "%.3f", e - s}'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]] if not isinstance(d[sys.argv[2]], list) else len(d[sys.argv[2]]))' "$1" "$2"; }
ms() { awk -v s="$1" 'BEGIN {printf "%.0f ms", s * 1000}'; }

truncate -s 4G "$work/xfs.img"
mkfs.xfs -q -m reflink=1 "$work/xfs.img"
mkdir "$xfs"
mount -o loop "$work/xfs.img" "$xfs"
truncate -s 4G "$work/ext4.img"
mkfs.ext4 -q -F "$work/ext4.img"
mkdir "$ext4loop"
mount -o loop "$work/ext4.img" "$ext4loop"

main=b/s/s
files=$(find "$TREE" -type f | wc -l)
echo "## fork: $TREE ($files files, $(du -sh --apparent-size "$TREE" | cut -f1)), $ROUNDS rounds, medians; load average (1, 5, 15 min) beside each figure"

# setup ROOT: a main scope holding the tree, and its snapshot; prints the id.
setup() {
	local root=$1
	"$L" --root "$root" tool workspace_list --scope "$main" >/dev/null
	cp -a "$TREE" "$root/spaces/b/agents/s/sessions/s/main/src"
	chmod -R go-rwx "$root/spaces/b/agents/s/sessions/s/main/src"
	"$L" --root "$root" --json snapshot create --scope "$main" --full >"$work/snap.json"
	field "$work/snap.json" id
}

# forks ROOT SNAP LABEL [FLAGS]: ROUNDS forks into fresh child scopes, each
# binary in turn every round.
forks() {
	local root=$1 snap=$2 label=$3
	shift 3
	local -A wall=() dur=() data=() fill=() rec=() how=()
	local r i s to
	for r in $(seq "$ROUNDS"); do
		for i in "${!bins[@]}"; do
			to="$main/f${label}r${r}b$i/c"
			s=$(now)
			"${bins[$i]}" --root "$root" --json fork --from "$main@$snap" --to "$to" "$@" >"$work/fork.json"
			wall[$i]+="$(since "$s") "
			dur[$i]+="$(field "$work/fork.json" duration_s) "
			data[$i]+="$(field "$work/fork.json" data_s) "
			fill[$i]+="$(field "$work/fork.json" fill_s) "
			rec[$i]+="$(field "$work/fork.json" record_s) "
			how[$i]="$(field "$work/fork.json" clone), $(field "$work/fork.json" files) files"
		done
	done
	local d t f c w
	for i in "${!bins[@]}"; do
		d=$(printf '%s\n' ${dur[$i]} | median)
		t=$(printf '%s\n' ${data[$i]} | median)
		f=$(printf '%s\n' ${fill[$i]} | median)
		c=$(printf '%s\n' ${rec[$i]} | median)
		w=$(printf '%s\n' ${wall[$i]} | median)
		echo "$(name "$i"): fork $label (${how[$i]}): $(ms "$d") in process = file data $(ms "$t") + metadata walk $(ms "$(awk -v a="$f" -v b="$t" 'BEGIN {print a - b}')") + base record $(ms "$c") + syncfs, swap and cleanup $(ms "$(awk -v a="$d" -v b="$f" -v c="$c" 'BEGIN {print a - b - c}')"); $(ms "$w") as a command; load $(load)"
	done
}

snap_ext4=$(setup "$work/ext4")
forks "$work/ext4" "$snap_ext4" ext4-copy
snap_ext4loop=$(setup "$ext4loop/root")
forks "$ext4loop/root" "$snap_ext4loop" ext4-loop-copy
snap_xfs=$(setup "$xfs/root")
forks "$xfs/root" "$snap_xfs" xfs-reflink
forks "$xfs/root" "$snap_xfs" xfs-copy --no-clone

# Merge: 20 files changed in a fresh fork, 5 of them in main too.
echo "## merge: 20 changed files into the $files-file scope, $ROUNDS rounds, medians"
root="$work/ext4"
mapfile -t changed < <(cd "$root/spaces/b/agents/s/sessions/s/main" && find src/net/http -maxdepth 1 -name '*.go' | sort | head -20)
scopedir() { echo "$root/spaces/b/agents/s/sessions/s/$1"; }
for conflicts in 0 5; do
	declare -A wall=() dur=() dry=() scan=() got=()
	for r in $(seq "$ROUNDS"); do
		for i in "${!bins[@]}"; do
			B=${bins[$i]}
			child="$main/m${conflicts}r${r}b$i/c"
			"$B" --root "$root" --json fork --from "$main" --to "$child" >/dev/null
			for f in "${changed[@]}"; do
				echo "// changed in the fork $r" >>"$(scopedir "runs/m${conflicts}r${r}b$i/children/c")/$f"
			done
			# Main's changes go through loomfs, so its next snapshot sees them;
			# the fork's are made behind its back, which a merge sees by fstat.
			for f in "${changed[@]:0:$conflicts}"; do
				python3 -c 'import json,sys; print(json.dumps({"path": sys.argv[1], "content": open(sys.argv[2]).read() + sys.argv[3] + "\n"}))' \
					"$f" "$(scopedir main)/$f" "// changed in main $r $i" | "$B" --root "$root" tool workspace_write --scope "$main" --input - >/dev/null
			done
			s=$(now)
			"$B" --root "$root" --json merge --from "$child" --into "$main" --dry-run >"$work/dry.json"
			dry[$i]+="$(since "$s") "
			s=$(now)
			"$B" --root "$root" --json merge --from "$child" --into "$main" --partial >"$work/merge.json" 2>/dev/null || true
			wall[$i]+="$(since "$s") "
			dur[$i]+="$(field "$work/merge.json" duration_s) "
			scan[$i]+="$(field "$work/merge.json" scan_s) "
			got[$i]="$(field "$work/merge.json" applied) applied, $(field "$work/merge.json" conflicts) conflicts"
		done
	done
	for i in "${!bins[@]}"; do
		echo "$(name "$i"): merge, $conflicts conflicts (${got[$i]}, --partial): $(ms "$(printf '%s\n' ${dur[$i]} | median)") in process (finding the fork's changes $(ms "$(printf '%s\n' ${scan[$i]} | median)")), $(ms "$(printf '%s\n' ${wall[$i]} | median)") as a command; --dry-run $(ms "$(printf '%s\n' ${dry[$i]} | median)") as a command; load $(load)"
	done
done
