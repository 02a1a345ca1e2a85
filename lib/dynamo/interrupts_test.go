package dynamo_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// approval is a pending approval on threadID created at t0, expiring at expires.
func approval(threadID, id string, expires time.Time) agent.Interrupt {
	return agent.Interrupt{ID: id, ThreadID: threadID, RunID: "r1", Epoch: 1, MessageID: "a1", Kind: agent.InterruptApproval,
		ToolCallID: "call-" + id, ToolName: "delete_note", Input: json.RawMessage(`{"id":"note-1"}`), Signature: "sig",
		Status: agent.InterruptPending, CreatedAt: t0, ExpiresAt: expires}
}

func mustCreateInterrupt(tb testing.TB, s *dynamo.Store, in agent.Interrupt) {
	tb.Helper()
	if _, created, err := s.CreateInterrupt(context.Background(), in); err != nil || !created {
		tb.Fatalf("CreateInterrupt(%s): created %v, %v", in.ID, created, err)
	}
}

// pendingEntries counts the pending index's entries of thread threadID, bypassing the store (every shard: which
// one a thread hashes to is the store's business).
func pendingEntries(t *testing.T, f *fixture, threadID string) int {
	t.Helper()
	n := 0
	for shard := range dynamo.DefaultInterruptShards {
		out, err := f.client.Query(context.Background(), &dynamodb.QueryInput{
			TableName:                 aws.String(f.table),
			IndexName:                 aws.String(dynamo.IndexPending),
			KeyConditionExpression:    aws.String("#s = :s"),
			ExpressionAttributeNames:  map[string]string{"#s": dynamo.AttrPendingShard},
			ExpressionAttributeValues: map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: fmt.Sprintf("INT#%d", shard)}},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range out.Items {
			if pk, _ := it["pk"].(*types.AttributeValueMemberS); pk != nil && pk.Value == "THREAD#"+threadID {
				n++
			}
		}
	}
	return n
}

// The pending index is sparse: an interrupt is in it from its create until its resolve, which removes the keys in
// its own write, and the head then carries no index attribute at all.
func TestPendingIndexHoldsOnlyPending(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-pending")
	for i := range 3 {
		mustCreateInterrupt(t, s, approval(th.ID, fmt.Sprintf("i%d", i), t0.Add(time.Hour)))
	}
	if n := pendingEntries(t, f, th.ID); n != 3 {
		t.Fatalf("%d pending index entries after 3 creates, want 3", n)
	}
	for i, st := range []agent.InterruptStatus{agent.InterruptApproved, agent.InterruptExpired} {
		if _, err := s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: "a1", ID: fmt.Sprintf("i%d", i), Status: st, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	if n := pendingEntries(t, f, th.ID); n != 1 {
		t.Fatalf("%d pending index entries after 2 resolves, want 1", n)
	}
	head, err := f.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "THREAD#" + th.ID}, "sk": &types.AttributeValueMemberS{Value: "INTM#a1#i0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(head.Item) == 0 {
		t.Fatal("the resolved interrupt's head is not at its key") // the checks below would pass on nothing
	}
	for _, a := range []string{dynamo.AttrPendingShard, dynamo.AttrPendingExpiry} {
		if _, ok := head.Item[a]; ok {
			t.Errorf("resolved interrupt head still has %s", a)
		}
	}
	// REVIEW S7: the resolve sets the table's TTL, so resolved interrupts leave the thread (and its reads)
	// agent.DefaultResolvedInterruptKeep after their answer, whatever the thread's age.
	ttl, _ := head.Item[dynamo.AttrExpiresAt].(*types.AttributeValueMemberN)
	if want := fmt.Sprint(t0.Add(agent.DefaultResolvedInterruptKeep).Add(time.Second - 1).Unix()); ttl == nil || ttl.Value != want {
		t.Errorf("resolved interrupt head's %s = %v, want %s (resolved + the keep age, rounded up to seconds)", dynamo.AttrExpiresAt, head.Item[dynamo.AttrExpiresAt], want)
	}
	// An expired but still pending interrupt is found through the index; the resolved ones are not.
	got, err := s.ListExpiredInterrupts(ctx, t0.Add(2*time.Hour), 0)
	if err != nil || len(got) != 1 || got[0].ID != "i2" {
		t.Fatalf("ListExpiredInterrupts = %+v, %v; want only i2", got, err)
	}
}

