package sqlite

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Stored times must read back identical (reflect.DeepEqual), including the zero time, which FinishedAt uses.
func TestMillisRoundTrip(t *testing.T) {
	t.Parallel()
	for _, in := range []time.Time{
		{},
		time.Date(2030, 1, 2, 3, 4, 5, 6_000_000, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 999_000_000, time.UTC),
		time.UnixMilli(0).UTC(),
	} {
		if got := fromMillis(millis(in)); got != in {
			t.Errorf("fromMillis(millis(%v)) = %v", in, got)
		}
		if got := fromNullMillis(nullInt(nullMillis(in))); got != in {
			t.Errorf("fromNullMillis(nullMillis(%v)) = %v", in, got)
		}
	}
}

// A file written by a newer schema is refused, not misread.
func TestRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "newer.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(t.Context(), fmt.Sprintf("PRAGMA user_version = %d", schemaVersion+1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(t.Context(), path); err == nil {
		_ = s.Close()
		t.Fatal("Open of a newer schema succeeded")
	} else if agent.KindOf(err) != agent.KindInternal {
		t.Fatalf("Open of a newer schema: %v, want KindInternal", err)
	}
}

func nullInt(v any) sql.NullInt64 {
	if v == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: v.(int64), Valid: true}
}
