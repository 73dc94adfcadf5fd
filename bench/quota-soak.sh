#!/usr/bin/env bash
# Quota soak (issue 23): Debian's stress-ng in a loomfs mount under a scope
# quota for DURATION seconds (default 600) with the file stressors that
# change sizes and names (--hdd --iomix --fallocate --seek --dir --dentry
# --rename --lockf --flock). Afterwards the scope's quota account must equal
# a walk of the scope (loomfs check --scope), and the daemon's RSS and open
# fds must be back near where they started. Prints the figures; exits 1 if
# the account and the walk differ. Run as root: bash bench/quota-soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-600}
QUOTA=${QUOTA:-4GiB}
SAMPLE=${SAMPLE:-60}
# RECONCILE is the mount's --reconcile: often, so the soak puts the
# reconcile beside the stressors many times.
RECONCILE=${RECONCILE:-30s}
BENCH_TMP=${BENCH_TMP:-/var/tmp}
command -v stress-ng >/dev/null || { echo "stress-ng missing: run scripts/setup" >&2; exit 1; }

daemon_pid="" work="" mnt=""
cleanup() {
	[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
	[ -n "$mnt" ] && mountpoint -q "$mnt" 2>/dev/null && umount -l "$mnt" || true
	[ -n "$work" ] && rm -rf "$work"
	true
}
trap cleanup EXIT
work=$(mktemp -d "$BENCH_TMP"/loomfs-soak.XXXXXX)
chmod 700 "$work"
mnt=$work/mnt
mkdir -p "$mnt"
go build -o "$work/loomfs" ./cmd/loomfs
root=$work/root
SCOPE=soak/agent/s
printf 'preset: open\nlimits:\n  scope_bytes: %s\n  file_bytes: 2GiB\n' "$QUOTA" >"$work/policy.yaml"
lf() { "$work/loomfs" --root "$root" --policy "$work/policy.yaml" "$@"; }
lf tool workspace_list --scope $SCOPE >/dev/null
"$work/loomfs" --root "$root" --policy "$work/policy.yaml" --log-level warn mount --reconcile "$RECONCILE" --scope $SCOPE "$mnt" 2>"$work/daemon.log" &
daemon_pid=$!
for _ in $(seq 100); do grep -q '^mounted ' "$work/daemon.log" && break; sleep 0.1; done
grep -q '^mounted ' "$work/daemon.log" || { cat "$work/daemon.log" >&2; exit 1; }

rss() { awk '/^VmRSS/ {print $2}' /proc/$daemon_pid/status; }
fds() { ls /proc/$daemon_pid/fd | wc -l; }
echo "start: daemon rss $(rss) KiB, $(fds) fds"
rss0=$(rss) fds0=$(fds)
fdlist() { for f in /proc/$daemon_pid/fd/*; do readlink "$f" | sed "s|$work|WORK|"; done | sort; }
fdlist >"$work/fds.start"

mkdir -p "$mnt/stress"
stress-ng --temp-path "$mnt/stress" --timeout "${DURATION}s" --metrics-brief \
	--hdd 1 --hdd-bytes 256M --iomix 1 --iomix-bytes 128M --fallocate 1 --fallocate-bytes 256M \
	--seek 1 --seek-size 256M --dir 1 --dentry 1 --rename 1 --lockf 1 --flock 1 \
	>"$work/stress.log" 2>&1 &
stress_pid=$!
elapsed=0
while kill -0 $stress_pid 2>/dev/null; do
	sleep "$SAMPLE" || true
	elapsed=$((elapsed + SAMPLE))
	kill -0 $stress_pid 2>/dev/null || break
	echo "t=${elapsed}s: daemon rss $(rss) KiB, $(fds) fds"
done
stress_rc=0
wait $stress_pid || stress_rc=$?
echo "stress-ng exited $stress_rc"
sed -n '/metrc\|stressor\|bogo\|passed\|failed\|skipped/p' "$work/stress.log" | tail -20
rm -rf "$mnt/stress"
sleep 3 # the mount's grant goes back after a second idle
echo "end: daemon rss $(rss) KiB, $(fds) fds (start $rss0 KiB, $fds0 fds)"
fdlist >"$work/fds.end"
echo "fds opened since the start and still open:"; comm -13 "$work/fds.start" "$work/fds.end" | sed 's/^/  /'
grep -q '^Vm' /proc/$daemon_pid/status && grep -E '^(VmHWM|VmRSS)' /proc/$daemon_pid/status
check=$(lf --json check --scope $SCOPE)
echo "$check" | python3 -c 'import json,sys; q=json.load(sys.stdin)["quota"]; print("account", q["account"], "walk", q["walk"], "match", q["match"])'
echo "reconcile corrections logged (every $RECONCILE): $(grep -c 'quota account corrected' "$work/daemon.log" || true)"
grep 'quota account corrected' "$work/daemon.log" | head -5 || true
echo "$check" | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["quota"]["match"] else 1)'
