package policy

import (
	"strings"
	"unicode/utf8"
)

// Bounds on names (SPEC §3.1). They match common POSIX limits so that any
// path loomfs accepts can also be created on the backing store.
const (
	MaxNameBytes = 255
	MaxPathBytes = 4096
)

// Reserved names.
const (
	// SubagentsDir is the top-level name a main scope reserves for the
	// artifact listing of child instances (SPEC §2.1).
	SubagentsDir = "subagents"
	// InternalPrefix starts every name loomfs keeps for itself, including
	// the temporary files of atomic writes; no door can name or create one.
	InternalPrefix = ".agentloom-"
	// ProbePrefix starts the file a projection's health probe writes
	// through the mount: loomfs's own, so no door names or lists it, and
	// one a killed probe leaves is swept like an atomic write's temporary.
	ProbePrefix = InternalPrefix + "probe-"
	// ReadyFile appears at the top of a projection once its health probe
	// passed (SPEC §6); nothing else may take the name.
	ReadyFile = ".workspace_ready"
)

// CleanPath validates a model-supplied relative path and returns it in
// canonical form ("." for the scope root, else "a/b/c"). "." components and
// one trailing slash are accepted and dropped (CleanTarget remembers the
// slash); everything else in SPEC §3.1 is refused with InvalidPath, or
// NameTooLong for a name or path over the bounds. mainScope reserves the
// top-level "subagents".
func CleanPath(raw string, mainScope bool) (string, error) {
	if raw == "" {
		return "", pathErr(raw, "path is empty; use \".\" for the workspace root")
	}
	if len(raw) > MaxPathBytes {
		return "", tooLong("path is %d bytes; the limit is %d", len(raw), MaxPathBytes)
	}
	if raw[0] == '/' {
		return "", pathErr(raw, "absolute paths are refused; give a path relative to the workspace root")
	}
	p := strings.TrimSuffix(raw, "/")
	if p == "" {
		return "", pathErr(raw, "path is empty")
	}
	var parts []string
	for _, c := range strings.Split(p, "/") {
		if c == "." {
			continue
		}
		if err := checkComponent(raw, c); err != nil {
			return "", err
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 {
		return ".", nil
	}
	// The first cleaned component, not raw: "./~" cleans to "~", which
	// must be refused too, or CleanPath would not be idempotent.
	if err := checkTop(raw, parts[0], mainScope); err != nil {
		return "", err
	}
	return strings.Join(parts, "/"), nil
}

// Target is a cleaned path together with what its spelling asks of the
// object there. A path ending in "/" (or "/.") names a directory, as it does
// for the kernel, so a file at "notes.txt/" is refused with NotDir instead of
// being read or replaced as if the slash were not there.
type Target struct {
	Rel string // as CleanPath returns it
	Dir bool   // the spelling names a directory
}

// CleanTarget is CleanPath remembering a trailing slash.
func CleanTarget(raw string, mainScope bool) (Target, error) {
	rel, err := CleanPath(raw, mainScope)
	if err != nil {
		return Target{}, err
	}
	dir := rel != "." && (strings.HasSuffix(raw, "/") || strings.HasSuffix(raw, "/."))
	return Target{Rel: rel, Dir: dir}, nil
}

// CheckKind refuses what the spelling does not allow: anything but a
// directory where it names one, and, where nothing exists yet, creating a
// file under a directory's spelling. found is false when nothing is there.
func (t Target) CheckKind(op Op, kind Kind, found bool) error {
	switch {
	case !t.Dir:
		return nil
	case found && kind != KindDir:
		return Errorf(NotDir, "%s/: a path ending in \"/\" names a directory, and %s is a %s; drop the trailing slash", t.Rel, t.Rel, kind)
	case !found && op == OpWrite:
		return Errorf(NotDir, "%s/: a path ending in \"/\" names a directory, so no file is created there; drop the trailing slash", t.Rel)
	}
	return nil
}

// CheckName validates one name about to be created in directory dir (a
// cleaned path). It refuses what CleanPath would refuse, so that every object
// created through the filesystem can be addressed by the tools.
func CheckName(dir, name string, mainScope bool) error {
	if err := checkComponent(name, name); err != nil {
		return err
	}
	// A name is one component: with a "/" it would name another path
	// ("b/../c") that CleanPath refuses.
	if strings.IndexByte(name, '/') >= 0 {
		return pathErr("", "a name can't contain \"/\"")
	}
	if dir == "." {
		if err := checkTop(name, name, mainScope); err != nil {
			return err
		}
	}
	if len(Join(dir, name)) > MaxPathBytes {
		return tooLong("path would be longer than %d bytes", MaxPathBytes)
	}
	return nil
}

// Addressable reports whether rel, a path found on the backing store, is
// short enough for the tools to name. A tree planted on the host can go
// deeper; walkers skip such a subtree and count it instead of failing.
func Addressable(rel string) bool { return len(rel) <= MaxPathBytes }

// Visible reports whether an existing entry called name is shown in
// listings. loomfs's own files are never shown.
func Visible(name string) bool {
	return !isInternal(name)
}

// Join joins a cleaned directory path and a name.
func Join(dir, name string) string {
	if dir == "." || dir == "" {
		return name
	}
	return dir + "/" + name
}

// checkTop refuses what may not stand at the top of a workspace: "~"
// (never expanded), "subagents" in a main scope (the artifact listing's),
// and ReadyFile (served by the projection alone).
func checkTop(raw, name string, mainScope bool) error {
	switch {
	case strings.HasPrefix(name, "~"):
		return pathErr(raw, "\"~\" is not expanded, and names starting with it are refused at the top of the workspace")
	case mainScope && name == SubagentsDir:
		return pathErr(raw, "%q at the top of a main workspace is reserved for the artifact listing of child agents", SubagentsDir)
	case name == ReadyFile:
		return pathErr(raw, "%q is reserved: the projection shows it once it is healthy", ReadyFile)
	}
	return nil
}

func checkComponent(raw, c string) error {
	switch {
	case c == "":
		return pathErr(raw, "empty path component (\"//\")")
	case c == "..":
		return pathErr(raw, "\"..\" components are refused; paths stay inside the workspace")
	case len(c) > MaxNameBytes:
		return tooLong("a path component is %d bytes; the limit is %d", len(c), MaxNameBytes)
	case !utf8.ValidString(c):
		return pathErr("", "path is not valid UTF-8")
	case isInternal(c):
		return pathErr(raw, "names starting with %q are reserved for loomfs", InternalPrefix)
	}
	for _, r := range c {
		switch {
		case r == 0:
			return pathErr("", "path contains a NUL byte")
		case r == '\\':
			return pathErr(raw, "backslashes are refused; use \"/\" to separate components")
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			return pathErr("", "path contains a control character (U+%04X)", r)
		}
	}
	return nil
}

func isInternal(name string) bool {
	return len(name) >= len(InternalPrefix) && strings.EqualFold(name[:len(InternalPrefix)], InternalPrefix)
}

// pathErr never echoes a path with control bytes back; callers pass "" then.
func pathErr(raw, format string, args ...any) *Error {
	e := Errorf(InvalidPath, format, args...)
	if raw != "" && len(raw) <= 512 {
		e.Message = "invalid path " + quote(raw) + ": " + e.Message
	} else {
		e.Message = "invalid path: " + e.Message
	}
	return e
}

// tooLong refuses a name or a path over the bounds, with NameTooLong; the
// path itself is never echoed.
func tooLong(format string, args ...any) *Error {
	e := pathErr("", format, args...)
	e.Code = NameTooLong
	return e
}

// quote shows a refused path as the model sent it, backslashes and
// quotes included, so it can see what to fix; only control characters,
// C1 ones too, are shown as "?", so none reaches a message or a log.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			b.WriteString("?")
			continue
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}
