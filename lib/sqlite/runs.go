package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

const runCols = `thread_id, id, trigger, status, error, usage_input, usage_output, usage_total, usage_cached,
	steps, model, assistant_message_id, epoch, created_at, updated_at, finished_at, first_seq, reserved`

// runReadCols are runCols and the columns of version 5 (ClaimRun's insert leaves them to their defaults).
const runReadCols = runCols + `, usage_reasoning, usage_cost, store, late_usage, usage_cache_write,
	signal_status, signal_owner, signal_attempts, signal_due`

func scanRun(sc scanner) (agent.Run, error) {
	var (
		r                agent.Run
		runErr           sql.NullString
		created, updated int64
		finished         sql.NullInt64
		store, late      sql.NullString
		sigStatus        sql.NullString
		sigOwner         string
		sigAttempts      int
		sigDue           sql.NullInt64
	)
	err := sc.Scan(&r.ThreadID, &r.ID, &r.Trigger, &r.Status, &runErr,
		&r.Usage.InputTokens, &r.Usage.OutputTokens, &r.Usage.TotalTokens, &r.Usage.CachedInputTokens,
		&r.Steps, &r.Model, &r.AssistantMessageID, &r.Epoch, &created, &updated, &finished, &r.FirstSeq, &r.Reserved,
		&r.Usage.ReasoningTokens, &r.Usage.CostMicroUSD, &store, &late, &r.Usage.CacheWriteTokens,
		&sigStatus, &sigOwner, &sigAttempts, &sigDue)
	if err != nil {
		return agent.Run{}, err
	}
	if sigStatus.Valid {
		r.Signal = &agent.RunSignal{Status: agent.SignalStatus(sigStatus.String), Owner: sigOwner, Attempts: sigAttempts,
			DueAt: fromNullMillis(sigDue)}
	}
	if r.Status == agent.RunRunning && r.Usage != (agent.Usage{}) {
		// A running run's usage columns hold what a ReleaseClaim naming it added to the thread (releaseRun).
		u := r.Usage
		r.Released, r.Usage = &u, agent.Usage{}
	}
	if store.Valid {
		r.Store = &agent.StoreUsage{}
		if err := json.Unmarshal([]byte(store.String), r.Store); err != nil {
			return agent.Run{}, err
		}
	}
	if late.Valid {
		r.LateUsage = &agent.Usage{}
		if err := json.Unmarshal([]byte(late.String), r.LateUsage); err != nil {
			return agent.Run{}, err
		}
	}
	if runErr.Valid {
		r.Error = &agent.RunError{}
		if err := json.Unmarshal([]byte(runErr.String), r.Error); err != nil {
			return agent.Run{}, err
		}
	}
	r.CreatedAt = fromMillis(created)
	r.UpdatedAt = fromMillis(updated)
	r.FinishedAt = fromNullMillis(finished)
	return r, nil
}

func runNotFound(id string) error {
	return agent.E(agent.KindNotFound, agent.CodeRunNotFound, "run %q not found", id)
}

func fenced(f agent.Fence) error {
	return agent.E(agent.KindConflict, agent.CodeRunFenced, "run %q at epoch %d no longer holds the thread", f.RunID, f.Epoch)
}

// claimRow is what a claim decision reads from the thread row.
type claimRow struct {
	owner string
	epoch int64
	// nextSeq is the first message position a claim may reserve: the thread's counter, or above its highest
	// stored message if that is higher (messages written without a claim, files migrated from version 1).
	nextSeq int64
	claim   *agent.Claim
}

// readClaim reads a thread's epoch, message counter and claim inside a transaction, in one statement.
func readClaim(ctx context.Context, c conn, threadID string) (claimRow, error) {
	var (
		row        claimRow
		maxSeq     sql.NullInt64
		runID      sql.NullString
		claimEpoch sql.NullInt64
		hb         sql.NullInt64
		readers    sql.NullInt64
		cancel     bool
	)
	err := c.queryRow(ctx, `SELECT owner, epoch, next_seq, (SELECT max(seq) FROM messages WHERE thread_id = threads.id),
		claim_run_id, claim_epoch, claim_heartbeat_at, claim_cancel, claim_readers_until
		FROM threads WHERE id = ?`, threadID).Scan(&row.owner, &row.epoch, &row.nextSeq, &maxSeq, &runID, &claimEpoch,
		&hb, &cancel, &readers)
	if errors.Is(err, sql.ErrNoRows) {
		return claimRow{}, threadNotFound(threadID)
	}
	if err != nil {
		return claimRow{}, err
	}
	if maxSeq.Valid && maxSeq.Int64 >= row.nextSeq {
		row.nextSeq = maxSeq.Int64 + 1
	}
	if runID.Valid {
		row.claim = &agent.Claim{RunID: runID.String, Epoch: claimEpoch.Int64, HeartbeatAt: fromNullMillis(hb),
			CancelRequested: cancel, ReadersUntil: fromNullMillis(readers)}
	}
	return row, nil
}

