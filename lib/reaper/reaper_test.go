package reaper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/tools"
)

// staleAfter is the tests' StaleAfter. Several tests run on the real clock with a live claim heartbeaten at
// time.Now() beside dead ones a minute old, and expect only the dead ones reaped: the live claim must stay fresh
// for however long a loaded machine takes to reach the tick (1 s did not, issue 16 item 12), and the dead ones
// must be stale at once. Tests on a manual clock move it by multiples of it.
const staleAfter = 30 * time.Second

// missingRuns hides every run item, as after a crash between DynamoDB's claim write and its run write.
type missingRuns struct{ *sqlite.Store }

func (missingRuns) GetRun(ctx context.Context, threadID, runID string) (agent.Run, error) {
	return agent.Run{}, agent.E(agent.KindNotFound, agent.CodeRunNotFound, "run %s not found", runID)
}

type fixture struct {
	store *sqlite.Store
	r     *reaper.Reaper
}

func setup(t *testing.T) *fixture {
	t.Helper()
	st := sqliteStore(t)
	clock := agent.SystemClock{}
	return &fixture{store: st, r: reaper.New(reaper.Deps{Store: st, Tools: tools.Demo(st, clock), Clock: clock}, reaper.Config{StaleAfter: staleAfter})}
}

// claim creates thread id (owner alice) and claims it for runID with a heartbeat at hb.
func (f *fixture) claim(t *testing.T, id, runID string, hb time.Time) agent.Run {
	t.Helper()
	ctx := context.Background()
	if _, _, err := f.store.CreateThread(ctx, agent.Thread{ID: id, Owner: "alice", CreatedAt: hb, UpdatedAt: hb}); err != nil {
		t.Fatal(err)
	}
	res, err := f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "alice", RunID: runID, AssistantMessageID: "msg_" + runID, Now: hb, Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	return res.Run
}

func (f *fixture) draft(t *testing.T, run agent.Run, md string, parts ...string) {
	t.Helper()
	var raw []json.RawMessage
	for _, p := range parts {
		raw = append(raw, json.RawMessage(p))
	}
	err := f.store.PutMessage(context.Background(), agent.MessageWrite{ThreadID: run.ThreadID, Seq: run.AssistantSeq(), Fence: run.Fence(), Now: time.Now(),
		Message: agent.Message{ID: run.AssistantMessageID, Role: agent.RoleAssistant, Parts: raw, Metadata: json.RawMessage(md)}})
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) idle(t *testing.T, id string) agent.Thread {
	t.Helper()
	th, err := f.store.GetThread(context.Background(), id)
	if err != nil || th.ActiveRun != nil {
		t.Fatalf("thread %s: %+v %v, want the claim released", id, th.ActiveRun, err)
	}
	return th
}

func finalSegment(t *testing.T, st *sqlite.Store, runID string) []byte {
	t.Helper()
	segs, err := st.ListSegments(context.Background(), runID, 0, time.Now())
	if err != nil || len(segs) == 0 || !segs[len(segs)-1].Final {
		t.Fatalf("segments of %s: %d %v, want a final one", runID, len(segs), err)
	}
	return segs[len(segs)-1].Data
}

// A tick finds a dead run through the index and reaps it: failed/stale, usage from its draft counted once on
// the thread, the draft finalized with a truthful result for the call that has none, a final segment written.
// A live run is left alone.
func TestTickReapsDeadRunsOnly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	dead := f.claim(t, "dead", "run_dead", time.Now().Add(-time.Minute))
	f.draft(t, dead, `{"status":"streaming","usage":{"inputTokens":7,"outputTokens":3,"totalTokens":10,"cachedInputTokens":0}}`,
		`{"type":"step-start"}`, `{"type":"tool-list_notes","toolCallId":"c1","state":"input-available","input":{}}`)
	f.claim(t, "live", "run_live", time.Now())
	st, err := f.r.Tick(ctx)
	if err != nil || st.Reaped != 1 {
		t.Fatalf("Tick = %+v, %v; want 1 reaped", st, err)
	}
	run, _ := f.store.GetRun(ctx, "dead", "run_dead")
	if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStale || run.Usage.TotalTokens != 10 {
		t.Fatalf("dead run = %+v", run)
	}
	if th := f.idle(t, "dead"); th.Usage.TotalTokens != 10 {
		t.Fatalf("thread usage %+v, want the draft's 10 tokens (REVIEW L/M12)", th.Usage)
	}
	rec, _ := f.store.GetMessage(ctx, "dead", "msg_run_dead")
	p, _ := agent.DecodePart(rec.Message.Parts[1])
	if rec.Message.Meta().Status != agent.MessageFailed || p.State != agent.StateOutputError || !bytes.Contains([]byte(p.ErrorText), []byte("unknown")) {
		t.Fatalf("dead draft not finalized truthfully: %s %s", rec.Message.Metadata, rec.Message.Parts[1])
	}
	if !bytes.Contains(finalSegment(t, f.store, "run_dead"), []byte(`"type":"finish"`)) {
		t.Fatal("final segment lacks finish")
	}
	if th, _ := f.store.GetThread(ctx, "live"); th.ActiveRun == nil {
		t.Fatal("the live run was reaped")
	}
}

