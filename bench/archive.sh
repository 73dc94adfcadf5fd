#!/usr/bin/env bash
# The S3 object store (issue 46), on the S3 service the environment names
# (AGENT_LOOM_S3_*, credentials from the AWS SDK's chain): Go's src tree
# (about 11,500 files, 127 MB) put into a fresh scope with "loomfs stage"
# and snapshotted, then, side by side in the same round:
#   - "loomfs snapshot archive" the first time, and again after 10 files
#     changed (through "loomfs stage", so the journal sees them) and a new
#     snapshot: wall time and bytes sent (from the command's --json);
#   - an "aws s3 sync"-style whole-file upload of the same tree with
#     rclone (a flat listing, size and mtime against the upload time, 8
#     transfers as loomfs has 8 uploaders): first full, then the changed
#     files only; bytes from rclone's own stats;
#   - "loomfs snapshot restore --from-archive" into a fresh root, again on
#     that root with every content already there (what the restore costs
#     besides the downloads), and "rclone copy" of the tree back, each
#     checked with diff -r;
#   - a run's output/ of 100 new files of 16 KiB: "runs finish" against
#     "runs finish --publish" on two runs alike, in alternating order.
# Prints medians of $ROUNDS rounds and the load average before, during and
# after: the figures are only as quiet as the machine.
#
# Each round writes under its own prefix of the bucket and deletes it at
# the round's end (the test RGW keeps objects in 1 GiB of memory).
#
# Usage, as root:
#   bash scripts/rgw up && eval "$(bash scripts/rgw env)"
#   ROUNDS=3 bash bench/archive.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
: "${AGENT_LOOM_S3_ENDPOINT:?no S3 service: bash scripts/rgw up && eval \"\$(bash scripts/rgw env)\"}"
: "${AGENT_LOOM_S3_BUCKET:?AGENT_LOOM_S3_BUCKET is not set (scripts/rgw env prints it)}"
command -v rclone >/dev/null || { echo "rclone not installed (apt-get install -y rclone)" >&2; exit 1; }
src="$(go env GOROOT)/src"
work=$(mktemp -d /var/tmp/loomfs-archive-bench.XXXXXX)
base="bench-archive-$$"
# rclone with no configuration file: an S3 remote on the command line,
# path-style addressing, keys from the environment. Its S3 client can't
# take a custom CA bundle; a plain-http endpoint needs none.
export RCLONE_CONFIG=/dev/null
remote=":s3,provider=Ceph,env_auth=true,force_path_style=true,endpoint='$AGENT_LOOM_S3_ENDPOINT':$AGENT_LOOM_S3_BUCKET"
rc() {
	if [[ $AGENT_LOOM_S3_ENDPOINT == http://* ]]; then
		env -u AWS_CA_BUNDLE rclone "$@"
	else
		rclone "$@"
	fi
}
cleanup() {
	rc purge --fast-list --checkers 16 "$remote/$base" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/loomfs" ./cmd/loomfs

now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN {printf "%.3f", e - s}'; }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
# field FILE KEY...: a value of the JSON in FILE, KEYs walking down.
field() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))
for k in sys.argv[2:]: v=v[k]
print(v)' "$@"; }
# synced LOG: the bytes rclone sent or fetched, from its final stats.
synced() { python3 -c 'import json,sys
print([json.loads(l)["stats"] for l in open(sys.argv[1]) if "\"stats\"" in l][-1]["bytes"])' "$1"; }
sync_flags=(--fast-list --transfers 8 --checkers 8 --update --use-server-modtime --use-json-log --stats 1h --stats-log-level NOTICE)

echo "## S3 archive: Go's src ($(find "$src" -type f | wc -l) files, $(($(find "$src" -type f -printf '%s\n' | awk '{n += $1} END {print n}') / 1000000)) MB) on $AGENT_LOOM_S3_ENDPOINT; $ROUNDS rounds, medians"
echo "load before: $(load) ($(nproc) CPUs)"
a1_t=(); a1_b=(); a1_n=(); s1_t=(); s1_b=(); s1_n=()
a2_t=(); a2_b=(); a2_n=(); s2_t=(); s2_b=(); s2_n=(); chg_b=()
r_t=(); r2_t=(); c_t=(); c_b=()
fin_t=(); pub_t=(); pub_b=(); loads=()
for r in $(seq "$ROUNDS"); do
	loads+=("$(cut -d' ' -f1 /proc/loadavg)")
	root="$work/r$r" fresh="$work/f$r" scope="b/bench/s$r"
	L=("$work/loomfs" --root "$root" --json)
	export AGENT_LOOM_S3_PREFIX="$base/r$r/loomfs/"
	sdest="$remote/$base/r$r/rclone/src"
	"${L[@]}" stage --scope "$scope" --into src "$src" >/dev/null
	dir="$root/spaces/b/agents/bench/sessions/s$r/main"
	"${L[@]}" snapshot create --scope "$scope" >/dev/null
	sync

	# First archive against the first full upload.
	s=$(now); "${L[@]}" snapshot archive --scope "$scope" >"$work/a.json"; a1_t+=("$(since "$s")")
	a1_b+=("$(field "$work/a.json" sent bytes)"); a1_n+=("$(field "$work/a.json" sent blobs)")
	s=$(now); rc sync "${sync_flags[@]}" "$dir/src/" "$sdest" 2>"$work/s.log"; s1_t+=("$(since "$s")")
	s1_b+=("$(synced "$work/s.log")"); s1_n+=("$(field <(grep '"stats"' "$work/s.log" | tail -1) stats transfers)")

	# 10 files change, spread over the tree; a new snapshot.
	mkdir -p "$work/chg$r"
	changed=0
	while read -r rel; do
		f="$work/chg$r/$(basename "$rel")"
		cp "$dir/$rel" "$f"
		printf '// changed in round %d\n' "$r" >>"$f"
		"${L[@]}" stage --scope "$scope" --into "$(dirname "$rel")" "$f" >/dev/null
		changed=$((changed + $(stat -c %s "$f")))
	done < <(cd "$dir" && find src -type f | sort | awk 'NR % 1000 == 500' | head -10)
	chg_b+=("$changed")
	"${L[@]}" snapshot create --scope "$scope" >/dev/null
	sync

	# Second archive against the second sync.
	s=$(now); "${L[@]}" snapshot archive --scope "$scope" >"$work/a.json"; a2_t+=("$(since "$s")")
	a2_b+=("$(field "$work/a.json" sent bytes)"); a2_n+=("$(field "$work/a.json" sent blobs)")
	s=$(now); rc sync "${sync_flags[@]}" "$dir/src/" "$sdest" 2>"$work/s.log"; s2_t+=("$(since "$s")")
	s2_b+=("$(synced "$work/s.log")"); s2_n+=("$(field <(grep '"stats"' "$work/s.log" | tail -1) stats transfers)")

	# Restore into a fresh root, again there (every content present), and
	# rclone's copy back; each must equal the tree.
	s=$(now); "$work/loomfs" --root "$fresh" snapshot restore --scope "$scope" --from-archive >/dev/null; r_t+=("$(since "$s")")
	diff -r "$dir" "$fresh/spaces/b/agents/bench/sessions/s$r/main" >/dev/null || { echo "round $r: the restored scope differs from the snapshot" >&2; exit 1; }
	s=$(now); "$work/loomfs" --root "$fresh" snapshot restore --scope "$scope" --from-archive >/dev/null; r2_t+=("$(since "$s")")
	s=$(now); rc copy "${sync_flags[@]}" "$sdest" "$work/copy$r" 2>"$work/c.log"; c_t+=("$(since "$s")")
	c_b+=("$(synced "$work/c.log")")
	diff -r "$dir/src" "$work/copy$r" >/dev/null || { echo "round $r: rclone's copy differs from the tree" >&2; exit 1; }
	rm -rf "$fresh" "$work/copy$r"

	# Publishing: two runs with 100 new files of 16 KiB each in output/,
	# one finished plainly and one with --publish, the first of them
	# alternating between rounds.
	export AGENT_LOOM_S3_PREFIX="$base/r$r/publish/"
	for kind in plain publish; do
		"${L[@]}" runs create --scope "b/bench/$kind$r" --run "$kind$r" --user bench >/dev/null
		mkdir -p "$work/out-$kind$r"
		for i in $(seq -w 0 99); do head -c 16384 /dev/urandom >"$work/out-$kind$r/f$i.bin"; done
		"${L[@]}" stage --scope "run:$kind$r" --into output "$work/out-$kind$r" >/dev/null
	done
	sync
	order=(plain publish)
	[ $((r % 2)) -eq 1 ] || order=(publish plain)
	for kind in "${order[@]}"; do
		if [ "$kind" = plain ]; then
			s=$(now); "${L[@]}" runs finish --run "$kind$r" >/dev/null; fin_t+=("$(since "$s")")
		else
			s=$(now); "${L[@]}" runs finish --run "$kind$r" --publish >"$work/p.json"; pub_t+=("$(since "$s")")
			pub_b+=("$(field "$work/p.json" published sent bytes)")
		fi
	done

	rc purge --fast-list --checkers 16 "$remote/$base/r$r"
	rm -rf "$root" "$work/chg$r" "$work"/out-*
done

A1=$(median "${a1_t[@]}") S1=$(median "${s1_t[@]}") A2=$(median "${a2_t[@]}") S2=$(median "${s2_t[@]}")
R1=$(median "${r_t[@]}") R2=$(median "${r2_t[@]}") C1=$(median "${c_t[@]}")
F=$(median "${fin_t[@]}") P=$(median "${pub_t[@]}")
printf '%-36s %10s %16s %20s %18s\n' "" "loomfs" "(contents, bytes)" "rclone sync-style" "(files, bytes)"
printf '%-36s %9.2fs %16s %19.2fs %18s   rclone/loomfs %s\n' "first upload" "$A1" "($(median "${a1_n[@]}"), $(median "${a1_b[@]}"))" "$S1" "($(median "${s1_n[@]}"), $(median "${s1_b[@]}"))" "$(ratio "$S1" "$A1")"
printf '%-36s %9.2fs %16s %19.2fs %18s   rclone/loomfs %s\n' "after 10 changed files ($(median "${chg_b[@]}") B)" "$A2" "($(median "${a2_n[@]}"), $(median "${a2_b[@]}"))" "$S2" "($(median "${s2_n[@]}"), $(median "${s2_b[@]}"))" "$(ratio "$S2" "$A2")"
printf '%-36s %9.2fs %16s %19.2fs %18s   rclone/loomfs %s\n' "restore into a fresh root" "$R1" "" "$C1" "(-, $(median "${c_b[@]}"))" "$(ratio "$C1" "$R1")"
printf '%-36s %9.2fs\n' "restore again, contents there" "$R2"
printf 'publish 100 files of 16 KiB: runs finish %.2fs, runs finish --publish %.2fs (%s bytes sent): +%.2fs\n' \
	"$F" "$P" "$(median "${pub_b[@]}")" "$(awk -v a="$P" -v b="$F" 'BEGIN {print a - b}')"
echo "raw: first archive ${a1_t[*]}; first sync ${s1_t[*]}; second archive ${a2_t[*]}; second sync ${s2_t[*]}; restore ${r_t[*]}; again ${r2_t[*]}; copy ${c_t[*]}; finish ${fin_t[*]}; finish --publish ${pub_t[*]}"
echo "load at each round's start: ${loads[*]}; after: $(load)"
