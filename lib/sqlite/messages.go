package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"

	"github.com/agentloop/agentloop/lib/agent"
)

const messageCols = `thread_id, id, seq, role, parts, metadata, created_at, updated_at`

// encodeParts joins the parts into one JSON array without re-encoding them, so their bytes are kept.
func encodeParts(parts []json.RawMessage) (string, error) {
	n := 2
	for _, p := range parts {
		n += len(p) + 1
	}
	var b bytes.Buffer
	b.Grow(n)
	b.WriteByte('[')
	for i, p := range parts {
		p = bytes.TrimSpace(p)
		if !json.Valid(p) {
			return "", agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message part %d is not valid JSON", i)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(p)
	}
	b.WriteByte(']')
	return b.String(), nil
}

func scanMessage(sc scanner) (agent.MessageRecord, error) {
	var (
		r                agent.MessageRecord
		parts            string
		metadata         sql.NullString
		created, updated int64
	)
	if err := sc.Scan(&r.ThreadID, &r.Message.ID, &r.Seq, &r.Message.Role, &parts, &metadata, &created,
		&updated); err != nil {
		return agent.MessageRecord{}, err
	}
	// Unmarshal into RawMessage elements copies each element's bytes exactly.
	if err := json.Unmarshal([]byte(parts), &r.Message.Parts); err != nil {
		return agent.MessageRecord{}, err
	}
	if metadata.Valid {
		r.Message.Metadata = json.RawMessage(metadata.String)
	}
	r.CreatedAt = fromMillis(created)
	r.UpdatedAt = fromMillis(updated)
	return r, nil
}

// putMessageSQL is the fenced upsert. A new id is inserted at the given seq. An existing row is overwritten only
// when its last writer's epoch is below the new one, or equal and not finalized (the DO UPDATE's WHERE); it then
// keeps its seq and created_at, unless it was deleted: a deleted message brought back by a newer writer is a new
// message at the position that writer reserved for it.
const putMessageSQL = `INSERT INTO messages (` + messageCols + `, writer_run_id, writer_epoch, final, deleted)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
	ON CONFLICT (thread_id, id) DO UPDATE SET
		seq = CASE WHEN messages.deleted THEN excluded.seq ELSE messages.seq END,
		created_at = CASE WHEN messages.deleted THEN excluded.created_at ELSE messages.created_at END,
		role = excluded.role, parts = excluded.parts, metadata = excluded.metadata, updated_at = excluded.updated_at,
		writer_run_id = excluded.writer_run_id, writer_epoch = excluded.writer_epoch, final = excluded.final,
		deleted = 0
	WHERE messages.writer_epoch < excluded.writer_epoch
		OR (messages.writer_epoch = excluded.writer_epoch AND NOT messages.final)`

// PutMessage upserts w.Message by id, fenced by w.Fence against the stored row's last writer (see putMessageSQL).
// An edit (w.HideBefore) hides the messages between the edited one and HideBefore in the same transaction.
// A fenced write is KindConflict/CodeRunFenced and changes nothing. Parts and metadata must be valid JSON
// (KindInvalid/CodeInvalidMessage).
func (s *Store) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	s.op()
	m := w.Message
	if w.ThreadID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidThreadID, "message needs a thread id")
	}
	if m.ID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message needs an id")
	}
	parts, err := encodeParts(m.Parts)
	if err != nil {
		return err
	}
	var metadata any
	if len(m.Metadata) > 0 {
		if !json.Valid(m.Metadata) {
			return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message metadata is not valid JSON")
		}
		metadata = string(m.Metadata)
	}
	now := millis(w.Now)
	return s.write(ctx, "put message", func(c conn) error {
		if err := claimAllows(ctx, c, w.ThreadID, w.Fence); err != nil {
			return err
		}
		var edited int64 // an edit's position (fence D)
		if w.HideBefore > 0 {
			err := c.queryRow(ctx, `SELECT seq FROM messages WHERE thread_id = ? AND id = ? AND NOT deleted`, w.ThreadID, m.ID).Scan(&edited)
			if errors.Is(err, sql.ErrNoRows) {
				return agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %q (to edit) not found", m.ID)
			}
			if err != nil {
				return err
			}
		}
		n, err := c.execN(ctx, putMessageSQL, w.ThreadID, m.ID, w.Seq, string(m.Role), parts, metadata, now, now,
			w.Fence.RunID, w.Fence.Epoch, w.Final)
		if err != nil {
			return err
		}
		if n == 0 {
			// A retry whose first attempt applied (a lost answer) rewrites exactly what its own run finalized:
			// that converges (DESIGN principle 3), as in the DynamoDB adapter.
			var same int
			err := c.queryRow(ctx, `SELECT count(*) FROM messages WHERE thread_id = ? AND id = ? AND NOT deleted
				AND final AND writer_run_id = ? AND writer_epoch = ? AND role = ? AND parts = ?
				AND metadata IS ?`, w.ThreadID, m.ID, w.Fence.RunID, w.Fence.Epoch, string(m.Role), parts, metadata).Scan(&same)
			if err == nil && same == 1 && w.Final {
				return nil
			}
			return messageFenced(m.ID, w.Fence)
		}
		if w.HideBefore > 0 {
			// The edit hides what came after the edited message in the same transaction (fence D): DeleteMessage
			// of each, afterwards, finds them hidden already.
			_, err := c.exec(ctx, `UPDATE messages SET deleted = 1, final = 0, parts = '[]', metadata = NULL,
				writer_run_id = ?, writer_epoch = ?
				WHERE thread_id = ? AND seq > ? AND seq < ? AND NOT deleted AND writer_epoch < ?`,
				w.Fence.RunID, w.Fence.Epoch, w.ThreadID, edited, w.HideBefore, w.Fence.Epoch)
			return err
		}
		return nil
	})
}

