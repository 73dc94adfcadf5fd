package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// recipe is what one image build put into its root filesystem.
type recipe struct {
	minimal  bool     // busybox only
	dev      bool     // busybox, Python and DevPackages
	python   string   // "python3.11"; empty for the minimal image
	packages []string // name=version, sorted
}

// Paths pruned from the root filesystem: documentation nobody in a sandbox reads.
var prunedPaths = []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/bug"}

// assemble fills rootfs with the image's files.
func (r *recipe) assemble(ctx context.Context, work, rootfs string, uid, gid int, say func(string, ...any)) error {
	roots := []string{"busybox-static"}
	if !r.minimal {
		py, err := pythonPackage(ctx)
		if err != nil {
			return err
		}
		r.python = py
		roots = append(roots, py+"-minimal", "lib"+py+"-stdlib")
	}
	var pkgs []string
	var err error
	if r.dev {
		// Toolchains need their tools (cpp, as, ld, perl…), not only
		// libraries: the whole Depends closure.
		roots = append(roots, DevPackages...)
		say("resolving the dependency closure of %s", strings.Join(roots, ", "))
		pkgs, err = closure(ctx, roots, func(string) bool { return true })
	} else {
		say("resolving the shared-library closure of %s", strings.Join(roots, ", "))
		pkgs, err = libraryClosure(ctx, roots)
	}
	if err != nil {
		return err
	}

	debs := filepath.Join(work, "debs")
	if err := os.Mkdir(debs, 0o700); err != nil {
		return fmt.Errorf("sandbox: image build: %w", err)
	}
	say("downloading Debian packages (%d) with apt-get download: %s", len(pkgs), strings.Join(pkgs, " "))
	args := []string{"-q", "download"}
	if os.Geteuid() == 0 {
		// apt's _apt download user can't write our private temp dir.
		args = append([]string{"-o", "APT::Sandbox::User=root"}, args...)
	}
	versions, err := archiveVersions(ctx, pkgs)
	if err != nil {
		return err
	}
	for _, p := range pkgs {
		if v, ok := versions[p]; ok {
			p += "=" + v
		}
		args = append(args, p)
	}
	if _, err := run(ctx, debs, "apt-get", args...); err != nil {
		return fmt.Errorf("sandbox: image build: %w (is the apt index current? run apt-get update)", err)
	}

	files, err := filepath.Glob(filepath.Join(debs, "*.deb"))
	if err != nil || len(files) != len(pkgs) {
		return fmt.Errorf("sandbox: image build: apt-get download left %d .deb files for %d packages", len(files), len(pkgs))
	}
	say("extracting packages with dpkg-deb -x")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return fmt.Errorf("sandbox: image build: %w", err)
	}
	for _, f := range files {
		if _, err := run(ctx, "", "dpkg-deb", "-x", f, rootfs); err != nil {
			return fmt.Errorf("sandbox: image build: %w", err)
		}
		out, err := run(ctx, "", "dpkg-deb", "-W", "--showformat=${Package}=${Version}", f)
		if err != nil {
			return fmt.Errorf("sandbox: image build: %w", err)
		}
		r.packages = append(r.packages, strings.TrimSpace(out))
	}
	slices.Sort(r.packages)
	for _, p := range prunedPaths {
		if err := os.RemoveAll(filepath.Join(rootfs, p)); err != nil {
			return fmt.Errorf("sandbox: image build: prune %s: %w", p, err)
		}
	}

	n, err := linkApplets(ctx, rootfs)
	if err != nil {
		return err
	}
	say("linked %d busybox applets", n)
	if err := writeSystemFiles(rootfs, uid, gid); err != nil {
		return err
	}
	if r.dev {
		// What maintainer scripts would have set up with update-alternatives.
		if err := linkMissing(rootfs, "usr/bin/cc", "gcc"); err != nil {
			return err
		}
	}
	if r.python != "" {
		for _, name := range []string{"python3", "python"} {
			if err := linkMissing(rootfs, "usr/bin/"+name, r.python); err != nil {
				return err
			}
		}
		say("precompiling the %s standard library", r.python)
		if err := precompile(ctx, rootfs, r.python); err != nil {
			// Only start-up time depends on it; the image works without.
			say("warning: precompile skipped: %v", err)
		}
	}
	checked, err := checkLibraries(rootfs)
	if err != nil {
		return err
	}
	say("checked the shared libraries of %d ELF files", checked)
	return nil
}