// A delete that dies after its tombstone leaves the thread's interrupts in place: the thread refuses new ones
// (the create takes its item back, chunks included), and the next DeleteThread removes everything, pending index
// entries included.
func TestHalfDoneDeleteRemovesInterrupts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-int-tomb")
	pk := "THREAD#" + th.ID
	big := approval(th.ID, "big", t0.Add(-time.Hour))
	big.Input, _ = json.Marshal(map[string]string{"document": incompressible(300 << 10)})
	for _, in := range []agent.Interrupt{approval(th.ID, "pending", t0.Add(-time.Hour)), big, approval(th.ID, "done", t0)} {
		mustCreateInterrupt(t, s, in)
	}
	if _, err := s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: "a1", ID: "done", Status: agent.InterruptDenied,
		Response: json.RawMessage(`{"approved":false}`), Now: t0}); err != nil {
		t.Fatal(err)
	}
	if n := countPrefix(t, f, pk, "INTC#"); n < 2 {
		t.Fatalf("%d interrupt chunks for a 300 KiB incompressible input, want it chunked", n)
	}

	failing := dynamo.New(dynamotest.Client(endpoint, dynamotest.FailBatchWrites), f.table)
	if err := failing.DeleteThread(ctx, th.ID); err == nil {
		t.Fatal("DeleteThread with failing batch deletes succeeded")
	}
	before := countPrefix(t, f, pk, "")
	for _, in := range []agent.Interrupt{approval(th.ID, "late", t0), big, approval(th.ID, "pending", t0)} {
		if _, _, err := s.CreateInterrupt(ctx, in); !agent.IsKind(err, agent.KindNotFound) {
			t.Errorf("CreateInterrupt(%s) on a tombstone: %v, want not found", in.ID, err)
		}
	}
	if n := countPrefix(t, f, pk, ""); n != before {
		t.Fatalf("refused creates left %d items in the partition, want %d", n, before)
	}

	if err := s.DeleteThread(ctx, th.ID); err != nil {
		t.Fatalf("DeleteThread again: %v", err)
	}
	if n := countPrefix(t, f, pk, ""); n != 0 {
		t.Fatalf("%d items left in the thread partition", n)
	}
	if n := pendingEntries(t, f, th.ID); n != 0 {
		t.Fatalf("%d pending index entries left", n)
	}
	for _, id := range []string{"pending", "big", "done"} {
		if _, err := s.GetInterrupt(ctx, th.ID, "a1", id); !errors.Is(err, agent.ErrInterruptNotFound) {
			t.Errorf("GetInterrupt(%s) after the delete: %v, want interrupt_not_found", id, err)
		}
	}
	if list, err := s.ListInterrupts(ctx, th.ID); err != nil || len(list) != 0 {
		t.Fatalf("ListInterrupts after the delete = %d, %v", len(list), err)
	}
	expired, err := s.ListExpiredInterrupts(ctx, t0.Add(time.Hour), 0)
	if err != nil || len(expired) != 0 {
		t.Fatalf("ListExpiredInterrupts after the delete = %+v, %v; want none", expired, err)
	}
}

