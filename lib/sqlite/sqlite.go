// Package sqlite is the embedded agent.Store: one SQLite file, driven by the pure-Go modernc.org/sqlite (no cgo),
// used by `agentloop dev` and by tests that want a real store without AWS. It passes lib/storetest.
//
// Concurrency. The file is opened in WAL mode, so readers never block the writer. Every write transaction is
// started with BEGIN IMMEDIATE: it takes the file's write lock before it reads, so two claimers (goroutines of one
// process or separate processes on the same file) serialise and the second one sees the first one's claim. Within
// one *Store the writes go through one writer goroutine with group commit (batch.go): a write call queues its write
// and waits; the writer takes the writes that queued while its previous transaction ran (up to Options.BatchWrites, and
// no more once they have bound Options.BatchBytes) and runs them in order in one transaction, each inside its own
// SAVEPOINT, so a write that fails (a refused condition, a constraint, any error of its own) rolls back its own
// statements only and that failure is its caller's result, while a write that reads then writes (a claim) sees
// the earlier writes of its batch. Every caller gets its own result after COMMIT; a transaction that fails as a
// whole (BEGIN, a statement or COMMIT with SQLITE_BUSY or SQLITE_LOCKED: another process on the file holds the
// lock) is rolled back and retried, writes and all, a few times before it is reported as
// KindUnavailable/CodeStoreUnavailable, and any other failure of the transaction is every write's result: nothing
// is reported applied that did not commit. A lone write runs without a savepoint. Across processes SQLite's busy
// timeout waits for the lock. A write gate on the context (agent.WithWriteGate: a fenced write's claim horizon) is
// asked when the call is made, before every retry of its transaction, and again for each write once the lock is
// held, just before its savepoint; a refused write writes nothing and fails alone. A caller whose context ends
// while its write waits is KindCanceled/CodeCanceled at once and its write is never run; once the writer has taken
// a write into a transaction, its caller waits for that transaction (statements run detached from the callers'
// contexts: the driver interrupts a statement whose context ends, and SQLite may answer that by rolling back the
// whole transaction, the batch's other writes with it). No write runs alone by necessity: none has retry rules
// of its own, and DeleteThread's deletes, the largest write, are one write among others (its size is what the
// byte bound does not count). The schema's migration is the first write of a Store, so it runs alone. Below, a
// write that "is one transaction" is one such write: its statements commit together or not at all.
// Reads run outside transactions; each read is a single statement and so sees one consistent snapshot. A read
// whose caller's context has ended fails with KindCanceled and runs nothing; once started, it runs to its end.
//
// Ownership. The claim lives on the thread row, with the thread's epoch and its message counter (next_seq): a
// claim is one transaction that checks owner and claim, reserves positions from the counter (starting above the
// highest stored message, so files of version 1 and messages written without a claim never collide) and
// records the run with the claim it took over, so a retried claim returns the same result. FinishRun and
// ReleaseClaim release the claim and add usage in one UPDATE of the thread row, so usage is counted by the write
// that releases and by no other. DeleteThread is one transaction: its claim check and every delete commit
// together, so no reader ever sees a half-deleted (tombstoned) thread, and CodeThreadDeleting never comes from
// this store.
//
// Interrupts. One row each, keyed (thread_id, id). CreateInterrupt checks the thread row and inserts (ON CONFLICT DO
// NOTHING) in one transaction, so an interrupt never outlives its thread; ResolveInterrupt is one UPDATE whose
// WHERE is status = 'pending' (the compare-and-set), and reads the row back in the same transaction when it
// matched nothing. The reaper's ListExpiredInterrupts reads the partial index interrupts_pending, which holds only
// pending rows by expiry: a resolve takes its row out of the index in the same statement, so the list is exact.
// Input and response are kept as given, byte for byte.
//
// Jobs and the queue (version 4). A job is one row keyed (thread_id, id); CreateJob checks the thread and inserts
// (ON CONFLICT DO NOTHING) in one transaction, and FinishJob, SetJobActivity and MarkJobDelivered are each one
// UPDATE whose WHERE is the compare-and-set (finished_at IS NULL; finished and not delivered), reading the row back
// in the same transaction when it matched nothing. ListDueJobs reads the partial index jobs_due (undelivered jobs
// by due_at); the delivery takes the row out of it. A queue entry is one row keyed (thread_id, message_id), its
// message kept like a stored one. Enqueue is one transaction: thread check, lazy removal of the thread's taken
// entries past expires_at, the stored entry if the id has one, the bound (a count of queued rows, so exact here),
// the next seq from threads.queue_seq (only Enqueue advances it; it survives every entry's removal) and the
// insert. TakeQueued is one UPDATE from queued; ListQueuedThreads reads the partial index queue_waiting (queued
// rows by created_at). DeleteThread removes both with everything else.
//
// Limits (version 5). A lease is one row of leases keyed (scope, holder) with its expiry; AcquireLease is one
// transaction (extend the holder's live row; else count the scope's live rows and, with room, purge its expired
// rows and insert), so of concurrent acquirers exactly the limit win. A counter window is one row of counters
// keyed (scope, window_start); Count is one transaction that refuses at the limit and drops older windows.
//
// Fencing. Each message row keeps its last writer's run id and epoch, whether that writer finalized it, and
// whether it is deleted; PutMessage and DeleteMessage are one upsert or update whose condition compares those
// with the write's fence (see putMessageSQL). A deleted message keeps its row (content dropped) so a late writer
// cannot bring it back; the rows go with DeleteThread.
//
// Cost. A heartbeat is one UPDATE of one thread row that sets only claim_heartbeat_at, which no index holds: the
// claimed-threads index (the reaper's work list) is keyed by thread id, so heartbeats write one table page and no
// index entry (TestHeartbeatWritesNoIndex). The price is paid by ListStaleClaims, which reads the row of every
// claimed thread (as many as there are runs in flight) to compare heartbeats.
// A write transaction has a fixed cost (BEGIN, COMMIT and the WAL frames of the pages it wrote, whatever it wrote
// in them) that group commit pays once per batch: under load (many runs streaming in one process, each appending a
// segment twice a second and heartbeating once a second) a transaction carries many writes, so a heartbeat waits
// for at most the batch in progress and its own, never for a queue of single transactions
// (BenchmarkParallelWrites: tx/op). Each write of a batch adds two statements SQLite runs but Statements does
// not count, SAVEPOINT and RELEASE, as it does not count BEGIN and COMMIT; Transactions counts transactions.
// Since one goroutine runs every write, the CPU a write costs it bounds the Store's write throughput: every write
// statement with arguments (all of them but the schema's) runs prepared, parsed once on the writer's connection
// (up to maxPrepared statements), which halves a heartbeat's cost there; so does every read with arguments (another
// maxPrepared at most), outside the writer.
//
// Storage. Times are unix milliseconds (INTEGER) and come back as UTC times with millisecond precision; a zero
// FinishedAt is NULL. A message's parts are kept as one JSON array (TEXT) whose elements are the parts' bytes as
// given, so every part round-trips byte for byte; only whitespace around a whole part is dropped. A part or
// metadata that is not valid JSON is refused with KindInvalid/CodeInvalidMessage. Metadata, segment data and
// values are kept as given. Expired segments are skipped on read and deleted when a run appends its first
// segment (seq 0).
//
// Durability: synchronous=NORMAL in WAL mode survives a killed process (kill -9) but may lose the last
// transactions on power loss, which is the right trade for a development store.
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/agentloop/agentloop/lib/agent"
)

