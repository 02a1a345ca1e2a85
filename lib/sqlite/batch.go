package sqlite

// Group commit: every write of a Store goes through one writer goroutine, which runs the writes that queued while
// its previous transaction ran together in its next one (see the package doc, Concurrency).

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

const (
	// DefaultBatchWrites bounds how many writes share one transaction (Options.BatchWrites,
	// AGENT_SQLITE_BATCH_WRITES).
	DefaultBatchWrites = 128
	// DefaultBatchBytes bounds the bytes a transaction's writes bind (their string and blob arguments): once a
	// batch has bound this much, its remaining writes wait for the next transaction. One write larger than this
	// still runs (alone at the head of its batch). Options.BatchBytes, AGENT_SQLITE_BATCH_BYTES.
	DefaultBatchBytes = 1 << 20
	// maxPrepared bounds how many write statements a Store keeps prepared (batchTx.stmt); past it, a new
	// statement is parsed each time it runs, as a read is. The package's writes use a few dozen.
	maxPrepared = 128
)

// A writeReq is one write call, from the queue until its result.
type writeReq struct {
	ctx context.Context // the caller's: its gate, its meter, its end
	fn  func(c conn) error
	// state is writePending while the caller may still leave, writeTaken while the writer decides the write (the
	// caller then waits for done), writeCanceled once the caller left: the write is never run.
	state atomic.Int32
	err   error // the result, set by the writer before it closes done
	done  chan struct{}
}

// The states of a writeReq.
const (
	writePending int32 = iota
	writeTaken
	writeCanceled
)

// take moves a pending write to the writer; false means its caller already left.
func (w *writeReq) take() bool { return w.state.CompareAndSwap(writePending, writeTaken) }

// finish reports err to the write's caller (the write must be taken).
func (w *writeReq) finish(err error) {
	w.err = err
	close(w.done)
}

// testHooks are seams for this package's tests; the zero value does nothing.
type testHooks struct {
	// queued is called by a caller once its write is in the queue, with the queue's length.
	queued func(n int)
	// commit is called before each COMMIT; an error fails that COMMIT as SQLite's own would (the transaction is
	// rolled back; a busy error is retried).
	commit func() error
}

// errClosed is the result of a write made after Close (or still queued when Close stopped the writer).
func errClosed() error {
	return agent.E(agent.KindInternal, agent.CodeInternal, "sqlite: the store is closed")
}

// enqueue puts w at the end of the queue and wakes the writer.
func (s *Store) enqueue(w *writeReq) error {
	s.wmu.Lock()
	if s.wclosed {
		s.wmu.Unlock()
		return errClosed()
	}
	s.wq = append(s.wq, w)
	n, queued := len(s.wq), s.hooks.queued
	s.wmu.Unlock()
	if queued != nil {
		queued(n)
	}
	select {
	case s.wake <- struct{}{}:
	default: // a wake is already pending
	}
	return nil
}

// nextBatch takes up to the batch's write bound (Options.BatchWrites) from the head of the queue.
func (s *Store) nextBatch() []*writeReq {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	n := min(len(s.wq), s.opts.BatchWrites)
	batch := s.wq[:n:n]
	s.wq = s.wq[n:]
	if len(s.wq) == 0 {
		s.wq = nil
	}
	return batch
}

// requeue puts writes a batch had no room for back at the head of the queue, in order.
func (s *Store) requeue(ws []*writeReq) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wq = append(ws[:len(ws):len(ws)], s.wq...)
}

// writer is the Store's writer goroutine: it runs batches until the queue is empty, then waits for a wake; it
// returns on Close.
func (s *Store) writer() {
	defer close(s.wdone)
	for {
		select {
		case <-s.wake:
		case <-s.wquit:
			return
		}
		for batch := s.nextBatch(); len(batch) > 0; batch = s.nextBatch() {
			if rest := s.commitBatch(batch); len(rest) > 0 {
				s.requeue(rest)
			}
		}
	}
}

