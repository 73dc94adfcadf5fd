package faults

import (
	"slices"
	"testing"
)

// TestPoints: the full matrix faults every call site, or a spread sample
// of them from the first to the last; the CI slice its few.
func TestPoints(t *testing.T) {
	defer func(f bool) { full = f }(full)
	for _, tc := range []struct {
		name       string
		full, kill bool
		n, sample  int
		want       []int
	}{
		{"full, every site", true, false, 4, 0, []int{1, 2, 3, 4}},
		{"full, sampled", true, false, 636, 4, []int{1, 212, 424, 636}},
		{"full, fewer sites than the sample", true, false, 3, 12, []int{1, 2, 3}},
		{"slice, errno: first and last", false, false, 13, 0, []int{1, 13}},
		{"slice, errno: one site", false, false, 1, 0, []int{1}},
		{"slice, kill: the middle", false, true, 13, 0, []int{7}},
		{"no calls", true, false, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full = tc.full
			if got := points(tc.n, tc.kill, tc.sample); !slices.Equal(got, tc.want) {
				t.Errorf("points(%d, %v, %d) = %v, want %v", tc.n, tc.kill, tc.sample, got, tc.want)
			}
		})
	}
}