const (
	// busyTimeout is how long SQLite itself waits for another connection's lock before a statement fails with
	// SQLITE_BUSY.
	busyTimeout = 5 * time.Second
	// busyAttempts bounds how often a write transaction that failed with SQLITE_BUSY/LOCKED is tried in all.
	busyAttempts = 5
	// maxOpenConns bounds the connection pool; writes use one connection at a time anyway.
	maxOpenConns = 8
)

// Store is an agent.Store on one SQLite file. It is safe for concurrent use by many goroutines, and several Stores
// (in one process or in several) may share the same file.
type Store struct {
	db   *sql.DB
	path string

	// The write queue (batch.go): callers append under wmu and wake the writer goroutine, which takes batches
	// from the head; wquit stops it, wdone is closed when it has returned.
	wmu     sync.Mutex
	wq      []*writeReq
	wclosed bool
	wake    chan struct{}
	wquit   chan struct{}
	wdone   chan struct{}
	hooks   testHooks
	opts    Options
	// wconn is the writer's connection and prepared the write statements prepared on it once (batch.go); only
	// the writer uses them.
	wconn    *sql.Conn
	prepared map[string]*sql.Stmt
	// reads holds the read statements prepared once (readStmt), for any goroutine, under rmu; rclosed is set by
	// Close.
	rmu     sync.Mutex
	reads   map[string]*sql.Stmt
	rclosed bool

	ops   atomic.Int64
	stmts atomic.Int64
	txs   atomic.Int64
}