// The create whose insert lands after a delete's sweep (the tombstone is there, the children are gone) sees the
// tombstone in its read and takes its item back: nothing is left for the delete's last step to miss.
func TestCreateInterruptAfterTheSweepIsTakenBack(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	th := thread(t, f.store, "th-int-sweep")
	pk := "THREAD#" + th.ID
	// The state between a delete's sweep and its last step: the tombstone alone.
	if _, err := f.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(f.table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "THREAD"}},
		UpdateExpression:          aws.String("SET deleting = :t"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": &types.AttributeValueMemberBOOL{Value: true}},
	}); err != nil {
		t.Fatal(err)
	}
	big := approval(th.ID, "big", t0.Add(time.Hour))
	big.Input, _ = json.Marshal(map[string]string{"document": incompressible(300 << 10)})
	for _, in := range []agent.Interrupt{approval(th.ID, "small", t0.Add(time.Hour)), big} {
		if _, _, err := f.store.CreateInterrupt(ctx, in); !agent.IsKind(err, agent.KindNotFound) {
			t.Fatalf("CreateInterrupt(%s) on a swept tombstone: %v, want not found", in.ID, err)
		}
	}
	if n := countPrefix(t, f, pk, ""); n != 1 {
		t.Fatalf("%d items in the partition, want only the tombstone", n)
	}
	if err := f.store.DeleteThread(ctx, th.ID); err != nil {
		t.Fatal(err)
	}
	if n := countPrefix(t, f, pk, ""); n != 0 {
		t.Fatalf("%d items left after the delete", n)
	}
}

