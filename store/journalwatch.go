package store

import (
	"os"
)

// OpenJournalDir opens the scope's journal directory (JournalDir), making
// it on first use, so a reader can watch it for new lines (inotify)
// instead of only polling. The caller closes it; it reads the journals
// with ReadJournal all the same.
func (w *Workspace) OpenJournalDir() (*os.File, error) {
	fd, err := w.stateSubdir(JournalDir)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), JournalDir), nil
}

// OwnJournal reports whether journal file name is one this Workspace wrote:
// its lines are the changes made through this Workspace, so a projection
// of it knows which of them are its own (JournalChange.Source).
func (w *Workspace) OwnJournal(name string) bool {
	j := w.journal
	if j == nil {
		return false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.names[name]
}