// ClaimRun makes req.RunID the thread's active run when the thread is idle or its claim is stale (never when
// req.StaleAfter <= 0), and reserves req.Reserve message positions (at least one) from the thread's counter, in
// one transaction. A thread req.Owner does not own is not found, like a missing one. A claim whose RunID already
// holds the thread is a retry and gets the stored result back (with the thread as it is now). A run id already
// recorded on the thread that does not hold it (finished, or taken over) is refused with KindConflict/CodeRunFenced:
// run ids are never reused, and a late retry of a claim that has since lost the thread must not start it again.
func (s *Store) ClaimRun(ctx context.Context, req agent.ClaimRequest) (agent.ClaimResult, error) {
	s.op()
	if req.ThreadID == "" {
		return agent.ClaimResult{}, agent.E(agent.KindInvalid, agent.CodeInvalidThreadID, "claim needs a thread id")
	}
	if req.RunID == "" {
		return agent.ClaimResult{}, agent.E(agent.KindInvalid, agent.CodeInvalidRunID, "claim needs a run id")
	}
	var res agent.ClaimResult
	err := s.write(ctx, "claim run", func(c conn) error {
		row, err := readClaim(ctx, c, req.ThreadID)
		if err != nil {
			return err
		}
		if row.owner != req.Owner {
			return threadNotFound(req.ThreadID)
		}
		if row.claim != nil && row.claim.RunID == req.RunID {
			res, err = readClaimResult(ctx, c, req.ThreadID, req.RunID)
			return err
		}
		if row.claim != nil && (req.StaleAfter <= 0 || !row.claim.Stale(req.Now, req.StaleAfter)) {
			return agent.E(agent.KindConflict, agent.CodeRunActive, "thread %q is running %q", req.ThreadID, row.claim.RunID)
		}
		epoch := row.epoch + 1
		reserve := max(req.Reserve, 1)
		now := millis(req.Now)
		var previous any
		if row.claim != nil {
			b, err := json.Marshal(row.claim)
			if err != nil {
				return err
			}
			previous = string(b)
		}
		n, err := c.execN(ctx, `INSERT INTO runs (`+runCols+`, previous)
			VALUES (?, ?, ?, ?, NULL, 0, 0, 0, 0, 0, '', ?, ?, ?, ?, NULL, ?, ?, ?) ON CONFLICT DO NOTHING`,
			req.ThreadID, req.RunID, string(req.Trigger), string(agent.RunRunning), req.AssistantMessageID,
			epoch, now, now, row.nextSeq, reserve, previous)
		if err != nil {
			return err
		}
		if n == 0 {
			return agent.E(agent.KindConflict, agent.CodeRunFenced, "run %q was claimed before and no longer holds thread %q",
				req.RunID, req.ThreadID)
		}
		th, err := scanThread(c.queryRow(ctx, `UPDATE threads SET epoch = ?, claim_run_id = ?, claim_epoch = ?,
			claim_heartbeat_at = ?, claim_cancel = 0, claim_readers_until = NULL, next_seq = ? WHERE id = ? RETURNING `+threadScanCols,
			epoch, req.RunID, epoch, now, row.nextSeq+int64(reserve), req.ThreadID))
		if err != nil {
			return err
		}
		res = agent.ClaimResult{
			Thread: th,
			Run: agent.Run{
				ID: req.RunID, ThreadID: req.ThreadID, Trigger: req.Trigger, Status: agent.RunRunning,
				AssistantMessageID: req.AssistantMessageID, UserMessageID: req.UserMessageID, Epoch: epoch, FirstSeq: row.nextSeq, Reserved: reserve,
				CreatedAt: fromMillis(now), UpdatedAt: fromMillis(now),
			},
			Previous: row.claim,
		}
		return nil
	})
	if err != nil {
		return agent.ClaimResult{}, err
	}
	return res, nil
}

