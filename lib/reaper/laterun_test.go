package reaper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/reaper"
)

// stalled is an HTTP client that holds the first request whose body contains match until release is closed (a
// request stalled in the network), then sends it; reached is closed when it holds it.
type stalled struct {
	match   string
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (s *stalled) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		if strings.Contains(string(body), s.match) {
			held := false
			s.once.Do(func() { held = true })
			if held {
				close(s.reached)
				<-s.release
			}
		}
	}
	return http.DefaultClient.Do(req)
}

// REVIEW D15, issue 16 "Left" 5: DynamoDB's ClaimRun is two writes, the claim and then the run item (putRun). A
// run item that lands late, after the reaper took the claim and found the run missing, and after the orphan
// sweeps that followed, must not leave a run recorded as running that no claim names and that no sweep finds (only
// a reader of the thread's runs would finish it). The clock is injected; the run write is stalled until the
// reap and two orphan sweeps are done. SQLite's ClaimRun is one transaction and never leaves the state.
func TestLateRunItemAfterTheReapIsFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	endpoint := dynamotest.Start(t)
	plain := dynamotest.Client(endpoint)
	table := fmt.Sprintf("reaper_late_%d", time.Now().UnixNano())
	if err := dynamotest.CreateTable(ctx, plain, table); err != nil {
		t.Fatal(err)
	}
	stall := &stalled{match: `"RUN#run_late"`, reached: make(chan struct{}), release: make(chan struct{})}
	st := dynamo.New(dynamotest.Client(endpoint, func(o *dynamodb.Options) { o.HTTPClient = stall }), table)
	clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
	r := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: clock.Now(), UpdatedAt: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan error, 1)
	go func() {
		_, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th", Owner: "alice", RunID: "run_late", Trigger: agent.TriggerUser,
			AssistantMessageID: "msg_run_late", UserMessageID: "u1", Now: clock.Now(), Reserve: 2})
		claimed <- err
	}()
	<-stall.reached // the claim applied; its run write is in the network

	tick := func(what string) reaper.Stats {
		t.Helper()
		clock.add(time.Minute)
		stats, err := r.Tick(ctx)
		if err != nil {
			t.Fatalf("%s: Tick: %v", what, err)
		}
		return stats
	}
	if stats := tick("the reap"); stats.Reaped != 1 {
		t.Fatalf("the reap: %+v, want the stale claim reaped", stats)
	}
	tick("the first orphan sweep")
	tick("the second orphan sweep")
	close(stall.release)
	err := <-claimed // the late run write
	tick("the sweep after the late write")
	run, gerr := st.GetRun(ctx, "th", "run_late")
	if gerr == nil && run.Status == agent.RunRunning {
		t.Fatalf("after the late run write (ClaimRun: %v) and a sweep the run is %s with no claim: no sweep finishes it", err, run.Status)
	}
	if err != nil && !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("the late ClaimRun: %v, want it to succeed or be refused as run_fenced", err)
	}
	if gerr != nil || run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStale {
		t.Fatalf("the run: %s %+v %v, want failed (stale)", run.Status, run.Error, gerr)
	}
	// The run as GET /threads/{id}/runs lists it: the reaper's placeholder (the late write refused) says it does
	// not know why the run started, with a trigger the contract documents (it had none); a run item that won
	// keeps its own.
	want := agent.TriggerUnknown
	if err == nil {
		want = agent.TriggerUser
	}
	if run.Trigger != want {
		t.Fatalf("the run's trigger %q (ClaimRun: %v), want %q", run.Trigger, err, want)
	}
	if th, err := st.GetThread(ctx, "th"); err != nil || th.ActiveRun != nil {
		t.Fatalf("thread: %+v %v, want idle", th.ActiveRun, err)
	}
	if orphans, err := st.ListOrphanRuns(ctx, clock.Now().Add(time.Hour), 0); err != nil || len(orphans) != 0 {
		t.Fatalf("orphans left: %v %v", orphans, err)
	}
}
