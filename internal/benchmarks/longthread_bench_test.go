package benchmarks

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
)

// Long threads (issue 10: "a 5,000-message thread with large tool outputs: a turn's store reads and peak memory
// equal those of a 50-message thread within 10 %"). Two threads are seeded straight through the store, the way
// runs write (one claim reserves the positions, every message written final under its fence): 50 and 5,000
// messages, every other one an assistant reply holding a tool call with a 34 KB output (words, so it compresses
// like text: DynamoDB keeps it gzipped inline). Then the same plain turns run on each, one at a time (after each,
// the turn's two messages are deleted again, so every turn meets exactly 50 or 5,000 messages), and each
// turn's message reads (calls, messages, bytes), DynamoDB requests and read units, bytes allocated by the whole
// process (client, handler, engine, store, offline model), and the peak of the heap's live objects (sampled every
// 200 µs), absolute and above what the heap held when the turn began, are averaged per thread. Run with -benchtime 1x (make
// bench does): the seeding is the slow part and happens once.

const (
	longTurns       = 30     // turns per thread
	longOutputBytes = 34_000 // one tool output: above the 32 KiB a result is cut to, so each reply costs the most
)

// readMeter counts the message reads a turn makes and the bytes of the messages they returned.
type readMeter struct {
	agent.Store
	calls, items, bytes atomic.Int64
}

func (m *readMeter) add(recs ...agent.MessageRecord) {
	m.calls.Add(1)
	for _, r := range recs {
		m.items.Add(1)
		n := len(r.Message.Metadata)
		for _, p := range r.Message.Parts {
			n += len(p)
		}
		m.bytes.Add(int64(n))
	}
}

func (m *readMeter) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	recs, err := m.Store.ListMessages(ctx, threadID)
	m.add(recs...)
	return recs, err
}

func (m *readMeter) ListMessagesPage(ctx context.Context, threadID string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	page, err := m.Store.ListMessagesPage(ctx, threadID, p)
	m.add(page.Items...)
	return page, err
}

func (m *readMeter) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	r, err := m.Store.GetMessage(ctx, threadID, id)
	if err == nil {
		m.add(r)
	} else {
		m.add()
	}
	return r, err
}

func (m *readMeter) reset() { m.calls.Store(0); m.items.Store(0); m.bytes.Store(0) }

// toolOutput is a tool result of about n bytes of words.
func toolOutput(rng *rand.Rand, n int) json.RawMessage {
	words := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
		"kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform"}
	var s strings.Builder
	for s.Len() < n {
		fmt.Fprintf(&s, "%s-%d ", words[rng.IntN(len(words))], rng.IntN(10_000))
	}
	out, _ := json.Marshal(map[string]string{"result": s.String()})
	return out
}

// seedLongThread writes n messages into thread (owner's) through s.
func seedLongThread(b *testing.B, s agent.Store, owner, thread string, n int) {
	b.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: thread, Owner: owner, Title: thread, CreatedAt: now, UpdatedAt: now}); err != nil {
		b.Fatal(err)
	}
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: thread, Owner: owner, RunID: "run_seed_" + thread, Trigger: agent.TriggerUser,
		AssistantMessageID: "seed_" + thread, Reserve: n, Now: now})
	if err != nil {
		b.Fatal(err)
	}
	md, _ := json.Marshal(agent.MessageMetadata{RunID: res.Run.ID, Status: agent.MessageCompleted})
	jobs := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				rng := rand.New(rand.NewPCG(uint64(i), 1))
				m := agent.Message{ID: fmt.Sprintf("u%05d", i), Role: agent.RoleUser,
					Parts: []json.RawMessage{agent.EncodePart(agent.Part{Type: "text", Text: fmt.Sprintf("question %d: look it up", i)})}}
				if i%2 == 1 {
					m = agent.Message{ID: fmt.Sprintf("a%05d", i), Role: agent.RoleAssistant, Metadata: md, Parts: []json.RawMessage{
						agent.EncodePart(agent.Part{Type: "step-start"}),
						agent.EncodePart(agent.Part{Type: "tool-list_notes", ToolCallID: fmt.Sprintf("call%05d", i), State: agent.StateOutputAvailable,
							Input: json.RawMessage(`{}`), Output: toolOutput(rng, longOutputBytes)}),
						agent.EncodePart(agent.Part{Type: "step-start"}),
						agent.EncodePart(agent.Part{Type: "text", Text: fmt.Sprintf("Here is what I found for question %d.", i-1)}),
					}}
				}
				w := agent.MessageWrite{ThreadID: thread, Seq: res.Run.FirstSeq + int64(i), Message: m, Fence: res.Run.Fence(), Final: true, Now: now}
				if err := s.PutMessage(ctx, w); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	run := res.Run
	run.Status, run.FinishedAt, run.UpdatedAt = agent.RunCompleted, now, now
	if err := s.FinishRun(ctx, run); err != nil {
		b.Fatal(err)
	}
}

