package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/agentloop/agentloop/lib/agent"
)

// HandOver moves the claim of req.Fence to the next epoch for the run's continuation (agent.HandOverStore), in
// one transaction: the thread's claim (only while it names req.Fence; its cancel request and reader marks stay)
// and the run row's epoch (only while it is running at req.Fence.Epoch). Every later write of the old holder
// checks the claim in its own transaction (fence F) and is refused.
func (s *Store) HandOver(ctx context.Context, req agent.HandOverRequest) (agent.ClaimResult, error) {
	s.op()
	var res agent.ClaimResult
	err := s.write(ctx, "hand over claim", func(c conn) error {
		var epoch int64
		err := c.queryRow(ctx, `UPDATE threads SET epoch = epoch + 1, claim_epoch = epoch + 1, claim_heartbeat_at = ?
			WHERE id = ? AND claim_run_id = ? AND claim_epoch = ? RETURNING epoch`,
			millis(req.Now), req.ThreadID, req.Fence.RunID, req.Fence.Epoch).Scan(&epoch)
		if errors.Is(err, sql.ErrNoRows) {
			return fenced(req.Fence)
		}
		if err != nil {
			return err
		}
		n, err := c.execN(ctx, `UPDATE runs SET epoch = ?, updated_at = ? WHERE thread_id = ? AND id = ? AND status = 'running' AND epoch = ?`,
			epoch, millis(req.Now), req.ThreadID, req.Fence.RunID, req.Fence.Epoch)
		if err != nil {
			return err
		}
		if n == 0 {
			return fenced(req.Fence) // an *agent.Error: the claim's update above is rolled back with it
		}
		res, err = readClaimResult(ctx, c, req.ThreadID, req.Fence.RunID)
		return err
	})
	if err != nil {
		return agent.ClaimResult{}, err
	}
	return res, nil
}
