package store

import (
	"sync"
	"sync/atomic"
	"time"
)

// A journal file whose writer ended it (its end line, written just before
// the writer closes it and goes on in another file if it goes on) never
// changes again. A reader that polls the journals (a mount's follower,
// every half second on a shared volume) need not open such a file again
// to learn its size, whether it is held and whether it ended: on a shared
// filesystem that is an open, a lock test, an fstat and a close, each a
// round trip, for every file the scope's writers ever ended until a
// snapshot removes them. settledJournals keeps what a Workspace read of
// them; a file the directory no longer lists is forgotten. A file whose
// writer died without its end line is not kept: it is looked at again,
// so that a lock test answered wrongly once (a shared filesystem's
// client reconnecting) never hides a live writer's later lines.
type settledJournals struct {
	mu    sync.Mutex
	files map[string]settledJournal
}

// settledJournal is what was read of an ended journal file: its size, the
// end of its last line (the end line's) and when it last changed.
type settledJournal struct {
	size, end int64
	mod       time.Time
}

// get returns what is known of name.
func (s *settledJournals) get(name string) (settledJournal, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.files[name]
	return j, ok
}

// put notes what was read of name, which its writer ended.
func (s *settledJournals) put(name string, j settledJournal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files == nil {
		s.files = map[string]settledJournal{}
	}
	s.files[name] = j
}

// keep forgets every file that is not in names, the directory's listing.
func (s *settledJournals) keep(names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.files) == 0 {
		return
	}
	listed := make(map[string]bool, len(names))
	for _, n := range names {
		listed[n] = true
	}
	for n := range s.files {
		if !listed[n] {
			delete(s.files, n)
		}
	}
}

// journalOpens counts the journal files opened to be described or read,
// for tests.
var journalOpens atomic.Int64
