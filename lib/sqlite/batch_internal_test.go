package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// batchStore opens a Store on a fresh file whose writer can be held inside a transaction (hold), so that the
// writes made meanwhile queue and then run together in its next transaction; queued is closed once n writes wait
// in the queue (n >= 2: the held write queues alone first).
func batchStore(t *testing.T, n int, o Options) (s *Store, queued <-chan struct{}) {
	t.Helper()
	s, err := OpenWith(t.Context(), filepath.Join(t.TempDir(), "batch.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	full := make(chan struct{})
	var once sync.Once
	s.hooks.queued = func(got int) { // set before any write but the schema's, which has returned
		if got == n {
			once.Do(func() { close(full) })
		}
	}
	return s, full
}

// hold makes s's writer busy inside a transaction, with a write that waits, until release is called.
func hold(t *testing.T, s *Store) (release func()) {
	t.Helper()
	running, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		errc <- s.write(context.Background(), "hold", func(conn) error {
			once.Do(func() { close(running) })
			<-gate
			return nil
		})
	}()
	<-running
	return func() {
		close(gate)
		if err := <-errc; err != nil {
			t.Errorf("the held write: %v", err)
		}
	}
}

// goCall runs call in its own goroutine; the channel gets its result.
func goCall(call func() error) <-chan error {
	c := make(chan error, 1)
	go func() { c <- call() }()
	return c
}

// value is the value stored under ns/key, or "" when there is none.
func value(t *testing.T, s *Store, key string) string {
	t.Helper()
	v, err := s.GetValue(t.Context(), "ns", key)
	if agent.IsKind(err, agent.KindNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("GetValue(%s): %v", key, err)
	}
	return string(v)
}

// Writes that arrive while a transaction runs share the next one, up to the batch's bounds: N writers released at
// once commit in one transaction; one more than the count bound takes two; writes binding more than the byte bound
// between them take two. The bounds are the defaults unless Options (AGENT_SQLITE_BATCH_*) set them.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		writers int
		size    int // bytes of each value
		opts    Options
		wantTx  int64
	}{
		{"16 writers", 16, 10, Options{}, 1},
		{"past the count bound", DefaultBatchWrites + 1, 10, Options{}, 2},
		{"past the byte bound", 3, DefaultBatchBytes * 6 / 10, Options{}, 2}, // the third write waits for the next transaction
		{"count bound set", 9, 10, Options{BatchWrites: 4}, 3},
		{"byte bound set", 4, 600, Options{BatchBytes: 1000}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, queued := batchStore(t, tc.writers, tc.opts)
			release := hold(t, s)
			var calls []<-chan error
			for i := range tc.writers {
				v := fmt.Sprintf("%d:%s", i, strings.Repeat("v", tc.size))
				calls = append(calls, goCall(func() error { return s.PutValue(t.Context(), "ns", fmt.Sprint(i), []byte(v)) }))
			}
			<-queued
			tx0 := s.Transactions()
			release()
			for i, c := range calls {
				if err := <-c; err != nil {
					t.Fatalf("writer %d: %v", i, err)
				}
			}
			if got := s.Transactions() - tx0; got != tc.wantTx {
				t.Fatalf("%d writers released at once took %d transactions, want %d", tc.writers, got, tc.wantTx)
			}
			for i := range tc.writers {
				if got := value(t, s, fmt.Sprint(i)); !strings.HasPrefix(got, fmt.Sprintf("%d:", i)) {
					t.Fatalf("value %d after the batch = %.20q", i, got)
				}
			}
		})
	}
}

// One write's failure inside a batch rolls back that write only (its savepoint), whatever it wrote before it
// failed, and is that caller's result; the batch's other writes commit. A write that reads and then writes (a
// claim) sees the earlier writes of its batch: of two claims of one thread in one batch, one wins.
func TestBatchIsolatesAFailedWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, queued := batchStore(t, 5, Options{})
	now := time.UnixMilli(1893553445006).UTC()
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: "th1", Owner: "u1", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	release := hold(t, s)
	refusal := agent.E(agent.KindConflict, agent.CodeRunFenced, "the condition failed")
	a := goCall(func() error { return s.PutValue(ctx, "ns", "a", []byte("1")) })
	failing := goCall(func() error {
		return s.write(ctx, "half a write", func(c conn) error {
			if _, err := c.exec(ctx, `INSERT INTO kv (ns, key, value) VALUES ('ns', 'half', x'31')`); err != nil {
				return err
			}
			return refusal
		})
	})
	claim := func(run string) <-chan error {
		return goCall(func() error {
			_, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: run, Trigger: agent.TriggerUser,
				Now: now, StaleAfter: time.Minute})
			return err
		})
	}
	claimA, claimB := claim("ra"), claim("rb")
	b := goCall(func() error { return s.PutValue(ctx, "ns", "b", []byte("1")) })
	<-queued
	tx0 := s.Transactions()
	release()

	if err := <-failing; !errors.Is(err, refusal) {
		t.Fatalf("the failing write: %v, want its own refusal", err)
	}
	for name, c := range map[string]<-chan error{"a": a, "b": b} {
		if err := <-c; err != nil {
			t.Fatalf("write %s beside the failed one: %v", name, err)
		}
	}
	errA, errB := <-claimA, <-claimB
	if (errA == nil) == (errB == nil) || !errors.Is(errors.Join(errA, errB), agent.ErrRunActive) {
		t.Fatalf("two claims of one thread in one batch: %v and %v, want one win and one run_active", errA, errB)
	}
	if got := s.Transactions() - tx0; got != 1 {
		t.Fatalf("the batch took %d transactions, want 1", got)
	}
	if value(t, s, "a") != "1" || value(t, s, "b") != "1" {
		t.Fatal("a write beside the failed one was not applied")
	}
	if got := value(t, s, "half"); got != "" {
		t.Fatalf("the failed write's first statement was kept: %q", got)
	}
}