// readClaimResult rebuilds the result of a claim that already applied from its run row.
func readClaimResult(ctx context.Context, c conn, threadID, runID string) (agent.ClaimResult, error) {
	var previous sql.NullString
	run, err := scanRun(scanFunc(func(dest ...any) error {
		return c.queryRow(ctx, `SELECT `+runReadCols+`, previous FROM runs WHERE thread_id = ? AND id = ?`,
			threadID, runID).Scan(append(dest, &previous)...)
	}))
	if errors.Is(err, sql.ErrNoRows) {
		// ClaimRun writes the claim and its run row in one transaction; a claim without its row was stored as
		// given by CreateThread, or the file is damaged. Either way there is no result to repeat.
		return agent.ClaimResult{}, agent.E(agent.KindInternal, agent.CodeStoreCorrupt,
			"thread %q is claimed by %q, which has no run row", threadID, runID)
	}
	if err != nil {
		return agent.ClaimResult{}, err
	}
	th, err := scanThread(c.queryRow(ctx, `SELECT `+threadScanCols+` FROM threads WHERE id = ?`, threadID))
	if err != nil {
		return agent.ClaimResult{}, err
	}
	res := agent.ClaimResult{Run: run, Thread: th}
	if previous.Valid {
		res.Previous = &agent.Claim{}
		if err := json.Unmarshal([]byte(previous.String), res.Previous); err != nil {
			return agent.ClaimResult{}, err
		}
	}
	return res, nil
}

// scanFunc adapts a function to scanner, so one scan function can read a row with extra trailing columns.
type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }

// heartbeatSQL is the whole heartbeat: one UPDATE of one thread row. It sets only claim_heartbeat_at, which no
// index contains (threads_claimed is keyed by id and filtered on claim_run_id), so it writes one table b-tree
// page and no index page; TestHeartbeatWritesNoIndex pins that. A cancel request is not a fence (REVIEW D2): the
// row's claim_cancel comes back to tell the run it was asked to stop.
const heartbeatSQL = `UPDATE threads SET claim_heartbeat_at = ?
	WHERE id = ? AND claim_run_id = ? AND claim_epoch = ? RETURNING claim_cancel`

// Heartbeat refreshes the claim's heartbeat if the claim still names f.RunID at f.Epoch, also when a cancel was
// requested (then KindCanceled/CodeRunCanceled, the heartbeat recorded). A deleted thread fences its run like a
// lost claim does.
func (s *Store) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	s.op()
	var cancel bool
	err := s.write(ctx, "heartbeat", func(c conn) error {
		err := c.queryRow(ctx, heartbeatSQL, millis(now), threadID, f.RunID, f.Epoch).Scan(&cancel)
		if errors.Is(err, sql.ErrNoRows) {
			return fenced(f) // the claim is gone, or the thread was deleted under the run
		}
		if err == nil {
			agent.StoreMeterFrom(ctx).Add(0, 1) // the row written (queryRow meters a request only)
		}
		return err
	})
	if err == nil && cancel {
		return agent.E(agent.KindCanceled, agent.CodeRunCanceled, "run %q was asked to stop", f.RunID)
	}
	return err
}

// keepClaimsSQL is a whole KeepClaims batch: one UPDATE over the batch's (thread, run, epoch) triples, passed as
// one JSON array so the statement and its parameter count stay the same whatever the batch's size. It sets only
// claim_heartbeat_at, as heartbeatSQL does (no index page), and returns the rows it wrote with the columns
// GetThread reads. A triple it does not match is a fenced claim: the heartbeat's own condition is the same, and a
// cancel request is no part of it (REVIEW D2: the row comes back with claim_cancel set).
const keepClaimsSQL = `UPDATE threads SET claim_heartbeat_at = ?
	FROM (SELECT value ->> 0 AS keep_id, value ->> 1 AS keep_run, value ->> 2 AS keep_epoch FROM json_each(?)) AS keep
	WHERE threads.id = keep.keep_id AND threads.claim_run_id = keep.keep_run AND threads.claim_epoch = keep.keep_epoch
	RETURNING ` + threadScanCols