// REVIEW M2: a claim whose run item is missing, or already terminal, is released too (it used to block the
// thread until a POST took it over).
func TestReleasesClaimsOfMissingOrFinishedRuns(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	// Terminal run whose release was lost: FinishRun's run write applied, its thread write did not.
	done := f.claim(t, "done", "run_done", old)
	done.Status, done.Usage, done.FinishedAt = agent.RunCompleted, agent.Usage{TotalTokens: 5}, old
	if err := f.store.FinishRun(ctx, done); err != nil {
		t.Fatal(err)
	}
	// A claim whose run item was never written (DynamoDB: a crash between the claim's two writes).
	ghost := f.claim(t, "ghost", "run_ghost", old)
	r := reaper.New(reaper.Deps{Store: missingRuns{f.store}, Clock: agent.SystemClock{}}, reaper.Config{StaleAfter: staleAfter})
	if ok, err := r.Reap(ctx, "ghost", agent.Claim{RunID: "run_other", Epoch: ghost.Epoch, HeartbeatAt: old}); err != nil || ok {
		t.Fatalf("a reap naming another run: %v %v", ok, err)
	}
	if th, _ := f.store.GetThread(ctx, "ghost"); th.ActiveRun == nil {
		t.Fatal("a reap naming another run released the claim")
	}
	if ok, err := r.Reap(ctx, "ghost", agent.Claim{RunID: ghost.ID, Epoch: ghost.Epoch, HeartbeatAt: old}); err != nil || !ok {
		t.Fatalf("reap of a claim without a run: %v %v", ok, err)
	}
	f.idle(t, "ghost")
	th, _ := f.store.GetThread(ctx, "done")
	if th.ActiveRun != nil {
		if ok, err := f.r.Reap(ctx, "done", *th.ActiveRun); err != nil || !ok {
			t.Fatalf("reap done: %v %v", ok, err)
		}
	}
	if th := f.idle(t, "done"); th.Usage.TotalTokens != 5 {
		t.Fatalf("usage of the finished run: %+v, want 5 counted once", th.Usage)
	}
}

