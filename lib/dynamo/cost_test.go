package dynamo_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/reaper"
)

// measureIndexes turns on the counter's own index accounting for f's table (dynalite reports no index write
// units), reading items through a client the counter is not registered on.
func measureIndexes(tb testing.TB, f *fixture) {
	tb.Helper()
	path, err := dynamotest.TemplatePath()
	if err != nil {
		tb.Fatal(err)
	}
	spec, err := dynamotest.LoadTable(path)
	if err != nil {
		tb.Fatal(err)
	}
	f.counter.MeasureIndexWrites(dynamotest.Client(endpoint), f.table, []string{dynamo.AttrPK, dynamo.AttrSK},
		spec.Indexes())
}

// realisticThread is a thread the size the HTTP layer allows in practice: a 16-character useChat id, an
// identity-provider subject, an 80-byte title.
func realisticThread(tb testing.TB, s *dynamo.Store) agent.Thread {
	tb.Helper()
	th, _, err := s.CreateThread(context.Background(), agent.Thread{ID: "Xk3j9Lm2Qp8Rt5Vw", Owner: "auth0|64f1c2e9a8b7d6c5e4f3a2b1",
		Title: strings.Repeat("t", 80), CreatedAt: t0, UpdatedAt: t0})
	if err != nil {
		tb.Fatal(err)
	}
	return th
}