// archiveVersions returns the newest version of each package that an apt
// source offers (apt-cache madison lists them newest first). apt-get
// download would otherwise ask for the installed version, which a host
// may hold from elsewhere and no source offers.
func archiveVersions(ctx context.Context, pkgs []string) (map[string]string, error) {
	out, err := run(ctx, "", "apt-cache", append([]string{"madison"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("sandbox: image build: %w", err)
	}
	return parseMadison(out), nil
}

// parseMadison reads "apt-cache madison" output: the first version listed
// from a Packages index for each package.
func parseMadison(out string) map[string]string {
	versions := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) < 3 || !strings.Contains(f[2], "Packages") {
			continue
		}
		name, v := strings.TrimSpace(f[0]), strings.TrimSpace(f[1])
		if _, ok := versions[name]; !ok {
			versions[name] = v
		}
	}
	return versions
}

// linkMissing makes the symlink rel → target in rootfs unless rel exists.
func linkMissing(rootfs, rel, target string) error {
	p := filepath.Join(rootfs, rel)
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	if err := os.Symlink(target, p); err != nil {
		return fmt.Errorf("sandbox: image build: link %s: %w", rel, err)
	}
	return nil
}

// changes are the image settings applied at import.
func (r *recipe) changes(uid, gid int) []string {
	title := "loomfs sandbox (busybox, " + r.python + ")"
	switch {
	case r.minimal:
		title = "loomfs sandbox (busybox only)"
	case r.dev:
		title = "loomfs sandbox dev (busybox, " + r.python + ", " + strings.Join(DevPackages, ", ") + ")"
	}
	return []string{
		"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"ENV LANG=C.UTF-8",
		"ENV HOME=/tmp",
		"ENV PYTHONDONTWRITEBYTECODE=1",
		"WORKDIR /workspace",
		fmt.Sprintf("USER %d:%d", uid, gid),
		`CMD ["/bin/sh"]`,
		fmt.Sprintf("LABEL org.opencontainers.image.title=%q", title),
	}
}

// message records the package list in the image history.
func (r *recipe) message() string {
	return "loomfs image build from Debian packages: " + strings.Join(r.packages, " ")
}

var pythonDep = regexp.MustCompile(`^python3\.[0-9]+$`)

// pythonPackage finds the distribution's Python (for example "python3.11")
// from what python3-minimal depends on.
func pythonPackage(ctx context.Context) (string, error) {
	deps, err := dependencies(ctx, []string{"python3-minimal"}, false)
	if err != nil {
		return "", err
	}
	for _, d := range deps["python3-minimal"] {
		if py, ok := strings.CutSuffix(d, "-minimal"); ok && pythonDep.MatchString(py) {
			return py, nil
		}
	}
	return "", fmt.Errorf("sandbox: image build: python3-minimal depends on no python3.N-minimal")
}

// libraryClosure returns roots plus every package reached through Depends and
// Pre-Depends edges that lead to shared-library packages (named lib* or
// zlib1g). Edges into tools such as dpkg or perl, needed only by maintainer
// scripts that never run in the sandbox, are not followed.
func libraryClosure(ctx context.Context, roots []string) ([]string, error) {
	return closure(ctx, roots, func(d string) bool { return strings.HasPrefix(d, "lib") || d == "zlib1g" })
}

