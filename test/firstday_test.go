package test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A coding agent's first day (issue 14): each scenario is one shell script
// run in the development image (loomfs image build --dev) twice, inside
// `loomfs run` over the scope's policed projection and in the same
// container over a plain bind mount of a temporary directory. Fixtures
// are made under /tmp, outside the workspace, so only /workspace differs.
// A script exits non-zero when something a toolchain needs went wrong,
// and prints the facts to compare on lines starting with "= ".

// devImage is the image the scenarios run in; scripts/setup builds it.
const devImage = "loomfs-sandbox-dev:latest"

// firstDayEnv is the environment both runs give the script.
const firstDayEnv = `set -e
export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com GIT_PAGER=cat
cd /workspace
`

// makeTree makes /tmp/t: an executable, a link to it, a link to a directory,
// a plain file, and the tar and zip archives of it.
const makeTree = `
mkdir -p /tmp/t/bin && cd /tmp/t
printf '#!/bin/sh\necho "= tool runs"\n' > bin/tool && chmod 755 bin/tool
ln -s bin/tool link && ln -s bin dirlink && echo data > data.txt
cd /tmp && tar -cf t.tar t
python3 - <<'EOF'
import os, stat, zipfile
with zipfile.ZipFile("/tmp/t.zip", "w") as z:
    for root, dirs, files in os.walk("/tmp/t"):
        for n in sorted(dirs + files):
            p = os.path.join(root, n)
            rel = os.path.relpath(p, "/tmp")
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                zi = zipfile.ZipInfo(rel)
                zi.create_system = 3
                zi.external_attr = (stat.S_IFLNK | 0o777) << 16
                z.writestr(zi, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                z.write(p, rel)
EOF
cd /workspace
`

// checkTree checks an extracted or copied /tmp/t at $1: each link a link,
// the executable executable.
const checkTree = `
check() {
	test -L "$1/link" && test -L "$1/dirlink" && test -f "$1/data.txt"
	test -x "$1/bin/tool" && "$1/link" && ls "$1/dirlink/" >/dev/null
	echo "= $1: $(readlink "$1/link") $(readlink "$1/dirlink") $(stat -c %A "$1/bin/tool" | cut -c1-4)"
}
`

// goModule makes a Go module with a main package and a test in ./g.
const goModule = `
mkdir g && cd g && printf 'module example.com/g\n\ngo 1.19\n' > go.mod
printf 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("= hello from go") }\n' > main.go
printf 'package main\n\nimport "testing"\n\nfunc TestMain(t *testing.T) {}\n' > main_test.go
`

type firstDay struct {
	name   string
	script string
}

