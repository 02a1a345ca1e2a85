package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/reaper"
)

// Seed 1000019 of the simulation (dynalite): a crash between the two writes of DynamoDB's FinishRun (the release
// applied, the outcome not recorded) leaves a claimless running run whose reply asks for an approval. The answer
// continues that reply under a new claim and finishes it. When the orphan sweep then finishes the old run, the
// reply is the later run's: the reaper leaves it as it is (before, it rewrote it as the old run's failed reply, from
// the old run's segments on top of the later run's parts: every tool call twice), and records the old run
// interrupted (what its reply said when it asked) with the usage its release added to the thread (before: none, so
// the thread's usage was no longer its runs' sum).
//
// On DynamoDB the state is made by FinishRun itself, its outcome write failing; SQLite finishes a run in one
// transaction and cannot reach it, so there the test builds it with ReleaseClaim naming the run.
func TestOrphanLeavesALaterRunsReplyAlone(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		st := sqliteStore(t)
		orphanLeavesALaterRunsReplyAlone(t, st, func(run agent.Run) agent.Usage {
			if err := st.ReleaseClaim(context.Background(), agent.ReleaseRequest{ThreadID: run.ThreadID, Fence: run.Fence(), Usage: run.Usage, Now: run.FinishedAt}); err != nil {
				t.Fatal(err)
			}
			return run.Usage
		})
	})
	t.Run("dynamo", func(t *testing.T) {
		t.Parallel()
		var dies atomic.Bool
		endpoint := dynamotest.Start(t)
		client := dynamotest.Client(endpoint, failRunUpdates(&dies))
		table := fmt.Sprintf("reaper_%d", time.Now().UnixNano())
		if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
			t.Fatal(err)
		}
		st := dynamo.New(client, table)
		orphanLeavesALaterRunsReplyAlone(t, st, func(run agent.Run) agent.Usage {
			dies.Store(true)
			defer dies.Store(false)
			if err := st.FinishRun(context.Background(), run); err == nil {
				t.Fatal("FinishRun succeeded with its outcome write failing")
			}
			return run.Usage
		})
	})
}

// failRunUpdates fails every UpdateItem on a run item while dies is set: a process that dies between FinishRun's
// release (on the thread item) and its outcome (on the run item).
func failRunUpdates(dies *atomic.Bool) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("failRunUpdates",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					if u, ok := in.Parameters.(*dynamodb.UpdateItemInput); ok && dies.Load() {
						if sk, ok := u.Key[dynamo.AttrSK].(*types.AttributeValueMemberS); ok && strings.HasPrefix(sk.Value, "RUN#") {
							return middleware.InitializeOutput{}, middleware.Metadata{}, errors.New("injected: the process dies here")
						}
					}
					return next.HandleInitialize(ctx, in)
				}), middleware.Before)
		})
	}
}

