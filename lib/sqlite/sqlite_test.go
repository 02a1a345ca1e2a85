package sqlite_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/storetest"
)

// setup opens a store on a fresh file (in a directory Open has to create) and closes it when the test ends.
func setup(t testing.TB) *sqlite.Store {
	t.Helper()
	return open(t, filepath.Join(t.TempDir(), "data", "agentloop.db"))
}

func open(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// nowMillis is the fixed time these tests write at, as unix milliseconds.
const nowMillis = 1893553445006

// nowTime is nowMillis as a UTC time.
func nowTime() time.Time { return time.UnixMilli(nowMillis).UTC() }

func newThread(t testing.TB, s agent.Store, id string) agent.Thread {
	t.Helper()
	th, _, err := s.CreateThread(t.Context(), agent.Thread{ID: id, Owner: "u1", CreatedAt: nowTime(), UpdatedAt: nowTime()})
	if err != nil {
		t.Fatalf("CreateThread: %v", err)
	}
	return th
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) agent.Store { return setup(t) })
}

// Two Stores on one file stand in for two processes (each has its own connection pool and write queue): each
// sees the other's writes, and a claim race across both still has exactly one winner.
func TestTwoStoresShareFile(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "shared.db")
	a, b := open(t, path), open(t, path)

	newThread(t, a, "th1")
	if _, err := b.GetThread(ctx, "th1"); err != nil {
		t.Fatalf("b.GetThread of a's thread: %v", err)
	}
	m := agent.Message{ID: "m1", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hi"}`)}}
	w := agent.MessageWrite{ThreadID: "th-messages", Message: m, Fence: testFence, Now: nowTime()}
	if err := b.PutMessage(ctx, w); err != nil {
		t.Fatalf("b.PutMessage: %v", err)
	}
	msgs, err := a.ListMessages(ctx, "th-messages")
	if err != nil || len(msgs) != 1 || string(msgs[0].Message.Parts[0]) != string(m.Parts[0]) {
		t.Fatalf("a.ListMessages = %v, %v; want b's message", msgs, err)
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []agent.Run
	)
	for i := range 40 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: fmt.Sprintf("run-%02d", i),
				Trigger: agent.TriggerUser, Now: nowTime(), StaleAfter: 30 * time.Second})
			if err != nil {
				if !errors.Is(err, agent.ErrRunActive) {
					t.Errorf("ClaimRun: %v, want run_active", err)
				}
				return
			}
			mu.Lock()
			winners = append(winners, res.Run)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d winners across two stores, want 1", len(winners))
	}
	run := winners[0]
	run.Status = agent.RunCompleted
	run.FinishedAt = nowTime().Add(time.Second)
	if err := a.FinishRun(ctx, run); err != nil {
		t.Fatalf("a.FinishRun: %v", err)
	}
	if th, err := b.GetThread(ctx, "th1"); err != nil || th.ActiveRun != nil || th.Epoch != 1 {
		t.Fatalf("b.GetThread after a finished = %+v, %v; want idle at epoch 1", th, err)
	}
}

// helperEnv names the environment variable that turns this test binary into a claimer process.
const helperEnv = "AGENTLOOP_SQLITE_CLAIMER"

// TestCrossProcessClaimRace runs real separate processes against one file: the claim is decided by SQLite's file
// lock, not by anything held in one process's memory.
func TestCrossProcessClaimRace(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "procs.db")
	s := open(t, path)
	newThread(t, s, "th1")

	const procs, perProc = 3, 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  int
		lost int
	)
	for p := range procs {
		wg.Go(func() {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperClaimer$", "-test.count=1")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|th1|p%d|%d", helperEnv, path, p, perProc))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("claimer process %d: %v\n%s", p, err, out)
				return
			}
			w, l, ok := parseTally(string(out))
			if !ok {
				t.Errorf("claimer process %d printed no tally:\n%s", p, out)
				return
			}
			mu.Lock()
			won += w
			lost += l
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if won != 1 || lost != procs*perProc-1 {
		t.Fatalf("across %d processes: %d won, %d lost; want 1 and %d", procs, won, lost, procs*perProc-1)
	}
	runs, err := s.ListRuns(t.Context(), "th1")
	if err != nil || len(runs) != 1 {
		t.Fatalf("ListRuns = %d runs, %v; want the one winner", len(runs), err)
	}
}