// The write gate is asked for each write once its batch holds the lock, just before its savepoint: a gate that
// closed while the write waited in the queue refuses it, it writes nothing, and the batch's other writes commit.
func TestBatchAsksEachWritesGate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, queued := batchStore(t, 3, Options{})
	release := hold(t, s)
	refused := errors.New("the claim's horizon has passed")
	var closed atomic.Bool
	gated := agent.WithWriteGate(ctx, func() error {
		if closed.Load() {
			return refused
		}
		return nil
	})
	calls := map[string]<-chan error{
		"a":     goCall(func() error { return s.PutValue(ctx, "ns", "a", []byte("1")) }),
		"gated": goCall(func() error { return s.PutValue(gated, "ns", "gated", []byte("1")) }),
		"b":     goCall(func() error { return s.PutValue(ctx, "ns", "b", []byte("1")) }),
	}
	<-queued
	closed.Store(true) // the horizon passes while the write waits for its batch
	release()
	for key, c := range calls {
		err := <-c
		if key == "gated" {
			if !errors.Is(err, refused) || !agent.IsKind(err, agent.KindUnavailable) {
				t.Fatalf("the gated write: %v, want the gate's refusal as unavailable", err)
			}
			if got := value(t, s, key); got != "" {
				t.Fatalf("the refused write was applied: %q", got)
			}
			continue
		}
		if err != nil || value(t, s, key) != "1" {
			t.Fatalf("write %s beside the refused one: %v, value %q", key, err, value(t, s, key))
		}
	}
}

// A caller whose context ends while its write waits in the queue gets KindCanceled at once, and its write is
// never run; the other writes of the batch commit.
func TestBatchSkipsACanceledWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, queued := batchStore(t, 2, Options{})
	release := hold(t, s)
	cctx, cancel := context.WithCancel(ctx)
	canceled := goCall(func() error { return s.PutValue(cctx, "ns", "canceled", []byte("1")) })
	other := goCall(func() error { return s.PutValue(ctx, "ns", "other", []byte("1")) })
	<-queued
	cancel()
	if err := <-canceled; !agent.IsKind(err, agent.KindCanceled) {
		t.Fatalf("the canceled write, its batch not yet begun: %v, want KindCanceled", err)
	}
	release()
	if err := <-other; err != nil {
		t.Fatalf("the write beside the canceled one: %v", err)
	}
	if got := value(t, s, "canceled"); got != "" {
		t.Fatalf("the canceled write was applied: %q", got)
	}
	if value(t, s, "other") != "1" {
		t.Fatal("the write beside the canceled one was not applied")
	}
}

// A COMMIT that fails fails every write of its batch, and none of them is applied, not even those whose own
// savepoint was released; the Store writes on afterwards.
func TestBatchFailedCommitAppliesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const n = 4
	s, queued := batchStore(t, n, Options{})
	commitErr := errors.New("disk I/O error")
	var commits atomic.Int32
	s.hooks.commit = func() error {
		if commits.Add(1) == 2 { // the first COMMIT is the held write's; the second the batch's
			return commitErr
		}
		return nil
	}
	release := hold(t, s)
	var calls []<-chan error
	for i := range n {
		calls = append(calls, goCall(func() error { return s.PutValue(ctx, "ns", fmt.Sprint(i), []byte("1")) }))
	}
	<-queued
	release()
	for i, c := range calls {
		if err := <-c; !errors.Is(err, commitErr) || !agent.IsKind(err, agent.KindInternal) {
			t.Fatalf("writer %d of the failed batch: %v, want the COMMIT's failure", i, err)
		}
	}
	for i := range n {
		if got := value(t, s, fmt.Sprint(i)); got != "" {
			t.Fatalf("value %d of the failed batch was applied: %q", i, got)
		}
	}
	if err := s.PutValue(ctx, "ns", "next", []byte("1")); err != nil || value(t, s, "next") != "1" {
		t.Fatalf("a write after the failed batch: %v", err)
	}
}

// A write made after Close fails, and Close returns once the writer has stopped.
func TestWriteAfterClose(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "closed.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.PutValue(t.Context(), "ns", "k", []byte("v")); !agent.IsKind(err, agent.KindInternal) {
		t.Fatalf("PutValue after Close: %v, want KindInternal", err)
	}
}