var _ agent.Store = (*Store)(nil)

// Options are a Store's group-commit bounds; a zero field means its default.
type Options struct {
	BatchWrites int // DefaultBatchWrites: the writes one transaction runs at most
	BatchBytes  int // DefaultBatchBytes: the bytes one transaction's writes bind, past which the rest wait
}

// Open opens (creating it and its parent directory if needed) the SQLite file at path and applies the schema,
// with the default Options.
func Open(ctx context.Context, path string) (*Store, error) { return OpenWith(ctx, path, Options{}) }

// OpenWith is Open with the given Options.
func OpenWith(ctx context.Context, path string, o Options) (*Store, error) {
	return open(ctx, path, busyTimeout, o)
}

// Options reports the Store's group-commit bounds, defaults filled in.
func (s *Store) Options() Options { return s.opts }

// open is OpenWith with SQLite's busy timeout as a parameter (tests shorten it).
func open(ctx context.Context, path string, busy time.Duration, o Options) (*Store, error) {
	o.BatchWrites = cmp.Or(o.BatchWrites, DefaultBatchWrites)
	o.BatchBytes = cmp.Or(o.BatchBytes, DefaultBatchBytes)
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "sqlite: resolve path")
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "sqlite: create data directory")
	}
	db, err := sql.Open("sqlite", dsn(abs, busy))
	if err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "sqlite: open")
	}
	db.SetMaxOpenConns(maxOpenConns)
	db.SetMaxIdleConns(maxOpenConns)
	s := &Store{db: db, path: abs, wake: make(chan struct{}, 1), wquit: make(chan struct{}), wdone: make(chan struct{}),
		prepared: map[string]*sql.Stmt{}, reads: map[string]*sql.Stmt{}, opts: o}
	go s.writer()
	if err := s.migrate(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// dsn builds the driver's connection string: a file: URI (so any path is safe) with the per-connection pragmas and
// BEGIN IMMEDIATE for every read-write transaction.
func dsn(abs string, busy time.Duration) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(OFF)")
	q.Set("_txlock", "immediate")
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}
	return u.String()
}

// Close stops the writer, once the writes already queued have their results, and closes the database. Calls
// made after Close fail.
func (s *Store) Close() error {
	s.wmu.Lock()
	closing := !s.wclosed
	s.wclosed = true
	s.wmu.Unlock()
	if closing {
		close(s.wquit)
	}
	<-s.wdone
	s.wmu.Lock()
	left := s.wq
	s.wq = nil
	s.wmu.Unlock()
	for _, w := range left {
		if w.take() {
			w.finish(errClosed())
		}
	}
	for _, st := range s.prepared {
		_ = st.Close()
	}
	if s.wconn != nil {
		_ = s.wconn.Close()
	}
	s.rmu.Lock()
	s.rclosed = true
	for _, st := range s.reads {
		_ = st.Close()
	}
	s.rmu.Unlock()
	if err := s.db.Close(); err != nil {
		return agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "sqlite: close")
	}
	return nil
}