// REVIEW M9: the reaper decides in its write. A claim whose heartbeat moved on after the index nominated it keeps
// its claim; of several reapers racing for one dead run exactly one reaps it.
func TestReapDecidesInItsWrite(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	live := f.claim(t, "live", "run_live", old)
	nominee := agent.Claim{RunID: live.ID, Epoch: live.Epoch, HeartbeatAt: old}
	if err := f.store.Heartbeat(ctx, "live", live.Fence(), time.Now()); err != nil { // the run came back
		t.Fatal(err)
	}
	if ok, err := f.r.Reap(ctx, "live", nominee); err != nil || ok {
		t.Fatalf("reaped a live run: %v %v", ok, err)
	}
	if run, _ := f.store.GetRun(ctx, "live", live.ID); run.Status != agent.RunRunning {
		t.Fatalf("live run = %s", run.Status)
	}

	dead := f.claim(t, "dead", "run_dead", old)
	f.draft(t, dead, `{"status":"streaming","usage":{"inputTokens":1,"outputTokens":1,"totalTokens":2,"cachedInputTokens":0}}`, `{"type":"text","text":"partial"}`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	reaped := 0
	for range 8 {
		wg.Go(func() {
			ok, err := f.r.Reap(ctx, "dead", agent.Claim{RunID: dead.ID, Epoch: dead.Epoch, HeartbeatAt: old})
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				reaped++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if th := f.idle(t, "dead"); reaped != 1 || th.Usage.TotalTokens != 2 {
		t.Fatalf("%d reapers reaped; thread usage %+v (want 1 and 2 tokens)", reaped, th.Usage)
	}
}

// A dead run whose final message was stored (only its outcome was lost) ends as its message says, and the
// message is left as the run wrote it.
func TestFinalMessageStoredOutcomeLost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	run := f.claim(t, "th", "run_1", time.Now().Add(-time.Minute))
	err := f.store.PutMessage(ctx, agent.MessageWrite{ThreadID: "th", Seq: run.AssistantSeq(), Fence: run.Fence(), Final: true, Now: time.Now(),
		Message: agent.Message{ID: run.AssistantMessageID, Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"all done"}`)},
			Metadata: json.RawMessage(`{"status":"completed","usage":{"inputTokens":1,"outputTokens":2,"totalTokens":3,"cachedInputTokens":0}}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f.r.Reap(ctx, "th", agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: time.Now().Add(-time.Minute)}); err != nil || !ok {
		t.Fatalf("reap: %v %v", ok, err)
	}
	got, _ := f.store.GetRun(ctx, "th", run.ID)
	rec, _ := f.store.GetMessage(ctx, "th", run.AssistantMessageID)
	if got.Status != agent.RunCompleted || rec.Message.Meta().Status != agent.MessageCompleted || f.idle(t, "th").Usage.TotalTokens != 3 {
		t.Fatalf("run %s, message %s", got.Status, rec.Message.Metadata)
	}
}

// Principle 9: a call whose tool recorded its outcome under the idempotency key gets that outcome, not "unknown".
func TestRecoveryReportsRecordedOutcome(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	run := f.claim(t, "th", "run_1", time.Now().Add(-time.Minute))
	add := tools.Demo(f.store, agent.SystemClock{})[0]
	inv := agent.ToolInvocation{ThreadID: "th", Owner: "alice", RunID: run.ID, ToolCallID: "c1", Input: json.RawMessage(`{"text":"milk"}`),
		IdempotencyKey: agent.IdempotencyKey("th", run.AssistantMessageID, "c1")}
	out, err := add.Execute(ctx, inv)
	if err != nil {
		t.Fatal(err)
	}
	f.draft(t, run, `{"status":"streaming"}`, `{"type":"tool-add_note","toolCallId":"c1","state":"input-available","input":{"text":"milk"}}`)
	if ok, err := f.r.Reap(ctx, "th", agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: time.Now().Add(-time.Minute)}); err != nil || !ok {
		t.Fatalf("reap: %v %v", ok, err)
	}
	rec, _ := f.store.GetMessage(ctx, "th", run.AssistantMessageID)
	p, _ := agent.DecodePart(rec.Message.Parts[0])
	if p.State != agent.StateOutputAvailable || !bytes.Equal(p.Output, out) {
		t.Fatalf("recovered part %s, want the recorded output %s", rec.Message.Parts[0], out)
	}
}

// lostRelease applies the first ReleaseClaim and then answers run_fenced, as an SDK retry after a lost answer
// does (the retry finds the claim gone).
type lostRelease struct {
	*sqlite.Store
	once sync.Once
}

func (l *lostRelease) ReleaseClaim(ctx context.Context, req agent.ReleaseRequest) error {
	err := l.Store.ReleaseClaim(ctx, req)
	applied := false
	l.once.Do(func() { applied = err == nil })
	if applied {
		return agent.E(agent.KindConflict, agent.CodeRunFenced, "the retry found the claim gone")
	}
	return err
}

// A reap whose release applied but whose answer was lost still finishes the run (it was left running forever).
func TestReapAfterLostReleaseAnswer(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	run := f.claim(t, "th", "run_1", old)
	r := reaper.New(reaper.Deps{Store: &lostRelease{Store: f.store}, Clock: agent.SystemClock{}}, reaper.Config{StaleAfter: staleAfter})
	if _, err := r.Reap(ctx, "th", agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: old}); err != nil {
		t.Fatal(err)
	}
	f.idle(t, "th")
	if got, _ := f.store.GetRun(ctx, "th", run.ID); got.Status != agent.RunFailed || got.Error == nil || got.Error.Code != agent.CodeStale {
		t.Fatalf("run = %+v, want failed/stale", got)
	}
	finalSegment(t, f.store, run.ID)
}

// diesAfterTakeOver is a reaper store that dies right after its takeover applied (the reaper's process ends).
type diesAfterTakeOver struct{ *sqlite.Store }

func (d diesAfterTakeOver) TakeOver(ctx context.Context, req agent.TakeRequest) (agent.Fence, error) {
	if _, err := d.Store.TakeOver(ctx, req); err != nil {
		return agent.Fence{}, err
	}
	return agent.Fence{}, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "the reaper's process died")
}

// stopsAfterRecordOutcome is a reaper store whose process stops right after the run's outcome applied: the
// reaper still holds the thread, and its release (which counts the run's usage) has not happened.
type stopsAfterRecordOutcome struct{ *sqlite.Store }

func (d stopsAfterRecordOutcome) RecordOutcome(ctx context.Context, run agent.Run, holder agent.Fence) error {
	if err := d.Store.RecordOutcome(ctx, run, holder); err != nil {
		return err
	}
	return agent.E(agent.KindInternal, agent.CodeInternal, "the reaper's process stopped")
}

// Two reapers nominate the same dead run: the first takes the claim and records the outcome, the second finds the
// takeover applied, adopts it and gives the claim back first. The dead run's usage is counted once, by whichever
// release applies (TestReapDecidesInItsWrite lost it 1 in ~10 under -race and load: the adopter released with
// none).
func TestAdoptedReapCountsTheUsage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	run := f.deadRun(t, old)
	nominee := agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: old}
	first := reaper.New(reaper.Deps{Store: stopsAfterRecordOutcome{f.store}, Clock: agent.SystemClock{}}, reaper.Config{StaleAfter: staleAfter})
	if _, err := first.Reap(ctx, "th", nominee); err == nil {
		t.Fatal("setup: the first reaper reported success")
	}
	if got, _ := f.store.GetRun(ctx, "th", run.ID); got.Status != agent.RunFailed {
		t.Fatalf("setup: run %s, want its outcome recorded", got.Status)
	}
	if ok, err := f.r.Reap(ctx, "th", nominee); err != nil || ok {
		t.Fatalf("second reaper: %v %v, want the takeover adopted (not counted as its reap)", ok, err)
	}
	if th := f.idle(t, "th"); th.Usage.TotalTokens != 2 {
		t.Fatalf("thread usage %+v, want the dead run's 2 tokens", th.Usage)
	}
}