// What a running thread costs per second of streaming, in DynamoDB write units, indexes included (DESIGN: at
// most 2). The 1 s heartbeat writes the thread item (1 WCU: it is well under 1 KB) and moves the thread in the
// running index only when the heartbeat crosses into a new 10 s bucket (an index delete and put, 1 WCU each): 60
// heartbeats cost 60 + 6×2 = 72 WCU, 1.2 WCU per second. The control at the end moves the index key on every
// write, as the heartbeat did before the bucket, and must see 2 index writes per write: the accounting is not
// blind to index writes.
func TestHeartbeatCost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	measureIndexes(t, f)
	ctx := context.Background()
	s := f.store
	th := realisticThread(t, s)
	req := claimReq(th.ID, "run_01jd8x5q3w9m2k7v4c6b1n0zt", t0)
	req.Owner = th.Owner
	res, err := s.ClaimRun(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.counter.Reset()
	const seconds = 60
	for i := 1; i <= seconds; i++ {
		if err := s.Heartbeat(ctx, th.ID, res.Run.Fence(), t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	c := f.counter.Counts()
	crossings := int64(0) // bucket boundaries passed in (t0, t0+60s]
	for i := 1; i <= seconds; i++ {
		prev, now := t0.Add(time.Duration(i-1)*time.Second), t0.Add(time.Duration(i)*time.Second)
		if !prev.Truncate(dynamo.DefaultHeartbeatBucket).Equal(now.Truncate(dynamo.DefaultHeartbeatBucket)) {
			crossings++
		}
	}
	if c.Writes != seconds || c.TableWriteUnits != seconds {
		t.Errorf("%d heartbeats: %d writes, %.1f table WCU; want %d and %d (1 WCU each)", seconds, c.Writes, c.TableWriteUnits, seconds, seconds)
	}
	if c.IndexWrites != 2*crossings || c.IndexWriteUnits != float64(2*crossings) {
		t.Errorf("%d heartbeats: %d index writes, %.1f index WCU; want %d (a delete and a put per bucket crossing)",
			seconds, c.IndexWrites, c.IndexWriteUnits, 2*crossings)
	}
	perSecond := c.WriteUnits() / seconds
	if perSecond > 2 {
		t.Errorf("a streaming second costs %.2f WCU in heartbeats, want at most 2", perSecond)
	}
	item, err := f.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "THREAD#" + th.ID}, "sk": &types.AttributeValueMemberS{Value: "THREAD"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("heartbeat: %.2f WCU per heartbeat on the table (thread item %d bytes), %.2f WCU/s with the running index (%d index writes in %d s)",
		c.TableWriteUnits/seconds, dynamo.ItemSize(item.Item), perSecond, c.IndexWrites, seconds)

	// Control: the same write moving the index key every time.
	f.counter.Reset()
	for i := 1; i <= 5; i++ {
		_, err := f.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(f.table),
			Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "THREAD#" + th.ID}, "sk": &types.AttributeValueMemberS{Value: "THREAD"}},
			UpdateExpression:          aws.String("SET " + dynamo.AttrClaimBucket + " = :b"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":b": &types.AttributeValueMemberS{Value: fmt.Sprintf("moved-%d", i)}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if c := f.counter.Counts(); c.IndexWrites != 10 || c.IndexWriteUnits != 10 {
		t.Fatalf("5 writes moving the index key: %d index writes (%.1f WCU), want 10", c.IndexWrites, c.IndexWriteUnits)
	}
}

// The keeper's reader probe (ReadersOf) of a chat Lambda's one run is one eventually consistent BatchGetItem of
// one thread item: 0.5 RCU, no write. A probe every 100 ms (engine.DefaultReaderProbe) is 5 RCU per streaming
// second, whether or not a reader is attached (infra/DYNAMODB.md "Resumed-stream readers").
func TestReaderProbeCost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := realisticThread(t, s)
	req := claimReq(th.ID, "run_01jd8x5q3w9m2k7v4c6b1n0zt", t0)
	req.Owner = th.Owner
	if _, err := s.ClaimRun(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkReader(ctx, th.ID, req.RunID, t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.counter.Reset()
	const probes = 10
	for range probes {
		marks, err := s.ReadersOf(ctx, []string{th.ID})
		if err != nil {
			t.Fatal(err)
		}
		if want := (agent.ReaderMark{ThreadID: th.ID, RunID: req.RunID, Until: t0.Add(5 * time.Second)}); len(marks) != 1 || marks[0] != want {
			t.Fatalf("ReadersOf = %+v, want [%+v]", marks, want)
		}
	}
	c := f.counter.Counts()
	if c.Reads != probes || c.ReadUnits != probes*0.5 || c.Writes != 0 || c.WriteUnits() != 0 {
		t.Fatalf("%d probes: %d reads (%.1f RCU), %d writes (%.1f WCU); want %d reads of 0.5 RCU and no write",
			probes, c.Reads, c.ReadUnits, c.Writes, c.WriteUnits(), probes)
	}
}

// The counter's index accounting follows DynamoDB's rules on the table's indexes: a thread entering the
// running index (claim) is one put, leaving it (the orphan sweep, once its released runs are recorded) one delete, a title change touches no index (byOwner is
// keys only and the title is no key), a rename of the sort key of byOwner (UpdateThread moves recency) is a delete
// and a put.
func TestCounterIndexRules(t *testing.T) {
	t.Parallel()
	f := setup(t)
	measureIndexes(t, f)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-rules")
	step := func(name string, want int64, op func() error) {
		t.Helper()
		before := f.counter.Counts()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d := f.counter.Counts().Sub(before); d.IndexWrites != want {
			t.Errorf("%s: %d index writes, want %d", name, d.IndexWrites, want)
		}
	}
	var run agent.Run
	step("ClaimRun (thread enters running; the run item is in no index)", 1, func() error {
		res, err := s.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
		run = res.Run
		return err
	})
	step("UpdateThread (byOwner sort key moves)", 2, func() error {
		_, err := s.UpdateThread(ctx, th.ID, agent.ThreadPatch{}, t0.Add(time.Second))
		return err
	})
	step("RequestCancel (no index attribute)", 0, func() error { _, err := s.RequestCancel(ctx, th.ID, "", t0); return err })
	// messagesBySeq (local, keys only): a new message is one entry, a rewrite that keeps its position none, a
	// delete removes it, and a message brought back is a new entry.
	msg := agent.Message{ID: "m1", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hi"}`)}}
	write := func(text string) func() error {
		return func() error {
			m := msg
			m.Parts = []json.RawMessage{json.RawMessage(`{"type":"text","text":"` + text + `"}`)}
			return s.PutMessage(ctx, agent.MessageWrite{ThreadID: th.ID, Seq: run.FirstSeq, Message: m, Fence: run.Fence(), Now: t0})
		}
	}
	step("PutMessage of a new message (enters messagesBySeq)", 1, write("hi"))
	step("PutMessage rewriting it (position kept: no index write)", 0, write("hello"))
	step("DeleteMessage (leaves messagesBySeq)", 1, func() error { return s.DeleteMessage(ctx, th.ID, msg.ID, run.Fence()) })
	step("PutMessage bringing it back (a new entry)", 1, write("again"))
	step("FinishRun without a finish time (the thread stays in running: no index write)", 0, func() error {
		run.Status = agent.RunCanceled
		return s.FinishRun(ctx, run)
	})
	step("ListOrphanRuns, its last run recorded (the thread leaves running)", 1, func() error {
		_, err := s.ListOrphanRuns(ctx, t0.Add(time.Hour), 0)
		return err
	})
	step("ClaimRun of an idle thread out of the index (enters running)", 1, func() error {
		_, err := s.ClaimRun(ctx, claimReq(th.ID, "r2", t0.Add(time.Hour)))
		return err
	})
}

// What an interrupt costs, in requests and capacity units, indexes included (infra/DYNAMODB.md, "Interrupts"). A
// realistic approval (a short tool input, an HMAC signature) is one small item: the create is 1 WCU for the head
// plus 1 for its entry in the pending index, and 1 RCU for the strongly consistent read of the thread; the resolve
// is 1 WCU plus 1 for the index entry it removes; a refused resolve is billed 1 WCU (and, where the failure
// carries no item, one GetItem); the reaper's list is 16 small Queries of the pending index.
func TestInterruptCost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	measureIndexes(t, f)
	ctx := context.Background()
	s := f.store
	th := realisticThread(t, s)
	in := agent.Interrupt{ID: "apr_01jd8x5q3w9m2k7v4c6b1n0zt", ThreadID: th.ID, RunID: "run_01jd8x5q3w9m2k7v4c6b1n0zt", Epoch: 1,
		MessageID: "msg_01jd8x5q3w9m2k7v4c6b1n0zt", Kind: agent.InterruptApproval, ToolCallID: "call_Zk3Lm9Qp2Rt8Vw5Xy7Ab1Cd",
		ToolName: "delete_note", Input: []byte(`{"id":"note_01jd8x5q3w9m2k7v4c6b1n0zt"}`),
		Signature: "q4y2b1nR0m7v3xW9kJ5sLh8pT6cF2dG1eA0zQwErTyU", Status: agent.InterruptPending,
		CreatedAt: t0, ExpiresAt: t0.Add(agent.DefaultInterruptTTL)}
	type cost struct {
		reads, writes, indexWrites int64
		tableWCU, indexWCU         float64
	}
	step := func(name string, want cost, op func() error) dynamo.Counts {
		t.Helper()
		before := f.counter.Counts()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d := f.counter.Counts().Sub(before)
		got := cost{d.Reads, d.Writes, d.IndexWrites, d.TableWriteUnits, d.IndexWriteUnits}
		if got != want {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
		t.Logf("%s: %d reads (%.1f RCU), %d writes (%.1f WCU table + %.1f WCU index)", name, d.Reads, d.ReadUnits,
			d.Writes, d.TableWriteUnits, d.IndexWriteUnits)
		return d
	}
	created := step("CreateInterrupt", cost{reads: 1, writes: 1, indexWrites: 1, tableWCU: 1, indexWCU: 1}, func() error {
		_, _, err := s.CreateInterrupt(ctx, in)
		return err
	})
	if created.ReadUnits != 1 {
		t.Errorf("CreateInterrupt read %.1f RCU, want 1 (one strongly consistent read of a thread item under 4 KB)", created.ReadUnits)
	}
	step("CreateInterrupt (repeat)", cost{reads: 1, writes: 1, tableWCU: 1}, func() error {
		_, _, err := s.CreateInterrupt(ctx, in)
		return err
	})
	step("ResolveInterrupt", cost{writes: 1, indexWrites: 1, tableWCU: 1, indexWCU: 1}, func() error {
		_, err := s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptApproved,
			Response: []byte(`{"approved":true,"reason":""}`), Now: t0.Add(time.Minute)})
		return err
	})
	step("ResolveInterrupt (already resolved)", cost{reads: failReads(), writes: 1, tableWCU: 1}, func() error {
		_, err := s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptDenied, Now: t0})
		if !errors.Is(err, agent.ErrAlreadyResolved) {
			return fmt.Errorf("want already_resolved, got %v", err)
		}
		return nil
	})
	step("ListExpiredInterrupts (none pending)", cost{reads: dynamo.DefaultInterruptShards}, func() error {
		_, err := s.ListExpiredInterrupts(ctx, t0.Add(48*time.Hour), 0)
		return err
	})
	head, err := f.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "THREAD#" + th.ID},
			"sk": &types.AttributeValueMemberS{Value: "INT#" + in.ID}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a resolved approval's item is %d bytes", dynamo.ItemSize(head.Item))
}