func messageFenced(id string, f agent.Fence) error {
	return agent.E(agent.KindConflict, agent.CodeRunFenced,
		"message %q was written by a newer run, or finalized, before run %q at epoch %d", id, f.RunID, f.Epoch)
}

// GetMessage reads one message of a thread; a deleted one is KindNotFound.
func (s *Store) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	s.op()
	r, err := scanMessage(s.read().queryRow(ctx, `SELECT `+messageCols+` FROM messages
		WHERE thread_id = ? AND id = ? AND NOT deleted`, threadID, id))
	if errors.Is(err, sql.ErrNoRows) {
		return agent.MessageRecord{}, agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %q not found", id)
	}
	if err != nil {
		return agent.MessageRecord{}, s.fail("get message", err)
	}
	return r, nil
}

// ListMessages returns the thread's messages by seq, then id, deleted ones left out.
func (s *Store) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+messageCols+` FROM messages WHERE thread_id = ? AND NOT deleted
		ORDER BY seq, id`, threadID)
	if err != nil {
		return nil, s.fail("list messages", err)
	}
	out, err := collect(rows, scanMessage)
	if err != nil {
		return nil, s.fail("list messages", err)
	}
	return out, nil
}

// ListMessagesPage reads one page through the messages_by_seq index (thread_id, seq, id): a range scan from the
// cursor down (or up, oldest first), LIMIT p.Limit+1 (the one more tells whether older messages remain), so its cost is
// the page's, whatever the thread holds. Deleted rows in the range are skipped by the scan.
func (s *Store) ListMessagesPage(ctx context.Context, threadID string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	s.op()
	limit := p.Limit
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	q := `SELECT ` + messageCols + ` FROM messages INDEXED BY messages_by_seq WHERE thread_id = ? AND NOT deleted`
	args := []any{threadID}
	cmp, order := "<", "DESC"
	if p.Oldest {
		cmp, order = ">", "ASC"
	}
	if !p.From.IsZero() {
		q += ` AND (seq, id) ` + cmp + ` (?, ?)`
		args = append(args, p.From.Seq, p.From.ID)
	}
	q += ` ORDER BY seq ` + order + `, id ` + order + ` LIMIT ?`
	args = append(args, limit+1)
	rows, err := s.read().query(ctx, q, args...)
	if err != nil {
		return agent.Page[agent.MessageRecord]{}, s.fail("list messages page", err)
	}
	out, err := collect(rows, scanMessage)
	if err != nil {
		return agent.Page[agent.MessageRecord]{}, s.fail("list messages page", err)
	}
	if len(out) > limit {
		return agent.Page[agent.MessageRecord]{Items: out[:limit], More: true}, nil
	}
	return agent.Page[agent.MessageRecord]{Items: out}, nil
}

