package sqlite

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// Reads run prepared, each statement kept once for every later read of the Store (issue 18: parsing was most of
// a turn's read cost); a caller that leaves does not spoil the statement for the next; past maxPrepared reads run
// unprepared; after Close a read fails, as before.
func TestReadsRunPrepared(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := batchStore(t, 2, Options{})
	if err := s.PutValue(ctx, "ns", "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.GetValue(gone, "ns", "k"); !agent.IsKind(err, agent.KindCanceled) {
		t.Fatalf("GetValue with a cancelled context: %v, want KindCanceled", err)
	}
	for range 2 {
		if got := value(t, s, "k"); got != "v" {
			t.Fatalf("GetValue: %q, want v", got)
		}
	}
	kept := func() (n int) {
		s.rmu.Lock()
		defer s.rmu.Unlock()
		for query := range s.reads {
			if strings.HasPrefix(query, "SELECT value FROM kv") {
				n++
			}
		}
		return n
	}
	if n := kept(); n != 1 {
		t.Fatalf("GetValue's statement is kept %d times after three reads, want once (%d kept)", n, len(s.reads))
	}
	s.rmu.Lock()
	for i := len(s.reads); i < maxPrepared; i++ {
		s.reads[fmt.Sprintf("SELECT %d", i)] = nil // placeholders, never run
	}
	s.rmu.Unlock()
	if vs, err := s.ListValues(ctx, "ns"); err != nil || len(vs) != 1 {
		t.Fatalf("a read once the prepared reads are at their bound: %v, %v", vs, err)
	}
	s.rmu.Lock()
	n := len(s.reads)
	for i := range maxPrepared { // Close closes what is kept
		delete(s.reads, fmt.Sprintf("SELECT %d", i))
	}
	s.rmu.Unlock()
	if n != maxPrepared {
		t.Fatalf("%d reads kept past the bound, want %d", n, maxPrepared)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetValue(ctx, "ns", "k"); err == nil {
		t.Fatal("GetValue after Close succeeded")
	}
}