func orphanLeavesALaterRunsReplyAlone(t *testing.T, st agent.Store, halfFinish func(agent.Run) agent.Usage) {
	clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
	r := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	ctx := context.Background()
	claim := claimsOn(t, st, clock, "th")
	reply := func(run agent.Run, seq int64, md string, parts ...string) agent.Message {
		t.Helper()
		m := agent.Message{ID: "msg_a", Role: agent.RoleAssistant, Metadata: json.RawMessage(md)}
		for _, p := range parts {
			m.Parts = append(m.Parts, json.RawMessage(p))
		}
		if err := st.PutMessage(ctx, agent.MessageWrite{ThreadID: "th", Seq: seq, Fence: run.Fence(), Final: true, Now: clock.Now(), Message: m}); err != nil {
			t.Fatal(err)
		}
		return m
	}
	asked := `{"type":"tool-delete_note","toolCallId":"call_1","state":"approval-requested","input":{"key":"k"},"approval":{"id":"apr_1"}}`

	// The first run asks for an approval, stores its reply, and dies inside FinishRun.
	first := claim("run_first", agent.TriggerUser)
	seq := first.AssistantSeq()
	reply(first, seq, `{"status":"interrupted","runId":"run_first","usage":{"inputTokens":5,"outputTokens":2,"totalTokens":7}}`,
		`{"type":"step-start"}`, asked)
	if err := st.AppendSegment(ctx, agent.Segment{ThreadID: "th", RunID: first.ID, Seq: 0, ExpiresAt: clock.Now().Add(time.Hour),
		Data: []byte(`data: {"type":"start","messageId":"msg_a"}` + "\n\n" + `data: {"type":"start-step"}` + "\n\n" +
			`data: {"type":"tool-input-available","toolCallId":"call_1","toolName":"delete_note","input":{"key":"k"}}` + "\n\n" +
			`data: {"type":"tool-approval-request","approvalId":"apr_1","toolCallId":"call_1"}` + "\n\n")}); err != nil {
		t.Fatal(err)
	}
	done := first
	done.Status, done.Usage, done.Steps, done.FinishedAt, done.UpdatedAt = agent.RunInterrupted,
		agent.Usage{InputTokens: 5, OutputTokens: 2, TotalTokens: 7}, 1, clock.Now(), clock.Now()
	released := halfFinish(done)

	// The answer continues the reply under a new claim and finishes it.
	clock.add(time.Second)
	later := claim("run_later", agent.TriggerContinuation)
	want := reply(later, seq, `{"status":"completed","runId":"run_later","usage":{"inputTokens":9,"outputTokens":3,"totalTokens":12}}`,
		`{"type":"step-start"}`,
		`{"type":"tool-delete_note","toolCallId":"call_1","state":"output-available","input":{"key":"k"},"output":{"deleted":true},"approval":{"id":"apr_1","approved":true}}`,
		`{"type":"step-start"}`, `{"type":"text","text":"Deleted."}`)
	fin := later
	fin.Status, fin.Usage, fin.Steps, fin.FinishedAt, fin.UpdatedAt = agent.RunCompleted,
		agent.Usage{InputTokens: 9, OutputTokens: 3, TotalTokens: 12}, 1, clock.Now(), clock.Now()
	if err := st.FinishRun(ctx, fin); err != nil {
		t.Fatal(err)
	}

	// The orphan is finished: by the sweep where the store lists orphans, else by a reader that meets it.
	clock.add(2 * staleAfter)
	if _, err := r.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.ReapOrphan(ctx, "th", first.ID); err != nil {
		t.Fatal(err)
	}

	got, err := st.GetMessage(ctx, "th", "msg_a")
	if err != nil {
		t.Fatal(err)
	}
	if g, w := fmt.Sprintf("%s %s", got.Message.Parts, got.Message.Metadata), fmt.Sprintf("%s %s", want.Parts, want.Metadata); g != w {
		t.Errorf("the later run's reply was rewritten by the orphan's reap:\n got  %s\n want %s", g, w)
	}
	run, err := st.GetRun(ctx, "th", first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != agent.RunInterrupted || run.Error != nil || run.Usage != released {
		t.Errorf("the orphan run: %s %+v usage %+v, want interrupted, no error, usage %+v", run.Status, run.Error, run.Usage, released)
	}
	runs, err := st.ListRuns(ctx, "th")
	if err != nil {
		t.Fatal(err)
	}
	var sum agent.Usage
	for _, r := range runs {
		if r.Status == agent.RunRunning {
			t.Errorf("run %s still running", r.ID)
		}
		sum = sum.Add(r.Usage)
	}
	th, err := st.GetThread(ctx, "th")
	if err != nil {
		t.Fatal(err)
	}
	if th.ActiveRun != nil || th.Usage != sum {
		t.Errorf("thread: claim %+v, usage %+v; want idle, usage = its runs' sum %+v", th.ActiveRun, th.Usage, sum)
	}
	// A second sweep finds nothing more to do.
	if stats, err := r.Tick(ctx); err != nil || stats.Orphans != 0 {
		t.Errorf("a later tick: %+v %v, want no orphans", stats, err)
	}
}

// failRelease refuses every ReleaseClaim for good: a reaper that dies after recording the outcome, before its
// release.
type failRelease struct{ agent.Store }

func (failRelease) ReleaseClaim(context.Context, agent.ReleaseRequest) error {
	return agent.E(agent.KindInternal, agent.CodeStoreUnavailable, "injected: the reaper dies here")
}

// A reaper that finishes an orphan (a run whose own release counted its usage, its outcome lost) and dies before
// its release leaves its claim; the next sweep reaps that claim, and the thread's usage stays its runs' sum: the
// orphan's usage is not added a second time (before, the next reaper took the outcome for one no release had
// counted, and the thread's usage was twice the run's). DynamoDB only: SQLite's FinishRun is one transaction, so it
// leaves no orphan (a ReleaseClaim naming a running run, as the other tests build one, is not something SQLite's
// callers do), and it keeps no released usage past the outcome.
func TestDeadOrphanReaperCountsTheUsageOnce(t *testing.T) {
	t.Parallel()
	deadOrphanReaper(t, dynamoStore(t))
}

func deadOrphanReaper(t *testing.T, st agent.Store) {
	clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
	ctx := context.Background()
	now := clock.Now()
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	res, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th", Owner: "alice", RunID: "run_1", AssistantMessageID: "msg_1", Now: now, Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	u := agent.Usage{InputTokens: 5, OutputTokens: 2, TotalTokens: 7}
	err = st.PutMessage(ctx, agent.MessageWrite{ThreadID: "th", Seq: run.AssistantSeq(), Fence: run.Fence(), Final: true, Now: now,
		Message: agent.Message{ID: "msg_1", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"done"}`)},
			Metadata: json.RawMessage(`{"status":"completed","runId":"run_1","usage":{"inputTokens":5,"outputTokens":2,"totalTokens":7}}`)}})
	if err != nil {
		t.Fatal(err)
	}
	// FinishRun's release applied, its outcome was lost.
	if err := st.ReleaseClaim(ctx, agent.ReleaseRequest{ThreadID: "th", Fence: run.Fence(), Usage: u, Now: now}); err != nil {
		t.Fatal(err)
	}
	clock.add(2 * staleAfter)
	dying := reaper.New(reaper.Deps{Store: failRelease{st}, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	if err := dying.ReapOrphan(ctx, "th", run.ID); err == nil {
		t.Fatal("the dying reaper's release did not fail")
	}
	clock.add(2 * staleAfter)
	r := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	if _, err := r.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	th, err := st.GetThread(ctx, "th")
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.GetRun(ctx, "th", run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if th.ActiveRun != nil || got.Status != agent.RunCompleted || got.Usage != u || th.Usage != u {
		t.Fatalf("after the next sweep: claim %+v, run %s usage %+v, thread usage %+v; want idle, completed, both %+v",
			th.ActiveRun, got.Status, got.Usage, th.Usage, u)
	}
}