// commitBatch runs batch in one transaction, retried as a whole (up to busyAttempts in all) when BEGIN, a
// statement or COMMIT fails with SQLITE_BUSY/LOCKED, and reports each write's own result once COMMIT succeeded.
// Any other failure of the transaction is every write's result: nothing is reported applied that did not
// commit. It returns the writes the batch's byte bound left for the next transaction (untaken).
func (s *Store) commitBatch(batch []*writeReq) []*writeReq {
	live := batch
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			// Before every attempt after the first (the caller asked before its first), as before each attempt of
			// a single write: the gate, then the context.
			live = s.prune(live)
			if len(live) == 0 {
				return nil
			}
		}
		ran, rest, err := s.attempt(live)
		if err == nil {
			for _, w := range ran {
				close(w.done)
			}
			return rest
		}
		for _, w := range ran {
			w.state.Store(writePending) // nothing of it was kept: it is again a write its caller may leave
		}
		if !isBusy(err) || attempt == busyAttempts {
			s.failAll(live, err)
			return nil
		}
		// Back off a little more each time; another process holds the write lock.
		timer := time.NewTimer(time.Duration(attempt*attempt) * 10 * time.Millisecond)
		select {
		case <-s.wquit:
			timer.Stop()
			s.failAll(live, errClosed())
			return nil
		case <-timer.C:
		}
	}
}

// prune drops the writes whose callers left, and finishes those whose gate refuses or whose context ended.
func (s *Store) prune(live []*writeReq) []*writeReq {
	out := live[:0]
	for _, w := range live {
		if w.state.Load() == writeCanceled {
			continue
		}
		err := agent.MayWrite(w.ctx)
		if err != nil {
			err = gateRefused{err}
		} else {
			err = w.ctx.Err()
		}
		if err != nil {
			if w.take() {
				w.finish(err)
			}
			continue
		}
		out = append(out, w)
	}
	return out
}

// failAll reports err to every write of live whose caller is still waiting.
func (s *Store) failAll(live []*writeReq, err error) {
	for _, w := range live {
		if w.take() {
			w.finish(err)
		}
	}
}

// attempt is one transaction over live: BEGIN IMMEDIATE, each write in its own savepoint, COMMIT. A write's own
// failure (a refused condition, a constraint, its gate, its context) rolls back its savepoint only and is its
// result (in w.err); ran are the writes taken, rest those the byte bound left for the next transaction. A
// non-nil error is the transaction's own: it was rolled back, and no write of it applied.
//
// The transaction runs on the writer's own connection (writeConn) with BEGIN IMMEDIATE, COMMIT and ROLLBACK as
// statements, not through a database/sql Tx: a Tx watches its context with a goroutine of its own, and every
// query in it with another (issue 18 item 2: about nine goroutine starts per turn, each waking an idle thread).
func (s *Store) attempt(live []*writeReq) (ran, rest []*writeReq, err error) {
	ctx := context.Background() // the transaction is every write's, so no caller's end may end it
	c, err := s.writeConn(ctx)
	if err != nil {
		return nil, nil, err
	}
	if _, err := c.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		if !isBusy(err) {
			s.dropWriteConn() // no transaction is open after a busy BEGIN; after anything else, trust nothing
		}
		return nil, nil, err
	}
	s.txs.Add(1)
	// A write alone needs no savepoint: the transaction is its own, and its failure rolls the transaction back.
	alone := len(live) == 1
	b := &batchTx{s: s, c: c}
	for i, w := range live {
		if b.bound >= int64(s.opts.BatchBytes) && len(ran) > 0 {
			rest = live[i:]
			break
		}
		if !w.take() {
			continue // its caller left before the lock was ours
		}
		ran = append(ran, w)
		var txErr error
		w.err, txErr = b.runOne(ctx, w, !alone)
		if txErr != nil {
			s.rollback(ctx)
			return ran, nil, txErr
		}
		if alone && w.err != nil {
			s.rollback(ctx)
			return ran, nil, nil
		}
	}
	if s.hooks.commit != nil {
		if err := s.hooks.commit(); err != nil {
			s.rollback(ctx)
			return ran, nil, err
		}
	}
	if _, err := c.ExecContext(ctx, `COMMIT`); err != nil {
		s.rollback(ctx) // a COMMIT that failed (SQLITE_BUSY) leaves the transaction open
		return ran, nil, err
	}
	return ran, rest, nil
}

// writeConn is the writer's connection, taken from the pool on first use and kept (only the writer goroutine
// uses it, and Close once the writer has returned).
func (s *Store) writeConn(ctx context.Context) (*sql.Conn, error) {
	if s.wconn == nil {
		c, err := s.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		s.wconn = c
	}
	return s.wconn, nil
}

// rollback ends the open transaction without its writes. When ROLLBACK itself fails (SQLite may have rolled the
// transaction back already, or the connection failed), the connection is dropped: none that might still hold a
// transaction goes back to the pool.
func (s *Store) rollback(ctx context.Context) {
	if _, err := s.wconn.ExecContext(ctx, `ROLLBACK`); err != nil {
		s.dropWriteConn()
	}
}

