package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Completion signals (agent.SignalStore): the run row is the outbox. recordOutcome stores an armed signal pending
// in the outcome's own UPDATE; ClaimSignal and SettleSignal are each one conditional UPDATE of the row; the
// runs_signals_due partial index holds exactly the pending ones.

// ListDueSignals reads the runs_signals_due index: pending signals due before before, earliest first.
func (s *Store) ListDueSignals(ctx context.Context, before time.Time, limit int) ([]agent.Run, error) {
	return listBefore(ctx, s, "list due signals", `SELECT `+runReadCols+` FROM runs INDEXED BY runs_signals_due
		WHERE signal_status = 'pending' AND signal_due < ?
		ORDER BY signal_due, thread_id, id LIMIT ?`, scanRun, before, limit)
}

// ClaimSignal is one UPDATE: the attempt count from c.Attempts to c.Attempts+1 and the new due time, while the
// signal is pending at c.Attempts.
func (s *Store) ClaimSignal(ctx context.Context, c agent.SignalClaim) error {
	s.op()
	return s.write(ctx, "claim signal", func(cn conn) error {
		n, err := cn.execN(ctx, `UPDATE runs SET signal_attempts = signal_attempts + 1, signal_due = ?
			WHERE thread_id = ? AND id = ? AND signal_status = 'pending' AND signal_attempts = ?`,
			millis(c.NextDue), c.ThreadID, c.RunID, c.Attempts)
		if err != nil || n > 0 {
			return err
		}
		if _, err := signalOf(ctx, cn, c.ThreadID, c.RunID); err != nil {
			return err
		}
		return agent.E(agent.KindConflict, agent.CodeSignalTaken, "run %q: its signal is not pending at attempt %d", c.RunID, c.Attempts)
	})
}

// SettleSignal is one UPDATE from pending to status, which also takes the row out of the due index.
func (s *Store) SettleSignal(ctx context.Context, threadID, runID string, status agent.SignalStatus) error {
	s.op()
	if status != agent.SignalDelivered && status != agent.SignalDropped {
		return agent.E(agent.KindInvalid, agent.CodeInvalidStatus, "run %q: a signal settles delivered or dropped, not %q", runID, status)
	}
	return s.write(ctx, "settle signal", func(cn conn) error {
		n, err := cn.execN(ctx, `UPDATE runs SET signal_status = ?, signal_due = NULL
			WHERE thread_id = ? AND id = ? AND signal_status = 'pending'`, string(status), threadID, runID)
		if err != nil || n > 0 {
			return err
		}
		_, err = signalOf(ctx, cn, threadID, runID) // settled already: nil
		return err
	})
}

// signalOf reads a run's signal status: KindNotFound for an unknown run or one with no signal.
func signalOf(ctx context.Context, c conn, threadID, runID string) (agent.SignalStatus, error) {
	var st sql.NullString
	err := c.queryRow(ctx, `SELECT signal_status FROM runs WHERE thread_id = ? AND id = ?`, threadID, runID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !st.Valid) {
		return "", runNotFound(runID)
	}
	return agent.SignalStatus(st.String), err
}
