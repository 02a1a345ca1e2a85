package storetest

import (
	"encoding/json"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// handOverTests are the hand-over's cases (agent.HandOverStore): the claim moves to the next epoch under the same
// run id, and every write of the old holder is refused from then on.
func handOverTests() []test {
	type w = leaf[agent.Store]
	return group(wholeStore,
		w{"MovesClaimAndRunToNextEpoch", testHandOverMoves},
		w{"FencesTheOldHolder", testHandOverFences},
		w{"RefusedOnceTheClaimMoved", testHandOverRefused},
		w{"KeepsACancelRequest", testHandOverKeepsCancel},
	)
}

type handOvers = env[agent.Store]

func handOver(e *handOvers, th agent.Thread, f agent.Fence, now time.Time) agent.ClaimResult {
	e.t.Helper()
	res, err := e.s.HandOver(e.ctx, agent.HandOverRequest{ThreadID: th.ID, Fence: f, Now: now})
	if err != nil {
		e.t.Fatalf("HandOver(%s, %+v): %v", th.ID, f, err)
	}
	return res
}

func testHandOverMoves(e *handOvers) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	res := handOver(e, th, run.Fence(), at(time.Second))
	want := run
	want.Epoch = run.Epoch + 1
	if res.Run.ID != run.ID || res.Run.Epoch != want.Epoch || res.Run.Status != agent.RunRunning ||
		res.Run.AssistantMessageID != run.AssistantMessageID || res.Run.FirstSeq != run.FirstSeq ||
		res.Run.Reserved != run.Reserved || !res.Run.CreatedAt.Equal(run.CreatedAt) {
		t.Fatalf("HandOver run = %s, want %s at epoch %d (created, positions and reply kept)", show(res.Run), show(run), want.Epoch)
	}
	got := getThread(e, th.ID)
	same(t, "claim after hand-over", got.ActiveRun, &agent.Claim{RunID: run.ID, Epoch: want.Epoch, HeartbeatAt: at(time.Second)})
	same(t, "HandOver thread", res.Thread.ActiveRun, got.ActiveRun)
	if r := getRun(e, th.ID, run.ID); r.Epoch != want.Epoch || r.Status != agent.RunRunning {
		t.Fatalf("GetRun after hand-over = %s, want running at epoch %d", show(r), want.Epoch)
	}
	// Handed over again from the new epoch, and finished there.
	again := handOver(e, th, res.Run.Fence(), at(2*time.Second))
	if again.Run.Epoch != want.Epoch+1 {
		t.Fatalf("second hand-over epoch = %d, want %d", again.Run.Epoch, want.Epoch+1)
	}
	must(t, e.s.Heartbeat(e.ctx, th.ID, again.Run.Fence(), at(3*time.Second)), "Heartbeat(new holder)")
	finish(e, again.Run, agent.RunCompleted, agent.Usage{InputTokens: 2, TotalTokens: 2}, at(4*time.Second))
	if c := getThread(e, th.ID).ActiveRun; c != nil {
		t.Fatalf("claim after the continuation finished = %s, want none", show(c))
	}
	if r := getRun(e, th.ID, run.ID); r.Status != agent.RunCompleted || r.Epoch != again.Run.Epoch {
		t.Fatalf("run after the continuation finished = %s, want completed at epoch %d", show(r), again.Run.Epoch)
	}
}