// deadRun is run_1 on thread th, claimed at old (stale), with a streaming draft that used 2 tokens and left one
// call (c1, list_notes) without a result.
func (f *fixture) deadRun(t *testing.T, old time.Time) agent.Run {
	t.Helper()
	run := f.claim(t, "th", "run_1", old)
	f.draft(t, run, `{"status":"streaming","runId":"run_1","usage":{"inputTokens":1,"outputTokens":1,"totalTokens":2,"cachedInputTokens":0}}`,
		`{"type":"tool-list_notes","toolCallId":"c1","state":"input-available","input":{}}`)
	return run
}

// laterClock is the system clock moved on by d.
type laterClock struct{ d time.Duration }

func (c laterClock) Now() time.Time { return time.Now().Add(c.d) }

// A reaper that dies right after its takeover leaves its own claim: the next sweep, once that claim is stale,
// reaps it the same way, at the next epoch, and finishes the run the dead reaper was finishing.
func TestDeadReaperIsReaped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	run := f.deadRun(t, old)
	dying := reaper.New(reaper.Deps{Store: diesAfterTakeOver{f.store}, Clock: agent.SystemClock{}}, reaper.Config{StaleAfter: staleAfter})
	if _, err := dying.Reap(ctx, "th", agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: old}); err == nil {
		t.Fatal("the dying reaper reported success")
	}
	th, _ := f.store.GetThread(ctx, "th")
	if th.ActiveRun == nil || th.ActiveRun.RunID != agent.ReapRunID(run.ID) || th.ActiveRun.Epoch != run.Epoch+1 {
		t.Fatalf("setup: claim %+v, want the reaper's at epoch %d", th.ActiveRun, run.Epoch+1)
	}
	next := reaper.New(reaper.Deps{Store: f.store, Clock: laterClock{2 * staleAfter}}, reaper.Config{StaleAfter: staleAfter})
	st, err := next.Tick(ctx)
	if err != nil || st.Reaped != 1 {
		t.Fatalf("next sweep: %+v, %v; want the dead reaper's claim reaped", st, err)
	}
	got, _ := f.store.GetRun(ctx, "th", run.ID)
	rec, _ := f.store.GetMessage(ctx, "th", run.AssistantMessageID)
	if idle := f.idle(t, "th"); got.Status != agent.RunFailed || rec.Message.Meta().Status != agent.MessageFailed ||
		idle.Usage.TotalTokens != 2 || idle.Epoch != run.Epoch+2 {
		t.Fatalf("after the next sweep: run %s, message %s, thread %+v", got.Status, rec.Message.Metadata, idle)
	}
}