// Path is the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// Ops counts the agent.Store method calls made on this Store: the unit a DynamoDB store pays a request (or a few)
// for, so benchmarks can report store operations per turn comparably across adapters.
func (s *Store) Ops() int64 { return s.ops.Load() }

// Statements counts the SQL statements this Store executed (every Exec and Query, retries included; BEGIN and
// COMMIT are not counted).
func (s *Store) Statements() int64 { return s.stmts.Load() }

// Transactions counts the write transactions this Store began (every BEGIN IMMEDIATE that took the lock,
// retries included).
func (s *Store) Transactions() int64 { return s.txs.Load() }

// op counts one Store method call.
func (s *Store) op() { s.ops.Add(1) }

// querier is what both *sql.DB and *sql.Tx offer.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// conn runs statements on a querier and counts them.
type conn struct {
	x querier
	n *atomic.Int64
}

// Per-run metering (agent.StoreMeter): every statement run under a context that carries a meter counts as one
// request (SQLite has no request unit; a statement is the nearest), and a statement that changes rows adds one
// write unit per row changed (so WriteUnits are rows written). SQLite has no read units: ReadUnits stay 0.
func (c conn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.n.Add(1)
	res, err := c.x.ExecContext(ctx, query, args...)
	if m := agent.StoreMeterFrom(ctx); m != nil {
		var rows int64
		if err == nil {
			rows, _ = res.RowsAffected()
		}
		m.Add(0, float64(rows))
	}
	return res, err
}

// execN runs a statement and returns how many rows it changed.
func (c conn) execN(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := c.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c conn) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	c.n.Add(1)
	agent.StoreMeterFrom(ctx).Add(0, 0)
	return c.x.QueryContext(ctx, query, args...)
}

func (c conn) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	c.n.Add(1)
	agent.StoreMeterFrom(ctx).Add(0, 0)
	return c.x.QueryRowContext(ctx, query, args...)
}

// read is the connection for reads outside a transaction.
func (s *Store) read() conn { return conn{x: reader{s}, n: &s.stmts} }

// reader runs reads on the pool, prepared: a statement with arguments (every read's but PRAGMA user_version) is
// parsed once per Store and connection (up to maxPrepared of them), as the writes are; parsing was most of a
// turn's read cost (issue 18: ListQueued, GetMessage and a transcript page read per turn, each parsed anew). A
// read whose caller's context has ended fails with the context's error and runs nothing; one that starts runs
// detached from that end, as the writes' statements do: on a context that can end, database/sql and the driver
// each start a goroutine per statement to watch it (two goroutine starts, and as many thread wake-ups on an idle
// process, for a single-row read), and a read is one bounded statement.
type reader struct{ s *Store }

func (r reader) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return r.s.db.ExecContext(ctx, query, args...)
}

func (r reader) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	if st := r.s.readStmt(ctx, query, args); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return r.s.db.QueryContext(ctx, query, args...)
}

func (r reader) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if ctx.Err() != nil {
		return r.s.db.QueryRowContext(ctx, query, args...) // reports the context's end, running nothing
	}
	ctx = context.WithoutCancel(ctx)
	if st := r.s.readStmt(ctx, query, args); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return r.s.db.QueryRowContext(ctx, query, args...)
}

