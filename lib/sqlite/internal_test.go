package sqlite

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// explainOps returns the VDBE opcodes SQLite compiles query to.
func explainOps(t *testing.T, s *Store, query string, args ...any) map[string]int {
	t.Helper()
	rows, err := s.db.QueryContext(t.Context(), "EXPLAIN "+query, args...)
	if err != nil {
		t.Fatalf("EXPLAIN: %v", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		ops[fmt.Sprint(vals[1])]++ // addr, opcode, p1, ...
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ops
}

// A heartbeat (one per second per run) must stay one row write: it sets a column no index holds, so SQLite
// compiles it without a single index write. The claim, which does change the claimed index, is the contrast that
// shows the check can see index writes.
func TestHeartbeatWritesNoIndex(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "hb.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	idxWrites := func(ops map[string]int) int { return ops["IdxInsert"] + ops["IdxDelete"] }
	hb := explainOps(t, s, heartbeatSQL, 1, "th", "run", 1)
	if hb["Update"] == 0 && hb["Insert"] == 0 {
		t.Fatalf("heartbeat plan has no row write at all: %v", hb)
	}
	if n := idxWrites(hb); n != 0 {
		t.Fatalf("heartbeat plan writes %d index entries, want none: %v", n, hb)
	}
	cl := explainOps(t, s, `UPDATE threads SET claim_run_id = ?, claim_heartbeat_at = ? WHERE id = ?`, "run", 1, "th")
	if idxWrites(cl) == 0 {
		t.Fatalf("a claim's update shows no index writes (%v): the check cannot see them", cl)
	}
}

// A KeepClaims batch is one statement whatever its size (the keeper's store work per process does not grow with
// its runs), it looks each thread up by its primary key instead of scanning the table, and like a heartbeat it
// writes no index entry.
func TestKeepClaimsIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "keep.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.UnixMilli(1_700_000_000_000).UTC()
	var batch []agent.KeptClaim
	for i := range 50 {
		id := fmt.Sprintf("th%d", i)
		if _, _, err := s.CreateThread(ctx, agent.Thread{ID: id, Owner: "u1", CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "u1", RunID: "run" + id, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, agent.KeptClaim{ThreadID: id, Fence: res.Run.Fence()})
	}
	for _, n := range []int{1, 10, 50} {
		before := s.Statements()
		for i, r := range s.KeepClaims(ctx, batch[:n], now.Add(time.Second)) {
			if r.Err != nil {
				t.Fatalf("batch of %d: claim %d: %v", n, i, r.Err)
			}
		}
		if got := s.Statements() - before; got != 1 {
			t.Fatalf("a batch of %d claims ran %d statements, want 1", n, got)
		}
	}
	if p := queryPlan(t, s, keepClaimsSQL, 1, `[["th1","run",1]]`); !strings.Contains(p, "SEARCH threads USING INDEX sqlite_autoindex_threads_1 (id=?)") ||
		strings.Contains(p, "SCAN threads") {
		t.Fatalf("keep claims plan = %q, want a lookup of each thread by its key", p)
	}
	if ops := explainOps(t, s, keepClaimsSQL, 1, `[["th1","run",1]]`); ops["IdxInsert"]+ops["IdxDelete"] != 0 {
		t.Fatalf("keep claims plan writes index entries, want none: %v", ops)
	}
}

// A file written by version 1 is migrated in place: everything in it reads back, a claim's positions start above
// its messages, its messages take fenced writes, and the claimed index is the new one.
func TestMigratesVersion1(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := migrated(t, 1,
		`INSERT INTO threads VALUES ('th1', 'u1', 'old', '{"reviewTools":true}', 1, 2, 3, 0, 1000, 2000, 2, NULL, NULL, NULL, 0)`,
		`INSERT INTO runs VALUES ('th1', 'r1', 'user', 'completed', NULL, 1, 2, 3, 0, 1, 'm', 'a1', 2, 1000, 2000, 2000)`,
		`INSERT INTO messages VALUES ('th1', 'u1', 0, 'user', '[{"type":"text","text":"hi"}]', NULL, 1000, 1000)`,
		`INSERT INTO messages VALUES ('th1', 'a1', 4, 'assistant', '[{"type":"text","text":"yo"}]', '{"status":"completed"}', 1000, 1000)`,
	)
	th, err := s.GetThread(ctx, "th1")
	if err != nil || th.Title != "old" || !th.Settings.ReviewTools || th.Epoch != 2 || th.Usage.TotalTokens != 3 {
		t.Fatalf("GetThread after migration = %+v, %v", th, err)
	}
	msgs, err := s.ListMessages(ctx, "th1")
	if err != nil || len(msgs) != 2 || msgs[1].Message.ID != "a1" || msgs[1].Seq != 4 {
		t.Fatalf("ListMessages after migration = %+v, %v", msgs, err)
	}
	run, err := s.GetRun(ctx, "th1", "r1")
	if err != nil || run.Status != agent.RunCompleted || run.Epoch != 2 {
		t.Fatalf("GetRun after migration = %+v, %v", run, err)
	}
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: "r2", Now: time.UnixMilli(3000),
		StaleAfter: time.Minute, Reserve: 2})
	if err != nil || res.Run.FirstSeq != 5 || res.Run.Epoch != 3 {
		t.Fatalf("ClaimRun after migration = %+v, %v; want positions from 5 at epoch 3", res.Run, err)
	}
	// Old messages carry no fence: the new run may finalize them, and then a lower epoch may not touch them.
	a1 := msgs[1].Message
	if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: "th1", Message: a1, Fence: res.Run.Fence(), Final: true,
		Now: time.UnixMilli(3000)}); err != nil {
		t.Fatalf("PutMessage over a v1 message: %v", err)
	}
	if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: "th1", Message: a1, Fence: agent.Fence{RunID: "r1", Epoch: 2},
		Now: time.UnixMilli(4000)}); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("PutMessage at a lower epoch after migration: %v, want run_fenced", err)
	}
	if n := explainOps(t, s, heartbeatSQL, 1, "th", "run", 1); n["IdxInsert"]+n["IdxDelete"] != 0 {
		t.Fatalf("heartbeat on a migrated file writes index entries: %v", n)
	}
	// Opening again is a no-op.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, s.Path())
	if err != nil {
		t.Fatalf("second Open after migration: %v", err)
	}
	_ = s2.Close()
}