// What finishing a turn and reaping a dead one write (fences A, B, C): FinishRun is the release and the outcome,
// two writes as before the fences (only their order changed); a reap is the takeover, the user message's and the
// reply's fences, the outcome, the failed reply, the final segment and the reaper's release.
func TestFinishAndReapCost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	measureIndexes(t, f)
	ctx := context.Background()
	s := f.store
	th := realisticThread(t, s)
	turn := func(runID string, at time.Time) agent.Run {
		t.Helper()
		req := claimReq(th.ID, runID, at)
		req.Owner, req.UserMessageID, req.AssistantMessageID, req.Reserve = th.Owner, "u-"+runID, "msg-"+runID, 2
		res, err := s.ClaimRun(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		run := res.Run
		user := agent.Message{ID: req.UserMessageID, Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hello there"}`)}}
		if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: th.ID, Seq: run.FirstSeq, Message: user, Fence: run.Fence(), Final: true, Now: at}); err != nil {
			t.Fatal(err)
		}
		draft := agent.Message{ID: req.AssistantMessageID, Role: agent.RoleAssistant,
			Parts:    []json.RawMessage{json.RawMessage(`{"type":"text","text":"partial"}`)},
			Metadata: json.RawMessage(`{"status":"streaming","runId":"` + runID + `"}`)}
		if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: th.ID, Seq: run.AssistantSeq(), Message: draft, Fence: run.Fence(), Now: at}); err != nil {
			t.Fatal(err)
		}
		return run
	}
	run := turn("run_01jd8x5q3w9m2k7v4c6b1n0za", t0)
	f.counter.Reset()
	done := run
	done.Status, done.Usage, done.FinishedAt = agent.RunCompleted, agent.Usage{InputTokens: 100, OutputTokens: 20, TotalTokens: 120}, t0.Add(time.Second)
	if err := s.FinishRun(ctx, done); err != nil {
		t.Fatal(err)
	}
	c := f.counter.Counts()
	if c.Writes != 2 {
		t.Errorf("FinishRun: %d writes, want 2 (the release, the outcome)", c.Writes)
	}
	t.Logf("FinishRun: %d writes, %d reads, %.1f WCU (table %.1f, index %.1f) %v", c.Writes, c.Reads, c.WriteUnits(), c.TableWriteUnits, c.IndexWriteUnits, c.ByOperation)

	dead := turn("run_01jd8x5q3w9m2k7v4c6b1n0zb", t0.Add(time.Minute))
	slot := agent.LeaseRequest{Scope: agent.RunSlotScope(th.Owner), Holder: dead.ID, Limit: 1, TTL: time.Hour, Now: t0.Add(time.Minute)}
	if retry, err := s.AcquireLease(ctx, slot); err != nil || retry > 0 {
		t.Fatalf("AcquireLease: %v %v", retry, err)
	}
	r := reaper.New(reaper.Deps{Store: s, Clock: fixedClock(t0.Add(time.Hour))}, reaper.Config{StaleAfter: 30 * time.Second})
	f.counter.Reset()
	if ok, err := r.Reap(ctx, th.ID, agent.Claim{RunID: dead.ID, Epoch: dead.Epoch, HeartbeatAt: t0.Add(time.Minute)}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}
	c = f.counter.Counts()
	// TakeOver 1, FenceMessage 1 each (both stored), RecordOutcome 1, the failed reply 1, the final segment and
	// its run marker 2, ReleaseClaim 1, the run slot's release 1. Before the fences a reap was 6: ReleaseClaim,
	// FinishRun's compare-and-set and its refused release (billed), the reply, the segment and its marker (and
	// the slot waited for its lease to expire).
	if c.Writes != 9 {
		t.Errorf("a reap: %d writes %v, want 9", c.Writes, c.ByOperation)
	}
	next := agent.LeaseRequest{Scope: agent.RunSlotScope(th.Owner), Holder: "run_next", Limit: 1, TTL: time.Hour, Now: t0.Add(time.Hour)}
	if retry, err := s.AcquireLease(ctx, next); err != nil || retry > 0 {
		t.Errorf("the user's next run after the reap: retry after %v (%v), want the reaped run's slot given back", retry, err)
	}
	t.Logf("a reap: %d writes, %d reads, %.1f WCU (table %.1f, index %.1f) %v", c.Writes, c.Reads, c.WriteUnits(),
		c.TableWriteUnits, c.IndexWriteUnits, c.ByOperation)

	// REVIEW D15: released threads stay in the running index until the orphan sweep finds their released runs
	// recorded; then one conditional write takes the thread out (1 WCU on the table, 1 for the index delete),
	// once per idle period rather than per turn.
	f.counter.Reset()
	orphans, err := s.ListOrphanRuns(ctx, t0.Add(2*time.Hour), 0)
	if err != nil || len(orphans) != 0 {
		t.Fatalf("ListOrphanRuns: %v %v, want none", orphans, err)
	}
	c = f.counter.Counts()
	if c.Writes != 1 || c.TableWriteUnits != 1 || c.IndexWriteUnits != 1 {
		t.Errorf("the sweep's drop of an idle thread: %d writes (%.1f WCU table, %.1f index), want 1 (1 + 1)", c.Writes, c.TableWriteUnits, c.IndexWriteUnits)
	}
	t.Logf("orphan sweep dropping an idle thread: %d writes, %d reads (%.1f RCU), %.1f WCU (table %.1f, index %.1f)", c.Writes, c.Reads,
		c.ReadUnits, c.WriteUnits(), c.TableWriteUnits, c.IndexWriteUnits)
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