var firstDays = []firstDay{
	{
		name: "git clone",
		script: `
mkdir /tmp/src && cd /tmp/src && git init -q -b main
printf '#!/bin/sh\necho "= script runs"\n' > run.sh && chmod 755 run.sh
ln -s run.sh link.sh && mkdir d && ln -s ../run.sh d/up && echo x > plain.txt
git add -A && git commit -qm init
cd /workspace && git clone -q /tmp/src clone && cd clone
st=$(git status --porcelain); test -z "$st" || { echo "not clean: $st"; exit 1; }
./run.sh && ./link.sh
echo "= $(readlink link.sh) $(readlink d/up) $(git ls-files -s run.sh | cut -c1-6)"`,
	},
	{
		name: "git init, commit, stash, checkout",
		script: `
git init -q -b main . && echo a > a.txt && printf '#!/bin/sh\n' > x.sh && chmod 700 x.sh
git add -A && git commit -qm one
echo b >> a.txt && git stash -q && git checkout -q -b other && git checkout -q main
git stash pop -q && git commit -qam two
st=$(git status --porcelain); test -z "$st" || { echo "not clean: $st"; exit 1; }
echo "= $(git ls-files -s x.sh | cut -c1-6) $(git log --oneline | wc -l) $(git ls-files | tr '\n' ' ')"`,
	},
	{
		name: "python venv",
		script: `
python3 -m venv venv && ./venv/bin/python -c 'import sys; print("=", sys.prefix, sys.prefix != sys.base_prefix)'`,
	},
	{
		name: "npm install of a package with a bin",
		script: `
mkdir -p /tmp/pkg/bin && cd /tmp/pkg
echo '{"name":"hello-bin","version":"1.0.0","bin":{"hello":"bin/hello.js"}}' > package.json
printf '#!/usr/bin/env node\nconsole.log("= hello from bin")\n' > bin/hello.js && chmod 755 bin/hello.js
npm pack --silent >/dev/null
mkdir /workspace/app && cd /workspace/app && echo '{"name":"app","version":"1.0.0"}' > package.json
npm install --offline --no-audit --no-fund --loglevel=error /tmp/pkg/hello-bin-1.0.0.tgz >/dev/null
./node_modules/.bin/hello`,
	},
	{
		name: "tar, unzip and tarfile of links and executables",
		script: makeTree + checkTree + `
mkdir x-tar x-unzip && tar -xf /tmp/t.tar -C x-tar && unzip -q /tmp/t.zip -d x-unzip
python3 -c 'import tarfile; tarfile.open("/tmp/t.tar").extractall("x-py")'
check x-tar/t; check x-unzip/t; check x-py/t`,
	},
	{
		name: "cp -a of links and executables",
		script: makeTree + checkTree + `
cp -a /tmp/t cpa && check cpa`,
	},
	{
		name: "make and gcc",
		script: `
mkdir c && cd c
printf '#include <stdio.h>\nint main(void) { puts("= hello from c"); return 0; }\n' > hello.c
printf 'hello: hello.c\n\t$(CC) -o $@ hello.c\n' > Makefile
make -s && ./hello`,
	},
	{
		name: "go build",
		script: goModule + `
go build -o app . && ./app`,
	},
	{
		name: "go test with the default temp dir",
		script: goModule + `
go test -count=1 . >/tmp/go-test.log 2>&1 || { tail -5 /tmp/go-test.log; exit 1; }
echo "= go test ok"`,
	},
	{
		name: "sqlite, two connections and a second process",
		script: `
python3 - <<'EOF'
import sqlite3, subprocess, sys
db = "/workspace/db.sqlite"
a = sqlite3.connect(db, timeout=1, isolation_level=None)
b = sqlite3.connect(db, timeout=1, isolation_level=None)
a.execute("create table t(x)")
# a reads, b reads, a ends: SQLite keeps the process's read lock on a's
# fd, and b's write upgrades it (POSIX locks belong to the process).
a.execute("begin"); a.execute("select count(*) from t").fetchall()
b.execute("begin"); b.execute("select count(*) from t").fetchall()
a.execute("commit")
b.execute("insert into t values (1)"); b.execute("commit")
a.execute("insert into t values (2)")
child = "import sqlite3; c = sqlite3.connect(%r, timeout=%s); c.execute('insert into t values (3)'); c.commit()"
subprocess.run([sys.executable, "-c", child % (db, 1)], check=True)
# While a holds the write lock, another process is kept out.
a.execute("begin immediate")
r = subprocess.run([sys.executable, "-c", child % (db, 0.2)], capture_output=True, text=True)
a.execute("commit")
print("= rows", a.execute("select count(*) from t").fetchone()[0], "second process kept out:", "locked" in r.stderr)
EOF`,
	},
}

// outcome is what one run of a scenario did.
type outcome struct {
	ok    bool
	facts string // the "= " lines
	out   string
}

func (o outcome) String() string {
	if o.ok {
		return "ok: " + o.facts
	}
	return "failed: " + o.out
}

func outcomeOf(out []byte, err error) outcome {
	var facts []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "= ") {
			facts = append(facts, l)
		}
	}
	return outcome{ok: err == nil, facts: strings.Join(facts, "\n"), out: strings.TrimSpace(string(out))}
}

