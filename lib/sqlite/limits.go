package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// leasesTable keeps one row per live (or not yet purged) lease (version 5). A lease whose expires_at is at or
// before a request's Now counts for nothing; AcquireLease purges the scope's expired rows when it inserts.
const leasesTable = `CREATE TABLE IF NOT EXISTS leases (
		scope      TEXT NOT NULL,
		holder     TEXT NOT NULL,
		expires_at INTEGER NOT NULL, -- unix ms
		PRIMARY KEY (scope, holder)
	) STRICT, WITHOUT ROWID`

// countersTable keeps one row per scope and fixed window (version 5); Count drops the scope's older windows when
// it counts in a new one, so a scope keeps one row.
const countersTable = `CREATE TABLE IF NOT EXISTS counters (
		scope        TEXT NOT NULL,
		window_start INTEGER NOT NULL, -- unix ms
		n            INTEGER NOT NULL,
		PRIMARY KEY (scope, window_start)
	) STRICT, WITHOUT ROWID`

// AcquireLease is one transaction: the holder's live lease is extended; otherwise the scope's live leases are
// counted (the primary key's range of the scope) and, when there is room, its expired rows are purged and the
// lease inserted. A refusal writes nothing.
func (s *Store) AcquireLease(ctx context.Context, r agent.LeaseRequest) (time.Duration, error) {
	s.op()
	if err := r.Check(false); err != nil {
		return 0, err
	}
	now, exp := millis(r.Now), millis(r.Now.Add(r.TTL))
	var retry time.Duration
	err := s.write(ctx, "acquire lease", func(c conn) error {
		retry = 0
		n, err := c.execN(ctx, `UPDATE leases SET expires_at = ? WHERE scope = ? AND holder = ? AND expires_at > ?`,
			exp, r.Scope, r.Holder, now)
		if err != nil || n > 0 {
			return err
		}
		var live int
		var first sql.NullInt64
		if err := c.queryRow(ctx, `SELECT count(*), min(expires_at) FROM leases WHERE scope = ? AND expires_at > ?`,
			r.Scope, now).Scan(&live, &first); err != nil {
			return err
		}
		if live >= r.Limit {
			retry = max(time.Duration(first.Int64-now)*time.Millisecond, time.Millisecond)
			return nil
		}
		if _, err := c.exec(ctx, `DELETE FROM leases WHERE scope = ? AND expires_at <= ?`, r.Scope, now); err != nil {
			return err
		}
		_, err = c.exec(ctx, `INSERT INTO leases (scope, holder, expires_at) VALUES (?, ?, ?)
			ON CONFLICT (scope, holder) DO UPDATE SET expires_at = excluded.expires_at`, r.Scope, r.Holder, exp)
		return err
	})
	if err != nil {
		return 0, err
	}
	return retry, nil
}

// RenewLease is one UPDATE of the holder's row, conditional on the lease being live.
func (s *Store) RenewLease(ctx context.Context, r agent.LeaseRequest) error {
	s.op()
	if err := r.Check(true); err != nil {
		return err
	}
	return s.write(ctx, "renew lease", func(c conn) error {
		n, err := c.execN(ctx, `UPDATE leases SET expires_at = ? WHERE scope = ? AND holder = ? AND expires_at > ?`,
			millis(r.Now.Add(r.TTL)), r.Scope, r.Holder, millis(r.Now))
		if err == nil && n == 0 {
			return agent.E(agent.KindConflict, agent.CodeLeaseLost, "no live lease of %q in %q", r.Holder, r.Scope)
		}
		return err
	})
}

// ReleaseLease deletes the holder's row.
func (s *Store) ReleaseLease(ctx context.Context, scope, holder string) error {
	s.op()
	return s.write(ctx, "release lease", func(c conn) error {
		_, err := c.exec(ctx, `DELETE FROM leases WHERE scope = ? AND holder = ?`, scope, holder)
		return err
	})
}

// Count is one transaction: read the window's count; when there is room, drop the scope's older windows and
// add one to this one's row.
func (s *Store) Count(ctx context.Context, r agent.CountRequest) (time.Duration, error) {
	s.op()
	if err := r.Check(); err != nil {
		return 0, err
	}
	start, end := agent.WindowOf(r.Now, r.Window)
	var retry time.Duration
	err := s.write(ctx, "count", func(c conn) error {
		retry = 0
		var n int
		err := c.queryRow(ctx, `SELECT n FROM counters WHERE scope = ? AND window_start = ?`, r.Scope, millis(start)).Scan(&n)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if _, err := c.exec(ctx, `DELETE FROM counters WHERE scope = ? AND window_start < ?`, r.Scope, millis(start)); err != nil {
				return err
			}
		case err != nil:
			return err
		case n >= r.Limit:
			retry = max(end.Sub(r.Now), time.Millisecond)
			return nil
		}
		_, err = c.exec(ctx, `INSERT INTO counters (scope, window_start, n) VALUES (?, ?, 1)
			ON CONFLICT (scope, window_start) DO UPDATE SET n = n + 1`, r.Scope, millis(start))
		return err
	})
	if err != nil {
		return 0, err
	}
	return retry, nil
}

// ReleaseLeases deletes the scope's rows whose holder begins with prefix (a range of the primary key's scope).
func (s *Store) ReleaseLeases(ctx context.Context, scope, prefix string) error {
	s.op()
	if scope == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidLease, "releasing leases needs a scope")
	}
	return s.write(ctx, "release leases", func(c conn) error {
		_, err := c.exec(ctx, `DELETE FROM leases WHERE scope = ? AND substr(holder, 1, length(?)) = ?`, scope, prefix, prefix)
		return err
	})
}
