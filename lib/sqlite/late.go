package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"

	"github.com/agentloop/agentloop/lib/agent"
)

// RecordLateUsage adds a fenced run's late spend to its run row and its thread's totals in one transaction; the
// run row's late_usage (NULL until then) is the insert-once marker, so a repeated call changes nothing.
func (s *Store) RecordLateUsage(ctx context.Context, late agent.LateUsage) error {
	s.op()
	f, u := late.Fence, late.Usage
	b, err := json.Marshal(u)
	if err != nil {
		return s.fail("encode late usage", err)
	}
	return s.write(ctx, "record late usage", func(c conn) error {
		var claimRun sql.NullString
		var claimEpoch sql.NullInt64
		var created int64
		err := c.queryRow(ctx, `SELECT claim_run_id, claim_epoch, created_at FROM threads WHERE id = ?`, late.ThreadID).
			Scan(&claimRun, &claimEpoch, &created)
		if errors.Is(err, sql.ErrNoRows) || err == nil && !late.ThreadCreatedAt.IsZero() && created != millis(late.ThreadCreatedAt) {
			return agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", late.ThreadID)
		}
		if err != nil {
			return err
		}
		if claimRun.String == f.RunID && claimEpoch.Int64 == f.Epoch {
			return agent.E(agent.KindConflict, agent.CodeRunActive, "run %s still holds its claim", f.RunID)
		}
		var status string
		var epoch int64
		var recorded sql.NullString
		err = c.queryRow(ctx, `SELECT status, epoch, late_usage FROM runs WHERE thread_id = ? AND id = ?`,
			late.ThreadID, f.RunID).Scan(&status, &epoch, &recorded)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return runNotFound(f.RunID)
		case err != nil:
			return err
		case recorded.Valid:
			return nil // recorded before
		case epoch != f.Epoch:
			return fenced(f)
		case status == string(agent.RunRunning):
			return agent.E(agent.KindConflict, agent.CodeRunActive, "run %s is still recorded as running", f.RunID)
		}
		const add = `usage_input = usage_input + ?, usage_output = usage_output + ?, usage_total = usage_total + ?,
			usage_cached = usage_cached + ?, usage_reasoning = usage_reasoning + ?, usage_cost = usage_cost + ?,
			usage_cache_write = usage_cache_write + ?`
		args := []any{u.InputTokens, u.OutputTokens, u.TotalTokens, u.CachedInputTokens, u.ReasoningTokens, u.CostMicroUSD,
			u.CacheWriteTokens}
		if _, err := c.exec(ctx, `UPDATE runs SET late_usage = ?, `+add+` WHERE thread_id = ? AND id = ?`,
			append(append([]any{string(b)}, args...), late.ThreadID, f.RunID)...); err != nil {
			return err
		}
		_, err = c.exec(ctx, `UPDATE threads SET `+add+` WHERE id = ?`, append(args, late.ThreadID)...)
		return err
	})
}