// Every write of the old holder after the hand-over is refused: heartbeat, a write of the reply the new holder
// wrote, its outcome and usage, a second hand-over.
func testHandOverFences(e *handOvers) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	old := run.Fence()
	reply := func(f agent.Fence, text string, now time.Time) agent.MessageWrite {
		return agent.MessageWrite{ThreadID: th.ID, Seq: run.AssistantSeq(), Fence: f, Now: now, Message: agent.Message{
			ID: run.AssistantMessageID, Role: agent.RoleAssistant, Parts: []json.RawMessage{mustJSON(map[string]string{"type": "text", "text": text})}}}
	}
	must(t, e.s.PutMessage(e.ctx, reply(old, "before", at(time.Second))), "PutMessage(old holder, before)")
	res := handOver(e, th, old, at(2*time.Second))
	must(t, e.s.PutMessage(e.ctx, reply(res.Run.Fence(), "continued", at(3*time.Second))), "PutMessage(new holder)")
	beforeThread := getThread(e, th.ID)

	wantErr(t, e.s.PutMessage(e.ctx, reply(old, "late", at(4*time.Second))), agent.KindConflict, agent.CodeRunFenced, "PutMessage(old holder, late)")
	wantErr(t, e.s.Heartbeat(e.ctx, th.ID, old, at(4*time.Second)), agent.KindConflict, agent.CodeRunFenced, "Heartbeat(old holder)")
	late := finished(run, agent.RunCompleted, agent.Usage{InputTokens: 1000, TotalTokens: 1000}, at(4*time.Second))
	wantErr(t, e.s.FinishRun(e.ctx, late), agent.KindConflict, agent.CodeRunFenced, "FinishRun(old holder)")
	_, err := e.s.HandOver(e.ctx, agent.HandOverRequest{ThreadID: th.ID, Fence: old, Now: at(4 * time.Second)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "HandOver(old holder again)")

	same(t, "thread unchanged by the old holder", getThread(e, th.ID), beforeThread)
	got, err := e.s.GetMessage(e.ctx, th.ID, run.AssistantMessageID)
	must(t, err, "GetMessage")
	if p := string(got.Message.Parts[0]); p != string(mustJSON(map[string]string{"type": "text", "text": "continued"})) {
		t.Fatalf("reply after the old holder's late write = %s, want the new holder's", p)
	}
	if r := getRun(e, th.ID, run.ID); r.Status != agent.RunRunning || r.Epoch != res.Run.Epoch {
		t.Fatalf("run after the old holder's late finish = %s, want running at epoch %d", show(r), res.Run.Epoch)
	}
}

func testHandOverRefused(e *handOvers) {
	t := e.t
	cases := []struct {
		name    string
		arrange func(th agent.Thread, run agent.Run)
	}{
		{"released", func(th agent.Thread, run agent.Run) {
			finish(e, run, agent.RunCompleted, agent.Usage{}, at(time.Second))
		}},
		{"reaped", func(th agent.Thread, run agent.Run) {
			_, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: run.Fence(), StaleBefore: at(time.Hour), RunID: run.ID, Now: at(time.Hour)})
			must(t, err, "TakeOver")
		}},
		{"handed over", func(th agent.Thread, run agent.Run) { handOver(e, th, run.Fence(), at(time.Second)) }},
	}
	for _, tc := range cases {
		th := newThread(e)
		run := claim(e, th, e.id("run"), at(0)).Run
		tc.arrange(th, run)
		beforeThread, beforeRun := getThread(e, th.ID), getRun(e, th.ID, run.ID)
		_, err := e.s.HandOver(e.ctx, agent.HandOverRequest{ThreadID: th.ID, Fence: run.Fence(), Now: at(2 * time.Hour)})
		wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, tc.name+": HandOver")
		same(t, tc.name+": thread unchanged", getThread(e, th.ID), beforeThread)
		same(t, tc.name+": run unchanged", getRun(e, th.ID, run.ID), beforeRun)
	}
	_, err := e.s.HandOver(e.ctx, agent.HandOverRequest{ThreadID: e.id("th"), Fence: agent.Fence{RunID: e.id("run"), Epoch: 1}, Now: at(0)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "HandOver(unknown thread)")
}

// A stop requested before the hand-over reaches the continuation: its first heartbeat says canceled.
func testHandOverKeepsCancel(e *handOvers) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	_, err := e.s.RequestCancel(e.ctx, th.ID, run.ID, at(time.Second))
	must(t, err, "RequestCancel")
	res := handOver(e, th, run.Fence(), at(2*time.Second))
	if c := res.Thread.ActiveRun; c == nil || !c.CancelRequested {
		t.Fatalf("claim after hand-over = %s, want the cancel request kept", show(c))
	}
	wantErr(t, e.s.Heartbeat(e.ctx, th.ID, res.Run.Fence(), at(3*time.Second)), agent.KindCanceled, agent.CodeRunCanceled, "Heartbeat(continuation)")
}
