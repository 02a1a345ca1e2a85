package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

const threadCols = `id, owner, title, settings, usage_input, usage_output, usage_total, usage_cached,
	created_at, updated_at, epoch, claim_run_id, claim_epoch, claim_heartbeat_at, claim_cancel`

// threadReadCols are threadCols and the columns of version 5, which inserts leave to their defaults or name
// after threadCols.
const threadReadCols = threadCols + `, usage_reasoning, usage_cost`

// threadScanCols are what scanThread reads: threadReadCols and the claim's readers-until (version 12), which only
// MarkReader sets.
const threadScanCols = threadReadCols + `, claim_readers_until, usage_cache_write`

func scanThread(sc scanner) (agent.Thread, error) {
	var (
		th               agent.Thread
		settings         string
		created, updated int64
		claimRun         sql.NullString
		claimEpoch, hb   sql.NullInt64
		readers          sql.NullInt64
		cancel           bool
	)
	err := sc.Scan(&th.ID, &th.Owner, &th.Title, &settings,
		&th.Usage.InputTokens, &th.Usage.OutputTokens, &th.Usage.TotalTokens, &th.Usage.CachedInputTokens,
		&created, &updated, &th.Epoch, &claimRun, &claimEpoch, &hb, &cancel,
		&th.Usage.ReasoningTokens, &th.Usage.CostMicroUSD, &readers, &th.Usage.CacheWriteTokens)
	if err != nil {
		return agent.Thread{}, err
	}
	if err := json.Unmarshal([]byte(settings), &th.Settings); err != nil {
		return agent.Thread{}, err
	}
	th.CreatedAt = fromMillis(created)
	th.UpdatedAt = fromMillis(updated)
	if claimRun.Valid {
		th.ActiveRun = &agent.Claim{
			RunID:           claimRun.String,
			Epoch:           claimEpoch.Int64,
			HeartbeatAt:     fromNullMillis(hb),
			CancelRequested: cancel,
			ReadersUntil:    fromNullMillis(readers),
		}
	}
	return th, nil
}

// claimArgs are the claim columns' values for c (all NULL when c is nil).
func claimArgs(c *agent.Claim) []any {
	if c == nil {
		return []any{nil, nil, nil, false}
	}
	return []any{c.RunID, c.Epoch, millis(c.HeartbeatAt), c.CancelRequested}
}

func threadNotFound(id string) error {
	return agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", id)
}

// CreateThread inserts t unless its id exists, and returns the stored thread.
func (s *Store) CreateThread(ctx context.Context, t agent.Thread) (agent.Thread, bool, error) {
	s.op()
	if t.ID == "" {
		return agent.Thread{}, false, agent.E(agent.KindInvalid, agent.CodeInvalidThreadID, "thread id is empty")
	}
	settings, err := json.Marshal(t.Settings)
	if err != nil {
		return agent.Thread{}, false, s.fail("encode settings", err)
	}
	var (
		stored  agent.Thread
		created bool
	)
	err = s.write(ctx, "create thread", func(c conn) error {
		args := append([]any{t.ID, t.Owner, t.Title, string(settings),
			t.Usage.InputTokens, t.Usage.OutputTokens, t.Usage.TotalTokens, t.Usage.CachedInputTokens,
			millis(t.CreatedAt), millis(t.UpdatedAt), t.Epoch}, claimArgs(t.ActiveRun)...)
		args = append(args, t.Usage.ReasoningTokens, t.Usage.CostMicroUSD)
		// A thread created again on a deleted one's id starts its epochs above the deleted one's (threadsGoneEpoch).
		n, err := c.execN(ctx, `INSERT INTO threads (`+threadReadCols+`)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11 + coalesce((SELECT epoch FROM threads_gone WHERE id = ?1), 0),
				?12, ?13, ?14, ?15, ?16, ?17) ON CONFLICT (id) DO NOTHING`, args...)
		if err != nil {
			return err
		}
		created = n == 1
		stored, err = scanThread(c.queryRow(ctx, `SELECT `+threadScanCols+` FROM threads WHERE id = ?`, t.ID))
		return err
	})
	if err != nil {
		return agent.Thread{}, false, err
	}
	return stored, created, nil
}

