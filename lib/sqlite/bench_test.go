package sqlite_test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sqlite"
)

// reportCounters adds store calls and SQL statements per iteration to the benchmark output.
func reportCounters(b *testing.B, s *sqlite.Store, ops0, stmts0 int64) {
	b.ReportMetric(float64(s.Ops()-ops0)/float64(b.N), "storeops/op")
	b.ReportMetric(float64(s.Statements()-stmts0)/float64(b.N), "stmts/op")
}

// BenchmarkClaimFinish is the fixed cost of one turn's ownership: claim the thread, heartbeat once, finish.
func BenchmarkClaimFinish(b *testing.B) {
	s := setup(b)
	ctx := b.Context()
	newThread(b, s, "th1")
	at := nowTime()
	ops0, stmts0 := s.Ops(), s.Statements()
	i := 0
	for b.Loop() {
		i++
		at = at.Add(time.Second)
		res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: fmt.Sprintf("run-%d", i),
			Trigger: agent.TriggerUser, Now: at, StaleAfter: 30 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Heartbeat(ctx, "th1", res.Run.Fence(), at); err != nil {
			b.Fatal(err)
		}
		run := res.Run
		run.Status = agent.RunCompleted
		run.Usage = agent.Usage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15}
		run.FinishedAt = at
		if err := s.FinishRun(ctx, run); err != nil {
			b.Fatal(err)
		}
	}
	reportCounters(b, s, ops0, stmts0)
}

// BenchmarkPutMessage measures inserting new messages and upserting a draft (the per-step write), at a typical
// size and at the 1 MB extreme.
func BenchmarkPutMessage(b *testing.B) {
	part := func(n int) json.RawMessage {
		return agent.EncodePart(agent.Part{Type: "text", Text: strings.Repeat("lorem ipsum ", n/12)})
	}
	cases := []struct {
		name   string
		size   int
		upsert bool
	}{
		{"insert-2KB", 2 << 10, false},
		{"upsert-2KB", 2 << 10, true},
		{"upsert-1MB", 1 << 20, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			s := setup(b)
			ctx := b.Context()
			newThread(b, s, "th1")
			m := agent.Message{ID: "m", Role: agent.RoleAssistant, Parts: []json.RawMessage{part(tc.size)},
				Metadata: json.RawMessage(`{"status":"streaming"}`)}
			b.SetBytes(int64(len(m.Parts[0])))
			// Message writes check the claim (fence F): write as the thread's run.
			res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: "r1",
				Trigger: agent.TriggerUser, Now: nowTime(), StaleAfter: 30 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			fence := res.Run.Fence()
			ops0, stmts0 := s.Ops(), s.Statements()
			i := 0
			for b.Loop() {
				i++
				if !tc.upsert {
					m.ID = fmt.Sprintf("m-%d", i)
				}
				w := agent.MessageWrite{ThreadID: "th1", Seq: int64(i), Message: m, Fence: fence, Now: nowTime()}
				if err := s.PutMessage(ctx, w); err != nil {
					b.Fatal(err)
				}
			}
			reportCounters(b, s, ops0, stmts0)
		})
	}
}

// BenchmarkParallelWrites is the write load of many streaming runs on one Store (issue 18: a process streaming
// 1,000 runs appends two segments and one heartbeat per run per second): 64 goroutines, each one run on its own
// claimed thread, append 2 KB segments, heartbeat, or both (two segments to one heartbeat). ns/op is the Store's
// throughput (wall time over all goroutines' calls); tx/op is how many write transactions a call cost.
func BenchmarkParallelWrites(b *testing.B) {
	const runsPerProc = 32 // b.SetParallelism: goroutines per GOMAXPROCS
	data := []byte(strings.Repeat("data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"word \"}\n\n", 2<<10/56))
	for _, tc := range []struct {
		name      string
		heartbeat func(i int64) bool
	}{
		{"append-segment", func(int64) bool { return false }},
		{"heartbeat", func(int64) bool { return true }},
		{"mixed", func(i int64) bool { return i%3 == 2 }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := setup(b)
			ctx := b.Context()
			runs := runsPerProc * runtime.GOMAXPROCS(0)
			fences := make([]agent.Fence, runs)
			for i := range fences {
				id := fmt.Sprintf("th%d", i)
				newThread(b, s, id)
				res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "u1", RunID: "run-" + id,
					Trigger: agent.TriggerUser, Now: nowTime(), StaleAfter: 30 * time.Second})
				if err != nil {
					b.Fatal(err)
				}
				fences[i] = res.Run.Fence()
			}
			var next atomic.Int64
			ops0, stmts0, txs0 := s.Ops(), s.Statements(), s.Transactions()
			b.SetParallelism(runsPerProc)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := int(next.Add(1) - 1)
				th, f := fmt.Sprintf("th%d", r), fences[r]
				var i, seq int64
				for pb.Next() {
					i++
					if tc.heartbeat(i) {
						if err := s.Heartbeat(ctx, th, f, nowTime().Add(time.Duration(i)*time.Millisecond)); err != nil {
							b.Error(err)
							return
						}
						continue
					}
					g := agent.Segment{ThreadID: th, RunID: f.RunID, Seq: seq, Data: data, CreatedAt: nowTime(),
						ExpiresAt: nowTime().Add(24 * time.Hour)}
					seq++
					if err := s.AppendSegment(ctx, g); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			reportCounters(b, s, ops0, stmts0)
			b.ReportMetric(float64(s.Transactions()-txs0)/float64(b.N), "tx/op")
		})
	}
}

// BenchmarkTurnReads is the reads a turn makes before it calls the model (issue 18: a turn's fixed cost weighs on
// CPU per streamed word): the thread, its queue, the user message and the newest page of a 10-message transcript.
func BenchmarkTurnReads(b *testing.B) {
	s := setup(b)
	ctx := b.Context()
	newThread(b, s, "th1")
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th1", Owner: "u1", RunID: "r1",
		Trigger: agent.TriggerUser, Now: nowTime(), StaleAfter: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10 {
		m := agent.Message{ID: fmt.Sprintf("m-%d", i), Role: agent.RoleUser,
			Parts: []json.RawMessage{agent.EncodePart(agent.Part{Type: "text", Text: strings.Repeat("word ", 40)})}}
		if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: "th1", Seq: int64(i + 1), Message: m, Fence: res.Run.Fence(),
			Now: nowTime()}); err != nil {
			b.Fatal(err)
		}
	}
	ops0, stmts0 := s.Ops(), s.Statements()
	for b.Loop() {
		if _, err := s.GetThread(ctx, "th1"); err != nil {
			b.Fatal(err)
		}
		if _, err := s.ListQueued(ctx, "th1"); err != nil {
			b.Fatal(err)
		}
		if _, err := s.GetMessage(ctx, "th1", "m-9"); err != nil {
			b.Fatal(err)
		}
		if p, err := s.ListMessagesPage(ctx, "th1", agent.MessagePage{Limit: 50}); err != nil || len(p.Items) != 10 {
			b.Fatal(len(p.Items), err)
		}
	}
	reportCounters(b, s, ops0, stmts0)
}