// Write statements with arguments run prepared, each kept once per Store (the schema's, which have none, are not
// kept); once maxPrepared statements are kept, a new one runs unprepared, and the write still succeeds.
func TestWritesRunPrepared(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := batchStore(t, 2, Options{})
	for range 2 {
		if err := s.PutValue(ctx, "ns", "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	var put int
	for query := range s.prepared {
		if strings.HasPrefix(strings.TrimSpace(query), "CREATE") {
			t.Fatalf("a schema statement is kept prepared: %.40q", query)
		}
		if strings.HasPrefix(query, "INSERT INTO kv") {
			put++
		}
	}
	if put != 1 {
		t.Fatalf("PutValue's statement is kept %d times after two puts, want once (%d kept)", put, len(s.prepared))
	}
	for i := len(s.prepared); i < maxPrepared; i++ { // the writer is idle: the last write returned
		s.prepared[fmt.Sprintf("SELECT %d", i)] = nil // placeholders, never run
	}
	if err := s.DeleteValue(ctx, "ns", "k"); err != nil {
		t.Fatalf("a write once the prepared statements are at their bound: %v", err)
	}
	if got := value(t, s, "k"); got != "" || len(s.prepared) != maxPrepared {
		t.Fatalf("after the delete: value %q, %d statements kept; want none and %d", got, len(s.prepared), maxPrepared)
	}
	for i := range maxPrepared { // Close closes what is kept
		delete(s.prepared, fmt.Sprintf("SELECT %d", i))
	}
}

// A COMMIT that fails with SQLITE_BUSY (another process on the file) retries the whole batch in a new transaction:
// every write of it runs again there, and each is applied exactly once.
func TestBatchRetriesABusyCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const n = 4
	s, queued := batchStore(t, n, Options{})
	busy := busyError(t)
	var commits atomic.Int32
	s.hooks.commit = func() error {
		if commits.Add(1) == 2 { // the first COMMIT is the held write's; the second the batch's
			return busy
		}
		return nil
	}
	if err := s.PutValue(ctx, "ns", "n", []byte("0")); err != nil {
		t.Fatal(err)
	}
	commits.Store(0)
	release := hold(t, s)
	var calls []<-chan error
	for range n {
		calls = append(calls, goCall(func() error {
			return s.write(ctx, "increment", func(c conn) error {
				_, err := c.exec(ctx, `UPDATE kv SET value = CAST(CAST(CAST(value AS TEXT) AS INTEGER) + 1 AS BLOB)
					WHERE ns = ? AND key = ?`, "ns", "n")
				return err
			})
		}))
	}
	<-queued
	tx0 := s.Transactions()
	release()
	for i, c := range calls {
		if err := <-c; err != nil {
			t.Fatalf("writer %d of the retried batch: %v", i, err)
		}
	}
	if got := s.Transactions() - tx0; got != 2 {
		t.Fatalf("the batch took %d transactions, want 2 (the busy COMMIT's and its retry's)", got)
	}
	var got int
	err := s.db.QueryRowContext(ctx, `SELECT CAST(value AS INTEGER) FROM kv WHERE ns = 'ns' AND key = 'n'`).Scan(&got)
	if err != nil || got != n {
		t.Fatalf("counter after %d increments in a retried batch = %d, %v", n, got, err)
	}
}

// busyError is a real SQLITE_BUSY: BEGIN IMMEDIATE while another connection holds the file's write lock.
func busyError(t *testing.T) error {
	t.Helper()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "busy.db")
	var dbs [2]*sql.DB
	for i := range dbs {
		db, err := sql.Open("sqlite", dsn(path, time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs[i] = db
	}
	tx, err := dbs[0].BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = dbs[1].BeginTx(ctx, nil)
	if !isBusy(err) {
		t.Fatalf("BEGIN IMMEDIATE beside a held lock: %v, want SQLITE_BUSY", err)
	}
	return err
}

// The writer's transactions start no goroutine to watch a context (issue 18 item 2: a database/sql Tx watched its
// own with one, and every query in it with another, about nine goroutine starts per turn, each waking an idle
// thread): while a write's query is open, no watcher is alive. Not parallel, so no other test's are either.
func TestWritesStartNoWatchers(t *testing.T) {
	s, _ := batchStore(t, 2, Options{})
	ctx := t.Context()
	if err := s.PutValue(ctx, "ns", "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	var stacks string
	err := s.write(ctx, "probe", func(c conn) error {
		rows, err := c.query(ctx, `SELECT key FROM kv WHERE ns = ?`, "ns")
		if err != nil {
			return err
		}
		defer rows.Close()
		if !rows.Next() {
			return fmt.Errorf("no row: %v", rows.Err())
		}
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, watcher := range []string{"database/sql.(*Tx).awaitDone", "database/sql.(*Rows).awaitDone", "interruptOnDone"} {
		if strings.Contains(stacks, watcher) {
			t.Errorf("a write runs with %s alive", watcher)
		}
	}
}