// readStmt is query prepared on the Store (database/sql prepares it on each connection the first time that
// connection runs it), kept for every later read; nil when it has no arguments, cannot be prepared (the caller
// runs it unprepared, and it reports its own error), maxPrepared reads are kept already, or the Store is closed.
// The statement is prepared outside rmu (preparing waits for a connection, which a reader may hold while it
// reads again), detached from the caller's end so that a caller that leaves does not fail it for the others.
func (s *Store) readStmt(ctx context.Context, query string, args []any) *sql.Stmt {
	if len(args) == 0 {
		return nil
	}
	s.rmu.Lock()
	st, ok := s.reads[query]
	full := s.rclosed || len(s.reads) >= maxPrepared
	s.rmu.Unlock()
	if ok || full {
		return st
	}
	st, err := s.db.PrepareContext(context.WithoutCancel(ctx), query)
	if err != nil {
		return nil
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if kept, ok := s.reads[query]; ok || s.rclosed || len(s.reads) >= maxPrepared {
		_ = st.Close() // another reader kept it first, or there is no room
		return kept
	}
	s.reads[query] = st
	return st
}

// write runs fn as one write of this Store: queued for the writer goroutine, run inside its own savepoint of the
// writer's next transaction (batch.go), and answered once that transaction committed. An *agent.Error returned
// by fn (a decision, such as a failed condition) rolls back fn's writes only and is returned as is; a
// transaction that fails with SQLITE_BUSY/LOCKED is rolled back and retried; any other failure is wrapped as
// KindInternal. The context's write gate (agent.MayWrite) is asked here, before every retry of the transaction,
// and again once BEGIN IMMEDIATE holds the lock (it may have waited up to the busy timeout for it, and the
// batches before it for their turn), just before fn's savepoint: a refused write writes nothing, and the call
// fails with the gate's error as KindUnavailable, not retried (fence E, as the DynamoDB client's Finalize
// middleware does before every SDK attempt). A caller whose context ends before its write is taken into a
// transaction gets KindCanceled and its write is not run; once taken, the call waits for its transaction.
func (s *Store) write(ctx context.Context, op string, fn func(c conn) error) error {
	// The gate, then the context: a run whose claim fell in doubt usually has both its gate closed and its
	// context canceled, and the select below picks at random among ready cases, so asking it first keeps the
	// same refused write failing the same way (the simulation's TestReplayIsExact/seed27 saw both in two plays
	// of one schedule when it did not).
	if err := agent.MayWrite(ctx); err != nil {
		return s.result(op, gateRefused{err})
	}
	if err := ctx.Err(); err != nil {
		return s.fail(op, err)
	}
	w := &writeReq{ctx: ctx, fn: fn, done: make(chan struct{})}
	if err := s.enqueue(w); err != nil {
		return err
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		if w.state.CompareAndSwap(writePending, writeCanceled) {
			return s.fail(op, ctx.Err())
		}
		<-w.done // taken: its transaction is under way
	}
	return s.result(op, w.err)
}

// result is the error a write call returns for its write's result.
func (s *Store) result(op string, err error) error {
	if err == nil {
		return nil
	}
	var g gateRefused
	if errors.As(err, &g) {
		return agent.Wrap(g.err, agent.KindUnavailable, agent.CodeStoreUnavailable, "sqlite: "+op+": write gate: attempt not sent")
	}
	return s.fail(op, err)
}

// gateRefused is an attempt the write gate refused (nothing was written).
type gateRefused struct{ err error }

func (g gateRefused) Error() string { return "write gate: " + g.err.Error() }
func (g gateRefused) Unwrap() error { return g.err }

// fail turns a database failure into an *agent.Error (an *agent.Error passes through unchanged).
func (s *Store) fail(op string, err error) error {
	var ae *agent.Error
	switch {
	case errors.As(err, &ae):
		return err
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return agent.Wrap(err, agent.KindCanceled, agent.CodeCanceled, "sqlite: "+op)
	case isBusy(err):
		return agent.Wrap(err, agent.KindUnavailable, agent.CodeStoreUnavailable, "sqlite: "+op)
	default:
		return agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "sqlite: "+op)
	}
}

func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// Times are stored as unix milliseconds and read back in UTC.

func millis(t time.Time) int64 { return t.UnixMilli() }

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// nullMillis stores the zero time as NULL.
func nullMillis(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

func fromNullMillis(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMillis(v.Int64)
}

// scanner is *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }
