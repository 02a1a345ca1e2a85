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
	steps, model, assistant_message_id, epoch, created_at, updated_at, finished_at`

func scanRun(sc scanner) (agent.Run, error) {
	var (
		r                agent.Run
		runErr           sql.NullString
		created, updated int64
		finished         sql.NullInt64
	)
	err := sc.Scan(&r.ThreadID, &r.ID, &r.Trigger, &r.Status, &runErr,
		&r.Usage.InputTokens, &r.Usage.OutputTokens, &r.Usage.TotalTokens, &r.Usage.CachedInputTokens,
		&r.Steps, &r.Model, &r.AssistantMessageID, &r.Epoch, &created, &updated, &finished)
	if err != nil {
		return agent.Run{}, err
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

func fenced(runID string, epoch int64) error {
	return agent.E(agent.KindConflict, agent.CodeRunFenced, "run %q at epoch %d no longer holds the thread", runID, epoch)
}

// readClaim reads a thread's epoch and claim inside a transaction.
func readClaim(ctx context.Context, c conn, threadID string) (epoch int64, claim *agent.Claim, err error) {
	var (
		runID      sql.NullString
		claimEpoch sql.NullInt64
		hb         sql.NullInt64
		cancel     bool
	)
	err = c.queryRow(ctx, `SELECT epoch, claim_run_id, claim_epoch, claim_heartbeat_at, claim_cancel
		FROM threads WHERE id = ?`, threadID).Scan(&epoch, &runID, &claimEpoch, &hb, &cancel)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, threadNotFound(threadID)
	}
	if err != nil {
		return 0, nil, err
	}
	if runID.Valid {
		claim = &agent.Claim{RunID: runID.String, Epoch: claimEpoch.Int64, HeartbeatAt: fromNullMillis(hb),
			CancelRequested: cancel}
	}
	return epoch, claim, nil
}

// ClaimRun makes req.RunID the thread's active run when the thread is idle or its claim is stale.
func (s *Store) ClaimRun(ctx context.Context, req agent.ClaimRequest) (agent.ClaimResult, error) {
	s.op()
	if req.ThreadID == "" || req.RunID == "" {
		return agent.ClaimResult{}, agent.E(agent.KindInvalid, CodeInvalid, "claim needs a thread id and a run id")
	}
	var res agent.ClaimResult
	err := s.write(ctx, "claim run", func(c conn) error {
		epoch, claim, err := readClaim(ctx, c, req.ThreadID)
		if err != nil {
			return err
		}
		if claim != nil && !claim.Stale(req.Now, req.StaleAfter) {
			return agent.E(agent.KindConflict, agent.CodeRunActive, "thread %q is running %q", req.ThreadID, claim.RunID)
		}
		epoch++
		now := millis(req.Now)
		n, err := c.execN(ctx, `INSERT INTO runs (`+runCols+`)
			VALUES (?, ?, ?, ?, NULL, 0, 0, 0, 0, 0, '', ?, ?, ?, ?, NULL) ON CONFLICT DO NOTHING`,
			req.ThreadID, req.RunID, string(req.Trigger), string(agent.RunRunning), req.AssistantMessageID,
			epoch, now, now)
		if err != nil {
			return err
		}
		if n == 0 {
			return agent.E(agent.KindConflict, CodeRunExists, "run %q already exists", req.RunID)
		}
		if _, err := c.exec(ctx, `UPDATE threads SET epoch = ?, claim_run_id = ?, claim_epoch = ?,
			claim_heartbeat_at = ?, claim_cancel = 0 WHERE id = ?`,
			epoch, req.RunID, epoch, now, req.ThreadID); err != nil {
			return err
		}
		res = agent.ClaimResult{
			Run: agent.Run{
				ID: req.RunID, ThreadID: req.ThreadID, Trigger: req.Trigger, Status: agent.RunRunning,
				AssistantMessageID: req.AssistantMessageID, Epoch: epoch,
				CreatedAt: fromMillis(now), UpdatedAt: fromMillis(now),
			},
			Previous: claim,
		}
		return nil
	})
	if err != nil {
		return agent.ClaimResult{}, err
	}
	return res, nil
}

// Heartbeat refreshes the claim's heartbeat if the claim still names runID at epoch and carries no cancel request.
// A deleted thread fences its run like a lost claim does.
func (s *Store) Heartbeat(ctx context.Context, threadID, runID string, epoch int64, now time.Time) error {
	s.op()
	return s.write(ctx, "heartbeat", func(c conn) error {
		n, err := c.execN(ctx, `UPDATE threads SET claim_heartbeat_at = ?
			WHERE id = ? AND claim_run_id = ? AND claim_epoch = ? AND claim_cancel = 0`,
			millis(now), threadID, runID, epoch)
		if err != nil || n == 1 {
			return err
		}
		// The condition failed; say why.
		_, claim, err := readClaim(ctx, c, threadID)
		var ae *agent.Error
		if errors.As(err, &ae) && ae.Kind == agent.KindNotFound {
			return fenced(runID, epoch) // the thread was deleted under the run
		}
		if err != nil {
			return err
		}
		if claim != nil && claim.RunID == runID && claim.Epoch == epoch && claim.CancelRequested {
			return agent.E(agent.KindCanceled, agent.CodeRunCanceled, "run %q was asked to stop", runID)
		}
		return fenced(runID, epoch)
	})
}

// RequestCancel marks the thread's active claim as cancel-requested and returns it; a repeated request returns
// the same claim. Unknown thread: KindNotFound. now is not recorded (the claim has no field for it).
func (s *Store) RequestCancel(ctx context.Context, threadID string, now time.Time) (agent.Claim, error) {
	s.op()
	var out agent.Claim
	err := s.write(ctx, "request cancel", func(c conn) error {
		_, claim, err := readClaim(ctx, c, threadID)
		if err != nil {
			return err
		}
		if claim == nil {
			return agent.E(agent.KindConflict, agent.CodeNoActiveRun, "thread %q has no active run", threadID)
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

// FinishRun records run's outcome by compare-and-set from running at run.Epoch, adds its usage to the thread and
// releases the thread's claim if it still names the run at that epoch. The run's UpdatedAt is stored as given
// (FinishedAt when zero); an unknown run is KindNotFound; a non-terminal status is KindInvalid.
func (s *Store) FinishRun(ctx context.Context, run agent.Run) error {
	s.op()
	if !run.Status.Terminal() {
		return agent.E(agent.KindInvalid, CodeInvalid, "run %q: status %q is not terminal", run.ID, run.Status)
	}
	var runErr any
	if run.Error != nil {
		b, err := json.Marshal(run.Error)
		if err != nil {
			return s.fail("encode run error", err)
		}
		runErr = string(b)
	}
	// UpdatedAt as given, else the finish time, else left as stored.
	updated := nullMillis(run.UpdatedAt)
	if updated == nil {
		updated = nullMillis(run.FinishedAt)
	}
	return s.write(ctx, "finish run", func(c conn) error {
		n, err := c.execN(ctx, `UPDATE runs SET status = ?, error = ?,
			usage_input = ?, usage_output = ?, usage_total = ?, usage_cached = ?,
			steps = ?, model = ?, finished_at = ?, updated_at = coalesce(?, updated_at)
			WHERE thread_id = ? AND id = ? AND status = ? AND epoch = ?`,
			string(run.Status), runErr,
			run.Usage.InputTokens, run.Usage.OutputTokens, run.Usage.TotalTokens, run.Usage.CachedInputTokens,
			run.Steps, run.Model, nullMillis(run.FinishedAt), updated,
			run.ThreadID, run.ID, string(agent.RunRunning), run.Epoch)
		if err != nil {
			return err
		}
		if n == 0 {
			var one int
			err := c.queryRow(ctx, `SELECT 1 FROM runs WHERE thread_id = ? AND id = ?`, run.ThreadID, run.ID).Scan(&one)
			if errors.Is(err, sql.ErrNoRows) {
				return runNotFound(run.ID)
			}
			if err != nil {
				return err
			}
			return fenced(run.ID, run.Epoch)
		}
		if _, err := c.exec(ctx, `UPDATE threads SET usage_input = usage_input + ?, usage_output = usage_output + ?,
			usage_total = usage_total + ?, usage_cached = usage_cached + ? WHERE id = ?`,
			run.Usage.InputTokens, run.Usage.OutputTokens, run.Usage.TotalTokens, run.Usage.CachedInputTokens,
			run.ThreadID); err != nil {
			return err
		}
		_, err = c.exec(ctx, `UPDATE threads SET claim_run_id = NULL, claim_epoch = NULL, claim_heartbeat_at = NULL,
			claim_cancel = 0, updated_at = coalesce(?, updated_at)
			WHERE id = ? AND claim_run_id = ? AND claim_epoch = ?`, nullMillis(run.FinishedAt), run.ThreadID, run.ID, run.Epoch)
		return err
	})
}

// ListStaleClaims lists claims whose heartbeat is before before, oldest first, through the partial index of
// claimed threads.
func (s *Store) ListStaleClaims(ctx context.Context, before time.Time, limit int) ([]agent.StaleClaim, error) {
	s.op()
	if limit <= 0 {
		limit = defaultListLimit
	}
	rows, err := s.read().query(ctx, `SELECT id, claim_run_id, claim_epoch, claim_heartbeat_at, claim_cancel FROM threads
		WHERE claim_run_id IS NOT NULL AND claim_heartbeat_at < ? ORDER BY claim_heartbeat_at, id LIMIT ?`, millis(before), limit)
	if err != nil {
		return nil, s.fail("list stale claims", err)
	}
	out, err := collect(rows, func(r scanner) (agent.StaleClaim, error) {
		var sc agent.StaleClaim
		var hb int64
		err := r.Scan(&sc.ThreadID, &sc.Claim.RunID, &sc.Claim.Epoch, &hb, &sc.Claim.CancelRequested)
		sc.Claim.HeartbeatAt = fromMillis(hb)
		return sc, err
	})
	if err != nil {
		return nil, s.fail("list stale claims", err)
	}
	return out, nil
}

// GetRun reads one run of a thread.
func (s *Store) GetRun(ctx context.Context, threadID, runID string) (agent.Run, error) {
	s.op()
	r, err := scanRun(s.read().queryRow(ctx, `SELECT `+runCols+` FROM runs WHERE thread_id = ? AND id = ?`,
		threadID, runID))
	if errors.Is(err, sql.ErrNoRows) {
		return agent.Run{}, runNotFound(runID)
	}
	if err != nil {
		return agent.Run{}, s.fail("get run", err)
	}
	return r, nil
}

// ListRuns returns the thread's runs, oldest first.
func (s *Store) ListRuns(ctx context.Context, threadID string) ([]agent.Run, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+runCols+` FROM runs WHERE thread_id = ? ORDER BY created_at, id`,
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
