package policy

import (
	"strings"
	"testing"
	"time"
)

const priorityFile = `version: 1
limits:
  scope_bytes: 5 GiB
priority: low
limits_by_priority:
  high:
    scope_bytes: 20 GiB
  low:
    scope_bytes: 1 GiB
    scope_files: 1000
volume_reserve_low: 10%
volume_reserve_normal: 2 GiB
hooks:
  before:
    - tools: [workspace_write, workspace_apply_patch]
      command: [/usr/local/bin/check, --strict]
      timeout: 2s
      rewrite: true
  after:
    - command: [sh, -c, "cat >/dev/null"]
`

func TestPolicyFilePriorityAndHooks(t *testing.T) {
	pol, err := Parse("p.yaml", []byte(priorityFile))
	if err != nil {
		t.Fatal(err)
	}
	if pol.Class() != PriorityLow {
		t.Errorf("class %q, want low", pol.Class())
	}
	for c, want := range map[Priority]int64{PriorityLow: 1 << 30, PriorityNormal: 5 << 30, PriorityHigh: 20 << 30} {
		if got := pol.ForPriority(c).Limits.ScopeBytes; got != want {
			t.Errorf("%s: scope_bytes %d, want %d", c, got, want)
		}
	}
	if got := pol.ForPriority("").Limits.ScopeFiles; got != 1000 {
		t.Errorf("the default class's scope_files %d, want low's 1000", got)
	}
	if got := pol.ForPriority(PriorityHigh).ForPriority(PriorityNormal).Limits.ScopeBytes; got != 5<<30 {
		t.Errorf("ForPriority twice: scope_bytes %d, want normal's", got)
	}
	if pol.VolumeReserveLow != (Watermark{Percent: 10}) || pol.VolumeReserveNormal != (Watermark{Bytes: 2 << 30}) {
		t.Errorf("watermarks %+v %+v", pol.VolumeReserveLow, pol.VolumeReserveNormal)
	}
	b := pol.Hooks.Before
	if len(b) != 1 || len(pol.Hooks.After) != 1 || !b[0].Rewrite || b[0].Timeout != 2*time.Second ||
		strings.Join(b[0].Tools, ",") != "workspace_write,workspace_apply_patch" || b[0].Command[0] != "/usr/local/bin/check" {
		t.Errorf("hooks %+v", pol.Hooks)
	}
	if a := pol.Hooks.After[0]; a.Timeout != DefaultHookTimeout || a.Tools != nil {
		t.Errorf("after hook %+v: want the default timeout, every tool", a)
	}
}

func TestPolicyFilePriorityRefused(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"unknown class", "priority: urgent\n", `priority "urgent"`},
		{"unknown class in limits_by_priority", "limits_by_priority:\n  urgent:\n    scope_bytes: 1 GiB\n", `unknown key "urgent"`},
		{"unknown limit of a class", "limits_by_priority:\n  low:\n    scope_byte: 1 GiB\n", `unknown key "scope_byte"`},
		{"percent over 100", "volume_reserve_low: 120%\n", "volume_reserve_low"},
		{"low reserve under normal's", "volume_reserve_low: 1 GiB\nvolume_reserve_normal: 2 GiB\n", "low-priority work must stop first"},
		{"hook without command", "hooks:\n  before:\n    - tools: [workspace_write]\n", "needs a command"},
		{"after hook can't rewrite", "hooks:\n  after:\n    - command: [x]\n      rewrite: true\n", `unknown key "rewrite"`},
		{"hooks not a list", "hooks:\n  before: x\n", "must be a list"},
		{"unknown hook event", "hooks:\n  during: []\n", `unknown key "during"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestCheckVolume(t *testing.T) {
	const gib = 1 << 30
	pol := Default()
	pol.VolumeReserveLow = Watermark{Percent: 20} // 2 GiB of 10
	pol.VolumeReserveNormal = Watermark{Bytes: 1 * gib}
	for _, tc := range []struct {
		name  string
		class Priority
		free  int64
		add   int64
		files int64
		code  Code
	}{
		{"low above its watermark grows", PriorityLow, 3 * gib, 1 << 20, 0, ""},
		{"low below its watermark is refused", PriorityLow, 2*gib - 1, 1, 0, VolumeReserved},
		{"low growth that would cross it is refused", PriorityLow, 2*gib + 10, 20, 0, VolumeReserved},
		{"low shrinking is not refused", PriorityLow, 0, -5, -1, ""},
		{"a new directory below the watermark is refused", PriorityLow, 0, 0, 1, VolumeReserved},
		{"normal goes on below low's watermark", PriorityNormal, 2*gib - 1, 1 << 20, 0, ""},
		{"normal below its own is refused", PriorityNormal, gib - 1, 1, 0, VolumeReserved},
		{"high goes on below normal's", PriorityHigh, 1, 1 << 20, 0, ""},
		{"the default class is normal", "", gib - 1, 1, 0, VolumeReserved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := pol.ForPriority(tc.class).CheckVolume(tc.free, 10*gib, tc.add, tc.files)
			if CodeOf(err) != tc.code {
				t.Fatalf("got %v, want code %q", err, tc.code)
			}
			if err == nil {
				return
			}
			msg := err.Error()
			for _, want := range []string{"higher-priority work", "delete files", "wait"} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q lacks %q", msg, want)
				}
			}
			if Errno(err).Error() != "no space left on device" {
				t.Errorf("errno %v, want ENOSPC", Errno(err))
			}
		})
	}
	if err := Default().CheckVolume(0, 10*gib, 1<<20, 1); err != nil {
		t.Errorf("a policy without watermarks refused: %v", err)
	}
}

// The workspace README and the tool descriptions (QuotaSummary) say how
// near full the volume may get before a workspace of the class can't grow.
func TestQuotaSummaryNamesTheWatermark(t *testing.T) {
	pol, err := Parse("p.yaml", []byte("volume_reserve_low: 10%\nvolume_reserve_normal: 2 GiB\n"))
	if err != nil {
		t.Fatal(err)
	}
	for c, want := range map[Priority]string{
		PriorityLow:    "low priority: while the shared volume has less than 10% free it can't grow (volume_reserved",
		PriorityNormal: "normal priority: while the shared volume has less than 2 GiB free",
		PriorityHigh:   "",
	} {
		got := QuotaSummary(pol.ForPriority(c))
		if want == "" && strings.Contains(got, "priority") || !strings.Contains(got, want) {
			t.Errorf("%s: %q lacks %q", c, got, want)
		}
	}
	if strings.Contains(WorkspaceReadme(Default()), "priority") {
		t.Error("a policy without watermarks speaks of priority")
	}
}