// A FinishRun that died between its release and the run's outcome (DynamoDB makes them two writes) leaves a run
// that no claim names; a reader that meets it finishes it (the reaper's sweep finds such runs too, on stores that
// list them: TestTickFinishesClaimlessRunningRuns).
func TestOrphanIsFinishedByItsReader(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	run := f.deadRun(t, old)
	if err := f.store.ReleaseClaim(ctx, agent.ReleaseRequest{ThreadID: "th", Fence: run.Fence(),
		Usage: agent.Usage{InputTokens: 1, OutputTokens: 1, TotalTokens: 2}}); err != nil {
		t.Fatal(err)
	}
	rec, _ := f.store.GetMessage(ctx, "th", run.AssistantMessageID)
	f.r.Orphans(ctx, "th", "", []agent.Message{rec.Message})
	got, _ := f.store.GetRun(ctx, "th", run.ID)
	rec, _ = f.store.GetMessage(ctx, "th", run.AssistantMessageID)
	// The usage was added once, by the run's own release.
	if got.Status != agent.RunFailed || rec.Message.Meta().Status != agent.MessageFailed || f.idle(t, "th").Usage.TotalTokens != 2 {
		t.Fatalf("orphan: run %s, message %s", got.Status, rec.Message.Metadata)
	}
}

// A sweep marks pending interrupts past their age expired (and nothing else), by compare-and-set; a dead run's
// interrupts that its message never showed are canceled when it is reaped.
func TestTickExpiresAndCancelsInterrupts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	now := time.Now()
	run := f.claim(t, "th", "run_dead", now.Add(-time.Minute))
	ins := map[string]string{} // interrupt id → the message that asked it
	ask := func(id string, expires time.Time, runID string) {
		t.Helper()
		ins[id] = "msg_" + runID
		in := agent.Interrupt{ID: id, ThreadID: "th", RunID: runID, MessageID: "msg_" + runID, Kind: agent.InterruptApproval,
			ToolCallID: "call_" + id, ToolName: "delete_note", Input: json.RawMessage(`{}`), Status: agent.InterruptPending,
			CreatedAt: now.Add(-25 * time.Hour), ExpiresAt: expires}
		if _, _, err := f.store.CreateInterrupt(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	ask("old", now.Add(-time.Hour), "run_earlier")
	ask("fresh", now.Add(time.Hour), "run_earlier")
	ask("asked_by_dead", now.Add(time.Hour), run.ID)
	st, err := f.r.Tick(ctx)
	if err != nil || st.Expired != 1 || st.Reaped != 1 {
		t.Fatalf("tick: %+v %v", st, err)
	}
	want := map[string]agent.InterruptStatus{"old": agent.InterruptExpired, "fresh": agent.InterruptPending, "asked_by_dead": agent.InterruptCanceled}
	for id, status := range want {
		in, err := f.store.GetInterrupt(ctx, "th", ins[id], id)
		if err != nil || in.Status != status {
			t.Errorf("%s: %s %v, want %s", id, in.Status, err, status)
		}
	}
	if st, _ := f.r.Tick(ctx); st.Expired != 0 {
		t.Fatalf("a second sweep expired %d again", st.Expired)
	}
}

// Issue 16 item 11: a reaped run's slot in its user's active-run scope is given back by the reaper at once, not
// when its lease expires, so a user whose processes die is not refused new runs for the lease's TTL.
func TestReapGivesBackTheRunSlot(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	run := f.claim(t, "th", "run_1", old)
	slot := agent.LeaseRequest{Scope: agent.RunSlotScope("alice"), Holder: run.ID, Limit: 1, TTL: time.Hour, Now: old}
	if retry, err := f.store.AcquireLease(ctx, slot); err != nil || retry > 0 {
		t.Fatalf("AcquireLease: %v %v", retry, err)
	}
	if ok, err := f.r.Reap(ctx, "th", agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: old}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}
	next := agent.LeaseRequest{Scope: agent.RunSlotScope("alice"), Holder: "run_2", Limit: 1, TTL: time.Hour, Now: time.Now()}
	if retry, err := f.store.AcquireLease(ctx, next); err != nil || retry > 0 {
		t.Fatalf("the user's next run after the reap: retry after %v (%v), want the reaped run's slot free", retry, err)
	}
}