// When another connection holds the write lock through every retry, a write fails with the catalog's
// KindUnavailable/CodeStoreUnavailable, and nothing is written.
func TestBusyIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "busy.db")
	s, err := open(ctx, path, time.Millisecond, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	holder, err := sql.Open("sqlite", dsn(path, busyTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	tx, err := holder.BeginTx(ctx, nil) // BEGIN IMMEDIATE: takes the write lock now
	if err != nil {
		t.Fatal(err)
	}
	err = s.PutValue(ctx, "ns", "k", []byte("v"))
	if !errors.Is(err, agent.ErrStoreUnavailable) || !agent.IsKind(err, agent.KindUnavailable) {
		t.Fatalf("PutValue while another process holds the lock: %v, want %s", err, agent.CodeStoreUnavailable)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetValue(ctx, "ns", "k"); !agent.IsKind(err, agent.KindNotFound) {
		t.Fatalf("GetValue after the refused write: %v, want not found", err)
	}
	if err := s.PutValue(ctx, "ns", "k", []byte("v")); err != nil {
		t.Fatalf("PutValue once the lock is free: %v", err)
	}
}

// A file written by version 2 (the schema before interrupts) is migrated in place: what it holds reads back, and
// interrupts can be created, resolved and listed on its threads.
func TestMigratesVersion2(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := migrated(t, 2,
		`INSERT INTO threads VALUES ('th1', 'u1', 'old', '{"reviewTools":true}', 1, 2, 3, 0, 1000, 2000, 2, NULL, NULL, NULL, 0, 5)`,
		`INSERT INTO runs VALUES ('th1', 'r1', 'user', 'completed', NULL, 1, 2, 3, 0, 1, 'm', 'a1', 2, 1000, 2000, 2000, 3, 2, NULL)`,
		`INSERT INTO messages VALUES ('th1', 'a1', 4, 'assistant', '[{"type":"text","text":"yo"}]', NULL, 1000, 1000, 'r1', 2, 1, 0)`,
	)
	if th, err := s.GetThread(ctx, "th1"); err != nil || th.Title != "old" || th.Epoch != 2 {
		t.Fatalf("GetThread after migration = %+v, %v", th, err)
	}
	if msgs, err := s.ListMessages(ctx, "th1"); err != nil || len(msgs) != 1 || msgs[0].Seq != 4 {
		t.Fatalf("ListMessages after migration = %+v, %v", msgs, err)
	}
	if run, err := s.GetRun(ctx, "th1", "r1"); err != nil || run.FirstSeq != 3 || run.Reserved != 2 {
		t.Fatalf("GetRun after migration = %+v, %v", run, err)
	}
	if list, err := s.ListInterrupts(ctx, "th1"); err != nil || len(list) != 0 {
		t.Fatalf("ListInterrupts after migration = %+v, %v; want none", list, err)
	}
	now := time.UnixMilli(3000).UTC()
	in := agent.Interrupt{ID: "i1", ThreadID: "th1", RunID: "r1", Epoch: 2, MessageID: "a1", Kind: agent.InterruptApproval,
		ToolName: "delete_note", Input: []byte(`{"id":1}`), Status: agent.InterruptPending, CreatedAt: now,
		ExpiresAt: now.Add(time.Minute)}
	if _, created, err := s.CreateInterrupt(ctx, in); err != nil || !created {
		t.Fatalf("CreateInterrupt after migration: created %v, %v", created, err)
	}
	if got, err := s.ListExpiredInterrupts(ctx, now.Add(time.Hour), 0); err != nil || len(got) != 1 || got[0].ID != "i1" {
		t.Fatalf("ListExpiredInterrupts after migration = %+v, %v", got, err)
	}
	if _, err := s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: "th1", MessageID: "a1", ID: "i1", Status: agent.InterruptExpired, Now: now}); err != nil {
		t.Fatalf("ResolveInterrupt after migration: %v", err)
	}
	if got, err := s.ListExpiredInterrupts(ctx, now.Add(time.Hour), 0); err != nil || len(got) != 0 {
		t.Fatalf("ListExpiredInterrupts after the resolve = %+v, %v; want none", got, err)
	}
}

// The reaper's list reads only the partial index of pending interrupts, and a resolve takes the row out of it in
// the same statement: the plan of the list is a search of interrupts_pending, and the resolve's plan deletes an
// entry of an index.
func TestExpiredInterruptsUseThePendingIndex(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if p := queryPlan(t, s, listExpiredSQL, 1, 10); !strings.Contains(p, "SEARCH interrupts USING INDEX interrupts_pending") ||
		strings.Contains(p, "TEMP B-TREE") {
		t.Fatalf("ListExpiredInterrupts plan = %q, want a search of interrupts_pending with no sort", p)
	}
	ops := explainOps(t, s, resolveSQL, "approved", nil, 1, "th", "i1", "a1")
	if ops["IdxDelete"] == 0 {
		t.Fatalf("resolve plan deletes no index entry (%v): the pending index would keep resolved rows", ops)
	}
}

// A file written by version 3 (the schema before jobs and the queue) is migrated in place: what it holds reads
// back, and its threads take jobs and queued messages, numbered from the new counter.
func TestMigratesVersion3(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := migrated(t, 3,
		`INSERT INTO threads VALUES ('th1', 'u1', 'old', '{"reviewTools":true}', 1, 2, 3, 0, 1000, 2000, 2, NULL, NULL, NULL, 0, 5)`,
		`INSERT INTO runs VALUES ('th1', 'r1', 'user', 'completed', NULL, 1, 2, 3, 0, 1, 'm', 'a1', 2, 1000, 2000, 2000, 3, 2, NULL)`,
		`INSERT INTO messages VALUES ('th1', 'a1', 4, 'assistant', '[{"type":"text","text":"yo"}]', NULL, 1000, 1000, 'r1', 2, 1, 0)`,
		`INSERT INTO interrupts VALUES ('th1', 'i1', 'r1', 2, 'a1', 'approval', 'c1', 'delete_note', '{"id":1}', 'sig',
			'pending', NULL, 1000, 5000, NULL)`,
	)
	if th, err := s.GetThread(ctx, "th1"); err != nil || th.Title != "old" || th.Epoch != 2 {
		t.Fatalf("GetThread after migration = %+v, %v", th, err)
	}
	if msgs, err := s.ListMessages(ctx, "th1"); err != nil || len(msgs) != 1 || msgs[0].Seq != 4 {
		t.Fatalf("ListMessages after migration = %+v, %v", msgs, err)
	}
	if list, err := s.ListInterrupts(ctx, "th1"); err != nil || len(list) != 1 || string(list[0].Input) != `{"id":1}` {
		t.Fatalf("ListInterrupts after migration = %+v, %v", list, err)
	}
	if list, err := s.ListJobs(ctx, "th1"); err != nil || len(list) != 0 {
		t.Fatalf("ListJobs after migration = %+v, %v; want none", list, err)
	}
	if list, err := s.ListQueued(ctx, "th1"); err != nil || len(list) != 0 {
		t.Fatalf("ListQueued after migration = %+v, %v; want none", list, err)
	}

	now := time.UnixMilli(3000).UTC()
	j := agent.Job{ID: "j1", ThreadID: "th1", Kind: "research", ToolCallID: "c2", Status: agent.JobRunning,
		DueAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now}
	if _, created, err := s.CreateJob(ctx, j); err != nil || !created {
		t.Fatalf("CreateJob after migration: created %v, %v", created, err)
	}
	if got, err := s.ListDueJobs(ctx, now.Add(time.Hour), 0); err != nil || len(got) != 1 || got[0].ID != "j1" {
		t.Fatalf("ListDueJobs after migration = %+v, %v", got, err)
	}
	for i, id := range []string{"q1", "q2"} {
		q := agent.QueuedMessage{ThreadID: "th1", Kind: agent.QueueUser, Status: agent.QueueQueued, CreatedAt: now,
			Message: agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"x"}`)}}}
		got, created, err := s.Enqueue(ctx, q, 0)
		if err != nil || !created || got.Seq != int64(i+1) {
			t.Fatalf("Enqueue(%s) after migration = seq %d, created %v, %v; want seq %d", id, got.Seq, created, err, i+1)
		}
	}
	if got, err := s.ListQueuedThreads(ctx, now.Add(time.Hour), 0); err != nil || len(got) != 1 || got[0] != "th1" {
		t.Fatalf("ListQueuedThreads after migration = %v, %v", got, err)
	}
}

// queryPlan returns SQLite's EXPLAIN QUERY PLAN of query, one detail per step, joined.
func queryPlan(t *testing.T, s *Store, query string, args ...any) string {
	t.Helper()
	rows, err := s.db.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "; ")
}

// The reaper's job and queue lists read only their partial indexes (undelivered jobs, queued entries), and the
// writes that end an item's wait take its row out of them in the same statement.
func TestReaperListsUseTheirPartialIndexes(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if p := queryPlan(t, s, listDueSQL, 1, 10); !strings.Contains(p, "SEARCH jobs USING INDEX jobs_due") ||
		strings.Contains(p, "TEMP B-TREE") {
		t.Fatalf("ListDueJobs plan = %q, want a search of jobs_due with no sort", p)
	}
	// DISTINCT sorts the thread ids it has read; the read itself is a range of the index alone.
	if p := queryPlan(t, s, listQueuedThreadsSQL, 1, 10); !strings.Contains(p, "SEARCH queue USING COVERING INDEX queue_waiting") {
		t.Fatalf("ListQueuedThreads plan = %q, want a search of queue_waiting (covering)", p)
	}
	if ops := explainOps(t, s, deliverSQL, 1, "th", "j1"); ops["IdxDelete"] == 0 {
		t.Fatalf("delivery plan deletes no index entry (%v): jobs_due would keep delivered jobs", ops)
	}
	if ops := explainOps(t, s, takeSQL, 1, 2, "th", "m1"); ops["IdxDelete"] == 0 {
		t.Fatalf("take plan deletes no index entry (%v): queue_waiting would keep taken entries", ops)
	}
}

// migrated writes a file of schema version (testdata/schema_v<version>.sql, then rows, then that user_version),
// opens it with Open, and checks that the migration took it to schemaVersion.
func migrated(t *testing.T, version int, rows ...string) *Store {
	t.Helper()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), fmt.Sprintf("v%d.db", version))
	raw, err := sql.Open("sqlite", dsn(path, busyTimeout))
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("schema_v%d.sql", version)))
	if err != nil {
		t.Fatal(err)
	}
	stmts := append(strings.Split(string(schema), ";\n"), rows...)
	stmts = append(stmts, fmt.Sprintf(`PRAGMA user_version = %d`, version))
	for _, stmt := range stmts {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := raw.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("v%d fixture: %v\n%s", version, err, stmt)
		}
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open(v%d file): %v", version, err)
	}
	t.Cleanup(func() { s.Close() })
	var got int
	if err := s.db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&got); err != nil || got != schemaVersion {
		t.Fatalf("user_version after migration = %d, %v; want %d", got, err, schemaVersion)
	}
	return s
}
