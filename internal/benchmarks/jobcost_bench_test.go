package benchmarks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
)

// The phases of one iteration of the job cost benchmark, in order. Each starts when the one before it has
// ended (the sub-agent is held until the dispatching turn ended, the wake starts when FinishJob returned, the pass
// when Enqueue returned), so every store call, SQL statement and DynamoDB request belongs to exactly one.
var costPhases = []struct{ name, what string }{
	{"first", "the thread's first message (creates the thread)"},
	{"plain", "a plain user turn on an existing thread whose queue is empty"},
	{"dispatch", "a turn that calls research (CreateJob, Start) and replies in a second step"},
	{"subagent", "the sub-agent task: GetJob, SetJobActivity, its model call, FinishJob"},
	{"wake", "the wake: GetJob, Enqueue"},
	{"pass", "the delivery pass: BeginQueued's reads, the claim, the steer turn, TakeQueued, MarkJobDelivered, the run's end, one more BeginQueued look, GetJob"},
	{"plain-after", "a plain user turn on the thread now that its queue holds the taken steer"},
	{"plain-20-taken", fmt.Sprintf("a plain user turn once the queue also holds %d taken %d-byte steers (kept %v)", seededTaken, seededBrief, agent.DefaultQueueKeep)},
}

const (
	seededTaken = 20
	seededBrief = 4 << 10 // a research brief of a few KB
)