// lateSegment lands a non-final segment of the dead run at the seq the reaper's final segment is about to take
// (the dead run's writer was still appending), once.
type lateSegment struct {
	*sqlite.Store
	once sync.Once
}

func (l *lateSegment) AppendSegment(ctx context.Context, s agent.Segment) error {
	if s.Final {
		var err error
		l.once.Do(func() {
			late := s
			late.Final, late.Data = false, []byte("data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"late\"}\n\n")
			err = l.Store.AppendSegment(ctx, late)
		})
		if err != nil {
			return err
		}
	}
	return l.Store.AppendSegment(ctx, s)
}

// REVIEW D8: the reaper's final segment, beaten to its seq by a late segment of the dead run, is written at the
// next seq, so readers end with the reaper's end instead of a synthesized one after a wait.
func TestFinalSegmentAfterALateSegment(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	run := f.claim(t, "th", "run_1", old)
	r := reaper.New(reaper.Deps{Store: &lateSegment{Store: f.store}, Clock: agent.SystemClock{}}, reaper.Config{StaleAfter: staleAfter})
	if ok, err := r.Reap(ctx, "th", agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: old}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}
	finalSegment(t, f.store, run.ID)
}

// Issue 16 item 11: a user message whose run died before writing anything gets a failed reply that readers show,
// with a stable code and a safe message, instead of one that readers hide (the engine still reads past it, so a
// re-post of the message runs again).
func TestEmptyReapShowsAFailedReply(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	run, _ := reapEmptyRun(t, f)
	recs, err := f.store.ListMessages(ctx, "th")
	if err != nil {
		t.Fatal(err)
	}
	var msgs []agent.Message
	for _, r := range recs {
		msgs = append(msgs, r.Message)
	}
	shown := agent.Shown(msgs)
	if len(shown) != 2 || shown[1].ID != run.AssistantMessageID {
		t.Fatalf("shown messages = %d, want the user message and its failed reply", len(shown))
	}
	md := shown[1].Meta()
	if md.Status != agent.MessageFailed || md.Error == nil || md.Error.Code != agent.CodeStale || md.Error.Message == "" {
		t.Fatalf("failed reply metadata = %s, want failed with the stale code and a message", shown[1].Metadata)
	}
	if v := agent.Visible(msgs); len(v) != 1 {
		t.Fatalf("the engine's view = %d messages, want the user message alone (a re-post runs again)", len(v))
	}
}

// stepClock is a clock the test moves by hand.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *stepClock) add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// REVIEW D15: a crash between FinishRun's release and its outcome (fence C) leaves a run recorded as running that
// no claim names. No reader is needed: one Tick with the clock past StaleAfter finds it (the store's list of
// claimless running runs) and finishes it through ReapOrphan, adopting the status of the final message it stored.
// A run still inside StaleAfter, and a live claimed run, are left alone. On both stores.
func TestTickFinishesClaimlessRunningRuns(t *testing.T) {
	t.Parallel()
	onBothStores(t, tickFinishesClaimlessRunningRuns)
}

// onBothStores runs fn on SQLite and on dynalite, as parallel subtests named after the store.
func onBothStores(t *testing.T, fn func(t *testing.T, st agent.Store)) {
	for name, open := range map[string]func(*testing.T) agent.Store{
		"sqlite": func(t *testing.T) agent.Store { return sqliteStore(t) },
		"dynamo": func(t *testing.T) agent.Store { return dynamoStore(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, open(t))
		})
	}
}

// sqliteStore opens a SQLite store in the test's temporary directory, closed when the test ends.
func sqliteStore(t *testing.T) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// dynamoStore starts a dynalite for the test and returns a store over a fresh table.
func dynamoStore(t *testing.T) *dynamo.Store {
	t.Helper()
	endpoint := dynamotest.Start(t)
	client := dynamotest.Client(endpoint)
	table := fmt.Sprintf("reaper_%d", time.Now().UnixNano())
	if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
		t.Fatal(err)
	}
	return dynamo.New(client, table)
}