// closure returns roots plus every package reached through Depends and
// Pre-Depends edges into packages follow accepts.
func closure(ctx context.Context, roots []string, follow func(string) bool) ([]string, error) {
	deps, err := dependencies(ctx, roots, true) // one apt-cache run: it is slow
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var walk func(p string)
	walk = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		for _, d := range deps[p] {
			if follow(d) {
				walk(d)
			}
		}
	}
	for _, p := range roots {
		walk(p)
	}
	return sortedKeys(seen), nil
}

// dependencies asks apt-cache for the Depends and Pre-Depends of pkgs, and
// with recurse of every package they reach.
func dependencies(ctx context.Context, pkgs []string, recurse bool) (map[string][]string, error) {
	args := []string{"depends", "--important"}
	if recurse {
		args = append(args, "--recurse")
	}
	out, err := run(ctx, "", "apt-cache", append(args, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("sandbox: image build: %w (is the apt index current? run apt-get update)", err)
	}
	deps := parseDepends(out)
	for _, p := range pkgs {
		if _, ok := deps[p]; !ok {
			return nil, fmt.Errorf("sandbox: image build: apt-cache knows no package %s", p)
		}
	}
	return deps, nil
}

// parseDepends reads "apt-cache depends --important" output: for each
// package its Depends and Pre-Depends, taking the first choice of each
// "a | b" group, the first provider of a virtual name, and dropping
// ":any" qualifiers.
func parseDepends(out string) map[string][]string {
	deps := map[string][]string{}
	var cur string
	inGroup, virtual := false, false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if line[0] != ' ' {
			cur = strings.TrimSpace(line)
			if _, ok := deps[cur]; !ok {
				deps[cur] = nil
			}
			inGroup = false
			continue
		}
		field := strings.TrimSpace(line)
		alt := strings.HasPrefix(field, "|")
		kind, name, ok := strings.Cut(strings.TrimPrefix(field, "|"), ": ")
		if !ok {
			// A provider listed under a virtual name.
			if virtual && cur != "" {
				deps[cur] = append(deps[cur], strings.TrimSpace(field))
			}
			virtual = false
			continue
		}
		virtual = false
		if kind != "Depends" && kind != "PreDepends" {
			continue
		}
		first := !inGroup
		inGroup = alt
		name, _, _ = strings.Cut(strings.TrimSpace(name), ":") // drop ":any"
		if !first || cur == "" {
			continue
		}
		if strings.HasPrefix(name, "<") {
			virtual = true
			continue
		}
		deps[cur] = append(deps[cur], name)
	}
	return deps
}

// linkApplets adds a symlink to /bin/busybox for every applet whose path is
// still free, so sh, ls, cat and the rest resolve. It runs the extracted
// busybox, which is static, to list them.
func linkApplets(ctx context.Context, rootfs string) (int, error) {
	out, err := run(ctx, "", filepath.Join(rootfs, "bin/busybox"), "--list-full")
	if err != nil {
		return 0, fmt.Errorf("sandbox: image build: list busybox applets: %w", err)
	}
	n := 0
	for _, p := range strings.Fields(out) {
		if p == "linuxrc" || !filepath.IsLocal(p) {
			continue
		}
		dst := filepath.Join(rootfs, p)
		if _, err := os.Lstat(dst); err == nil {
			continue // a real program wins over the applet
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return 0, fmt.Errorf("sandbox: image build: %w", err)
		}
		if err := os.Symlink("/bin/busybox", dst); err != nil {
			return 0, fmt.Errorf("sandbox: image build: %w", err)
		}
		n++
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin/sh")); err != nil {
		return 0, fmt.Errorf("sandbox: image build: busybox provides no /bin/sh")
	}
	return n, nil
}

// writeSystemFiles adds the accounts, name-service config and the mount
// points the runner uses.
func writeSystemFiles(rootfs string, uid, gid int) error {
	dirs := []struct {
		path string
		mode fs.FileMode
	}{
		{"tmp", 0o1777}, {"workspace", 0o755}, {"skills", 0o755},
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"root", 0o700}, {"etc", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(rootfs, d.path)
		if err := os.MkdirAll(p, d.mode); err != nil {
			return fmt.Errorf("sandbox: image build: %w", err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("sandbox: image build: %w", err)
		}
	}
	files := map[string]string{
		"etc/passwd":        fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nsandbox:x:%d:%d:loomfs sandbox:/tmp:/bin/sh\n", uid, gid),
		"etc/group":         fmt.Sprintf("root:x:0:\nsandbox:x:%d:\n", gid),
		"etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("sandbox: image build: %w", err)
		}
	}
	return nil
}

