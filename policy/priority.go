package policy

import (
	"fmt"
	"strconv"
	"strings"
)

// Priority is a task's class (seed 001 §5.3): it picks a scope's limits
// (limits_by_priority), the order gc reclaims sessions in (low first), and
// the volume watermark below which a scope may no longer grow.
type Priority string

const (
	PriorityLow    Priority = "low"
	PriorityNormal Priority = "normal"
	PriorityHigh   Priority = "high"
)

// Priorities lists the classes from the lowest.
var Priorities = []Priority{PriorityLow, PriorityNormal, PriorityHigh}

// ParsePriority reads a class name; "" is normal.
func ParsePriority(s string) (Priority, error) {
	switch p := Priority(s); p {
	case "":
		return PriorityNormal, nil
	case PriorityLow, PriorityNormal, PriorityHigh:
		return p, nil
	}
	return "", Errorf(InvalidInput, "priority %q is not one of low, normal, high", s)
}

// Rank orders classes: low 0, normal 1, high 2 ("" is normal).
func (p Priority) Rank() int {
	switch p {
	case PriorityLow:
		return 0
	case PriorityHigh:
		return 2
	}
	return 1
}

// Or returns p, or def when p is "".
func (p Priority) Or(def Priority) Priority {
	if p == "" {
		return def
	}
	return p
}

// Watermark is free room a volume keeps: Bytes, or Percent of the
// filesystem's size when Percent is set. The zero value keeps nothing.
type Watermark struct {
	Bytes   int64
	Percent float64
}

// Of returns the watermark in bytes of a filesystem of total bytes.
func (w Watermark) Of(total int64) int64 {
	if w.Percent > 0 {
		return int64(float64(total) * w.Percent / 100)
	}
	return w.Bytes
}

// IsZero reports whether w keeps nothing.
func (w Watermark) IsZero() bool { return w.Bytes == 0 && w.Percent == 0 }

func (w Watermark) String() string {
	switch {
	case w.Percent > 0:
		return strconv.FormatFloat(w.Percent, 'f', -1, 64) + "%"
	case w.Bytes > 0:
		return Bytes(w.Bytes)
	}
	return "none"
}

// ParseWatermark reads "10%", "2 GiB" or a number of bytes.
func ParseWatermark(s string) (Watermark, error) {
	if num, ok := strings.CutSuffix(strings.TrimSpace(s), "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || v <= 0 || v >= 100 {
			return Watermark{}, fmt.Errorf("%q is not a percentage above 0 and below 100", s)
		}
		return Watermark{Percent: v}, nil
	}
	v, err := ParseBytes(s)
	if err != nil {
		return Watermark{}, err
	}
	return Watermark{Bytes: v}, nil
}

// Class returns the policy's priority class ("" is normal).
func (p *Policy) Class() Priority { return p.Priority.Or(PriorityNormal) }

// ForPriority returns a copy of p for a scope of class c ("" keeps p's
// class): its limits are the class's (limits_by_priority) and its volume
// watermark the class's. Applying it twice is applying it once.
func (p *Policy) ForPriority(c Priority) *Policy {
	q := *p
	q.Priority = c.Or(p.Class())
	if l, ok := p.LimitsByPriority[q.Priority]; ok {
		q.Limits = l
	}
	return &q
}

// VolumeWatermark returns the free room the volume keeps from a scope of
// this policy's class: reserve_low for low, reserve_normal for normal,
// nothing for high, which may use the volume to its end.
func (p *Policy) VolumeWatermark() Watermark {
	switch p.Class() {
	case PriorityLow:
		return p.VolumeReserveLow
	case PriorityNormal:
		return p.VolumeReserveNormal
	}
	return Watermark{}
}

// WatchesVolume reports whether the policy sets a volume watermark, so
// that growth of every class, high included, must be counted against the
// volume's free space.
func (p *Policy) WatchesVolume() bool {
	return !p.VolumeReserveLow.IsZero() || !p.VolumeReserveNormal.IsZero()
}

// CheckVolume decides whether a scope of this policy's class may grow by
// addBytes and addFiles on a volume with free of total bytes left: below
// the class's watermark, growth is refused (VolumeReserved) while higher
// classes go on. A change that does not grow (a read, a delete, a
// truncation) is never refused.
func (p *Policy) CheckVolume(free, total, addBytes, addFiles int64) error {
	w := p.VolumeWatermark()
	if w.IsZero() || (addBytes <= 0 && addFiles <= 0) {
		return nil
	}
	keep := w.Of(total)
	if addBytes < 0 {
		addBytes = 0
	}
	if free-addBytes >= keep {
		return nil
	}
	if free < 0 {
		free = 0
	}
	return Errorf(VolumeReserved, "the volume keeps its last %s for higher-priority work, and %s is free, so this %s-priority workspace can't grow now (a change of %s refused); reads, deletes and truncations still work: delete files this workspace no longer needs, or wait until space is freed; retrying at once will be refused again",
		Bytes(keep), Bytes(free), p.Class(), Bytes(addBytes))
}