// FenceMessage is the reaper's stub (fence B), checked against the claim like any message write: an unknown id
// gets a hidden row (deleted, no content) written by f; a stored one below f.Epoch takes f as its writer, not
// final, content and position kept; one at f.Epoch or above is left alone. (On SQLite fence F already refuses
// every write of a run that lost its claim; the stub keeps the two stores' answers the same.)
func (s *Store) FenceMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	s.op()
	return s.write(ctx, "fence message", func(c conn) error {
		if err := claimAllows(ctx, c, threadID, f); err != nil {
			return err
		}
		_, err := c.exec(ctx, `INSERT INTO messages (`+messageCols+`, writer_run_id, writer_epoch, final, deleted)
			VALUES (?, ?, 0, '', '[]', NULL, 0, 0, ?, ?, 0, 1)
			ON CONFLICT (thread_id, id) DO UPDATE SET writer_run_id = excluded.writer_run_id,
				writer_epoch = excluded.writer_epoch, final = 0
			WHERE messages.writer_epoch < excluded.writer_epoch`, threadID, id, f.RunID, f.Epoch)
		return err
	})
}

// DeleteMessage hides one message, fenced like PutMessage: the row stays, with the deleter's fence, its content
// dropped, so a late writer at a lower epoch (or at the deleter's epoch after a finalizing write) cannot bring
// it back. An unknown id is a no-op; a fenced delete is KindConflict/CodeRunFenced.
func (s *Store) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	s.op()
	return s.write(ctx, "delete message", func(c conn) error {
		if err := claimAllows(ctx, c, threadID, f); err != nil {
			return err
		}
		n, err := c.execN(ctx, `UPDATE messages SET deleted = 1, final = 0, parts = '[]', metadata = NULL,
			writer_run_id = ?, writer_epoch = ?
			WHERE thread_id = ? AND id = ? AND (writer_epoch < ? OR (writer_epoch = ? AND NOT final))`,
			f.RunID, f.Epoch, threadID, id, f.Epoch, f.Epoch)
		if err != nil || n == 1 {
			return err
		}
		var one int
		err = c.queryRow(ctx, `SELECT 1 FROM messages WHERE thread_id = ? AND id = ?`, threadID, id).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		return messageFenced(id, f)
	})
}

// claimAllows is fence F for message writes: when the thread has a row, its claim must name f (the writing run,
// or the reaper's takeover claim), checked in the write's own transaction, so a run that lost its claim (reaped,
// taken over, finished) writes nothing, a new id included. A deleted thread (no row, its id in threads_gone)
// refuses every fenced write, so a run of it writes nothing before a thread is created on the id again, and that
// thread's claim refuses it after. Messages of a thread that never had a row (the store suite's message cases,
// which need no thread) are fenced by their own rows only.
func claimAllows(ctx context.Context, c conn, threadID string, f agent.Fence) error {
	var claimRun sql.NullString
	var claimEpoch sql.NullInt64
	err := c.queryRow(ctx, `SELECT claim_run_id, claim_epoch FROM threads WHERE id = ?`, threadID).Scan(&claimRun, &claimEpoch)
	if errors.Is(err, sql.ErrNoRows) {
		var one int
		err = c.queryRow(ctx, `SELECT 1 FROM threads_gone WHERE id = ?`, threadID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		return agent.E(agent.KindConflict, agent.CodeRunFenced, "thread %q was deleted: run %q at epoch %d is fenced", threadID, f.RunID, f.Epoch)
	}
	if err != nil {
		return err
	}
	if claimRun.String != f.RunID || claimEpoch.Int64 != f.Epoch || !claimRun.Valid {
		return agent.E(agent.KindConflict, agent.CodeRunFenced, "run %q at epoch %d does not hold thread %q", f.RunID, f.Epoch, threadID)
	}
	return nil
}

// recreatedClaimAllows fences the insert of a child that names its writer (an interrupt, a job) in a thread created
// again on a deleted one's id (its id is in threads_gone): the claim tells a run of this thread from a late run
// of the deleted one (whose epochs are at or below the new thread's base, or, for a thread created again before
// schema 10, overlap its epochs), and the writer must hold it (claimAllows). A thread never deleted is not checked: a child's insert there is fenced by its thread alone,
// as before (issue 16 item 2).
func recreatedClaimAllows(ctx context.Context, c conn, threadID string, f agent.Fence) error {
	var one int
	err := c.queryRow(ctx, `SELECT 1 FROM threads_gone WHERE id = ?`, threadID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return claimAllows(ctx, c, threadID, f)
}
