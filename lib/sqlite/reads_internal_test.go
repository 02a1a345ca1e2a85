package sqlite

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// Reads run prepared, each statement kept once for every later read of the Store (issue 18: parsing was most of
// a turn's read cost); a caller that left fails with KindCanceled and does not spoil the statement for the next;
// past maxPrepared reads run unprepared; after Close a read fails, as before.
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
	if _, err := s.ListValues(gone, "ns"); !agent.IsKind(err, agent.KindCanceled) {
		t.Fatalf("ListValues with a cancelled context: %v, want KindCanceled", err)
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

// doneSpy is a context that records whether anyone asked for its Done channel.
type doneSpy struct {
	context.Context
	asked *atomic.Bool
}

func (d doneSpy) Done() <-chan struct{} {
	d.asked.Store(true)
	return d.Context.Done()
}

// A read that starts runs detached from its caller's context: on a context that can end, database/sql and the
// driver each start a goroutine per statement to watch its Done channel (issue 18: a turn's reads woke idle
// threads for them), so nothing of a read may ask for it.
func TestReadsWatchNoContext(t *testing.T) {
	t.Parallel()
	s, _ := batchStore(t, 2, Options{})
	if err := s.PutValue(t.Context(), "ns", "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for name, read := range map[string]func(ctx context.Context) error{
		"GetValue":   func(ctx context.Context) error { _, err := s.GetValue(ctx, "ns", "k"); return err },
		"ListValues": func(ctx context.Context) error { _, err := s.ListValues(ctx, "ns"); return err },
	} {
		for i := range 2 { // the first read prepares the statement, the second finds it kept
			ctx := doneSpy{t.Context(), new(atomic.Bool)}
			if err := read(ctx); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if ctx.asked.Load() {
				t.Errorf("%s (read %d) watched its caller's context", name, i+1)
			}
		}
	}
}