// KeepClaims heartbeats a batch of claims in one write transaction of one statement (keepClaimsSQL), whatever the
// batch's size: the process's keeper sends it once per heartbeat period, so the file's write lock is taken once
// per second for all of the process's runs instead of once per run. Each claim's gate is asked once the
// transaction holds the write lock (and again on a retried attempt); a refused claim is left out of the UPDATE.
// A transaction that fails gives its error to every claim the gates let through.
func (s *Store) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	s.op()
	out := make([]agent.KeepResult, len(claims))
	if len(claims) == 0 {
		return out
	}
	type triple struct {
		id, run string
		epoch   int64
	}
	refused := make([]bool, len(claims))
	err := s.write(ctx, "keep claims", func(c conn) error {
		keys := make([][3]any, 0, len(claims))
		for i, k := range claims {
			out[i], refused[i] = agent.KeepResult{}, false
			if k.Gate != nil {
				if err := k.Gate(); err != nil {
					refused[i] = true
					out[i].Err = agent.Wrap(err, agent.KindUnavailable, agent.CodeStoreUnavailable, "sqlite: keep claims: write gate: attempt not sent")
					continue
				}
			}
			keys = append(keys, [3]any{k.ThreadID, k.Fence.RunID, k.Fence.Epoch})
		}
		if len(keys) == 0 {
			return nil
		}
		batch, err := json.Marshal(keys)
		if err != nil {
			return err
		}
		rows, err := c.query(ctx, keepClaimsSQL, millis(now), string(batch))
		if err != nil {
			return err
		}
		kept, err := collect(rows, scanThread)
		if err != nil {
			return err
		}
		agent.StoreMeterFrom(ctx).AddUnits(0, float64(len(kept))) // the rows written (query meters a request only)
		stored := make(map[triple]agent.Claim, len(kept))
		for _, th := range kept {
			if th.ActiveRun != nil {
				stored[triple{th.ID, th.ActiveRun.RunID, th.ActiveRun.Epoch}] = *th.ActiveRun
			}
		}
		for i, k := range claims {
			if refused[i] {
				continue
			}
			claim, ok := stored[triple{k.ThreadID, k.Fence.RunID, k.Fence.Epoch}]
			switch {
			case !ok:
				out[i].Err = fenced(k.Fence) // the claim is gone, or the thread was deleted under the run
			case claim.CancelRequested:
				out[i] = agent.KeepResult{Claim: claim, Err: agent.E(agent.KindCanceled, agent.CodeRunCanceled, "run %q was asked to stop", k.Fence.RunID)}
			default:
				out[i].Claim = claim
			}
		}
		return nil
	})
	if err != nil { // rolled back: nothing was written, and every claim the gates let through has the error
		for i := range out {
			if !refused[i] {
				out[i] = agent.KeepResult{Err: err}
			}
		}
	}
	return out
}

// RequestCancel marks the thread's active claim as cancel-requested and returns it; a repeated request returns
// the same claim. runID, when set, must name the active run. Unknown thread: KindNotFound. now is not recorded
// (the claim has no field for it).
func (s *Store) RequestCancel(ctx context.Context, threadID, runID string, now time.Time) (agent.Claim, error) {
	s.op()
	var out agent.Claim
	err := s.write(ctx, "request cancel", func(c conn) error {
		row, err := readClaim(ctx, c, threadID)
		if err != nil {
			return err
		}
		claim := row.claim
		if claim == nil {
			return agent.E(agent.KindConflict, agent.CodeNoActiveRun, "thread %q has no active run", threadID)
		}
		if runID != "" && claim.RunID != runID {
			return agent.E(agent.KindConflict, agent.CodeNoActiveRun, "run %q is not the active run of thread %q", runID, threadID)
		}
		if !claim.CancelRequested {
			if _, err := c.exec(ctx, `UPDATE threads SET claim_cancel = 1 WHERE id = ?`, threadID); err != nil {
				return err
			}
			claim.CancelRequested = true
		}
		out = *claim
		return nil
	})
	return out, err
}

// markReaderSQL is the whole MarkReader: one UPDATE of one thread row, of a column no index holds.
const markReaderSQL = `UPDATE threads SET claim_readers_until = max(coalesce(claim_readers_until, 0), ?)
	WHERE id = ? AND claim_run_id = ?`