// No interrupt item comes near the item limit, whatever its input and response hold: each value is inline up to
// 64 KiB and chunked beyond, and the head stays small enough that a resolve stays cheap.
func TestInterruptItemsStayUnderLimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-int-big")
	for i, size := range []int{60 << 10, 70 << 10, 5 << 20} {
		in := approval(th.ID, fmt.Sprintf("i%d", i), t0.Add(time.Hour))
		in.Kind = agent.InterruptClientTool
		in.Input, _ = json.Marshal(map[string]string{"document": incompressible(size)})
		mustCreateInterrupt(t, s, in)
		resp, _ := json.Marshal(map[string]any{"output": incompressible(size)})
		got, err := s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptAnswered,
			Response: resp, Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Input) != string(in.Input) || string(got.Response) != string(resp) {
			t.Fatalf("%d bytes: input or response did not round-trip", size)
		}
	}
	heads, err := f.client.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
		KeyConditionExpression: aws.String("pk = :pk AND begins_with(sk, :p)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "THREAD#" + th.ID},
			":p": &types.AttributeValueMemberS{Value: "INT#"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range heads.Items {
		if n := dynamo.ItemSize(h); n > 200<<10 {
			t.Errorf("interrupt head %v is %d bytes, want at most 200 KiB", h["sk"], n)
		}
	}
	assertItemSizes(t, f)
}

// fixedIDs makes a store's call ids predictable, so a recorded answer can carry them.
type fixedIDs string

func (f fixedIDs) New(prefix string) string { return prefix + string(f) }

// interruptJSON is an interrupt head as DynamoDB stores it (the attribute names of infra/DYNAMODB.md).
func interruptJSON(extra string) string {
	return `{"pk":{"S":"THREAD#th"},"sk":{"S":"INT#i1"},"kind":{"S":"interrupt"},"id":{"S":"i1"},"threadId":{"S":"th"},` +
		`"runId":{"S":"r1"},"epoch":{"N":"3"},"messageId":{"S":"a1"},"interruptKind":{"S":"approval"},` +
		`"toolCallId":{"S":"call1"},"toolName":{"S":"delete_note"},"signature":{"S":"sig"},"createdAt":{"S":"` + hb + `"},` +
		`"expiresTime":{"S":"` + hb + `"},"body":{"S":"{\"id\":1}"}` + extra + `}`
}

const (
	pendingJSON  = `,"status":{"S":"pending"},"pendingShard":{"S":"INT#3"},"pendingExpiresAt":{"S":"` + hb + `"},"createId":{"S":"cother"}`
	resolvedJSON = `,"status":{"S":"denied"},"resolvedAt":{"S":"` + hb + `"},"respBody":{"S":"{\"approved\":false}"},"createId":{"S":"cother"}`
)

// The interrupt paths dynalite cannot exercise, replayed with DynamoDB's failure bodies (see recorded_test.go):
// the item returned with a failed condition explains it, with no GetItem of the interrupt.
func TestInterruptFailuresClassifiedFromTheReturnedItem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in := agent.Interrupt{ID: "i1", ThreadID: "th", RunID: "r9", MessageID: "a1", Kind: agent.InterruptApproval, ToolName: "other",
		Input: json.RawMessage(`{"id":2}`), Status: agent.InterruptPending, CreatedAt: t0, ExpiresAt: t0}
	resolve := agent.ResolveRequest{ThreadID: "th", MessageID: "a1", ID: "i1", Status: agent.InterruptApproved, Response: json.RawMessage(`{"approved":true}`), Now: t0}
	thread := answer{200, `{"Item":` + threadJSON("") + `}`}

	t.Run("resolve: a resolved interrupt comes back with already_resolved", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(interruptJSON(resolvedJSON + `,"resolveId":{"S":"rother"}`))}})
		got, err := s.ResolveInterrupt(ctx, resolve)
		if !errors.Is(err, agent.ErrAlreadyResolved) || got.Status != agent.InterruptDenied || string(got.Response) != `{"approved":false}` {
			t.Fatalf("ResolveInterrupt = %+v, %v; want the stored denial with already_resolved", got, err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("resolve: our own resolve, answered late, succeeds", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(interruptJSON(resolvedJSON + `,"resolveId":{"S":"rfixed"}`))}},
			dynamo.WithIDs(fixedIDs("fixed")))
		if got, err := s.ResolveInterrupt(ctx, resolve); err != nil || got.Status != agent.InterruptDenied {
			t.Fatalf("ResolveInterrupt = %+v, %v; want our own stored resolution, no error", got, err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("create: the existing interrupt comes back, the thread read once", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"PutItem": {failedWith(interruptJSON(pendingJSON))}, "GetItem": {thread}})
		got, created, err := s.CreateInterrupt(ctx, in)
		if err != nil || created || got.RunID != "r1" || got.ToolName != "delete_note" || string(got.Input) != `{"id":1}` {
			t.Fatalf("CreateInterrupt = %+v, %v, %v; want the stored interrupt", got, created, err)
		}
		r.want(t, "PutItem", "GetItem")
		if k := fmt.Sprint(r.bodies[1]["Key"]); !strings.Contains(k, "THREAD#th") || !strings.Contains(k, "S:THREAD]") {
			t.Fatalf("the read after the failed create was of %s, want the thread item", k)
		}
	})
	t.Run("create: our own put, answered late, is created", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"PutItem": {failedWith(interruptJSON(strings.Replace(pendingJSON, "cother", "cfixed", 1)))},
			"GetItem": {thread}}, dynamo.WithIDs(fixedIDs("fixed")))
		if _, created, err := s.CreateInterrupt(ctx, in); err != nil || !created {
			t.Fatalf("CreateInterrupt: created %v, %v; want our own insert recognised", created, err)
		}
		r.want(t, "PutItem", "GetItem")
	})
	t.Run("create: an interrupt of a tombstoned thread is not found", func(t *testing.T) {
		tomb := answer{200, `{"Item":` + threadJSON(`,"deleting":{"BOOL":true}`) + `}`}
		s, r := newReplay(t, map[string][]answer{"PutItem": {failedWith(interruptJSON(pendingJSON))}, "GetItem": {tomb}})
		if _, _, err := s.CreateInterrupt(ctx, in); !agent.IsKind(err, agent.KindNotFound) {
			t.Fatalf("CreateInterrupt: %v, want not found", err)
		}
		r.want(t, "PutItem", "GetItem") // not ours: nothing is deleted
	})
}

