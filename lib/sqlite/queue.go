package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

const queueCols = `thread_id, message_id, seq, kind, role, parts, metadata, owner, job_id, status, created_at,
	taken_at, expires_at`

func scanQueued(sc scanner) (agent.QueuedMessage, error) {
	var (
		q                  agent.QueuedMessage
		kind, role, status string
		parts              string
		metadata           sql.NullString
		created            int64
		taken, expires     sql.NullInt64
	)
	err := sc.Scan(&q.ThreadID, &q.Message.ID, &q.Seq, &kind, &role, &parts, &metadata, &q.Owner, &q.JobID, &status,
		&created, &taken, &expires)
	if err != nil {
		return agent.QueuedMessage{}, err
	}
	q.Kind, q.Message.Role, q.Status = agent.QueueKind(kind), agent.Role(role), agent.QueueStatus(status)
	// Unmarshal into RawMessage elements copies each element's bytes exactly ("null", a taken entry's, is none).
	if err := json.Unmarshal([]byte(parts), &q.Message.Parts); err != nil {
		return agent.QueuedMessage{}, err
	}
	if metadata.Valid {
		q.Message.Metadata = json.RawMessage(metadata.String)
	}
	q.CreatedAt, q.TakenAt, q.ExpiresAt = fromMillis(created), fromNullMillis(taken), fromNullMillis(expires)
	return q, nil
}

func queuedNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "queued message %s of thread %q not found", id, threadID)
}