func parseTally(out string) (won, lost int, ok bool) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "tally won=%d lost=%d", &won, &lost); err == nil {
			return won, lost, true
		}
	}
	return 0, 0, false
}

// TestHelperClaimer is the body of a claimer process; it does nothing in a normal test run.
func TestHelperClaimer(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("only runs as a child of TestCrossProcessClaimRace")
	}
	f := strings.Split(spec, "|")
	if len(f) != 4 {
		t.Fatalf("bad %s=%q", helperEnv, spec)
	}
	path, thread, prefix := f[0], f[1], f[2]
	n, err := strconv.Atoi(f[3])
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, path)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		won, lost int
	)
	for i := range n {
		wg.Go(func() {
			_, err := s.ClaimRun(t.Context(), agent.ClaimRequest{ThreadID: thread, Owner: "u1", RunID: fmt.Sprintf("%s-%d", prefix, i),
				Trigger: agent.TriggerUser, Now: nowTime(), StaleAfter: 30 * time.Second})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, agent.ErrRunActive):
				lost++
			default:
				t.Errorf("ClaimRun: %v", err)
			}
		})
	}
	wg.Wait()
	fmt.Printf("tally won=%d lost=%d\n", won, lost)
}

// Data written before Close is there after Open.
func TestReopenKeepsData(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "a", "b", "reopen.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	newThread(t, s, "th1")
	if err := s.PutValue(t.Context(), "ns", "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	if _, err := s.GetThread(t.Context(), "th1"); err != nil {
		t.Fatalf("GetThread after reopen: %v", err)
	}
	if v, err := s.GetValue(t.Context(), "ns", "k"); err != nil || string(v) != "v" {
		t.Fatalf("GetValue after reopen = %q, %v", v, err)
	}
}

// Ops counts Store calls one each; Statements counts the SQL behind them.
func TestOpsCounters(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ops, stmts := s.Ops(), s.Statements()
	newThread(t, s, "th1") // insert + read back
	if _, err := s.GetThread(t.Context(), "th1"); err != nil {
		t.Fatal(err)
	}
	if got := s.Ops() - ops; got != 2 {
		t.Fatalf("Ops grew by %d for 2 calls", got)
	}
	if got := s.Statements() - stmts; got != 3 {
		t.Fatalf("Statements grew by %d, want 3 (insert, read back, get)", got)
	}
}

