package benchmarks

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The reaper's Tick over a store full of idle threads: it must cost what it finds (here 10 stale runs), not what
// the table holds. Idle threads are of four shapes, so that every sparse index the tick reads holds entries it
// must not pay for: most are a bare thread; one in 10 has a delivered job and its taken steer entry (both out of
// the dueWork index); one in 100 has a job still running, due in half an hour (in dueWork, not due); one in 100
// waits for an approval that expires tomorrow (in the pending-interrupts index, not expired).

const (
	staleRuns = 10
	// idle shapes, by thread index
	shapePlain, shapeDelivered, shapeRunning, shapePending = "plain", "delivered", "running", "pending"
)

// tickFixture is a seeded store and the reaper that sweeps it through a ledger.
type tickFixture struct {
	base   agent.Store // seeding goes here, uncounted
	ledger *ledger
	meter  *meter
	reaper *reaper.Reaper
	jobs   *wakes
	// grow seeds idle threads [from, to).
	grow    func(b *testing.B, from, to int)
	idle    int
	iter    int
	created map[string]bool
}

// wakes is a Jobs port that counts what the reaper asks for (nothing, in this benchmark).
type wakes struct{ n atomic.Int64 }

func (w *wakes) Start(context.Context, agent.Job) error    { w.n.Add(1); return nil }
func (w *wakes) Wake(context.Context, agent.JobTask) error { w.n.Add(1); return nil }
func (f *tickFixture) idleID(i int) string                 { return fmt.Sprintf("idle-%05d", i) }
func (f *tickFixture) staleID(k int) string                { return fmt.Sprintf("stale-%02d", k) }
func newTickFixture(base agent.Store, m *meter) *tickFixture {
	f := &tickFixture{base: base, ledger: newLedger(base), jobs: &wakes{}, created: map[string]bool{}, meter: m}
	f.ledger.route = func(phase, method string) agent.Store {
		if phase == "metered" {
			return m.route(phase, method)
		}
		return base
	}
	f.reaper = reaper.New(reaper.Deps{Store: f.ledger, Jobs: f.jobs}, reaper.Config{})
	return f
}

// staleRuns claims the stale threads with a heartbeat an hour old and a draft reply, as runs whose process died
// mid-reply leave them.
func (f *tickFixture) staleRuns(b *testing.B, stale int) {
	ctx := context.Background()
	f.iter++
	old := time.Now().Add(-time.Hour)
	part, _ := json.Marshal(map[string]string{"type": "text", "text": "The answer is"})
	for k := range stale {
		id := f.staleID(k)
		if !f.created[id] {
			f.created[id] = true
			if _, _, err := f.base.CreateThread(ctx, agent.Thread{ID: id, Owner: "o", CreatedAt: old, UpdatedAt: old}); err != nil {
				b.Fatal(err)
			}
		}
		runID := fmt.Sprintf("run_%d_%d", f.iter, k)
		res, err := f.base.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "o", RunID: runID, Trigger: agent.TriggerUser,
			AssistantMessageID: "msg_" + runID, Now: old.Add(time.Duration(k) * time.Second), StaleAfter: agent.DefaultStaleAfter, Reserve: 2})
		if err != nil {
			b.Fatal(err)
		}
		md, _ := json.Marshal(agent.MessageMetadata{Status: agent.MessageStreaming, RunID: runID})
		w := agent.MessageWrite{ThreadID: id, Seq: res.Run.AssistantSeq(), Fence: res.Run.Fence(), Now: old,
			Message: agent.Message{ID: res.Run.AssistantMessageID, Role: agent.RoleAssistant, Parts: []json.RawMessage{part}, Metadata: md}}
		if err := f.base.PutMessage(ctx, w); err != nil {
			b.Fatal(err)
		}
	}
}

// lists are the tick's index reads; everything else it does is for what they found.
var lists = []string{"ListStaleClaims", "ListExpiredInterrupts", "ListDueJobs", "ListQueuedThreads"}

