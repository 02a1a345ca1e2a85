package sqlite

import (
	"context"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

const segmentCols = `thread_id, run_id, seq, data, final, created_at, expires_at`

func scanSegment(sc scanner) (agent.Segment, error) {
	var (
		g                agent.Segment
		created, expires int64
	)
	if err := sc.Scan(&g.ThreadID, &g.RunID, &g.Seq, &g.Data, &g.Final, &created, &expires); err != nil {
		return agent.Segment{}, err
	}
	g.CreatedAt = fromMillis(created)
	g.ExpiresAt = fromMillis(expires)
	return g, nil
}

// AppendSegment stores g unless its (RunID, Seq) exists. A run's first segment (seq 0) also deletes every segment
// that expired before g.CreatedAt, which keeps the file from growing without a TTL sweeper.
func (s *Store) AppendSegment(ctx context.Context, g agent.Segment) error {
	s.op()
	if g.RunID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidSegment, "segment needs a run id")
	}
	if g.Seq < 0 {
		return agent.E(agent.KindInvalid, agent.CodeInvalidSegment, "segment seq %d is negative", g.Seq)
	}
	data := g.Data
	if data == nil {
		data = []byte{} // the driver binds a nil slice as NULL
	}
	return s.write(ctx, "append segment", func(c conn) error {
		if _, err := c.exec(ctx, `INSERT INTO segments (`+segmentCols+`) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (run_id, seq) DO NOTHING`,
			g.ThreadID, g.RunID, g.Seq, data, g.Final, millis(g.CreatedAt), millis(g.ExpiresAt)); err != nil {
			return err
		}
		if g.Seq != 0 || g.CreatedAt.IsZero() {
			return nil
		}
		_, err := c.exec(ctx, `DELETE FROM segments WHERE expires_at < ?`, millis(g.CreatedAt))
		return err
	})
}

// ListSegments returns the run's unexpired segments with Seq >= from, in order, up to and including the run's
// first final segment (expired or not): whatever a fenced writer appended after the reaper's final segment is
// never read.
func (s *Store) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+segmentCols+` FROM segments
		WHERE run_id = ?1 AND seq >= ?2 AND expires_at >= ?3
			AND seq <= coalesce((SELECT min(seq) FROM segments WHERE run_id = ?1 AND final), 9223372036854775807)
		ORDER BY seq`, runID, from, millis(now))
	if err != nil {
		return nil, s.fail("list segments", err)
	}
	out, err := collect(rows, scanSegment)
	if err != nil {
		return nil, s.fail("list segments", err)
	}
	return out, nil
}
