package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

const interruptCols = `thread_id, id, run_id, epoch, message_id, kind, tool_call_id, tool_name, input, signature,
	status, response, created_at, expires_at, resolved_at`

func scanInterrupt(sc scanner) (agent.Interrupt, error) {
	var (
		in               agent.Interrupt
		input, response  sql.NullString
		created, expires int64
		resolved         sql.NullInt64
		kind, status     string
	)
	err := sc.Scan(&in.ThreadID, &in.ID, &in.RunID, &in.Epoch, &in.MessageID, &kind, &in.ToolCallID, &in.ToolName,
		&input, &in.Signature, &status, &response, &created, &expires, &resolved)
	if err != nil {
		return agent.Interrupt{}, err
	}
	in.Kind, in.Status = agent.InterruptKind(kind), agent.InterruptStatus(status)
	if input.Valid {
		in.Input = json.RawMessage(input.String)
	}
	if response.Valid {
		in.Response = json.RawMessage(response.String)
	}
	in.CreatedAt, in.ExpiresAt, in.ResolvedAt = fromMillis(created), fromMillis(expires), fromNullMillis(resolved)
	return in, nil
}

// rawJSON binds a JSON value as TEXT exactly as given; empty is NULL.
func rawJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func interruptNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeInterruptNotFound, "interrupt %s of thread %q not found", id, threadID)
}

