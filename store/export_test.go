package store

import "testing"

// UseNoFollowWalk makes the calling test resolve paths the way a kernel
// without openat2 does (one O_NOFOLLOW component at a time), so that both
// resolvers run the same cases. The test must not run in parallel.
func UseNoFollowWalk(t testing.TB) {
	old := noOpenat2.Load()
	noOpenat2.Store(true)
	t.Cleanup(func() { noOpenat2.Store(old) })
}
