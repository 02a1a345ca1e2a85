package sqlite_test

import (
	"encoding/json"
	"fmt"
	"strings"
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
			fence := agent.Fence{RunID: "r1", Epoch: 1}
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
