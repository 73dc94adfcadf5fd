package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestNoRenameNoReplace: every exclusive create of a scope works where
// the filesystem refuses RENAME_NOREPLACE, and still refuses a second
// create of the same name.
func TestNoRenameNoReplace(t *testing.T) {
	store.RefuseRenameNoReplace(t)
	ctx := context.Background()
	ws := newEnv(t).open(t, mainScope, nil)
	cases := []struct {
		name string
		run  func() error
	}{
		{"call record", func() error {
			if rec, err := ws.BeginCall(context.Background(), "c1", "workspace_write", []byte("{}")); err != nil || rec != nil {
				return errors.Join(err, errors.New("BeginCall returned a record on first use"))
			}
			rec, err := ws.BeginCall(context.Background(), "c1", "workspace_write", []byte("{}"))
			if err == nil && rec == nil {
				return errors.New("the second BeginCall of c1 found no record")
			}
			return err
		}},
		{"confirmation token", func() error {
			tok, err := ws.IssueToken(store.Confirmation{Path: "a.txt"})
			if err != nil {
				return err
			}
			c, err := ws.RedeemToken(tok)
			if err == nil && c == nil {
				return errors.New("the token issued is not redeemable")
			}
			return err
		}},
		{"new file", func() error {
			if _, err := ws.WriteFile(ctx, "new.txt", []byte("x"), nil); err != nil {
				return err
			}
			_, err := ws.WriteFile(ctx, "new.txt", []byte("y"), ptr(""))
			if policy.CodeOf(err) != policy.Conflict {
				return errors.Join(err, errors.New("a write expecting no file did not conflict with one"))
			}
			return nil
		}},
		{"exec marker", func() error {
			if err := ws.SetMarker(store.Marker{Scope: mainScope.String()}); err != nil {
				return err
			}
			if err := ws.SetMarker(store.Marker{Scope: mainScope.String()}); err == nil {
				return errors.New("a second marker was set over the first")
			}
			return ws.ClearMarker()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.run(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