// Enqueue is one transaction on the thread row and the queue: it checks the thread (and the incarnation q.Epoch
// names: above the epoch of the thread deleted last on the id, threads_gone, and not above the thread's), deletes the thread's taken
// entries past their expiry (the lazy TTL: an expired entry no longer holds its id), returns an entry stored
// under the id, refuses a full queue, takes the next seq from threads.queue_seq and inserts. The count and the
// insert commit together, so the bound is exact here.
func (s *Store) Enqueue(ctx context.Context, q agent.QueuedMessage, max int) (agent.QueuedMessage, bool, error) {
	s.op()
	if err := q.Check(); err != nil {
		return agent.QueuedMessage{}, false, err
	}
	if max <= 0 {
		max = agent.DefaultMaxQueued
	}
	parts, err := encodeParts(q.Message.Parts)
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	var metadata any
	if len(q.Message.Metadata) > 0 {
		if !json.Valid(q.Message.Metadata) {
			return agent.QueuedMessage{}, false, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "queued message metadata is not valid JSON")
		}
		metadata = string(q.Message.Metadata)
	}
	var (
		stored  agent.QueuedMessage
		created bool
	)
	err = s.write(ctx, "enqueue", func(c conn) error {
		if err := threadExists(ctx, c, q.ThreadID); err != nil {
			return err
		}
		if err := incarnationAllows(ctx, c, q.ThreadID, q.Epoch); err != nil {
			return err
		}
		if _, err := c.exec(ctx, `DELETE FROM queue WHERE thread_id = ? AND status = 'taken' AND expires_at < ?`,
			q.ThreadID, millis(q.CreatedAt)); err != nil {
			return err
		}
		var err error
		stored, err = scanQueued(c.queryRow(ctx, `SELECT `+queueCols+` FROM queue WHERE thread_id = ? AND message_id = ?`,
			q.ThreadID, q.Message.ID))
		if !errors.Is(err, sql.ErrNoRows) {
			return err // stored already (or a failure)
		}
		var n int
		if err := c.queryRow(ctx, `SELECT count(*) FROM queue WHERE thread_id = ? AND status = 'queued'`,
			q.ThreadID).Scan(&n); err != nil {
			return err
		}
		if n >= max {
			return agent.E(agent.KindConflict, agent.CodeQueueFull, "thread %q has %d queued messages already", q.ThreadID, n)
		}
		var seq int64
		if err := c.queryRow(ctx, `UPDATE threads SET queue_seq = queue_seq + 1 WHERE id = ? RETURNING queue_seq`,
			q.ThreadID).Scan(&seq); err != nil {
			return err
		}
		stored, err = scanQueued(c.queryRow(ctx, `INSERT INTO queue (`+queueCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, NULL, NULL) RETURNING `+queueCols,
			q.ThreadID, q.Message.ID, seq, string(q.Kind), string(q.Message.Role), parts, metadata, q.Owner, q.JobID,
			millis(q.CreatedAt)))
		created = err == nil
		return err
	})
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	return stored, created, nil
}

// incarnationAllows refuses, as not found, an enqueue named for an incarnation of the thread id other than the
// live thread's (issue 16 item 2): an epoch at or below the epoch of the thread deleted last on the id (a thread
// created again starts above it), or above the thread's own. Epoch 0 names none. A thread's delete removes its
// queue in the same transaction, so no entry of an earlier incarnation is ever stored, and readers filter nothing.
func incarnationAllows(ctx context.Context, c conn, threadID string, epoch int64) error {
	if epoch == 0 {
		return nil
	}
	var current, base int64
	err := c.queryRow(ctx, `SELECT epoch, coalesce((SELECT epoch FROM threads_gone WHERE id = ?1), 0) FROM threads WHERE id = ?1`,
		threadID).Scan(&current, &base)
	if errors.Is(err, sql.ErrNoRows) {
		return threadNotFound(threadID)
	}
	if err != nil {
		return err
	}
	if epoch <= base || epoch > current {
		return agent.E(agent.KindNotFound, agent.CodeThreadNotFound,
			"thread %q: epoch %d is of another incarnation (this one is above %d, at %d)", threadID, epoch, base, current)
	}
	return nil
}

// ListQueued returns the thread's queued entries in seq order (queue_by_seq).
func (s *Store) ListQueued(ctx context.Context, threadID string) ([]agent.QueuedMessage, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+queueCols+` FROM queue WHERE thread_id = ? AND status = 'queued'
		ORDER BY seq`, threadID)
	if err != nil {
		return nil, s.fail("list queued", err)
	}
	out, err := collect(rows, scanQueued)
	if err != nil {
		return nil, s.fail("list queued", err)
	}
	return out, nil
}

// takeSQL is the compare-and-set from queued; it takes the row out of both partial indexes.
const takeSQL = `UPDATE queue SET status = 'taken', taken_at = ?, expires_at = ?, parts = 'null', metadata = NULL
	WHERE thread_id = ? AND message_id = ? AND status = 'queued'`

// TakeQueued is the compare-and-set UPDATE, and when it matched nothing, the read that tells a taken entry (a
// no-op) from an unknown one, in one transaction.
func (s *Store) TakeQueued(ctx context.Context, threadID, messageID string, now time.Time) error {
	s.op()
	return s.write(ctx, "take queued", func(c conn) error {
		n, err := c.execN(ctx, takeSQL, millis(now), millis(now.Add(agent.DefaultQueueKeep)), threadID, messageID)
		if err != nil || n == 1 {
			return err
		}
		var one int
		err = c.queryRow(ctx, `SELECT 1 FROM queue WHERE thread_id = ? AND message_id = ?`, threadID, messageID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return queuedNotFound(threadID, messageID)
		}
		return err
	})
}

// listQueuedThreadsSQL reads the partial index of queued entries (INDEXED BY, as listExpiredSQL).
const listQueuedThreadsSQL = `SELECT DISTINCT thread_id FROM queue INDEXED BY queue_waiting
	WHERE status = 'queued' AND created_at < ? LIMIT ?`

// ListQueuedThreads returns the distinct threads with an entry queued before before, from the queue_waiting
// index. The answer is exact at the time of the read.
func (s *Store) ListQueuedThreads(ctx context.Context, before time.Time, limit int) ([]string, error) {
	return listBefore(ctx, s, "list queued threads", listQueuedThreadsSQL, func(sc scanner) (string, error) {
		var id string
		err := sc.Scan(&id)
		return id, err
	}, before, limit)
}
