package dynamo_test

import (
	"context"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// What a generated title costs (issue 20 item 5): one UpdateItem of the thread item, 1 WCU (a realistic thread is
// well under 1 KB) and no index write (byOwner is keys only, and the write leaves recency alone). Refused (a title
// the owner set), it is the same failed conditional write, which DynamoDB bills at 1 WCU, and one strongly
// consistent GetItem (1 RCU) on a server that returns no ALL_OLD with the failure, as dynalite does; DynamoDB
// returns the item and spares the read.
func TestGeneratedTitleCost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	measureIndexes(t, f)
	ctx := context.Background()
	s := f.store
	th := realisticThread(t, s)
	f.counter.Reset()
	if _, set, err := s.SetGeneratedTitle(ctx, agent.GeneratedTitle{ThreadID: th.ID, CreatedAt: th.CreatedAt, Replaces: th.Title, Title: "Trip to Lisbon"}); err != nil || !set {
		t.Fatalf("SetGeneratedTitle: set %v, %v", set, err)
	}
	c := f.counter.Counts()
	if c.Writes != 1 || c.Reads != 0 || c.TableWriteUnits != 1 || c.IndexWrites != 0 || c.IndexWriteUnits != 0 {
		t.Fatalf("a generated title: %d writes (%.1f WCU, %d index writes, %.1f index WCU), %d reads; want 1 write of 1 WCU, no index write, no read",
			c.Writes, c.TableWriteUnits, c.IndexWrites, c.IndexWriteUnits, c.Reads)
	}

	mine := "Mine"
	if _, err := s.UpdateThread(ctx, th.ID, agent.ThreadPatch{Title: &mine}, t0); err != nil {
		t.Fatal(err)
	}
	f.counter.Reset()
	if _, set, err := s.SetGeneratedTitle(ctx, agent.GeneratedTitle{ThreadID: th.ID, CreatedAt: th.CreatedAt, Replaces: mine, Title: "Trip"}); err != nil || set {
		t.Fatalf("SetGeneratedTitle over the owner's title: set %v, %v", set, err)
	}
	c = f.counter.Counts()
	if c.Writes != 1 || c.Reads > 1 || c.TableWriteUnits != 1 || c.IndexWrites != 0 {
		t.Fatalf("a refused generated title: %d writes (%.1f WCU, %d index writes), %d reads (%.1f RCU); want 1 write of 1 WCU and at most 1 read",
			c.Writes, c.TableWriteUnits, c.IndexWrites, c.Reads, c.ReadUnits)
	}
	t.Logf("set: 1 UpdateItem, 1 WCU; refused: %d writes (%.1f WCU), %d reads (%.1f RCU)", c.Writes, c.TableWriteUnits, c.Reads, c.ReadUnits)
}
