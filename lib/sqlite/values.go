package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/agentloop/agentloop/lib/agent"
)

// PutValue sets ns/key to value.
func (s *Store) PutValue(ctx context.Context, ns, key string, value []byte) error {
	s.op()
	if value == nil {
		value = []byte{} // the driver binds a nil slice as NULL
	}
	return s.write(ctx, "put value", func(c conn) error {
		_, err := c.exec(ctx, `INSERT INTO kv (ns, key, value) VALUES (?, ?, ?)
			ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value`, ns, key, value)
		return err
	})
}

// GetValue reads ns/key; an unknown key is KindNotFound.
func (s *Store) GetValue(ctx context.Context, ns, key string) ([]byte, error) {
	s.op()
	var v []byte
	err := s.read().queryRow(ctx, `SELECT value FROM kv WHERE ns = ? AND key = ?`, ns, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, agent.E(agent.KindNotFound, agent.CodeNotFound, "%s/%s not found", ns, key)
	}
	if err != nil {
		return nil, s.fail("get value", err)
	}
	return v, nil
}

// ListValues returns the namespace's entries ordered by key (byte order).
func (s *Store) ListValues(ctx context.Context, ns string) ([]agent.KV, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT key, value FROM kv WHERE ns = ? ORDER BY key`, ns)
	if err != nil {
		return nil, s.fail("list values", err)
	}
	out, err := collect(rows, func(sc scanner) (agent.KV, error) {
		var kv agent.KV
		err := sc.Scan(&kv.Key, &kv.Value)
		return kv, err
	})
	if err != nil {
		return nil, s.fail("list values", err)
	}
	return out, nil
}

// DeleteValue removes ns/key; an unknown key is a no-op.
func (s *Store) DeleteValue(ctx context.Context, ns, key string) error {
	s.op()
	return s.write(ctx, "delete value", func(c conn) error {
		_, err := c.exec(ctx, `DELETE FROM kv WHERE ns = ? AND key = ?`, ns, key)
		return err
	})
}
