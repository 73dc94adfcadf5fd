#!/usr/bin/env bash
# Peak memory of workspace_read_image over issue 43's hostile images
# (tools.hostileImages): the high-water mark (VmHWM) of one process
# reading them one at a time and by four callers at once (the tools
# test's child process), then each read alone as a whole `loomfs tool`
# process (maximum resident set size from /usr/bin/time -v). It measures
# commit REV (default HEAD) in a worktree of its own; BASE=<commit> adds
# the per-image figures of loomfs built at that commit.
# Usage: bash bench/image-memory.sh   (REV, BASE from the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
cleanup() {
	git worktree remove --force "$work/rev" 2>/dev/null || true
	[ -z "${BASE:-}" ] || git worktree remove --force "$work/base" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach "$work/rev" "${REV:-HEAD}" >/dev/null 2>&1
(cd "$work/rev" && go test -c -o "$work/tools.test" ./tools/ && go build -o "$work/loomfs" ./cmd/loomfs)
bins=("$work/loomfs")
if [ -n "${BASE:-}" ]; then
	git worktree add --detach "$work/base" "$BASE" >/dev/null 2>&1
	(cd "$work/base" && go build -o "$work/loomfs-base" ./cmd/loomfs)
	bins+=("$work/loomfs-base")
fi

echo "## one process, VmHWM from when the images are in place ($(git rev-parse --short "${REV:-HEAD}"))"
(cd "$work/rev/tools" && "$work/tools.test" -test.count=1 -test.run '^TestReadImageMemory$' -test.v) |
	grep -E 'VmHWM|^(ok|PASS|FAIL|---)'

root="$work/root"
scope=bench/images/one
"$work/loomfs" --root "$root" tool workspace_list --scope "$scope" --input '{}' >/dev/null
dir="$root/spaces/bench/agents/images/sessions/one/main"
LOOMFS_IMAGE_MEMORY=dump LOOMFS_IMAGE_DIR="$dir" "$work/tools.test" -test.count=1 \
	-test.run '^TestReadImageMemoryChild$' | sed -n 's/^image //p' >"$work/names"

echo
echo "## each read alone as a loomfs tool process"
echo "| image | file | binary | answer | max RSS | wall |"
echo "|---|---|---|---|---|---|"
while IFS=: read -r file name; do
	name=${name# }
	for bin in "${bins[@]}"; do
		/usr/bin/time -v -o "$work/time" "$bin" --root "$root" tool workspace_read_image --scope "$scope" \
			--input "{\"path\":\"$file\"}" >"$work/out" 2>/dev/null || true
		answer=$(grep -o '"code":"[a-z_]*"' "$work/out" || grep -o '"width":[0-9]*,"height":[0-9]*' "$work/out" || echo '?')
		rss=$(awk '/Maximum resident set size/ {printf "%.1f MiB", $6/1024}' "$work/time")
		wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$work/time")
		echo "| $name | $(numfmt --to=iec --suffix=B "$(stat -c %s "$dir/$file")") | $(basename "$bin") | $answer | $rss | $wall |"
	done
done <"$work/names"
