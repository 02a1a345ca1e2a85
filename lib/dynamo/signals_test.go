package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// What a completion signal costs (issue 21 item 4): the outcome's write carries it (FinishRun stays two writes;
// the run item enters the dueWork index: one index write), delivery marks it with one UpdateItem (the index entry
// leaves: one more index write), a sweep's claim is one UpdateItem (the entry moves: a delete and a put), and an idle
// sweep's list is the 16 shard Queries of dueWork's signal shards.
func TestSignalCosts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	measureIndexes(t, f)
	ctx := context.Background()
	s := f.store
	type cost struct {
		reads, writes, indexWrites int64
		wcu                        float64
	}
	measure := func(name string, op func() error) cost {
		t.Helper()
		f.counter.Reset()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c := f.counter.Counts()
		got := cost{c.Reads, c.Writes, c.IndexWrites, c.TableWriteUnits + c.IndexWriteUnits}
		t.Logf("%-34s reads %d writes %d index writes %d WCU %.1f", name, got.reads, got.writes, got.indexWrites, got.wcu)
		return got
	}
	finish := func(id string, armed bool) cost {
		th := thread(t, s, id)
		res, err := s.ClaimRun(ctx, claimReq(th.ID, "run-"+id, t0))
		if err != nil {
			t.Fatal(err)
		}
		run := res.Run
		run.Status, run.FinishedAt, run.UpdatedAt = agent.RunCompleted, t0.Add(time.Second), t0.Add(time.Second)
		if armed {
			run.Signal = &agent.RunSignal{Status: agent.SignalPending, Owner: th.Owner, DueAt: t0.Add(31 * time.Second)}
		}
		return measure("FinishRun (armed "+map[bool]string{true: "yes", false: "no"}[armed]+")", func() error { return s.FinishRun(ctx, run) })
	}
	plain, armed := finish("th-sig-plain", false), finish("th-sig-armed", true)
	if armed.reads != plain.reads || armed.writes != plain.writes || armed.indexWrites != plain.indexWrites+1 {
		t.Errorf("FinishRun armed %+v, plain %+v: want the same requests and one index write more", armed, plain)
	}
	claim := measure("ClaimSignal", func() error {
		return s.ClaimSignal(ctx, agent.SignalClaim{ThreadID: "th-sig-armed", RunID: "run-th-sig-armed", NextDue: t0.Add(time.Hour)})
	})
	if claim.reads != 0 || claim.writes != 1 || claim.indexWrites != 2 {
		t.Errorf("ClaimSignal %+v: want one UpdateItem moving the index entry", claim)
	}
	settle := measure("SettleSignal", func() error {
		return s.SettleSignal(ctx, "th-sig-armed", "run-th-sig-armed", agent.SignalDelivered)
	})
	if settle.reads != 0 || settle.writes != 1 || settle.indexWrites != 1 {
		t.Errorf("SettleSignal %+v: want one UpdateItem and the index entry's delete", settle)
	}
	idle := measure("ListDueSignals (none due)", func() error { _, err := s.ListDueSignals(ctx, t0.Add(2*time.Hour), 0); return err })
	if idle.reads != 16 || idle.writes != 0 {
		t.Errorf("ListDueSignals %+v: want the 16 shard Queries", idle)
	}
}