// Interrupts an older build stored under INT#<id> (before REVIEW S7 keyed them by message) stay readable and
// answerable: a deploy while approvals wait loses none. ListMessageInterrupts finds them when the message has no
// INTM# interrupt, GetInterrupt and ResolveInterrupt after a miss on the new key, and the resolve takes one out of
// the pending index like any other.
func TestInterruptsOfTheOlderKeyShape(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-int-legacy")
	pk := "THREAD#" + th.ID
	waiting, answered := approval(th.ID, "waiting", t0.Add(time.Hour)), approval(th.ID, "answered", t0.Add(time.Hour))
	other := approval(th.ID, "other", t0.Add(time.Hour))
	other.MessageID = "a0"
	for _, in := range []agent.Interrupt{waiting, answered, other} {
		mustCreateInterrupt(t, s, in)
		// Moved to the key an older build wrote, with every attribute as it was.
		sk := "INTM#" + in.MessageID + "#" + in.ID
		got, err := f.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{dynamo.AttrPK: &types.AttributeValueMemberS{Value: pk}, dynamo.AttrSK: &types.AttributeValueMemberS{Value: sk}}})
		if err != nil || len(got.Item) == 0 {
			t.Fatalf("GetItem(%s): %d attributes, %v", sk, len(got.Item), err)
		}
		got.Item[dynamo.AttrSK] = &types.AttributeValueMemberS{Value: "INT#" + in.ID}
		if _, err := f.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(f.table), Item: got.Item}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(f.table),
			Key: map[string]types.AttributeValue{dynamo.AttrPK: &types.AttributeValueMemberS{Value: pk}, dynamo.AttrSK: &types.AttributeValueMemberS{Value: sk}}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := countPrefix(t, f, pk, "INTM#"); n != 0 {
		t.Fatalf("%d INTM# items left, want every interrupt under the older key", n)
	}
	answer := answered.Resolve(agent.InterruptApproved, t0)
	answer.Response = json.RawMessage(`{"approved":true}`)
	if got, err := s.ResolveInterrupt(ctx, answer); err != nil || got.Status != agent.InterruptApproved {
		t.Fatalf("ResolveInterrupt of an older-key interrupt = %+v, %v", got, err)
	}
	if _, err := s.ResolveInterrupt(ctx, answer); !errors.Is(err, agent.ErrAlreadyResolved) {
		t.Fatalf("ResolveInterrupt again: %v, want already_resolved", err)
	}
	wrong := waiting.Resolve(agent.InterruptDenied, t0)
	wrong.MessageID = "a0"
	if _, err := s.ResolveInterrupt(ctx, wrong); !agent.IsKind(err, agent.KindNotFound) {
		t.Fatalf("ResolveInterrupt naming another message: %v, want not found", err)
	}
	list, err := s.ListMessageInterrupts(ctx, th.ID, "a1")
	if err != nil || len(list) != 2 || list[0].ID != "answered" || list[1].ID != "waiting" || list[1].Status != agent.InterruptPending {
		t.Fatalf("ListMessageInterrupts(a1) = %+v, %v; want answered, then waiting (pending)", list, err)
	}
	if got, err := s.GetInterrupt(ctx, th.ID, "a1", "waiting"); err != nil || got.ToolCallID != "call-waiting" {
		t.Fatalf("GetInterrupt(waiting) = %+v, %v", got, err)
	}
	if _, err := s.GetInterrupt(ctx, th.ID, "a0", "waiting"); !errors.Is(err, agent.ErrInterruptNotFound) {
		t.Fatalf("GetInterrupt naming another message: %v, want interrupt_not_found", err)
	}
	// The reaper finds the waiting one through the pending index, and expires it by its key.
	expired, err := s.ListExpiredInterrupts(ctx, t0.Add(2*time.Hour), 0)
	if err != nil || len(expired) != 2 {
		t.Fatalf("ListExpiredInterrupts = %+v, %v; want waiting and other", expired, err)
	}
	for _, in := range expired {
		if _, err := s.ResolveInterrupt(ctx, in.Resolve(agent.InterruptExpired, t0.Add(2*time.Hour))); err != nil {
			t.Fatalf("expire %s: %v", in.ID, err)
		}
	}
	if n := pendingEntries(t, f, th.ID); n != 0 {
		t.Fatalf("%d pending index entries left", n)
	}
	// A new interrupt of the message is stored under the new key; both shapes are in the thread's history.
	later := approval(th.ID, "later", t0.Add(time.Hour))
	later.CreatedAt = t0.Add(time.Second)
	mustCreateInterrupt(t, s, later)
	if n := countPrefix(t, f, pk, "INTM#a1#"); n != 1 {
		t.Fatalf("%d items under INTM#a1#, want the new one", n)
	}
	if all, err := s.ListInterrupts(ctx, th.ID); err != nil || len(all) != 4 {
		t.Fatalf("ListInterrupts = %d, %v; want 4", len(all), err)
	}
}

