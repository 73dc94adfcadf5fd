package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/store"
)

func init() {
	addCommand(newPinCmd)
	addCommand(newUnpinCmd)
}

const pinHelp = `A pinned session or snapshot is kept by "loomfs gc" however old it is.
Without --snapshot the whole session of --scope is pinned (a child scope pins
its session). Pins are kept in the scope's state directory, outside every
workspace.`

func newPinCmd(g *globals) *cobra.Command {
	var scope, snap, note string
	var list bool
	cmd := &cobra.Command{
		Use:   "pin --scope S [--snapshot ID] [--note TEXT] | pin --list",
		Short: "Keep a session or a snapshot from being reclaimed",
		Long:  pinHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			vol, err := store.OpenVolume(ctx, g.storeConfig())
			if err != nil {
				return err
			}
			defer vol.Close()
			out := cmd.OutOrStdout()
			if list {
				pins, err := retention.Pins(vol)
				if err != nil {
					return err
				}
				if g.json {
					return json.NewEncoder(out).Encode(pins)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SCOPE\tSNAPSHOT\tSINCE\tNOTE")
				for _, p := range pins {
					what := p.Snapshot
					if what == "" {
						what = "(whole session)"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Scope, what, p.Time.Format(time.RFC3339), p.Note)
				}
				return tw.Flush()
			}
			sc, err := parseScopeFlag(scope)
			if err != nil {
				return err
			}
			p, err := retention.PinItem(vol, sc, snap, note, time.Now())
			if err != nil {
				return err
			}
			g.auditAdmin(ctx, "pin", sc, map[string]any{"snapshot": snap, "note": note})
			if g.json {
				return json.NewEncoder(out).Encode(p)
			}
			if snap == "" {
				fmt.Fprintf(out, "pinned session %s\n", p.Scope)
			} else {
				fmt.Fprintf(out, "pinned snapshot %s of %s\n", snap, p.Scope)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION[/RUN/INSTANCE]")
	cmd.Flags().StringVar(&snap, "snapshot", "", "pin this snapshot instead of the session")
	cmd.Flags().StringVar(&note, "note", "", "why it is kept")
	cmd.Flags().BoolVar(&list, "list", false, "list every pin on the volume")
	return cmd
}

func newUnpinCmd(g *globals) *cobra.Command {
	var scope, snap string
	cmd := &cobra.Command{
		Use:   "unpin --scope S [--snapshot ID]",
		Short: "Let a pinned session or snapshot be reclaimed again",
		Long:  pinHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, vol, err := g.scopeVolume(cmd.Context(), scope)
			if err != nil {
				return err
			}
			defer vol.Close()
			if err := retention.Unpin(vol, sc, snap); err != nil {
				return err
			}
			g.auditAdmin(cmd.Context(), "unpin", sc, map[string]any{"snapshot": snap})
			fmt.Fprintln(cmd.OutOrStdout(), "unpinned")
			return nil
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION[/RUN/INSTANCE] (required)")
	cmd.Flags().StringVar(&snap, "snapshot", "", "unpin this snapshot instead of the session")
	return cmd
}