func tickFinishesClaimlessRunningRuns(t *testing.T, st agent.Store) {
	clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
	r := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	ctx := context.Background()
	claim := func(id, runID string) agent.Run {
		t.Helper()
		now := clock.Now()
		if _, _, err := st.CreateThread(ctx, agent.Thread{ID: id, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		res, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "alice", RunID: runID, AssistantMessageID: "msg_" + runID, Now: now, Reserve: 2})
		if err != nil {
			t.Fatal(err)
		}
		return res.Run
	}
	reply := func(run agent.Run, final bool, md, part string) {
		t.Helper()
		err := st.PutMessage(ctx, agent.MessageWrite{ThreadID: run.ThreadID, Seq: run.AssistantSeq(), Fence: run.Fence(), Final: final, Now: clock.Now(),
			Message: agent.Message{ID: run.AssistantMessageID, Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(part)}, Metadata: json.RawMessage(md)}})
		if err != nil {
			t.Fatal(err)
		}
	}
	idle := func(id string) {
		t.Helper()
		if th, err := st.GetThread(ctx, id); err != nil || th.ActiveRun != nil {
			t.Errorf("thread %s: %+v %v, want the claim released", id, th.ActiveRun, err)
		}
	}

	// final: the reply was stored final (completed), then the release applied and the outcome was lost.
	final := claim("final", "run_final")
	reply(final, true, `{"status":"completed","runId":"run_final","usage":{"inputTokens":1,"outputTokens":2,"totalTokens":3,"cachedInputTokens":0}}`,
		`{"type":"text","text":"done"}`)
	// draft: the reply was still streaming.
	draft := claim("draft", "run_draft")
	reply(draft, false, `{"status":"streaming","runId":"run_draft"}`, `{"type":"text","text":"half"}`)
	for _, run := range []agent.Run{final, draft} {
		if err := st.ReleaseClaim(ctx, agent.ReleaseRequest{ThreadID: run.ThreadID, Fence: run.Fence(), Now: clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	live := claim("live", "run_live")

	// Within StaleAfter nothing is touched.
	if _, err := r.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.GetRun(ctx, "final", final.ID); got.Status != agent.RunRunning {
		t.Fatalf("a fresh claimless run was finished before StaleAfter: %s", got.Status)
	}

	clock.add(2 * staleAfter)
	if err := st.Heartbeat(ctx, "live", live.Fence(), clock.Now()); err != nil {
		t.Fatal(err)
	}
	stats, err := r.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Orphans != 2 {
		t.Errorf("Tick stats %+v, want 2 orphans", stats)
	}
	if got, _ := st.GetRun(ctx, "final", final.ID); got.Status != agent.RunCompleted {
		t.Errorf("run with a final completed reply = %s, want completed", got.Status)
	}
	got, _ := st.GetRun(ctx, "draft", draft.ID)
	rec, _ := st.GetMessage(ctx, "draft", draft.AssistantMessageID)
	if got.Status != agent.RunFailed || got.Error == nil || got.Error.Code != agent.CodeStale || rec.Message.Meta().Status != agent.MessageFailed {
		t.Errorf("streaming orphan: run %s %+v, message %s", got.Status, got.Error, rec.Message.Metadata)
	}
	idle("final")
	idle("draft")
	if got, _ := st.GetRun(ctx, "live", live.ID); got.Status != agent.RunRunning {
		t.Errorf("the live run was finished: %s", got.Status)
	}
	if th, _ := st.GetThread(ctx, "live"); th.ActiveRun == nil || th.ActiveRun.RunID != live.ID {
		t.Errorf("the live run lost its claim: %+v", th.ActiveRun)
	}
	// Finished, they are not named again.
	if stats, err := r.Tick(ctx); err != nil || stats.Orphans != 0 {
		t.Errorf("a later tick: %+v %v, want no orphans", stats, err)
	}
}

// reapEmptyRun claims th for run_1 a minute ago, stores its user message u1 and nothing else, and reaps the run:
// a run that died before its first word. It returns the run and u1.
func reapEmptyRun(t *testing.T, f *fixture) (agent.Run, agent.Message) {
	t.Helper()
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	run := f.claim(t, "th", "run_1", old)
	user := agent.Message{ID: "u1", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hi"}`)}}
	if err := f.store.PutMessage(ctx, agent.MessageWrite{ThreadID: "th", Seq: run.FirstSeq, Message: user, Fence: run.Fence(), Final: true, Now: old}); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.r.Reap(ctx, "th", agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: old}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}
	return run, user
}
