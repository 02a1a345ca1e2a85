package sqlite

import (
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// SQLite's busy retries ask the write gate before every attempt, as the DynamoDB client does before every SDK
// attempt (issue 16 item 2, fence E): a fenced write whose claim's horizon passed while it waited for another
// connection's write lock is not sent. Two waits are covered: between the store's own retries of a transaction
// that failed with SQLITE_BUSY, and inside BEGIN IMMEDIATE (SQLite's busy timeout), after which the lock is ours
// but the write must still not be made.
func TestWriteGateAskedBeforeEveryAttempt(t *testing.T) {
	t.Parallel()
	refused := errors.New("the claim's horizon has passed")
	for _, tc := range []struct {
		name string
		busy time.Duration // SQLite's own wait for the lock
	}{
		{"between retries", time.Millisecond}, // each attempt fails busy; the gate closes after the first
		{"inside the lock wait", busyTimeout}, // the lock is freed while BEGIN waits, after the gate closed
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "gate.db")
			s, err := open(ctx, path, tc.busy, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			holder, err := sql.Open("sqlite", dsn(path, busyTimeout))
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()
			tx, err := holder.BeginTx(ctx, nil) // BEGIN IMMEDIATE: another connection holds the write lock
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			asked, open := 0, true
			first := make(chan struct{})
			gate := func() error {
				mu.Lock()
				defer mu.Unlock()
				asked++
				if asked == 1 {
					close(first)
					open = false // the horizon passes while the attempt waits for the lock
					return nil
				}
				if !open {
					return refused
				}
				return nil
			}
			done := make(chan error, 1)
			go func() { done <- s.PutValue(agent.WithWriteGate(ctx, gate), "ns", "k", []byte("v")) }()
			if tc.busy == busyTimeout {
				select {
				case <-first:
				case err := <-done:
					t.Fatalf("PutValue returned %v before asking its gate", err)
				}
				if err := tx.Rollback(); err != nil { // the lock is free: BEGIN IMMEDIATE now succeeds
					t.Fatal(err)
				}
			}
			err = <-done
			if tc.busy != busyTimeout {
				if rerr := tx.Rollback(); rerr != nil {
					t.Fatal(rerr)
				}
			}
			if !errors.Is(err, refused) {
				t.Fatalf("PutValue: %v, want the gate's refusal", err)
			}
			if _, err := s.GetValue(ctx, "ns", "k"); !agent.IsKind(err, agent.KindNotFound) {
				t.Fatalf("GetValue after the refused write: %v, want not found", err)
			}
		})
	}
}
