package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// op is one operation of one door: how to prepare the scope for it, how to
// run it under a fault, and what it may leave behind.
type op struct {
	door, name string
	// setup prepares the cell without a fault and returns the tree the
	// operation starts from.
	setup func(c *cell) tree
	// do runs the operation, traced, and returns how it ended; it sets
	// c.ack when the operation said it was done.
	do func(c *cell) outcome
	// after returns the trees the scope may hold after the operation:
	// the first is the tree before it (it failed or was cut off before it
	// changed anything), the last the tree it makes, and any between are
	// states it documents as allowed on the way; a nil after means only
	// held() judges.
	after func(c *cell, before tree) []tree
	// held checks what else the operation promises (optional).
	held func(c *cell, o outcome) []string
	// tool marks an operation whose answer is a tool's JSON.
	tool bool
	// sample bounds the call sites of one system call the full matrix
	// faults (spread from the first to the last); 0 is every one.
	sample int
}

const (
	oldText = "alpha\nbeta\ngamma\n"
	newText = "a new content, longer than the old one\nline two\n"
)

func seed(c *cell, files map[string]string) tree {
	for p, content := range files {
		if o := c.tool("workspace_write", map[string]any{"path": p, "content": content}); o.exit != 0 {
			c.t.Fatalf("setup: write %s: %s", p, o)
		}
	}
	return c.tree()
}

// toolOp is an operation of the tool door: one loomfs tool call.
func toolOp(name, tool string, files map[string]string, input any, after func(before tree) tree) op {
	return op{
		door: "tool", name: name, tool: true,
		setup: func(c *cell) tree { return seed(c, files) },
		do: func(c *cell) outcome {
			b, _ := json.Marshal(input)
			o := run(c.traced("tool", tool, "--scope", scope, "--input", string(b), "--timeout", "20s"), "", 60*time.Second)
			c.ack = o.exit == 0 && strings.HasPrefix(strings.TrimSpace(o.stdout), "{") && !strings.Contains(o.stdout, `"error"`)
			return o
		},
		after: func(c *cell, before tree) []tree { return []tree{before, after(before)} },
	}
}

func with(t tree, set map[string]string, del ...string) tree {
	u := tree{}
	for k, v := range t {
		u[k] = v
	}
	for k, v := range set {
		u[k] = v
	}
	for _, k := range del {
		delete(u, k)
	}
	return u
}

const quotaPolicy = `version: 1
limits:
  scope_bytes: 1 MiB
  scope_files: 100
rules:
  - path: tmp
    max_bytes: 64 KiB
    max_files: 10
`

const patch = `*** Begin Patch
*** Update File: x.txt
@@
 alpha
-beta
+BETA
 gamma
*** Add File: n.txt
+added by the patch
*** Delete File: z.txt
*** End Patch
`

// writeNew writes a file in a directory the write makes: a write that
// fails after making it keeps the directory (as mkdir -p would), which is
// the one state between old and new it may leave.
func writeNew(x map[string]string) op {
	o := toolOp("write_new", "workspace_write", x, map[string]any{"path": "d/new.txt", "content": newText},
		func(b tree) tree { return with(b, map[string]string{"d": "/", "d/new.txt": newText}) })
	o.after = func(c *cell, b tree) []tree {
		return []tree{b, with(b, map[string]string{"d": "/"}), with(b, map[string]string{"d": "/", "d/new.txt": newText})}
	}
	return o
}

// ops are the operations of every door the matrix runs.
func ops() []op {
	x := map[string]string{"x.txt": oldText}
	list := []op{
		toolOp("write", "workspace_write", x, map[string]any{"path": "x.txt", "content": newText},
			func(b tree) tree { return with(b, map[string]string{"x.txt": newText}) }),
		writeNew(x),
		toolOp("edit", "workspace_edit", x, map[string]any{"path": "x.txt", "old_text": "beta", "new_text": "BETA"},
			func(b tree) tree { return with(b, map[string]string{"x.txt": "alpha\nBETA\ngamma\n"}) }),
		toolOp("multi_edit", "workspace_edit", x, map[string]any{"path": "x.txt", "edits": []map[string]any{
			{"old_text": "alpha", "new_text": "ALPHA"}, {"old_text": "gamma", "new_text": "GAMMA"}}},
			func(b tree) tree { return with(b, map[string]string{"x.txt": "ALPHA\nbeta\nGAMMA\n"}) }),
		toolOp("apply_patch", "workspace_apply_patch", map[string]string{"x.txt": oldText, "z.txt": "to be deleted\n"},
			map[string]any{"patch": patch},
			func(b tree) tree {
				return with(b, map[string]string{"x.txt": "alpha\nBETA\ngamma\n", "n.txt": "added by the patch\n"}, "z.txt")
			}),
		toolOp("delete", "workspace_delete", x, map[string]any{"path": "x.txt"},
			func(b tree) tree { return with(b, nil, "x.txt") }),
		toolOp("mkdir", "workspace_mkdir", x, map[string]any{"path": "d"},
			func(b tree) tree { return with(b, map[string]string{"d": "/"}) }),
	}
	q := toolOp("quota_grant", "workspace_write", x, map[string]any{"path": "tmp/q.txt", "content": newText},
		func(b tree) tree { return with(b, map[string]string{"tmp": "/", "tmp/q.txt": newText}) })
	setup := q.setup
	q.door = "quota"
	q.setup = func(c *cell) tree {
		c.policy = filepath.Join(c.dir, "policy.yaml")
		if err := os.WriteFile(c.policy, []byte(quotaPolicy), 0o600); err != nil {
			c.t.Fatal(err)
		}
		return setup(c)
	}
	list = append(list, q, stageOp(), snapshotCreateOp(), snapshotRestoreOp(), mountOp(), auditRotationOp())
	if dockerUp() {
		list = append(list, sandboxOp())
	}
	return list
}

