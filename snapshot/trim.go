package snapshot

import (
	"github.com/agentloom/loomfs/store"
)

// trimAbove is how many journal files of ended processes a scope keeps
// before TrimJournals removes them.
const trimAbove = 64

// TrimJournals removes the change journals of scope sc whose writers are
// gone when there are more than a few, so that a scope no snapshot is
// taken of does not keep a file for every process that ever changed it.
// If the index had not read them all, it is told to start afresh: the
// next snapshot walks the scope. It returns how many files went (or, with
// dryRun, would go). The caller holds the scope lock.
func TrimJournals(vol *store.Volume, sc store.Scope, dryRun bool) (int, error) {
	files, err := vol.JournalFiles(sc)
	if err != nil {
		return 0, err
	}
	var dead []store.JournalFile
	for _, f := range files {
		if !f.Live {
			dead = append(dead, f)
		}
	}
	if len(dead) <= trimAbove || dryRun {
		if len(dead) <= trimAbove {
			return 0, nil
		}
		return len(dead), nil
	}
	repo, err := OpenRepo(vol, sc, false)
	if err == nil {
		defer repo.Close()
		if s := repo.loadState(); s.id != "" {
			unread := false
			for _, f := range dead {
				unread = unread || s.cursor[f.Name] < f.Size
				delete(s.cursor, f.Name)
			}
			if unread {
				s.id = ""
			}
			if err := repo.saveState(s.all(), s.commit); err != nil {
				return 0, err
			}
		}
	}
	n := 0
	for _, f := range dead {
		if vol.RemoveJournal(sc, f.Name) == nil {
			n++
		}
	}
	return n, nil
}