// restore deletes the newest user message and reply of thread, fenced above the run that wrote them.
func restore(b *testing.B, s agent.Store, thread string) {
	b.Helper()
	ctx := context.Background()
	th, err := s.GetThread(ctx, thread)
	if err != nil {
		b.Fatal(err)
	}
	p, err := s.ListMessagesPage(ctx, thread, agent.MessagePage{Limit: 2})
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range p.Items {
		if !strings.HasPrefix(r.Message.ID, "turn") && !strings.HasPrefix(r.Message.ID, "msg_") {
			b.Fatalf("restore %s: %s is not the turn's", thread, r.Message.ID)
		}
		if err := s.DeleteMessage(ctx, thread, r.Message.ID, agent.Fence{RunID: "bench-restore", Epoch: th.Epoch + 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// heapPeak samples the heap's live object bytes until stop, and returns the largest value seen.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(200 * time.Microsecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-stop:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return out
}

// longFigures is what the turns on one thread cost, summed.
type longFigures struct {
	calls, items, bytes     int64
	ddbReads, ddbRequests   int64
	rcu                     float64
	alloc, peakGrowth, peak uint64
	ops                     map[string]int64 // DynamoDB requests by operation
}

func (f longFigures) per(n int) map[string]float64 {
	d := float64(n)
	return map[string]float64{"read-calls": float64(f.calls) / d, "messages-read": float64(f.items) / d,
		"KB-read": float64(f.bytes) / d / 1e3, "ddb-reads": float64(f.ddbReads) / d, "ddb-requests": float64(f.ddbRequests) / d,
		"rcu": f.rcu / d, "MB-allocated": float64(f.alloc) / d / 1e6, "MB-peak-heap-growth": float64(f.peakGrowth) / d / 1e6,
		"MB-peak-heap": float64(f.peak) / d / 1e6}
}

// runLong seeds both threads through seed, then runs the turns and reports both sizes and their ratio.
func runLong(b *testing.B, s *stack, m *readMeter, seed agent.Store, counter *dynamo.Counter) {
	sizes := []int{50, 5_000}
	for _, n := range sizes {
		start := time.Now()
		seedLongThread(b, seed, "bench", fmt.Sprintf("long%d", n), n)
		b.Logf("seeded %d messages in %v", n, time.Since(start).Round(time.Millisecond))
	}
	figures := map[int]*longFigures{}
	for _, n := range sizes {
		figures[n] = &longFigures{ops: map[string]int64{}}
	}
	b.ResetTimer()
	for i := range longTurns {
		for _, n := range sizes { // interleaved, so load on the machine falls on both alike
			f := figures[n]
			m.reset()
			if counter != nil {
				counter.Reset()
			}
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			alloc0, live0 := ms.TotalAlloc, ms.HeapAlloc
			stop := make(chan struct{})
			peak := heapPeak(stop)
			s.turn(b, fmt.Sprintf("long%d", n), fmt.Sprintf("turn%d", i), "hello, what did we find so far?")
			close(stop)
			p := <-peak
			runtime.ReadMemStats(&ms)
			f.alloc += ms.TotalAlloc - alloc0
			if p > live0 {
				f.peakGrowth += p - live0
			}
			f.peak += p
			f.calls, f.items, f.bytes = f.calls+m.calls.Load(), f.items+m.items.Load(), f.bytes+m.bytes.Load()
			if counter != nil {
				c := counter.Counts()
				f.ddbReads, f.ddbRequests, f.rcu = f.ddbReads+c.Reads, f.ddbRequests+c.Reads+c.Writes, f.rcu+c.ReadUnits
				for op, k := range c.ByOperation {
					f.ops[op] += k
				}
			}
			// The turn added its message and its reply: hide both again (tombstones are in no page), so every
			// turn meets a thread of exactly n messages.
			b.StopTimer()
			restore(b, seed, fmt.Sprintf("long%d", n))
			b.StartTimer()
		}
	}
	b.StopTimer()
	small, large := figures[sizes[0]].per(longTurns), figures[sizes[1]].per(longTurns)
	names := []string{"read-calls", "messages-read", "KB-read", "MB-allocated", "MB-peak-heap-growth", "MB-peak-heap"}
	if counter != nil {
		names = append(names, "ddb-reads", "ddb-requests", "rcu")
	}
	var lines []string
	for _, name := range names {
		ratio := 0.0
		if small[name] > 0 {
			ratio = large[name] / small[name]
		}
		lines = append(lines, fmt.Sprintf("%-20s %10.3g %10.3g   ratio %.3f", name, small[name], large[name], ratio))
		b.ReportMetric(small[name], name+"-50/turn")
		b.ReportMetric(large[name], name+"-5000/turn")
		b.ReportMetric(ratio, name+"-ratio")
	}
	if counter != nil {
		for _, n := range sizes {
			var ops []string
			for _, op := range slices.Sorted(maps.Keys(figures[n].ops)) {
				ops = append(ops, fmt.Sprintf("%s %.3g", op, float64(figures[n].ops[op])/longTurns))
			}
			lines = append(lines, fmt.Sprintf("DynamoDB requests per turn, %d messages: %s", n, strings.Join(ops, ", ")))
		}
	}
	// Printed, not logged: a benchmark's log is cut at ten lines.
	fmt.Printf("%s: per turn, averaged over %d turns each:\n%-20s %10s %10s\n%s\n", b.Name(), longTurns, "", "50 msgs", "5000 msgs",
		strings.Join(lines, "\n"))
}

// BenchmarkLongThreadSQLite: a turn on a 5,000-message thread against one on a 50-message thread, on SQLite.
func BenchmarkLongThreadSQLite(b *testing.B) {
	m := &readMeter{}
	s := setup(b, nil, nil, config.Config{}, meterReads(m))
	runLong(b, s, m, s.store, nil)
}

// BenchmarkLongThreadDynamo: the same on dynalite, with DynamoDB requests and read units.
func BenchmarkLongThreadDynamo(b *testing.B) {
	m := &readMeter{}
	s, counter := dynamoStack(b, config.Config{}, meterReads(m))
	runLong(b, s, m, s.store, counter)
}

// meterReads puts m between the engine and its store.
func meterReads(m *readMeter) func(*devserver.Options, *probe) {
	return func(o *devserver.Options, _ *probe) {
		inner := o.Wrap
		o.Wrap = func(s agent.Store) agent.Store {
			m.Store = inner(s)
			return m
		}
	}
}