// CreateInterrupt inserts in unless (thread, id) exists, in one transaction that first checks the thread row: an
// interrupt never outlives its thread (DeleteThread removes both in one transaction, so there is no half-deleted
// thread to write into).
func (s *Store) CreateInterrupt(ctx context.Context, in agent.Interrupt) (agent.Interrupt, bool, error) {
	s.op()
	if err := in.Check(); err != nil {
		return agent.Interrupt{}, false, err
	}
	var (
		stored  agent.Interrupt
		created bool
	)
	err := s.write(ctx, "create interrupt", func(c conn) error {
		var one int
		err := c.queryRow(ctx, `SELECT 1 FROM threads WHERE id = ?`, in.ThreadID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return threadNotFound(in.ThreadID)
		}
		if err != nil {
			return err
		}
		if err := recreatedClaimAllows(ctx, c, in.ThreadID, agent.Fence{RunID: in.RunID, Epoch: in.Epoch}); err != nil {
			return err
		}
		n, err := c.execN(ctx, `INSERT INTO interrupts (`+interruptCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id, id) DO NOTHING`,
			in.ThreadID, in.ID, in.RunID, in.Epoch, in.MessageID, string(in.Kind), in.ToolCallID, in.ToolName,
			rawJSON(in.Input), in.Signature, string(in.Status), nil, millis(in.CreatedAt), millis(in.ExpiresAt), nil)
		if err != nil {
			return err
		}
		created = n == 1
		stored, err = scanInterrupt(c.queryRow(ctx, `SELECT `+interruptCols+` FROM interrupts
			WHERE thread_id = ? AND id = ?`, in.ThreadID, in.ID))
		return err
	})
	if err != nil {
		return agent.Interrupt{}, false, err
	}
	return stored, created, nil
}

// GetInterrupt reads one interrupt; unknown (or asked by another message) is KindNotFound/CodeInterruptNotFound.
func (s *Store) GetInterrupt(ctx context.Context, threadID, messageID, id string) (agent.Interrupt, error) {
	s.op()
	in, err := scanInterrupt(s.read().queryRow(ctx, `SELECT `+interruptCols+` FROM interrupts
		WHERE thread_id = ? AND id = ? AND message_id = ?`, threadID, id, messageID))
	if errors.Is(err, sql.ErrNoRows) {
		return agent.Interrupt{}, interruptNotFound(threadID, id)
	}
	if err != nil {
		return agent.Interrupt{}, s.fail("get interrupt", err)
	}
	return in, nil
}

// ListInterrupts returns the thread's interrupts oldest first, ties by id (interrupts_by_created).
func (s *Store) ListInterrupts(ctx context.Context, threadID string) ([]agent.Interrupt, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+interruptCols+` FROM interrupts WHERE thread_id = ?
		ORDER BY created_at, id`, threadID)
	if err != nil {
		return nil, s.fail("list interrupts", err)
	}
	out, err := collect(rows, scanInterrupt)
	if err != nil {
		return nil, s.fail("list interrupts", err)
	}
	return out, nil
}

// listMessageSQL reads one message's interrupts from interrupts_by_message (INDEXED BY: the statement fails to
// prepare rather than fall back to reading the thread's every interrupt if the index ever stops matching).
const listMessageSQL = `SELECT ` + interruptCols + ` FROM interrupts INDEXED BY interrupts_by_message
	WHERE thread_id = ? AND message_id = ? ORDER BY created_at, id`

// ListMessageInterrupts returns one message's interrupts oldest first, ties by id: one statement over
// interrupts_by_message, which reads only that message's rows (REVIEW S7).
func (s *Store) ListMessageInterrupts(ctx context.Context, threadID, messageID string) ([]agent.Interrupt, error) {
	s.op()
	rows, err := s.read().query(ctx, listMessageSQL, threadID, messageID)
	if err != nil {
		return nil, s.fail("list message interrupts", err)
	}
	out, err := collect(rows, scanInterrupt)
	if err != nil {
		return nil, s.fail("list message interrupts", err)
	}
	return out, nil
}

// resolveSQL is the compare-and-set: it applies only to a pending row, and returns the row it wrote.
const resolveSQL = `UPDATE interrupts SET status = ?, response = ?, resolved_at = ?
	WHERE thread_id = ? AND id = ? AND message_id = ? AND status = 'pending' RETURNING ` + interruptCols

// ResolveInterrupt is one transaction: the compare-and-set UPDATE, and when it matched nothing, the read that
// tells an unknown interrupt (KindNotFound) from a resolved one (returned with KindConflict/CodeAlreadyResolved).
func (s *Store) ResolveInterrupt(ctx context.Context, req agent.ResolveRequest) (agent.Interrupt, error) {
	s.op()
	if err := req.Check(); err != nil {
		return agent.Interrupt{}, err
	}
	var stored agent.Interrupt
	err := s.write(ctx, "resolve interrupt", func(c conn) error {
		var err error
		stored, err = scanInterrupt(c.queryRow(ctx, resolveSQL, string(req.Status), rawJSON(req.Response),
			millis(req.Now), req.ThreadID, req.ID, req.MessageID))
		if err == nil {
			// The thread's interrupts resolved longer than the keep age ago go (DynamoDB: the table's TTL), so
			// its reads grow with its recent questions only (REVIEW S7).
			_, err = c.exec(ctx, `DELETE FROM interrupts WHERE thread_id = ? AND status <> 'pending' AND resolved_at < ?`,
				req.ThreadID, millis(req.Now.Add(-agent.DefaultResolvedInterruptKeep)))
			return err
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		stored, err = scanInterrupt(c.queryRow(ctx, `SELECT `+interruptCols+` FROM interrupts
			WHERE thread_id = ? AND id = ? AND message_id = ?`, req.ThreadID, req.ID, req.MessageID))
		if errors.Is(err, sql.ErrNoRows) {
			return interruptNotFound(req.ThreadID, req.ID)
		}
		if err != nil {
			return err
		}
		return alreadyResolved(stored)
	})
	switch {
	case err == nil:
		return stored, nil
	case errors.Is(err, agent.ErrAlreadyResolved):
		return stored, err // the stored interrupt goes with the conflict
	}
	return agent.Interrupt{}, err
}

func alreadyResolved(in agent.Interrupt) error {
	return agent.E(agent.KindConflict, agent.CodeAlreadyResolved, "interrupt %s was already resolved (%s)", in.ID, in.Status)
}

// listExpiredSQL reads the partial index of pending interrupts (INDEXED BY: the statement fails to prepare rather
// than fall back to a scan if the index ever stops matching the query).
const listExpiredSQL = `SELECT ` + interruptCols + ` FROM interrupts INDEXED BY interrupts_pending
	WHERE status = 'pending' AND expires_at < ? ORDER BY expires_at, thread_id, id LIMIT ?`

// ListExpiredInterrupts returns pending interrupts past their expiry, oldest expiry first (ties by thread and
// id), from the interrupts_pending index. The answer is exact at the time of the read.
func (s *Store) ListExpiredInterrupts(ctx context.Context, before time.Time, limit int) ([]agent.Interrupt, error) {
	return listBefore(ctx, s, "list expired interrupts", listExpiredSQL, scanInterrupt, before, limit)
}