// needImage fails the test when the development image is missing.
func needImage(t *testing.T, image string) {
	t.Helper()
	if err := exec.Command("docker", "image", "inspect", image).Run(); err != nil {
		t.Fatalf("image %s is missing: scripts/setup builds it (loomfs image build --dev)", image)
	}
}

// runPlain runs script in image over a plain bind mount of a fresh
// directory, in a container set up as the runner sets up its own, but
// with an executable /tmp.
func runPlain(t *testing.T, image, script string) outcome {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chown(dir, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", "run", "--rm", "--network", "none", "--read-only",
		"--tmpfs", "/tmp:rw,exec,nosuid,nodev,size=64m,mode=1777", "--cap-drop", "ALL",
		"--security-opt", "no-new-privileges", "--user", "1000:1000", "--memory", "512m", "--memory-swap", "512m",
		"--cpus", "1", "--pids-limit", "256", "-e", "HOME=/tmp", "-e", "TMPDIR=/tmp", "-e", "PYTHONDONTWRITEBYTECODE=1",
		"-v", dir+":/workspace", "-w", "/workspace", "--entrypoint", "/bin/sh", image,
		"-c", "umask 077 && exec /bin/sh -c \"$1\"", "sh", script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return outcomeOf(out.Bytes(), err)
}

// runLoomfs runs script in image with loomfs run, in a fresh scope.
func runLoomfs(t *testing.T, image, script string) outcome {
	t.Helper()
	c := newCLI(t)
	cmd := exec.Command(loomfsBin, "--root", c.root, "--log-level", "error", "run", "--scope", "acme/firstday/s1", "--timeout", "120", "--", "sh", "-c", script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "AGENT_LOOM_SANDBOX_IMAGE=" + image}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return outcomeOf(out.Bytes(), err)
}

// TestFirstDay runs each scenario both ways and compares: the plain run
// must work, and the loomfs run must do the same: exit the same way and
// print the same facts (modes, link targets, outputs).
func TestFirstDay(t *testing.T) {
	needImage(t, devImage)
	for _, sc := range firstDays {
		t.Run(sc.name, func(t *testing.T) {
			script := firstDayEnv + sc.script
			plain := runPlain(t, devImage, script)
			if !plain.ok {
				t.Fatalf("the scenario fails on a plain bind mount, so it shows nothing about loomfs: %s", plain.out)
			}
			lf := runLoomfs(t, devImage, script)
			if !lf.ok || lf.facts != plain.facts {
				t.Errorf("in loomfs run: %s\non a plain bind mount: %s", lf, plain)
			}
		})
	}
}

// TestFirstDayBench times each scenario in loomfs run and over a plain
// bind mount, side by side, median of $LOOMFS_FIRSTDAY_BENCH runs each,
// and prints a Markdown table (bench/firstday.sh runs it for BENCHMARKS.md).
func TestFirstDayBench(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("LOOMFS_FIRSTDAY_BENCH"))
	if n < 1 {
		t.Skip("set LOOMFS_FIRSTDAY_BENCH=3 (bench/firstday.sh) to time the first-day scenarios")
	}
	needImage(t, devImage)
	median := func(run func(*testing.T, string, string) outcome, script string) (time.Duration, outcome) {
		var ds []time.Duration
		var o outcome
		for range n {
			start := time.Now()
			o = run(t, devImage, script)
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2], o
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | plain bind mount | loomfs run | ratio |\n| --- | ---: | ---: | ---: |\n")
	for _, sc := range firstDays {
		script := firstDayEnv + sc.script
		plain, po := median(runPlain, script)
		lf, lo := median(runLoomfs, script)
		note := ""
		switch {
		case !po.ok:
			note = " (fails on the plain mount too)"
		case !lo.ok:
			note = " (fails)"
		case lo.facts != po.facts:
			note = " (differs)"
		}
		fmt.Fprintf(&b, "| %s | %.2f s | %.2f s%s | %.2f× |\n", sc.name, plain.Seconds(), lf.Seconds(), note, lf.Seconds()/plain.Seconds())
	}
	fmt.Print(b.String())
}
