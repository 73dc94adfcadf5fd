package nodeid

import (
	"os"
	"testing"
)

func TestName(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ env, want string }{
		{"", host},
		{"worker-7", "worker-7"},
	} {
		t.Setenv(Env, tc.env)
		got, err := Name()
		if err != nil || got != tc.want {
			t.Errorf("%s=%q: Name() = %q, %v; want %q", Env, tc.env, got, err, tc.want)
		}
	}
}