// GetThread reads one thread.
func (s *Store) GetThread(ctx context.Context, id string) (agent.Thread, error) {
	s.op()
	th, err := scanThread(s.read().queryRow(ctx, `SELECT `+threadScanCols+` FROM threads WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return agent.Thread{}, threadNotFound(id)
	}
	if err != nil {
		return agent.Thread{}, s.fail("get thread", err)
	}
	return th, nil
}

// ListThreads returns owner's threads, most recently updated first.
func (s *Store) ListThreads(ctx context.Context, owner string, limit int) ([]agent.Thread, error) {
	page, err := s.ListThreadsPage(ctx, owner, agent.ThreadPage{Limit: limit})
	return page.Items, err
}

// ListThreadsPage reads one page of owner's threads: a keyset read on (updated_at, id) past the cursor, one row
// more than the page to know whether more remain.
func (s *Store) ListThreadsPage(ctx context.Context, owner string, p agent.ThreadPage) (agent.Page[agent.Thread], error) {
	s.op()
	limit := p.Limit
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	q := `SELECT ` + threadScanCols + ` FROM threads WHERE owner = ?`
	args := []any{owner}
	if !p.From.IsZero() {
		at := millis(p.From.UpdatedAt)
		q += ` AND (updated_at < ? OR (updated_at = ? AND id < ?))`
		args = append(args, at, at, p.From.ID)
	}
	rows, err := s.read().query(ctx, q+` ORDER BY updated_at DESC, id DESC LIMIT ?`, append(args, limit+1)...)
	if err != nil {
		return agent.Page[agent.Thread]{}, s.fail("list threads", err)
	}
	out, err := collect(rows, scanThread)
	if err != nil {
		return agent.Page[agent.Thread]{}, s.fail("list threads", err)
	}
	if out == nil {
		out = []agent.Thread{}
	}
	if len(out) > limit {
		return agent.Page[agent.Thread]{Items: out[:limit], More: true}, nil
	}
	return agent.Page[agent.Thread]{Items: out}, nil
}

// UpdateThread applies p and sets UpdatedAt to now.
func (s *Store) UpdateThread(ctx context.Context, id string, p agent.ThreadPatch, now time.Time) (agent.Thread, error) {
	s.op()
	var title, settings any
	byUser := 0
	if p.Title != nil {
		title, byUser = *p.Title, 1
	}
	if p.Settings != nil {
		b, err := json.Marshal(*p.Settings)
		if err != nil {
			return agent.Thread{}, s.fail("encode settings", err)
		}
		settings = string(b)
	}
	var th agent.Thread
	err := s.write(ctx, "update thread", func(c conn) error {
		var err error
		th, err = scanThread(c.queryRow(ctx, `UPDATE threads
			SET title = coalesce(?, title), title_by_user = max(title_by_user, ?), settings = coalesce(?, settings), updated_at = ?
			WHERE id = ? RETURNING `+threadScanCols, title, byUser, settings, millis(now), id))
		if errors.Is(err, sql.ErrNoRows) {
			return threadNotFound(id)
		}
		return err
	})
	return th, err
}

// SetGeneratedTitle sets the title in one conditional UPDATE (the same incarnation, its title still g.Replaces,
// and neither the owner's nor generated), then reads the row back in the same transaction.
func (s *Store) SetGeneratedTitle(ctx context.Context, g agent.GeneratedTitle) (agent.Thread, bool, error) {
	s.op()
	if g.Title == "" {
		return agent.Thread{}, false, agent.E(agent.KindInvalid, agent.CodeInvalidTitle, "a generated title is empty")
	}
	var (
		th  agent.Thread
		set bool
	)
	err := s.write(ctx, "set generated title", func(c conn) error {
		n, err := c.execN(ctx, `UPDATE threads SET title = ?, title_generated = 1
			WHERE id = ? AND created_at = ? AND title = ? AND title_by_user = 0 AND title_generated = 0`,
			g.Title, g.ThreadID, millis(g.CreatedAt), g.Replaces)
		if err != nil {
			return err
		}
		set = n == 1
		th, err = scanThread(c.queryRow(ctx, `SELECT `+threadScanCols+` FROM threads WHERE id = ?`, g.ThreadID))
		if errors.Is(err, sql.ErrNoRows) {
			return threadNotFound(g.ThreadID)
		}
		return err
	})
	if err != nil {
		return agent.Thread{}, false, err
	}
	return th, set, nil
}

// AddUsage adds u.Usage to the thread's totals in one conditional UPDATE (the same incarnation, and a key other
// than the last one added), which records u.Key; a thread that is missing, or of another incarnation, is not
// found, and the last key again changes nothing.
func (s *Store) AddUsage(ctx context.Context, u agent.ThreadUsage) error {
	s.op()
	return s.write(ctx, "add usage", func(c conn) error {
		n, err := c.execN(ctx, `UPDATE threads SET usage_input = usage_input + ?, usage_output = usage_output + ?,
			usage_total = usage_total + ?, usage_cached = usage_cached + ?, usage_reasoning = usage_reasoning + ?,
			usage_cost = usage_cost + ?, usage_cache_write = usage_cache_write + ?, usage_key = ?
			WHERE id = ? AND created_at = ? AND usage_key IS NOT ?`,
			u.Usage.InputTokens, u.Usage.OutputTokens, u.Usage.TotalTokens, u.Usage.CachedInputTokens, u.Usage.ReasoningTokens,
			u.Usage.CostMicroUSD, u.Usage.CacheWriteTokens, u.Key, u.ThreadID, millis(u.CreatedAt), u.Key)
		if err != nil || n == 1 {
			return err
		}
		var created int64
		err = c.queryRow(ctx, `SELECT created_at FROM threads WHERE id = ?`, u.ThreadID).Scan(&created)
		if errors.Is(err, sql.ErrNoRows) || err == nil && created != millis(u.CreatedAt) {
			return threadNotFound(u.ThreadID)
		}
		return err // the key added last: counted before
	})
}

// DeleteThread removes the thread with its messages, runs, segments, interrupts, jobs and queue, in one
// transaction: the claim check and every delete commit together or not at all. That transaction is the tombstone
// of the port's contract: no other connection can see the thread half deleted, claim it or write into it while
// the delete runs, and a delete killed half way leaves everything as it was (calling it again does the whole
// delete). A held claim, even a
// stale one, refuses the delete with KindConflict/CodeRunActive (the reaper or a takeover frees it first). The
// children are deleted even when the thread row is gone, so a repeated delete also clears what an interrupted
// older version of this store may have left behind.
func (s *Store) DeleteThread(ctx context.Context, id string) error {
	s.op()
	return s.write(ctx, "delete thread", func(c conn) error {
		var claimRun sql.NullString
		err := c.queryRow(ctx, `SELECT claim_run_id FROM threads WHERE id = ?`, id).Scan(&claimRun)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if claimRun.Valid {
			return agent.E(agent.KindConflict, agent.CodeRunActive, "thread %q is running %q", id, claimRun.String)
		}
		if err == nil {
			// The thread existed: its runs' late writes are refused while no thread row is there (claimAllows),
			// and a thread created again on the id starts above its epoch (CreateThread).
			if _, err := c.exec(ctx, `INSERT INTO threads_gone (id, epoch) SELECT id, epoch FROM threads WHERE id = ?
				ON CONFLICT (id) DO UPDATE SET epoch = max(threads_gone.epoch, excluded.epoch)`, id); err != nil {
				return err
			}
		}
		for _, stmt := range []string{
			// Segments by thread, and by the thread's runs in case a segment was written without its thread id.
			`DELETE FROM segments WHERE thread_id = ?1 OR run_id IN (SELECT id FROM runs WHERE thread_id = ?1)`,
			`DELETE FROM messages WHERE thread_id = ?1`,
			`DELETE FROM interrupts WHERE thread_id = ?1`,
			`DELETE FROM jobs WHERE thread_id = ?1`,
			`DELETE FROM queue WHERE thread_id = ?1`,
			`DELETE FROM runs WHERE thread_id = ?1`,
			`DELETE FROM threads WHERE id = ?1`,
		} {
			if _, err := c.exec(ctx, stmt, id); err != nil {
				return err
			}
		}
		return nil
	})
}

// FinishDelete has nothing to finish: DeleteThread is one transaction, so no delete is ever left half done.
func (s *Store) FinishDelete(context.Context, string) error { return nil }

// collect scans every row and closes rows. It never returns a nil slice without an error.
// listBefore runs a reaper work-list query (query takes the cutoff and the limit: limit <= 0 means
// agent.DefaultListLimit) and scans its rows.
func listBefore[T any](ctx context.Context, s *Store, what, query string, scan func(scanner) (T, error), before time.Time, limit int) ([]T, error) {
	s.op()
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	rows, err := s.read().query(ctx, query, millis(before), limit)
	if err != nil {
		return nil, s.fail(what, err)
	}
	out, err := collect(rows, scan)
	if err != nil {
		return nil, s.fail(what, err)
	}
	return out, nil
}

func collect[T any](rows *sql.Rows, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