// costFlow runs one iteration: a thread, a plain turn, a delivered job, and plain turns after it.
func (js *jobStack) costFlow(b *testing.B) {
	l := js.ledger
	thread := js.thread("cost")
	l.setPhase("first")
	js.turn(b, thread, "u1", "hello")
	l.setPhase("plain")
	js.turn(b, thread, "u2", "hello benchmark, how are you today")
	l.hold()
	l.setPhase("dispatch")
	js.turn(b, thread, "u3", `/tool research {"question":"What is the capital of France?"}`)
	l.setPhase("subagent")
	l.release()
	js.await(b, thread)
	l.setPhase("check")
	js.check(b, thread)
	l.setPhase("plain-after")
	js.turn(b, thread, "u4", "thanks, that helps")
	l.setPhase("seed")
	ctx := context.Background()
	part, _ := json.Marshal(map[string]string{"type": "text", "text": strings.Repeat("brief ", seededBrief/6)})
	for i := range seededTaken {
		jobID := fmt.Sprintf("job_seed_%d", i)
		q := agent.QueuedMessage{ThreadID: thread, Kind: agent.QueueSteer, JobID: jobID, Status: agent.QueueQueued, CreatedAt: time.Now(),
			Message: agent.Message{ID: agent.SteerMessageID(jobID), Role: agent.RoleUser, Parts: []json.RawMessage{part}}}
		if _, _, err := js.dev.Store.Enqueue(ctx, q, seededTaken+1); err != nil {
			b.Fatal(err)
		}
		if err := js.dev.Store.TakeQueued(ctx, thread, q.Message.ID, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	l.setPhase("plain-20-taken")
	js.turn(b, thread, "u5", "and what else?")
	l.setPhase("")
}

// runJobCost runs b.N iterations of costFlow and reports per phase (per iteration): store calls, and SQLite
// statements or DynamoDB requests and capacity; the log lists each phase by store method. "Per delivered job"
// is the dispatch's CreateJob plus the sub-agent, wake and pass phases.
func runJobCost(b *testing.B, js *jobStack) {
	l := js.ledger
	l.setPhase("")
	l.reset()
	if js.meter != nil {
		js.meter.reset()
	}
	// The pass's phase starts when the wake's Enqueue returned; the wake's when the sub-agent's FinishJob did.
	js.marks.onCall(func(method string, _ any) {
		switch method {
		case "FinishJob":
			l.advance("subagent", "wake")
		case "Enqueue":
			l.advance("wake", "pass")
		}
	})
	defer js.marks.onCall(nil)
	for range b.N {
		js.costFlow(b)
	}
	n := float64(b.N)
	job := func(phase string) bool { return phase == "subagent" || phase == "wake" || phase == "pass" }
	var jobCalls, jobStmts float64
	var jobDDB dynamo.Counts
	for _, ph := range costPhases {
		calls := l.byMethod(ph.name)
		var counts map[string]dynamo.Counts
		if js.meter != nil {
			counts = js.meter.counts(ph.name)
		}
		total, stmts := float64(l.total(ph.name)), float64(l.tallyOf(ph.name))
		c := sum(counts)
		if job(ph.name) {
			jobCalls, jobStmts, jobDDB = jobCalls+total, jobStmts+stmts, sum(map[string]dynamo.Counts{"job": jobDDB, ph.name: c})
		}
		if ph.name == "dispatch" {
			jobCalls += float64(calls["CreateJob"])
			jobDDB = sum(map[string]dynamo.Counts{"job": jobDDB, "CreateJob": counts["CreateJob"]})
		}
		summary := fmt.Sprintf("%.3g store calls", total/n)
		if js.meter != nil {
			summary += fmt.Sprintf(", %.3g DynamoDB requests (%.3g reads, %.3g writes), %.3g RCU, %.3g WCU (index %.3g)",
				float64(c.Reads+c.Writes)/n, float64(c.Reads)/n, float64(c.Writes)/n, c.ReadUnits/n, c.WriteUnits()/n, c.IndexWriteUnits/n)
			b.ReportMetric(float64(c.Reads+c.Writes)/n, "ddb-req-"+ph.name)
			b.ReportMetric(c.WriteUnits()/n, "wcu-"+ph.name)
		} else {
			summary += fmt.Sprintf(", %.3g SQL statements", stmts/n)
			b.ReportMetric(stmts/n, "stmts-"+ph.name)
		}
		b.ReportMetric(total/n, "calls-"+ph.name)
		if final(b) {
			b.Logf("%s (%s): %s: %s", ph.name, ph.what, summary, table(calls, counts, b.N))
		}
	}
	b.ReportMetric(jobCalls/n, "store-calls/job")
	if js.meter != nil {
		b.ReportMetric(float64(jobDDB.Reads+jobDDB.Writes)/n, "ddb-requests/job")
		b.ReportMetric(jobDDB.WriteUnits()/n, "wcu/job")
		b.ReportMetric(jobDDB.ReadUnits/n, "rcu/job")
		for _, ph := range []string{"plain", "plain-after", "plain-20-taken"} {
			q := js.meter.counts(ph)["ListQueued"]
			b.ReportMetric(q.ReadUnits/n, "queue-rcu-"+ph)
		}
	} else {
		// The dispatch's CreateJob runs beside the turn's other statements: count one alone, as it ran.
		th := js.thread("cost")
		js.turn(b, th, "u1", "hello")
		now := time.Now()
		before := l.tally()
		if _, _, err := js.dev.SQLite.CreateJob(context.Background(), agent.Job{ID: agent.JobID(th, "run_x", "call_x"), ThreadID: th, Owner: "bench",
			Kind: "research", ToolCallID: "call_x", Input: json.RawMessage(`{"question":"q"}`), Status: agent.JobRunning,
			CreatedAt: now, UpdatedAt: now, DueAt: now.Add(time.Hour)}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(jobStmts/n+float64(l.tally()-before), "stmts/job")
	}
}

// advance moves from phase from to phase to; in any other phase it does nothing.
func (l *ledger) advance(from, to string) {
	l.mu.Lock()
	at := l.phase
	l.mu.Unlock()
	if at == from {
		l.setPhase(to)
	}
}

// BenchmarkJobCostSQLite: the store calls and SQL statements of one delivered job, phase by phase, and of the
// plain turns around it (the queue look every turn now makes).
func BenchmarkJobCostSQLite(b *testing.B) {
	js := newJobStack(b, false, false)
	js.ledger.tally = js.dev.SQLite.Statements
	runJobCost(b, js)
}

// BenchmarkJobCostDynamo: the same on dynalite, with DynamoDB requests by operation, read units and write units
// (index writes computed by the counter: dynalite reports none) per phase and store method.
func BenchmarkJobCostDynamo(b *testing.B) { runJobCost(b, newJobStack(b, true, true)) }