// MarkReader records that a resumed-stream reader of runID stays attached until until (the claim's ReadersUntil
// only grows), while the thread's claim names runID; otherwise KindConflict/CodeNoActiveRun, or KindNotFound for
// an unknown thread, and nothing changes.
func (s *Store) MarkReader(ctx context.Context, threadID, runID string, until time.Time) error {
	s.op()
	return s.write(ctx, "mark reader", func(c conn) error {
		n, err := c.execN(ctx, markReaderSQL, millis(until), threadID, runID)
		if err != nil || n == 1 {
			return err
		}
		var exists bool
		if err := c.queryRow(ctx, `SELECT EXISTS (SELECT 1 FROM threads WHERE id = ?)`, threadID).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return threadNotFound(threadID)
		}
		return agent.E(agent.KindConflict, agent.CodeNoActiveRun, "run %q is not the active run of thread %q", runID, threadID)
	})
}

// readersOfSQL is the whole ReadersOf: one SELECT over the ids, passed as one JSON array (the statement and its
// parameter count stay the same whatever their number), by the primary key.
const readersOfSQL = `SELECT id, claim_run_id, claim_readers_until FROM threads
	WHERE id IN (SELECT value FROM json_each(?)) AND claim_run_id IS NOT NULL`

// ReadersOf reads the reader marks of the threads' claims in one statement (readersOfSQL) outside any
// transaction: it takes no write lock and waits for none (WAL readers see the last commit).
func (s *Store) ReadersOf(ctx context.Context, threadIDs []string) ([]agent.ReaderMark, error) {
	s.op()
	out := make([]agent.ReaderMark, len(threadIDs))
	for i, id := range threadIDs {
		out[i].ThreadID = id
	}
	if len(threadIDs) == 0 {
		return out, nil
	}
	ids, err := json.Marshal(threadIDs)
	if err != nil {
		return nil, s.fail("readers of", err)
	}
	rows, err := s.read().query(ctx, readersOfSQL, string(ids))
	if err != nil {
		return nil, s.fail("readers of", err)
	}
	defer rows.Close()
	marks := make(map[string]agent.ReaderMark, len(threadIDs))
	for rows.Next() {
		var (
			m     agent.ReaderMark
			until sql.NullInt64
		)
		if err := rows.Scan(&m.ThreadID, &m.RunID, &until); err != nil {
			return nil, s.fail("readers of", err)
		}
		m.Until = fromNullMillis(until)
		marks[m.ThreadID] = m
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("readers of", err)
	}
	for i, id := range threadIDs {
		if m, ok := marks[id]; ok {
			out[i] = m
		}
	}
	return out, nil
}

// releaseSQL releases a claim and adds usage in one UPDATE; the caller appends its condition.
const releaseSQL = `UPDATE threads SET usage_input = usage_input + ?, usage_output = usage_output + ?,
	usage_total = usage_total + ?, usage_cached = usage_cached + ?,
	usage_reasoning = usage_reasoning + ?, usage_cost = usage_cost + ?, usage_cache_write = usage_cache_write + ?,
	claim_run_id = NULL, claim_epoch = NULL, claim_heartbeat_at = NULL, claim_cancel = 0, claim_readers_until = NULL,
	updated_at = coalesce(?, updated_at)
	WHERE id = ? AND claim_run_id = ? AND claim_epoch = ?`

func releaseArgs(threadID string, f agent.Fence, u agent.Usage, updated time.Time) []any {
	return []any{u.InputTokens, u.OutputTokens, u.TotalTokens, u.CachedInputTokens, u.ReasoningTokens, u.CostMicroUSD,
		u.CacheWriteTokens, nullMillis(updated),
		threadID, f.RunID, f.Epoch}
}

// releaseRun keeps the usage a release added on the run it names while that run is recorded as running (its usage
// columns are unused until its outcome, which overwrites them): Run.Released. SQLite's own FinishRun releases and
// records in one transaction and never leaves that state; a ReleaseClaim naming a run does (the reaper's release
// names the dead run only after recording its outcome), and readers see it as they would on DynamoDB.
func releaseRun(ctx context.Context, c conn, req agent.ReleaseRequest) error {
	u := req.Usage
	if u == (agent.Usage{}) {
		return nil
	}
	_, err := c.exec(ctx, `UPDATE runs SET usage_input = ?, usage_output = ?, usage_total = ?, usage_cached = ?,
		usage_reasoning = ?, usage_cost = ?, usage_cache_write = ? WHERE thread_id = ? AND id = ? AND status = 'running'`,
		u.InputTokens, u.OutputTokens, u.TotalTokens, u.CachedInputTokens, u.ReasoningTokens, u.CostMicroUSD,
		u.CacheWriteTokens, req.ThreadID, agent.ReapedRunID(req.Fence.RunID))
	return err
}