// Whitespace around a whole part is the one thing not kept (documented); everything inside is.
func TestPartSurroundingWhitespaceDropped(t *testing.T) {
	t.Parallel()
	s := setup(t)
	m := agent.Message{ID: "m1", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(" \n{ \"type\": \"text\" }\t ")}}
	w := agent.MessageWrite{ThreadID: "th1", Message: m, Fence: testFence, Now: nowTime()}
	if err := s.PutMessage(t.Context(), w); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetMessage(t.Context(), "th1", "m1")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{ "type": "text" }`; string(got.Message.Parts[0]) != want {
		t.Fatalf("part = %q, want %q", got.Message.Parts[0], want)
	}
}

// FinishRun only takes terminal outcomes, and a run id is never claimed twice: once its run is finished, a late
// retry of its claim is refused as fenced instead of starting it again.
func TestFinishRunRejectsRunning(t *testing.T) {
	t.Parallel()
	s := setup(t)
	newThread(t, s, "th1")
	req := agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: "r1", Now: nowTime(), StaleAfter: time.Minute}
	res, err := s.ClaimRun(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(t.Context(), res.Run); !errors.Is(err, &agent.Error{Code: agent.CodeInvalidStatus}) {
		t.Fatalf("FinishRun(running) error = %v, want %s", err, agent.CodeInvalidStatus)
	}
	run := res.Run
	run.Status = agent.RunCompleted
	if err := s.FinishRun(t.Context(), run); err != nil {
		t.Fatal(err)
	}
	req.Now = nowTime().Add(time.Hour)
	if _, err := s.ClaimRun(t.Context(), req); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("ClaimRun with a finished run's id: error = %v, want %s", err, agent.CodeRunFenced)
	}
	if th, err := s.GetThread(t.Context(), "th1"); err != nil || th.ActiveRun != nil || th.Epoch != 1 {
		t.Fatalf("thread after the refused claim = %+v, %v; want idle at epoch 1", th, err)
	}
}

// Messages written without a claim (tests, tools of older builds) never share a position with a claim's: the
// first claim starts above the highest stored seq, deleted messages included.
func TestClaimStartsAboveExistingMessages(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := setup(t)
	for _, seq := range []int64{3, 0, 7} {
		m := agent.Message{ID: fmt.Sprintf("m%d", seq), Role: agent.RoleUser}
		w := agent.MessageWrite{ThreadID: "th1", Seq: seq, Message: m, Fence: testFence, Now: nowTime()}
		if err := s.PutMessage(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteMessage(ctx, "th1", "m7", testFence); err != nil {
		t.Fatal(err)
	}
	newThread(t, s, "th1") // after the messages: a thread's row fences message writes by its claim (fence F)
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: "r1", Now: nowTime(),
		StaleAfter: time.Minute, Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.FirstSeq != 8 || res.Run.Reserved != 2 {
		t.Fatalf("first claim at [%d,+%d), want [8,+2)", res.Run.FirstSeq, res.Run.Reserved)
	}
}

// testFence is the fence of this file's message writes: one writer that never finalizes.
var testFence = agent.Fence{RunID: "r1", Epoch: 1}

// Fence F (REVIEW §3): PutMessage, DeleteMessage and FinishRun check the thread's claim in their own transaction,
// so a run whose claim the reaper took writes nothing, a new id included (which no message row could fence), while
// the reaper's takeover claim writes.
func TestWritesCheckTheClaim(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := setup(t)
	newThread(t, s, "th1")
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: "r1", Now: nowTime(), Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	msg := func(id string) agent.Message {
		return agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hi"}`)}}
	}
	if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: "th1", Seq: run.FirstSeq, Message: msg("u1"), Fence: run.Fence(), Now: nowTime()}); err != nil {
		t.Fatalf("PutMessage while holding the claim: %v", err)
	}
	hold, err := s.TakeOver(ctx, agent.TakeRequest{ThreadID: "th1", Fence: run.Fence(), RunID: run.ID, Now: nowTime()})
	if err != nil {
		t.Fatal(err)
	}
	late := agent.MessageWrite{ThreadID: "th1", Seq: run.AssistantSeq(), Message: msg("new-id"), Fence: run.Fence(), Now: nowTime()}
	if err := s.PutMessage(ctx, late); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("PutMessage of a new id after the takeover: %v, want %s", err, agent.CodeRunFenced)
	}
	if err := s.DeleteMessage(ctx, "th1", "u1", run.Fence()); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("DeleteMessage after the takeover: %v, want %s", err, agent.CodeRunFenced)
	}
	done := run
	done.Status = agent.RunCompleted
	if err := s.FinishRun(ctx, done); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("FinishRun after the takeover: %v, want %s", err, agent.CodeRunFenced)
	}
	msgs, err := s.ListMessages(ctx, "th1")
	if err != nil || len(msgs) != 1 || msgs[0].Message.ID != "u1" {
		t.Fatalf("messages after the late writes = %+v, %v; want u1 alone", msgs, err)
	}
	// The reaper's claim writes, and a second holder of the same id is refused.
	late.Fence = hold
	if err := s.PutMessage(ctx, late); err != nil {
		t.Fatalf("PutMessage by the reaper's claim: %v", err)
	}
	if err := s.ReleaseClaim(ctx, agent.ReleaseRequest{ThreadID: "th1", Fence: hold}); err != nil {
		t.Fatal(err)
	}
	late.Fence = hold
	if err := s.PutMessage(ctx, late); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("PutMessage after the reaper gave the thread back: %v, want %s", err, agent.CodeRunFenced)
	}
}