// precompile byte-compiles the standard library with the extracted
// interpreter, run through the extracted dynamic loader so the host needs no
// Python of its own. Hash-based, unchecked .pyc files suit a read-only root:
// Python would otherwise recompile every imported module on every command.
func precompile(ctx context.Context, rootfs, python string) error {
	loader, libDirs, err := loaderOf(rootfs)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, loader, "--library-path", strings.Join(libDirs, ":"),
		filepath.Join(rootfs, "usr/bin", python), "-S", "-m", "compileall", "-q",
		"-s", rootfs, "-p", "/", "--invalidation-mode", "unchecked-hash",
		filepath.Join(rootfs, "usr/lib", python))
	cmd.Env = []string{"PYTHONHOME=" + filepath.Join(rootfs, "usr"), "LANG=C.UTF-8"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("compileall: %w: %s", err, lastLines(out, 5))
	}
	return nil
}

// loaderOf finds the extracted dynamic loader and library directories.
func loaderOf(rootfs string) (string, []string, error) {
	for _, pat := range []string{"lib/*/ld-linux*.so.*", "usr/lib/*/ld-linux*.so.*", "lib*/ld-linux*.so.*", "usr/lib*/ld-linux*.so.*"} {
		m, _ := filepath.Glob(filepath.Join(rootfs, pat))
		for _, p := range m {
			// A symlink here points at an absolute path, which on this host
			// would be the host's own loader.
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
				return p, libraryDirs(rootfs), nil
			}
		}
	}
	return "", nil, fmt.Errorf("no dynamic loader in the image")
}

// libraryDirs are the directories the dynamic loader searches by default.
func libraryDirs(rootfs string) []string {
	var dirs []string
	for _, pat := range []string{"lib", "lib64", "usr/lib", "usr/lib64", "lib/*-linux-*", "usr/lib/*-linux-*"} {
		m, _ := filepath.Glob(filepath.Join(rootfs, pat))
		for _, d := range m {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// checkLibraries verifies that every ELF file in rootfs finds its program
// interpreter and each DT_NEEDED library in the loader's directories (or its
// own, for $ORIGIN run paths), so a missing package fails the build rather
// than a command. It returns how many ELF files it checked.
func checkLibraries(rootfs string) (int, error) {
	have := map[string]bool{}
	for _, d := range libraryDirs(rootfs) {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			have[e.Name()] = true
		}
	}
	var missing []string
	checked := 0
	err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir // a toolchain's test fixtures (other systems' binaries), never loaded
		}
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := elf.Open(p)
		if err != nil {
			return nil // not ELF
		}
		defer f.Close()
		checked++
		rel, _ := filepath.Rel(rootfs, p)
		for _, prog := range f.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			buf := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(buf, 0); err == nil {
				interp := string(bytes.TrimRight(buf, "\x00"))
				if _, err := os.Lstat(filepath.Join(rootfs, interp)); err != nil {
					missing = append(missing, rel+": interpreter "+interp)
				}
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return nil
		}
		for _, lib := range needed {
			if have[lib] {
				continue
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(p), lib)); err == nil {
				continue
			}
			missing = append(missing, rel+": "+lib)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sandbox: image build: check libraries: %w", err)
	}
	if len(missing) > 0 {
		return 0, fmt.Errorf("sandbox: image build: shared libraries missing from the image: %s", strings.Join(missing, "; "))
	}
	return checked, nil
}

// run runs a command and returns its standard output; on failure the error
// carries the tail of its standard error.
func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines(stderr.Bytes(), 5))
	}
	return string(out), nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