// A stream segment is one PutItem of 1 WCU per KB of its item. A 500 ms flush of a streaming reply holds 1–2 KB of
// text-delta frames: raw, its item is 2 or 3 KB (2–3 WCU); deflated (segments.go), a few hundred bytes, 1 WCU.
func TestSegmentCost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := realisticThread(t, s)
	const run = "run_01jd8x5q3w9m2k7v4c6b1n0zt"
	for i, n := range []int{1024, 2048} {
		seg := agent.Segment{ThreadID: th.ID, RunID: run, Seq: int64(i), Data: textFrames(n, uint64(i)), CreatedAt: t0,
			ExpiresAt: t0.Add(agent.SegmentTTL)}
		f.counter.Reset()
		if err := s.AppendSegment(ctx, seg); err != nil {
			t.Fatal(err)
		}
		c := f.counter.Counts()
		pk, sk := segKey(run, seg.Seq)
		it := rawItem(t, f, pk, sk)
		stored := dynamo.ItemSize(it)
		delete(it, "enc")
		it["body"] = &types.AttributeValueMemberB{Value: seg.Data}
		raw := dynamo.ItemSize(it)
		rawWCU := (raw + 1023) / 1024
		if c.Writes != 1 || c.TableWriteUnits != 1 || rawWCU < 2 {
			t.Errorf("a %d-byte text segment: %d writes, %.1f WCU (item %d bytes); want 1 write of 1 WCU (raw it would be %d bytes, %d WCU)",
				len(seg.Data), c.Writes, c.TableWriteUnits, stored, raw, rawWCU)
		}
		t.Logf("a %d-byte text segment: item %d bytes, %.1f WCU (raw: %d bytes, %d WCU)", len(seg.Data), stored, c.TableWriteUnits, raw, rawWCU)
	}
}