// Issue 16 item 2 (REVIEW D10): a run of a deleted thread writes nothing while no thread row exists, so nothing of
// it is there for a thread created again on the id; once that thread exists, fence F refuses the old run as it
// refuses any run that does not hold the claim.
func TestWritesBetweenDeleteAndRecreateAreRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := setup(t)
	newThread(t, s, "th1")
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: "r1", Now: nowTime(), Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	msg := func(id string) agent.Message {
		return agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hi"}`)}}
	}
	if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: "th1", Seq: run.FirstSeq, Message: msg("u1"), Fence: run.Fence(), Now: nowTime()}); err != nil {
		t.Fatal(err)
	}
	done := run
	done.Status = agent.RunCompleted
	if err := s.FinishRun(ctx, done); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteThread(ctx, "th1"); err != nil {
		t.Fatal(err)
	}
	late := agent.MessageWrite{ThreadID: "th1", Seq: run.AssistantSeq(), Message: msg("late"), Fence: run.Fence(), Now: nowTime()}
	if err := s.PutMessage(ctx, late); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("PutMessage of a new id after the delete: %v, want %s", err, agent.CodeRunFenced)
	}
	if err := s.FenceMessage(ctx, "th1", "stub", run.Fence()); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("FenceMessage after the delete: %v, want %s", err, agent.CodeRunFenced)
	}
	if err := s.DeleteMessage(ctx, "th1", "u1", run.Fence()); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("DeleteMessage after the delete: %v, want %s", err, agent.CodeRunFenced)
	}
	newThread(t, s, "th1")
	if msgs, err := s.ListMessages(ctx, "th1"); err != nil || len(msgs) != 0 {
		t.Fatalf("messages of the thread created again = %+v, %v; want none", msgs, err)
	}
	if err := s.PutMessage(ctx, late); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("PutMessage of a new id after the thread was created again: %v, want %s", err, agent.CodeRunFenced)
	}
}

// REVIEW S7: a thread's resolved interrupts do not pile up for its reads: a resolve removes the thread's interrupts
// resolved more than agent.DefaultResolvedInterruptKeep before it (DynamoDB: the table's TTL does, see
// lib/dynamo). Pending ones stay whatever their age.
func TestResolvedInterruptsArePurged(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	t0 := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(agent.DefaultResolvedInterruptKeep + time.Second)
	for i, id := range []string{"old", "waiting", "new"} {
		in := agent.Interrupt{ID: id, ThreadID: "th", RunID: "r", MessageID: "m" + id, Kind: agent.InterruptApproval, ToolCallID: "c" + id,
			ToolName: "t", Status: agent.InterruptPending, CreatedAt: t0.Add(time.Duration(i) * time.Second), ExpiresAt: t0.Add(48 * time.Hour)}
		if _, _, err := s.CreateInterrupt(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []struct {
		id  string
		now time.Time
	}{{"old", t0}, {"new", later}} {
		if _, err := s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: "th", MessageID: "m" + r.id, ID: r.id, Status: agent.InterruptApproved, Now: r.now}); err != nil {
			t.Fatal(err)
		}
	}
	ins, err := s.ListInterrupts(ctx, "th")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range ins {
		ids = append(ids, in.ID)
	}
	if strings.Join(ids, ",") != "waiting,new" {
		t.Fatalf("interrupts %v, want the pending one and the one resolved within the keep age", ids)
	}
}
