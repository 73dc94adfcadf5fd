#!/usr/bin/env bash
# Snapshot section of bench/run.sh ("bash bench/run.sh snapshot"): a full and
# an incremental "loomfs snapshot create" of a 10,000-file, ~80 MB tree, side
# by side with cp -a and rsync -a of the same tree in the same run. Prints
# medians of $ROUNDS rounds: wall time, and bytes written.
#
# loomfs makes what it writes durable (fsync of a few new contents, one
# syncfs for many, fsync of the manifest); cp and rsync sync nothing, so
# "cp -a + sync" is shown too. The page cache is warm for every tool.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-10000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/loomfs" ./cmd/loomfs
go build -o "$work/gentree" ./bench/gentree
command -v rsync >/dev/null || { echo "rsync not installed (scripts/setup installs it)"; exit 1; }

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN {printf "%.4f", e - s}'; }
bytes_of() { du -sb --apparent-size "$1" 2>/dev/null | cut -f1; }

root="$work/root"
L=("$work/loomfs" --root "$root" --json)
"${L[@]}" tool workspace_list --scope b/s/s >/dev/null
dir="$root/spaces/b/agents/s/sessions/s/main"
snaps="$root/.agentloom-snapshots"
"$work/gentree" -dir "$dir/tree" -files "$FILES" -size 8192
echo "## snapshot: $FILES files, $(($(bytes_of "$dir/tree") / 1000000)) MB; loomfs snapshot vs cp -a vs rsync -a, $ROUNDS rounds, medians"
cat "$dir"/tree/*/*/* >/dev/null
sync

# new_bytes FILE: the new_bytes of a manifest printed by "snapshot create --json".
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# Full copies.
snap_t=(); snap_in=(); cp_t=(); cpsync_t=(); rs_t=()
for _ in $(seq "$ROUNDS"); do
	rm -rf "$snaps"; sync
	s=$(now); "${L[@]}" snapshot create --scope b/s/s >"$work/m.json"; snap_t+=("$(since "$s")")
	snap_in+=("$(field "$work/m.json" duration_s)")
	full_new=$(field "$work/m.json" new_bytes)
	sync
	s=$(now); cp -a "$dir/tree" "$work/cp"; cp_t+=("$(since "$s")")
	rm -rf "$work/cp"; sync
	s=$(now); cp -a "$dir/tree" "$work/cp"; sync; cpsync_t+=("$(since "$s")")
	rm -rf "$work/cp"; sync
	s=$(now); rsync -a "$dir/tree/" "$work/rs/"; rs_t+=("$(since "$s")")
	rm -rf "$work/rs"; sync
done
printf 'full copy       loomfs snapshot %.3fs (in process %.3fs, %d bytes stored)  cp -a %.3fs  cp -a + sync %.3fs  rsync -a %.3fs\n' \
	"$(printf '%s\n' "${snap_t[@]}" | median)" "$(printf '%s\n' "${snap_in[@]}" | median)" "$full_new" \
	"$(printf '%s\n' "${cp_t[@]}" | median)" "$(printf '%s\n' "${cpsync_t[@]}" | median)" "$(printf '%s\n' "${rs_t[@]}" | median)"

# Incremental: 10 files change between rounds, through loomfs (the tool
# door, as an agent changes them, so the change journal records them);
# loomfs snapshots the tree again, rsync -a brings an existing copy up to
# date from the same files.
rm -rf "$snaps"
"${L[@]}" snapshot create --scope b/s/s >/dev/null
rsync -a "$dir/tree/" "$work/rs/"
sync
inc_t=(); inc_in=(); inc_new=(); inc_disk=(); inc_read=(); rsi_t=(); rsi_b=(); changed_b=()
for r in $(seq "$ROUNDS"); do
	n=0
	for i in $(seq 0 997 $((FILES - 1))); do
		[ "$n" -lt 10 ] || break
		rel=$(printf 'tree/d%03d/e%02d/f%05d.txt' $((i % 100)) $(((i / 100) % 10)) "$i")
		python3 -c 'import json,sys; print(json.dumps({"path": sys.argv[1], "content": open(sys.argv[2]).read() + sys.argv[3]}))' \
			"$rel" "$dir/$rel" "$(printf 'round %d change %d' "$r" "$n")" | "${L[@]}" tool workspace_write --scope b/s/s --input - >/dev/null
		n=$((n + 1))
	done
	changed=0
	for i in $(seq 0 997 $((FILES - 1)) | head -10); do
		f=$(printf '%s/tree/d%03d/e%02d/f%05d.txt' "$dir" $((i % 100)) $(((i / 100) % 10)) "$i")
		changed=$((changed + $(stat -c %s "$f")))
	done
	changed_b+=("$changed")
	sync
	before=$(bytes_of "$snaps")
	s=$(now); "${L[@]}" snapshot create --scope b/s/s >"$work/m.json"; inc_t+=("$(since "$s")")
	inc_disk+=($(($(bytes_of "$snaps") - before)))
	inc_in+=("$(field "$work/m.json" duration_s)")
	inc_new+=("$(field "$work/m.json" new_bytes)")
	inc_read+=("$(field "$work/m.json" hashed)")
	inc_walk="walk: $(field "$work/m.json" walk)"
	sync
	s=$(now); rsync -a --stats "$dir/tree/" "$work/rs/" >"$work/rs.txt"; rsi_t+=("$(since "$s")")
	rsi_b+=("$(awk -F': ' '/^Literal data/ {gsub(/[^0-9]/, "", $2); print $2}' "$work/rs.txt")")
done
it=$(printf '%s\n' "${inc_t[@]}" | median); rt=$(printf '%s\n' "${rsi_t[@]}" | median)
printf 'after 10 changes loomfs snapshot %.3fs (in process %.3fs; %s; read %d files; wrote %d content bytes = the 10 files'"'"' %d; snapshot dir grew %d bytes with manifest and index)  rsync -a into the copy %.3fs (%d bytes of data)  rsync/loomfs %.1fx\n' \
	"$it" "$(printf '%s\n' "${inc_in[@]}" | median)" "$inc_walk" "$(printf '%s\n' "${inc_read[@]}" | median)" \
	"$(printf '%s\n' "${inc_new[@]}" | median)" "$(printf '%s\n' "${changed_b[@]}" | median)" "$(printf '%s\n' "${inc_disk[@]}" | median)" \
	"$rt" "$(printf '%s\n' "${rsi_b[@]}" | median)" "$(awk -v a="$rt" -v b="$it" 'BEGIN {print a / b}')"