// FinishRun releases the thread's claim, on condition that it still names the run at its epoch, adding the run's
// usage in that same UPDATE (fence C: the release is the decision), then records the run's outcome by
// compare-and-set from running at run.Epoch, both in one transaction: a refused release is run_fenced and
// changes nothing. The run's UpdatedAt is stored as given (FinishedAt when zero); an unknown run is KindNotFound;
// a non-terminal status is KindInvalid/CodeInvalidStatus.
func (s *Store) FinishRun(ctx context.Context, run agent.Run) error {
	s.op()
	if !run.Status.Terminal() {
		return agent.E(agent.KindInvalid, agent.CodeInvalidStatus, "run %q: status %q is not terminal", run.ID, run.Status)
	}
	return s.write(ctx, "finish run", func(c conn) error {
		n, err := c.execN(ctx, releaseSQL, releaseArgs(run.ThreadID, run.Fence(), run.Usage, run.FinishedAt)...)
		if err != nil {
			return err
		}
		if n == 0 {
			return refused(ctx, c, run)
		}
		return recordOutcome(ctx, c, run)
	})
}

// RecordOutcome is the reaper's write of a dead run's outcome: the compare-and-set of FinishRun without the
// release, checked in the same transaction against the reaper's claim (holder) when one is given (fence F).
func (s *Store) RecordOutcome(ctx context.Context, run agent.Run, holder agent.Fence) error {
	s.op()
	if !run.Status.Terminal() {
		return agent.E(agent.KindInvalid, agent.CodeInvalidStatus, "run %q: status %q is not terminal", run.ID, run.Status)
	}
	return s.write(ctx, "record outcome", func(c conn) error {
		if holder.RunID != "" {
			if err := holds(ctx, c, run.ThreadID, holder); err != nil {
				return err
			}
		}
		return recordOutcome(ctx, c, run)
	})
}

// runExists is nil when the run has a row, else KindNotFound.
func runExists(ctx context.Context, c conn, run agent.Run) error {
	var one int
	err := c.queryRow(ctx, `SELECT 1 FROM runs WHERE thread_id = ? AND id = ?`, run.ThreadID, run.ID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return runNotFound(run.ID)
	}
	return err
}

// holds is fence F: nil when the thread's claim names f, else run_fenced. Writes of a run (messages, its outcome)
// check it inside their own transaction, so nothing a run writes lands once its claim is gone.
// NoteTakes checks, in one read transaction of the write lock, that the thread's claim still names the run at
// its epoch (fence F): every message write checks the claim itself here, so a dead run's take is refused without
// the reaper fencing its ids, and the ids are not kept (agent.Run.Takes stays empty on SQLite).
func (s *Store) NoteTakes(ctx context.Context, run agent.Run, ids []string) error {
	s.op()
	if len(ids) == 0 {
		return nil
	}
	return s.write(ctx, "note takes", func(c conn) error { return holds(ctx, c, run.ThreadID, run.Fence()) })
}

func holds(ctx context.Context, c conn, threadID string, f agent.Fence) error {
	var one int
	err := c.queryRow(ctx, `SELECT 1 FROM threads WHERE id = ? AND claim_run_id = ? AND claim_epoch = ?`,
		threadID, f.RunID, f.Epoch).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fenced(f)
	}
	return err
}