// dropWriteConn closes the writer's connection for good (the pool opens another when the writer next needs
// one), with the statements prepared on it.
func (s *Store) dropWriteConn() {
	for q, st := range s.prepared {
		if st != nil {
			_ = st.Close()
		}
		delete(s.prepared, q)
	}
	_ = s.wconn.Raw(func(any) error { return driver.ErrBadConn }) // database/sql closes a conn that answers this
	_ = s.wconn.Close()
	s.wconn = nil
}

// runOne runs one taken write inside the open transaction: the gate and the context are asked once the lock is
// held, just before its savepoint (a refused write writes nothing), then fn runs between SAVEPOINT and RELEASE,
// or ROLLBACK TO when it fails (without savepoint, the caller rolls the transaction back when werr is set). werr
// is the write's result; txErr a failure that spoils the whole transaction (SQLITE_BUSY/LOCKED, as a single
// transaction's is retried, or a savepoint SQLite could not roll back because it already rolled the transaction
// back).
func (b *batchTx) runOne(ctx context.Context, w *writeReq, savepoint bool) (werr, txErr error) {
	if err := agent.MayWrite(w.ctx); err != nil {
		return gateRefused{err}, nil
	}
	if err := w.ctx.Err(); err != nil {
		return err, nil
	}
	if savepoint {
		if err := b.exec(ctx, `SAVEPOINT w`); err != nil {
			return nil, err
		}
	}
	err := w.fn(conn{x: b, n: &b.s.stmts})
	if isBusy(err) {
		return nil, err
	}
	if !savepoint {
		return err, nil
	}
	if err == nil {
		if err := b.exec(ctx, `RELEASE w`); err != nil {
			return nil, err
		}
		return nil, nil
	}
	for _, stmt := range []string{`ROLLBACK TO w`, `RELEASE w`} {
		if rerr := b.exec(ctx, stmt); rerr != nil {
			return nil, fmt.Errorf("%s: %w (after the write failed: %v)", stmt, rerr, err)
		}
	}
	return err, nil
}

// batchTx is a batch's transaction as its writes see it (their conn's querier). Every statement counts the bytes
// it binds towards Options.BatchBytes and runs detached from its caller's end: the driver interrupts a statement
// whose context ends, and SQLite may answer an interrupted write by rolling back the whole transaction, every other
// write of the batch with it (a caller whose context ended before its write ran never gets this far: runOne asks
// first); the context's values, such as the caller's meter, are kept. A statement with arguments (every write's:
// the schema's statements have none) runs prepared, parsed once on the writer's connection.
type batchTx struct {
	s     *Store
	c     *sql.Conn
	bound int64
}

func (b *batchTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	ctx, st := b.enter(ctx, query, args)
	if st != nil {
		return st.ExecContext(ctx, args...)
	}
	return b.c.ExecContext(ctx, query, args...)
}

func (b *batchTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ctx, st := b.enter(ctx, query, args)
	if st != nil {
		return st.QueryContext(ctx, args...)
	}
	return b.c.QueryContext(ctx, query, args...)
}

func (b *batchTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	ctx, st := b.enter(ctx, query, args)
	if st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return b.c.QueryRowContext(ctx, query, args...)
}

// enter counts a statement's bound bytes and returns the context it runs under and, when it has arguments, its
// prepared form in this transaction (nil: run it unprepared).
func (b *batchTx) enter(ctx context.Context, query string, args []any) (context.Context, *sql.Stmt) {
	for _, a := range args {
		switch v := a.(type) {
		case string:
			b.bound += int64(len(v))
		case []byte:
			b.bound += int64(len(v))
		}
	}
	ctx = context.WithoutCancel(ctx)
	if len(args) == 0 {
		return ctx, nil
	}
	return ctx, b.stmt(ctx, query)
}

// stmt is query prepared on the writer's connection, once (up to maxPrepared statements). nil when query cannot
// be prepared (or there is no room): the caller runs it unprepared, and it reports its own error.
func (b *batchTx) stmt(ctx context.Context, query string) *sql.Stmt {
	p, ok := b.s.prepared[query]
	if !ok {
		if len(b.s.prepared) >= maxPrepared {
			return nil
		}
		var err error
		if p, err = b.c.PrepareContext(ctx, query); err != nil {
			return nil
		}
		b.s.prepared[query] = p
	}
	return p
}

// exec runs one of the batch's own statements (SAVEPOINT, RELEASE, ROLLBACK TO), prepared.
func (b *batchTx) exec(ctx context.Context, query string) error {
	if st := b.stmt(ctx, query); st != nil {
		_, err := st.ExecContext(ctx)
		return err
	}
	_, err := b.c.ExecContext(ctx, query)
	return err
}
