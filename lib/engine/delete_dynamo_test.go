package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/engine"
)

// A delete that died half way (DynamoDB: tombstone written, children not yet removed) leaves a thread id that
// reads as missing and that nothing may claim. The next message to that id finishes the delete and starts a
// fresh thread that shows nothing of the old one (REVIEW H3). SQLite deletes in one transaction, so only the
// DynamoDB adapter has this state.
func TestPostFinishesAnInterruptedDelete(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("dynalite in -short")
	}
	endpoint := dynamotest.Start(t)
	ctx := context.Background()
	client := dynamotest.Client(endpoint)
	table := fmt.Sprintf("del_%d", time.Now().UnixNano())
	if err := dynamotest.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	store := dynamo.New(client, table)
	f := setup(t, withStore(func(agent.Store) agent.Store { return store }))
	if run, _ := f.turn(t, "th", "u1", "secret plans"); run.Status != agent.RunCompleted {
		t.Fatal(run.Status)
	}
	// A process whose batch deletes all fail dies after the tombstone.
	dying := dynamo.New(dynamotest.Client(endpoint, dynamotest.FailBatchWrites), table)
	if err := dying.DeleteThread(ctx, "th"); err == nil {
		t.Fatal("the dying delete succeeded")
	}
	if _, _, err := store.CreateThread(ctx, agent.Thread{ID: "th", Owner: "mallory"}); !errors.Is(err, agent.ErrThreadDeleting) {
		t.Fatalf("setup: create on the tombstone: %v, want thread_deleting", err)
	}
	tr, err := f.eng.Begin(ctx, engine.Request{Owner: "mallory", ThreadID: "th", Kind: engine.TurnSubmit, Message: userMsg("m1", "what was here?")})
	if err != nil {
		t.Fatalf("a post to the tombstoned id: %v", err)
	}
	if run := tr.Stream(ctx, io.Discard); run.Status != agent.RunCompleted {
		t.Fatalf("run %s", run.Status)
	}
	recs, err := store.ListMessages(ctx, "th")
	if err != nil || len(recs) != 2 || recs[0].Message.ID != "m1" {
		t.Fatalf("the new thread shows %d messages (%v), want only mallory's turn", len(recs), err)
	}
	if th, _ := store.GetThread(ctx, "th"); th.Owner != "mallory" {
		t.Fatalf("owner %q", th.Owner)
	}
}
