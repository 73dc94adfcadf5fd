package fusefs

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	snap "github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/tools"
)

const crossSecret = "outside-secret-42"

// bindMount bind-mounts src onto dst (which must exist) and unmounts it in
// t.Cleanup.
func bindMount(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("mount", "--bind", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("mount --bind %s: %v: %s", dst, err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dst, err)
		}
	})
}

// crossEnv mounts a scope holding bound.txt, a file bind-mounted from
// outside the volume on the same filesystem, and bounddir, a directory
// bind-mounted the same way, next to an ordinary file.
func crossEnv(t *testing.T) (*env, string) {
	e := newEnv(t, withOptions(func(o *Options) { o.AllowOther = true }))
	secret := e.outside + "/secret.txt"
	mustWrite(t, secret, crossSecret+"\n")
	if err := os.Chmod(secret, 0o600); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, e.outside+"/dir/inner.txt", crossSecret+"\n")
	mustWrite(t, e.host("mine.txt"), "mine\n")
	mustWrite(t, e.host("bound.txt"), "")
	if err := os.Mkdir(e.host("bounddir"), 0o700); err != nil {
		t.Fatal(err)
	}
	bindMount(t, secret, e.host("bound.txt"))
	bindMount(t, e.outside+"/dir", e.host("bounddir"))
	return e, secret
}

// checkOutside fails if the outside file changed.
func checkOutside(t *testing.T, secret string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(secret, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o600 || st.Size != int64(len(crossSecret)+1) {
		t.Errorf("the outside file changed: mode %04o, size %d", st.Mode&0o7777, st.Size)
	}
}

// TestCrossMountTools: through the tool door, an object bind-mounted
// into the scope from the same filesystem is never read, listed as
// usable, searched or matched, and the walks count it as refused.
func TestCrossMountTools(t *testing.T) {
	e, secret := crossEnv(t)
	tb := &tools.Toolbox{WS: e.ws}
	call := func(name string, in any) (string, error) {
		b, _ := json.Marshal(in)
		res, err := tb.Call(context.Background(), name, "", b)
		return string(res), err
	}
	for _, c := range []struct {
		tool string
		in   any
	}{
		{tools.Read, map[string]any{"path": "bound.txt"}},
		{tools.Read, map[string]any{"path": "bounddir/inner.txt"}},
		{tools.List, map[string]any{"path": "bounddir"}},
		{tools.Grep, map[string]any{"pattern": crossSecret, "path": "bound.txt"}},
		{tools.Write, map[string]any{"path": "bounddir/new.txt", "content": "x"}},
		{tools.Write, map[string]any{"path": "bound.txt", "content": "x"}},
		{tools.Delete, map[string]any{"path": "bound.txt"}},
		{tools.Delete, map[string]any{"path": "bounddir/inner.txt"}},
	} {
		if res, err := call(c.tool, c.in); err == nil {
			t.Errorf("%s %v crossed the mount: %s", c.tool, c.in, res)
		}
	}

	res, err := call(tools.Grep, map[string]any{"pattern": crossSecret})
	if err != nil {
		t.Fatal(err)
	}
	var grep tools.GrepResult
	json.Unmarshal([]byte(res), &grep)
	if len(grep.Matches) != 0 || grep.SkippedRefused != 2 {
		t.Errorf("grep of the scope: %d matches, %d refused, want 0 and 2: %s", len(grep.Matches), grep.SkippedRefused, res)
	}

	res, err = call(tools.Glob, map[string]any{"pattern": "**"})
	if err != nil {
		t.Fatal(err)
	}
	var glob struct {
		Matches []string
		Refused int `json:"skipped_refused"`
	}
	json.Unmarshal([]byte(res), &glob)
	if strings.Join(glob.Matches, " ") != "mine.txt" || glob.Refused != 2 {
		t.Errorf("glob of the scope: %v, %d refused, want [mine.txt] and 2", glob.Matches, glob.Refused)
	}

	res, err = call(tools.List, map[string]any{"path": "."})
	if err != nil {
		t.Fatal(err)
	}
	var list tools.ListResult
	json.Unmarshal([]byte(res), &list)
	for _, en := range list.Entries {
		if refused := en.Refused != ""; refused != strings.HasPrefix(en.Name, "bound") {
			t.Errorf("listed %s with refused %q", en.Name, en.Refused)
		}
	}

	m, err := snap.Create(context.Background(), e.ws, snap.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var skipped []string
	for _, s := range m.Skipped {
		skipped = append(skipped, s.Path)
	}
	if m.Files != 1 || strings.Join(skipped, " ") != "bound.txt bounddir" {
		t.Errorf("snapshot kept %d files and skipped %v; want 1 file, bound.txt and bounddir skipped", m.Files, skipped)
	}
	checkOutside(t, secret)
}

// TestCrossMountFUSE: through the mount, the sandbox user can't read,
// list, search, append to, chmod or truncate an object bind-mounted into
// the scope, and the outside file is unchanged.
func TestCrossMountFUSE(t *testing.T) {
	e, secret := crossEnv(t)
	for _, c := range []struct{ name, cmd string }{
		{"read", "cat bound.txt"},
		{"read in dir", "cat bounddir/inner.txt"},
		{"list", "ls bounddir"},
		{"grep", "grep -r " + crossSecret + " ."},
		{"append", "echo more >> bound.txt"},
		{"chmod", "chmod 666 bound.txt"},
		{"truncate", "truncate -s 0 bound.txt"},
		{"create in dir", "echo x > bounddir/new.txt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := asUser(t, e.mnt, DefaultUID, "cd $W && "+c.cmd)
			if err == nil || strings.Contains(out, crossSecret) {
				t.Errorf("%s crossed the mount: err %v, output %q", c.cmd, err, out)
			}
			checkOutside(t, secret)
		})
	}
	if _, err := os.Stat(e.outside + "/dir/new.txt"); err == nil {
		t.Error("a file was created in the outside directory")
	}
}

// TestCrossMountMarkedFile: a file that looks like an emulated link (the
// sticky mark) bind-mounted into the scope from elsewhere on the same
// filesystem is refused as on another mount, never read as a link: not by
// the store, not by the tools' listing, not through the mount.
func TestCrossMountMarkedFile(t *testing.T) {
	e := newEnv(t)
	marked := e.outside + "/marked"
	mustWrite(t, marked, "/etc/shadow")
	if err := os.Chmod(marked, os.ModeSticky|0o600); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, e.host("link"), "")
	bindMount(t, marked, e.host("link"))

	if target, _, err := e.ws.ReadLink("link"); err == nil || !strings.Contains(err.Error(), "another mount") {
		t.Errorf("store ReadLink of a bound marked file: %q, %v; want it refused as on another mount", target, err)
	}
	tb := &tools.Toolbox{WS: e.ws}
	out, err := tb.Call(context.Background(), tools.List, "", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "/etc/shadow") {
		t.Errorf("the listing shows the bound file's content as a target: %s", out)
	}
	if target, err := os.Readlink(e.path("link")); err == nil {
		t.Errorf("readlink through the mount: %q, want a refusal", target)
	}
}
