package quota_test

import (
	"context"
	"testing"

	"github.com/agentloom/loomfs/quota"
)

// BenchmarkReserve is what the account adds to a write(2) through the
// mount: a 128 KiB piece, taken from the grant, with a refill now and then.
func BenchmarkReserve(b *testing.B) {
	a, err := quota.Open(openDir(b, b.TempDir()), quota.Options{Limits: limits(1<<50, 0), Walk: (&scope{}).walk})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	for b.Loop() {
		if err := a.Reserve(context.Background(), 128<<10, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateDelete is what it adds to a create and a delete.
func BenchmarkCreateDelete(b *testing.B) {
	a, err := quota.Open(openDir(b, b.TempDir()), quota.Options{Limits: limits(5<<30, 100000), Walk: (&scope{}).walk})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	for b.Loop() {
		if err := a.Reserve(context.Background(), 0, 1); err != nil {
			b.Fatal(err)
		}
		a.Adjust(-2, -1)
	}
}