// stageOp stages two files into data/ as the platform does: each file
// is placed whole or not at all.
func stageOp() op {
	files := map[string]string{"s1.txt": oldText, "s2.txt": newText}
	return op{
		door: "platform", name: "stage",
		setup: func(c *cell) tree {
			src := filepath.Join(c.dir, "src")
			os.Mkdir(src, 0o700)
			for n, s := range files {
				if err := os.WriteFile(filepath.Join(src, n), []byte(s), 0o600); err != nil {
					c.t.Fatal(err)
				}
			}
			return seed(c, map[string]string{"x.txt": oldText})
		},
		do: func(c *cell) outcome {
			o := run(c.traced("stage", "--scope", scope, "--into", "data", filepath.Join(c.dir, "src")+"/"), "", time.Minute)
			c.ack = o.exit == 0
			return o
		},
		held: func(c *cell, o outcome) []string {
			t := c.tree()
			var bad []string
			for n, s := range files {
				got, ok := t["data/"+n]
				if ok && got != s {
					bad = append(bad, fmt.Sprintf("data/%s is torn: %q", n, clip(got)))
				}
				if !ok && c.ack {
					bad = append(bad, fmt.Sprintf("stage answered done but data/%s is missing", n))
				}
			}
			if t["x.txt"] != oldText {
				bad = append(bad, "stage changed x.txt")
			}
			return bad
		},
	}
}

var snapshotID = func(out string) string {
	var m struct{ ID string }
	json.Unmarshal([]byte(out), &m)
	return m.ID
}

// snapshotCreateOp takes a snapshot: the workspace is left alone, and a
// snapshot said to be taken restores.
func snapshotCreateOp() op {
	return op{
		door: "snapshot", name: "create",
		setup: func(c *cell) tree {
			return seed(c, map[string]string{"x.txt": oldText, "d/y.txt": newText})
		},
		do: func(c *cell) outcome {
			o := run(c.traced("--json", "snapshot", "create", "--scope", scope), "", time.Minute)
			c.ack = o.exit == 0 && snapshotID(o.stdout) != ""
			return o
		},
		after: func(c *cell, before tree) []tree { return []tree{before} },
		held: func(c *cell, o outcome) []string {
			var bad []string
			if !c.ack {
				if o := run(c.plain("--json", "snapshot", "create", "--scope", scope), "", time.Minute); o.exit != 0 {
					bad = append(bad, "the next snapshot failed: "+o.String())
				}
				return bad
			}
			before := c.tree()
			c.must("", "tool", "workspace_write", "--scope", scope, "--input", `{"path":"x.txt","content":"changed\n"}`)
			if o := run(c.plain("snapshot", "restore", "--scope", scope, snapshotID(o.stdout)), "", time.Minute); o.exit != 0 {
				return append(bad, "the snapshot said taken does not restore: "+o.String())
			}
			if got := c.tree(); !got.equal(before) {
				bad = append(bad, fmt.Sprintf("the snapshot said taken restores %s, not %s", got, before))
			}
			return bad
		},
	}
}

// snapshotRestoreOp restores a snapshot: the workspace is the old tree or
// the snapshot's, never a mix.
func snapshotRestoreOp() op {
	var id string
	var snap tree
	return op{
		door: "snapshot", name: "restore",
		setup: func(c *cell) tree {
			snap = seed(c, map[string]string{"x.txt": oldText, "d/y.txt": newText})
			id = snapshotID(c.must("", "--json", "snapshot", "create", "--scope", scope))
			return seed(c, map[string]string{"x.txt": newText, "z.txt": "after the snapshot\n"})
		},
		do: func(c *cell) outcome {
			o := run(c.traced("snapshot", "restore", "--scope", scope, id), "", time.Minute)
			c.ack = o.exit == 0
			return o
		},
		after: func(c *cell, before tree) []tree { return []tree{before, snap} },
	}
}

// auditRotationOp appends records to a node's chain small enough to
// rotate several times (a helper process using package audit, as every
// loomfs writer does); verify must find the chain whole.
func auditRotationOp() op {
	return op{
		door: "audit", name: "rotation",
		setup: func(c *cell) tree { return seed(c, map[string]string{"x.txt": oldText}) },
		do: func(c *cell) outcome {
			x := c.tracedExec(os.Args[0], c.root)
			x.Env = append(env(), "LOOMFS_FAULTS_HELPER=audit-rotate")
			o := run(x, "", time.Minute)
			c.ack = o.exit == 0
			return o
		},
		after: func(c *cell, before tree) []tree { return []tree{before} },
		held: func(c *cell, o outcome) []string {
			if o.exit == 1 && !strings.Contains(o.stderr, "audit") {
				return []string{"the writer failed without saying why: " + o.String()}
			}
			q := run(c.plain("--json", "audit", "query", "--op", "faults_rotation"), "", time.Minute)
			acked := strings.Count(o.stdout, "recorded\n")
			if got := strings.Count(q.stdout, `"op":"faults_rotation"`); got < acked {
				return []string{fmt.Sprintf("%d records acknowledged, %d in the chain", acked, got)}
			}
			return nil
		},
	}
}
