package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

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
			return "", agent.E(agent.KindInvalid, CodeInvalid, "message part %d is not valid JSON", i)
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

// PutMessage upserts m by id: a new id is stored at seq; an existing one keeps its seq and creation time.
func (s *Store) PutMessage(ctx context.Context, threadID string, seq int64, m agent.Message, now time.Time) error {
	s.op()
	if threadID == "" || m.ID == "" {
		return agent.E(agent.KindInvalid, CodeInvalid, "message needs a thread id and an id")
	}
	parts, err := encodeParts(m.Parts)
	if err != nil {
		return err
	}
	var metadata any
	if len(m.Metadata) > 0 {
		metadata = string(m.Metadata)
	}
	return s.write(ctx, "put message", func(c conn) error {
		_, err := c.exec(ctx, `INSERT INTO messages (`+messageCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (thread_id, id) DO UPDATE SET role = excluded.role, parts = excluded.parts,
				metadata = excluded.metadata, updated_at = excluded.updated_at`,
			threadID, m.ID, seq, string(m.Role), parts, metadata, millis(now), millis(now))
		return err
	})
}

// GetMessage reads one message of a thread.
func (s *Store) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	s.op()
	r, err := scanMessage(s.read().queryRow(ctx, `SELECT `+messageCols+` FROM messages WHERE thread_id = ? AND id = ?`,
		threadID, id))
	if errors.Is(err, sql.ErrNoRows) {
		return agent.MessageRecord{}, agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %q not found", id)
	}
	if err != nil {
		return agent.MessageRecord{}, s.fail("get message", err)
	}
	return r, nil
}

// ListMessages returns the thread's messages by seq, then id.
func (s *Store) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+messageCols+` FROM messages WHERE thread_id = ? ORDER BY seq, id`,
		threadID)
	if err != nil {
		return nil, s.fail("list messages", err)
	}
	out, err := collect(rows, scanMessage)
	if err != nil {
		return nil, s.fail("list messages", err)
	}
	return out, nil
}

// DeleteMessage removes one message; an unknown id is a no-op.
func (s *Store) DeleteMessage(ctx context.Context, threadID, id string) error {
	s.op()
	return s.write(ctx, "delete message", func(c conn) error {
		_, err := c.exec(ctx, `DELETE FROM messages WHERE thread_id = ? AND id = ?`, threadID, id)
		return err
	})
}
