package test

import (
	"strings"
	"testing"
)

// TestSQLiteInContainer: inside the sandbox, two SQLite connections of one
// process that read at once and then write, and a second process, share a
// database in the workspace as on a local disk (POSIX record locks belong
// to the process, not to the open).
func TestSQLiteInContainer(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/sqlite"
	script := `
import sqlite3, subprocess, sys
a = sqlite3.connect("t.db", timeout=0)
b = sqlite3.connect("t.db", timeout=0)
a.execute("create table t (who text)")
a.executemany("insert into t values (?)", [("x",), ("y",), ("z",)]); a.commit()
# Both read at once (a statement with rows left holds its read lock),
# then each writes.
ca = a.execute("select * from t"); ca.fetchone()
cb = b.execute("select * from t"); cb.fetchone()
ca.fetchall(); cb.fetchall()
b.execute("insert into t values ('b')"); b.commit()
a.execute("insert into t values ('a')"); a.commit()
a.execute("begin immediate")
other = "import sqlite3\ntry:\n sqlite3.connect('t.db', timeout=0).execute('insert into t values (1)').connection.commit(); print('wrote')\nexcept sqlite3.OperationalError as e: print(e)\n"
print("while held:", subprocess.run([sys.executable, "-c", other], capture_output=True, text=True).stdout.strip())
a.rollback()
print("after:", subprocess.run([sys.executable, "-c", other], capture_output=True, text=True).stdout.strip())
print("rows:", b.execute("select count(*) from t").fetchone()[0])
`
	r := c.run("", "run", "--scope", scope, "--", "python3", "-c", script)
	want := "while held: database is locked\nafter: wrote\nrows: 6\n"
	if r.code != 0 || string(r.stdout) != want {
		t.Fatalf("sqlite in the sandbox: exit %d, stdout %q, want %q; stderr %s", r.code, r.stdout, want, strings.TrimSpace(r.stderr))
	}
}