// What an answer reads of a reviewTools thread's interrupts (REVIEW S7): the thread has asked 1,000 approvals
// before, each on its own reply and answered, and its newest reply waits for one. "thread" is the read every
// continuation, settle and view made before S7 (the thread's whole interrupt prefix, ListInterrupts); "message"
// is what they make now (ListMessageInterrupts of the reply they answer). Reported per read: requests and RCU
// (make bench; the resolved ones stand in for a day's answers, which the TTL keeps).
func BenchmarkAnswerInterruptReads(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	s := f.store
	th := realisticThread(b, s)
	ask := func(i int, pending bool) agent.Interrupt {
		id := fmt.Sprintf("apr_%025d", i)
		in := agent.Interrupt{ID: id, ThreadID: th.ID, RunID: fmt.Sprintf("run_%025d", i), Epoch: int64(i + 1),
			MessageID: fmt.Sprintf("msg_%025d", i), Kind: agent.InterruptApproval, ToolCallID: fmt.Sprintf("call_%024d", i),
			ToolName: "delete_note", Input: []byte(`{"id":"note_01jd8x5q3w9m2k7v4c6b1n0zt"}`),
			Signature: "q4y2b1nR0m7v3xW9kJ5sLh8pT6cF2dG1eA0zQwErTyU", Status: agent.InterruptPending,
			CreatedAt: t0.Add(time.Duration(i) * time.Second), ExpiresAt: t0.Add(agent.DefaultInterruptTTL)}
		mustCreateInterrupt(b, s, in)
		if !pending {
			req := in.Resolve(agent.InterruptApproved, in.CreatedAt.Add(time.Second))
			req.Response = json.RawMessage(`{"approved":true}`)
			if _, err := s.ResolveInterrupt(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
		return in
	}
	const answered = 1000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < answered; i += 8 {
				ask(i, false)
			}
		})
	}
	wg.Wait()
	newest := ask(answered, true)
	for _, tc := range []struct {
		name string
		read func() (int, error)
	}{
		{"thread", func() (int, error) { ins, err := s.ListInterrupts(ctx, th.ID); return len(ins), err }},
		{"message", func() (int, error) {
			ins, err := s.ListMessageInterrupts(ctx, th.ID, newest.MessageID)
			return len(ins), err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			before := f.counter.Counts()
			n := 0
			for b.Loop() {
				got, err := tc.read()
				if err != nil {
					b.Fatal(err)
				}
				n++
				if tc.name == "message" && got != 1 {
					b.Fatalf("ListMessageInterrupts = %d interrupts, want the newest reply's one", got)
				}
			}
			d := f.counter.Counts().Sub(before)
			b.ReportMetric(float64(d.Reads)/float64(n), "requests/read")
			b.ReportMetric(d.ReadUnits/float64(n), "RCU/read")
		})
	}
}