// ticks measures b.N ticks, each finding stale runs (seeded before it, outside the timer). The timed ticks go
// to the store directly; on DynamoDB one more tick, untimed, goes through the meter for its requests and
// capacity (the counter's index accounting reads every item it writes twice, which would distort the time).
func (f *tickFixture) ticks(b *testing.B, stale int) {
	ctx := context.Background()
	f.ledger.reset()
	tick := func(phase string) {
		f.staleRuns(b, stale)
		f.ledger.setPhase(phase)
		if phase == "tick" {
			b.StartTimer()
		}
		st, err := f.reaper.Tick(ctx)
		b.StopTimer()
		f.ledger.setPhase("")
		if err != nil || st.Nominated != stale || st.Reaped != stale || st.Expired+st.Redriven+st.Swept != 0 {
			b.Fatalf("tick = %+v, %v (want exactly the %d stale runs)", st, err, stale)
		}
	}
	b.StopTimer()
	b.ResetTimer()
	for range b.N {
		tick("tick")
	}
	if n := f.jobs.n.Load(); n != 0 {
		b.Fatalf("the tick asked for %d delivery passes", n)
	}
	n := float64(b.N)
	calls := f.ledger.byMethod("tick")
	var listCalls int64
	for _, m := range lists {
		listCalls += calls[m]
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/n, "ms/tick")
	b.ReportMetric(float64(f.ledger.total("tick"))/n, "store-calls/tick")
	b.ReportMetric(float64(listCalls)/n, "list-calls/tick")
	b.ReportMetric(float64(f.idle), "idle-threads")
	if f.ledger.tally != nil {
		b.ReportMetric(float64(f.ledger.tallyOf("tick"))/n, "stmts/tick")
	}
	detail := table(calls, nil, b.N)
	if f.meter != nil {
		f.meter.reset()
		tick("metered")
		counts := f.meter.counts("metered")
		detail = table(f.ledger.byMethod("metered"), counts, 1)
		all := sum(counts)
		listed := dynamo.Counts{}
		for _, m := range lists {
			c := counts[m]
			listed.Reads, listed.ReadUnits = listed.Reads+c.Reads, listed.ReadUnits+c.ReadUnits
		}
		b.ReportMetric(float64(all.Reads+all.Writes), "ddb-requests/tick")
		b.ReportMetric(float64(listed.Reads), "list-requests/tick")
		b.ReportMetric(all.ReadUnits, "rcu/tick")
		b.ReportMetric(listed.ReadUnits, "list-rcu/tick")
		b.ReportMetric(all.WriteUnits(), "wcu/tick")
	}
	if final(b) {
		b.Logf("per tick (%d idle threads, %d stale runs): %s", f.idle, stale, detail)
	}
}

// warm runs one untimed tick that reaps stale runs: the first requests after a large seed are slower (the
// server's caches, the runtime's JIT) than every later one.
func (f *tickFixture) warm(b *testing.B) {
	f.staleRuns(b, staleRuns)
	if st, err := f.reaper.Tick(context.Background()); err != nil || st.Reaped != staleRuns {
		b.Fatalf("warm-up tick = %+v, %v", st, err)
	}
}

// runTick seeds 1,000 idle threads, measures ticks that find 10 stale runs and ticks that find nothing, grows
// the idle threads to 10,000 and measures again.
func runTick(b *testing.B, f *tickFixture) {
	for _, n := range []int{1000, 10000} {
		start := time.Now()
		f.grow(b, f.idle, n)
		seeded := time.Since(start)
		f.idle = n
		f.warm(b)
		for _, stale := range []int{staleRuns, 0} {
			b.Run(fmt.Sprintf("idle-%d/stale-%d", n, stale), func(b *testing.B) {
				if final(b) && stale != 0 {
					b.Logf("idle threads seeded in %v", seeded.Round(time.Millisecond))
				}
				f.ticks(b, stale)
			})
		}
	}
}

// BenchmarkReaperTickSQLite: one reaper Tick on SQLite with 1,000 and 10,000 idle threads and 10 stale runs.
func BenchmarkReaperTickSQLite(b *testing.B) {
	s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "tick.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	f := newTickFixture(s, nil)
	f.ledger.tally = s.Statements
	f.grow = func(b *testing.B, from, to int) {
		ctx, now := context.Background(), time.Now()
		for i := from; i < to; i++ {
			if err := seedIdle(ctx, s, f.idleID(i), shapeOf(i), now); err != nil {
				b.Fatal(err)
			}
		}
	}
	runTick(b, f)
}

// BenchmarkReaperTickDynamo: the same on dynalite, with DynamoDB requests and capacity per tick. The idle threads
// are copies of four template threads written by the store itself (one of each shape), with their ids (and the
// index shards derived from them) rewritten, put with BatchWriteItem: 25 items a request instead of the store's
// one request per write (or four, for an insert that checks its thread), so 10,000 threads take seconds.
func BenchmarkReaperTickDynamo(b *testing.B) {
	endpoint := dynamotest.Start(b)
	raw := dynamotest.Client(endpoint)
	table := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	ctx := context.Background()
	if err := dynamotest.CreateTable(ctx, raw, table); err != nil {
		b.Fatal(err)
	}
	m, err := newMeter(endpoint, table)
	if err != nil {
		b.Fatal(err)
	}
	base := dynamo.New(raw, table)
	f := newTickFixture(base, m)
	templates := map[string][]map[string]types.AttributeValue{}
	for _, shape := range []string{shapePlain, shapeDelivered, shapeRunning, shapePending} {
		id := "TEMPLATE-" + shape
		if err := seedIdle(ctx, base, id, shape, time.Now()); err != nil {
			b.Fatal(err)
		}
		out, err := raw.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
			KeyConditionExpression:    aws.String("pk = :pk"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "THREAD#" + id}}})
		if err != nil || out.LastEvaluatedKey != nil {
			b.Fatalf("template %s: %v", id, err)
		}
		templates[shape] = out.Items
	}
	f.grow = func(b *testing.B, from, to int) {
		var items []map[string]types.AttributeValue
		for i := from; i < to; i++ {
			for _, it := range templates[shapeOf(i)] {
				items = append(items, cloneItem(it, "TEMPLATE-"+shapeOf(i), f.idleID(i)))
			}
		}
		if err := batchPut(ctx, raw, table, items); err != nil {
			b.Fatal(err)
		}
	}
	runTick(b, f)
}
