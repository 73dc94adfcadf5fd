package sandbox

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestNormalizeTag(t *testing.T) {
	t.Setenv("AGENT_LOOM_SANDBOX_IMAGE", "")
	for _, tc := range []struct {
		tag     string
		minimal bool
		want    string
		ok      bool
	}{
		{"", false, DefaultImage, true},
		{"", true, MinimalImage, true},
		{"sandbox", false, "sandbox:latest", true},
		{"acme/sandbox:v2", false, "acme/sandbox:v2", true},
		{"registry.local:5000/sb:1", false, "registry.local:5000/sb:1", true},
		{"Bad Tag", false, "", false},
		{"UPPER:1", false, "", false},
		{"sb@sha256:" + strings.Repeat("a", 64), false, "", false},
	} {
		got, err := normalizeTag(tc.tag, tc.minimal)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("normalizeTag(%q, %v) = %q, %v; want %q ok=%v", tc.tag, tc.minimal, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("normalizeTag(%q): %v is not ErrInvalidRequest", tc.tag, err)
		}
	}
}

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in       string
		uid, gid int
		ok       bool
	}{
		{"", 1000, 1000, true},
		{"1000:1000", 1000, 1000, true},
		{"65534:100", 65534, 100, true},
		{"0:0", 0, 0, false},
		{"1000:0", 0, 0, false},
		{"0:1000", 0, 0, false},
		{"root", 0, 0, false},
		{"sandbox:sandbox", 0, 0, false},
		{"1000", 0, 0, false},
		{"-1:5", 0, 0, false},
	} {
		uid, gid, err := parseUser(tc.in)
		if (err == nil) != tc.ok || uid != tc.uid || gid != tc.gid {
			t.Errorf("parseUser(%q) = %d, %d, %v", tc.in, uid, gid, err)
		}
	}
}

func TestParseDepends(t *testing.T) {
	out := `libpython3.11-stdlib
  Depends: libpython3.11-minimal
 |Depends: media-types
  Depends: mime-support
  Depends: libc6
python3.11-minimal
  PreDepends: libc6
  Depends: <python3:any>
    python3
  Depends: zlib1g:any
 |Depends: liba
 |Depends: libb
  Depends: libc
`
	got := parseDepends(out)
	want := map[string][]string{
		"libpython3.11-stdlib": {"libpython3.11-minimal", "media-types", "libc6"},
		"python3.11-minimal":   {"libc6", "python3", "zlib1g", "liba"}, // python3 provides <python3:any>
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("%s: got %v, want %v", k, got[k], v)
		}
	}
}

// TestLibraryClosure asks this host's apt for the real closure: shared
// libraries are in, maintainer-script tools are out.
func TestLibraryClosure(t *testing.T) {
	py, err := pythonPackage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got, err := libraryClosure(t.Context(), []string{"busybox-static", py + "-minimal", "lib" + py + "-stdlib"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"busybox-static", py + "-minimal", "lib" + py + "-minimal", "libc6", "zlib1g", "libexpat1", "libssl3", "libffi8"} {
		if !slices.Contains(got, p) {
			t.Errorf("closure lacks %s: %v", p, got)
		}
	}
	for _, p := range []string{"dpkg", "perl", "perl-base", "tar", "mailcap", "media-types"} {
		if slices.Contains(got, p) {
			t.Errorf("closure has %s: %v", p, got)
		}
	}
}

func TestWriteTarOwnershipAndSetID(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	os.WriteFile(filepath.Join(dir, "bin", "suid"), []byte("x"), 0o755)
	os.Chmod(filepath.Join(dir, "bin", "suid"), 0o4755|os.ModeSetuid)
	os.Symlink("/bin/suid", filepath.Join(dir, "link"))
	var buf bytes.Buffer
	if err := writeTar(&buf, dir); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Mode&0o6000 != 0 {
			t.Errorf("%s: uid %d gid %d mode %o", h.Name, h.Uid, h.Gid, h.Mode)
		}
		if h.Name == "link" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/bin/suid") {
			t.Errorf("link header %+v", h)
		}
	}
	if !slices.Equal(names, []string{"bin/", "bin/suid", "link"}) {
		t.Fatalf("entries %v", names)
	}
}

func TestCheckLibrariesReportsMissing(t *testing.T) {
	host, err := exec.LookPath("dpkg-deb") // any dynamically linked program
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
	b, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "usr/bin/prog"), b, 0o755)
	_, err = checkLibraries(root)
	if err == nil || !strings.Contains(err.Error(), "usr/bin/prog: libc.so.6") || !strings.Contains(err.Error(), "interpreter") {
		t.Fatalf("err = %v, want missing libc and interpreter named", err)
	}
}

func TestParseMadison(t *testing.T) {
	out := `    nodejs | 18.20.4+dfsg-1~deb12u3 | http://deb.example/debian-security bookworm-security/main amd64 Packages
    nodejs | 18.20.4+dfsg-1~deb12u2 | http://deb.example/debian bookworm/main amd64 Packages
    nodejs | 18.20.4+dfsg-1~deb12u2 | http://deb.example/debian bookworm/main Sources
       git | 1:2.39.5-0+deb12u3 | http://deb.example/debian bookworm/main amd64 Packages
`
	got := parseMadison(out)
	want := map[string]string{"nodejs": "18.20.4+dfsg-1~deb12u3", "git": "1:2.39.5-0+deb12u3"}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