// recordOutcome is the outcome's compare-and-set from running at run.Epoch.
func recordOutcome(ctx context.Context, c conn, run agent.Run) error {
	var runErr any
	if run.Error != nil {
		b, err := json.Marshal(run.Error)
		if err != nil {
			return err
		}
		runErr = string(b)
	}
	var store any
	if run.Store != nil {
		b, err := json.Marshal(run.Store)
		if err != nil {
			return err
		}
		store = string(b)
	}
	// UpdatedAt as given, else the finish time, else left as stored.
	updated := nullMillis(run.UpdatedAt)
	if updated == nil {
		updated = nullMillis(run.FinishedAt)
	}
	// The completion signal, when armed, is stored pending in this same UPDATE (the run item is its outbox).
	var sigStatus, sigDue any
	sigOwner, sigAttempts := "", 0
	if sg := run.Signal; sg != nil {
		sigStatus, sigDue, sigOwner, sigAttempts = string(agent.SignalPending), millis(sg.DueAt), sg.Owner, sg.Attempts
	}
	n, err := c.execN(ctx, `UPDATE runs SET status = ?, error = ?,
		usage_input = ?, usage_output = ?, usage_total = ?, usage_cached = ?, usage_reasoning = ?, usage_cost = ?,
		usage_cache_write = ?, store = ?, steps = ?, model = ?, finished_at = ?, updated_at = coalesce(?, updated_at),
		signal_status = ?, signal_owner = ?, signal_attempts = ?, signal_due = ?
		WHERE thread_id = ? AND id = ? AND status = ? AND epoch = ?`,
		string(run.Status), runErr,
		run.Usage.InputTokens, run.Usage.OutputTokens, run.Usage.TotalTokens, run.Usage.CachedInputTokens,
		run.Usage.ReasoningTokens, run.Usage.CostMicroUSD, run.Usage.CacheWriteTokens, store,
		run.Steps, run.Model, nullMillis(run.FinishedAt), updated,
		sigStatus, sigOwner, sigAttempts, sigDue,
		run.ThreadID, run.ID, string(agent.RunRunning), run.Epoch)
	if err != nil {
		return err
	}
	if n == 0 {
		return refused(ctx, c, run)
	}
	return nil
}

// refused is the error of a run write whose condition matched no row: the run is unknown (KindNotFound), or it
// exists and the write was fenced.
func refused(ctx context.Context, c conn, run agent.Run) error {
	if err := runExists(ctx, c, run); err != nil {
		return err
	}
	return fenced(run.Fence())
}

// TakeOver takes a stale claim (or, with no fence, an idle thread) for the reaper at epoch+1, in one UPDATE.
func (s *Store) TakeOver(ctx context.Context, req agent.TakeRequest) (agent.Fence, error) {
	s.op()
	runID := agent.ReapRunID(req.RunID)
	query := `UPDATE threads SET epoch = epoch + 1, claim_run_id = ?, claim_epoch = epoch + 1, claim_heartbeat_at = ?,
		claim_cancel = 0, claim_readers_until = NULL WHERE id = ? AND `
	args := []any{runID, millis(req.Now), req.ThreadID}
	if req.Fence.RunID == "" {
		query += `claim_run_id IS NULL`
	} else {
		query += `claim_run_id = ? AND claim_epoch = ?`
		args = append(args, req.Fence.RunID, req.Fence.Epoch)
		if !req.StaleBefore.IsZero() {
			query += ` AND claim_heartbeat_at < ?`
			args = append(args, millis(req.StaleBefore))
		}
	}
	var out agent.Fence
	err := s.write(ctx, "take over claim", func(c conn) error {
		var epoch int64
		err := c.queryRow(ctx, query+` RETURNING epoch`, args...).Scan(&epoch)
		if errors.Is(err, sql.ErrNoRows) {
			return fenced(req.Fence)
		}
		if err != nil {
			return err
		}
		out = agent.Fence{RunID: runID, Epoch: epoch}
		return nil
	})
	return out, err
}

// ReleaseClaim releases the claim if it still names req.Fence and its heartbeat is before req.StaleBefore (any
// heartbeat when zero), adding req.Usage and setting the thread's UpdatedAt to req.Now (when set) in the same
// UPDATE. It looks only at the thread row, so a claim whose run row is missing or already terminal is released
// the same way. Anything else, an unknown thread included, is KindConflict/CodeRunFenced.
func (s *Store) ReleaseClaim(ctx context.Context, req agent.ReleaseRequest) error {
	s.op()
	query, args := releaseSQL, releaseArgs(req.ThreadID, req.Fence, req.Usage, req.Now)
	if !req.StaleBefore.IsZero() {
		query += ` AND claim_heartbeat_at < ?`
		args = append(args, millis(req.StaleBefore))
	}
	return s.write(ctx, "release claim", func(c conn) error {
		n, err := c.execN(ctx, query, args...)
		if err != nil {
			return err
		}
		if n == 0 {
			return fenced(req.Fence)
		}
		return releaseRun(ctx, c, req)
	})
}

// ListStaleClaims lists claims whose heartbeat is before before, oldest first. It walks the partial index of
// claimed threads (never the whole table) and compares each claimed row's heartbeat.
func (s *Store) ListStaleClaims(ctx context.Context, before time.Time, limit int) ([]agent.StaleClaim, error) {
	return listBefore(ctx, s, "list stale claims", `SELECT id, claim_run_id, claim_epoch, claim_heartbeat_at, claim_cancel
		FROM threads INDEXED BY threads_claimed
		WHERE claim_run_id IS NOT NULL AND claim_heartbeat_at < ? ORDER BY claim_heartbeat_at, id LIMIT ?`,
		func(r scanner) (agent.StaleClaim, error) {
			var sc agent.StaleClaim
			var hb int64
			err := r.Scan(&sc.ThreadID, &sc.Claim.RunID, &sc.Claim.Epoch, &hb, &sc.Claim.CancelRequested)
			sc.Claim.HeartbeatAt = fromMillis(hb)
			return sc, err
		}, before, limit)
}

// ListOrphanRuns reads the runs_running index (runs recorded as running, by updatedAt) and keeps those whose
// thread's claim does not name them at their epoch: one indexed range read, proportional to the runs in flight.
func (s *Store) ListOrphanRuns(ctx context.Context, before time.Time, limit int) ([]agent.Run, error) {
	return listBefore(ctx, s, "list orphan runs", `SELECT `+runReadCols+` FROM runs INDEXED BY runs_running
		WHERE status = 'running' AND updated_at < ?
		AND NOT EXISTS (SELECT 1 FROM threads t WHERE t.id = runs.thread_id AND t.claim_run_id = runs.id
			AND t.claim_epoch = runs.epoch)
		ORDER BY updated_at, thread_id, id LIMIT ?`, scanRun, before, limit)
}

// GetRun reads one run of a thread.
func (s *Store) GetRun(ctx context.Context, threadID, runID string) (agent.Run, error) {
	s.op()
	r, err := scanRun(s.read().queryRow(ctx, `SELECT `+runReadCols+` FROM runs WHERE thread_id = ? AND id = ?`,
		threadID, runID))
	if errors.Is(err, sql.ErrNoRows) {
		return agent.Run{}, runNotFound(runID)
	}
	if err != nil {
		return agent.Run{}, s.fail("get run", err)
	}
	return r, nil
}

// ListRunsPage reads one page of runs (newest or oldest first) through the runs_by_created index (thread_id, created_at,
// id), LIMIT p.Limit+1.
func (s *Store) ListRunsPage(ctx context.Context, threadID string, p agent.RunPage) (agent.Page[agent.Run], error) {
	s.op()
	limit := p.Limit
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	q := `SELECT ` + runReadCols + ` FROM runs INDEXED BY runs_by_created WHERE thread_id = ?`
	args := []any{threadID}
	cmp, order := "<", "DESC"
	if p.Oldest {
		cmp, order = ">", "ASC"
	}
	if !p.From.IsZero() {
		q += ` AND (created_at, id) ` + cmp + ` (?, ?)`
		args = append(args, millis(p.From.CreatedAt), p.From.ID)
	}
	q += ` ORDER BY created_at ` + order + `, id ` + order + ` LIMIT ?`
	args = append(args, limit+1)
	rows, err := s.read().query(ctx, q, args...)
	if err != nil {
		return agent.Page[agent.Run]{}, s.fail("list runs page", err)
	}
	out, err := collect(rows, scanRun)
	if err != nil {
		return agent.Page[agent.Run]{}, s.fail("list runs page", err)
	}
	if len(out) > limit {
		return agent.Page[agent.Run]{Items: out[:limit], More: true}, nil
	}
	return agent.Page[agent.Run]{Items: out}, nil
}

// ListRuns returns the thread's runs, oldest first.
func (s *Store) ListRuns(ctx context.Context, threadID string) ([]agent.Run, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+runReadCols+` FROM runs WHERE thread_id = ? ORDER BY created_at, id`,
		threadID)
	if err != nil {
		return nil, s.fail("list runs", err)
	}
	out, err := collect(rows, scanRun)
	if err != nil {
		return nil, s.fail("list runs", err)
	}
	return out, nil
}
