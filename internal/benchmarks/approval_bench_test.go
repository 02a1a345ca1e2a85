package benchmarks

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
)

// toolClock records when the benchmark's tools start, and how many store calls the turn had made by then.
type toolClock struct {
	mu      sync.Mutex
	startAt time.Time
	calls   int64
}

// withApprovalTools serves two tools with the same body: "guarded" needs approval, "free" does not.
func withApprovalTools(tc *toolClock) func(*devserver.Options, *probe) {
	return func(o *devserver.Options, p *probe) {
		o.Tools = func(agent.ValueStore, agent.Clock) []agent.Tool {
			exec := func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
				tc.mu.Lock()
				tc.startAt, tc.calls = time.Now(), p.calls.Load()
				tc.mu.Unlock()
				return json.RawMessage(`"done"`), nil
			}
			schema := json.RawMessage(`{"type":"object"}`)
			return []agent.Tool{
				{Name: "guarded", Kind: agent.ToolServer, Approval: agent.ApprovalAlways, InputSchema: schema, Execute: exec},
				{Name: "free", Kind: agent.ToolServer, InputSchema: schema, Execute: exec},
			}
		}
	}
}

// approve posts the approval of the newest message's requested approval, as the AI SDK does.
func (s *stack) approve(b *testing.B, thread string) {
	msgs, err := s.store.ListMessages(context.Background(), thread)
	if err != nil || len(msgs) == 0 {
		b.Fatalf("list: %v", err)
	}
	body := map[string]any{"id": thread, "trigger": "submit-message"}
	var out []any
	for i, r := range msgs {
		m := r.Message
		if i == len(msgs)-1 {
			body["messageId"] = m.ID
			for j, raw := range m.Parts {
				p, _ := agent.DecodePart(raw)
				if p.State == agent.StateApprovalRequested {
					yes := true
					p.State, p.Approval.Approved = agent.StateApprovalResponded, &yes
					m.Parts[j] = agent.EncodePart(p)
				}
			}
		}
		out = append(out, m)
	}
	body["messages"] = out
	js, _ := json.Marshal(body)
	resp := s.post(b, "/chat", string(js))
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(data), "tool-output-available") {
		b.Fatalf("approve: %d %s", resp.StatusCode, data)
	}
}

// runApproval measures, per iteration, a turn that asks for approval and the answer that continues it, against
// the same tool call made without approval: the store calls (and DynamoDB requests) of each, and the time from
// the answer's arrival to the tool's start.
func runApproval(b *testing.B, s *stack, tc *toolClock, counter *dynamo.Counter) {
	var lat []time.Duration
	var callsToTool int64
	var askDDB, answerDDB, freeDDB dynamo.Counts
	for i := 0; i < b.N; i++ {
		thread := fmt.Sprintf("apr%d", i)
		snap := func() dynamo.Counts {
			if counter == nil {
				return dynamo.Counts{}
			}
			return counter.Counts()
		}
		c0 := snap()
		s.turn(b, thread, "u1", `/tool guarded {"n":1}`)
		c1 := snap()
		s.approve(b, thread)
		c2 := snap()
		p := s.probe
		p.mu.Lock()
		received := p.received
		p.mu.Unlock()
		tc.mu.Lock()
		lat = append(lat, tc.startAt.Sub(received))
		callsToTool = max(callsToTool, tc.calls)
		tc.mu.Unlock()
		s.turn(b, "free"+thread, "u1", `/tool free {"n":1}`)
		c3 := snap()
		askDDB, answerDDB, freeDDB = addCounts(askDDB, c1.Sub(c0)), addCounts(answerDDB, c2.Sub(c1)), addCounts(freeDDB, c3.Sub(c2))
	}
	b.ReportMetric(pct(lat, 0.50), "p50-answer-to-tool-µs")
	b.ReportMetric(pct(lat, 0.99), "p99-answer-to-tool-µs")
	b.ReportMetric(float64(callsToTool), "store-calls-answer-to-tool")
	if counter != nil {
		n := float64(b.N)
		b.ReportMetric(float64(askDDB.Reads+askDDB.Writes)/n, "ddb-requests-ask-turn")
		b.ReportMetric(float64(answerDDB.Reads+answerDDB.Writes)/n, "ddb-requests-answer-turn")
		b.ReportMetric(float64(freeDDB.Reads+freeDDB.Writes)/n, "ddb-requests-plain-tool-turn")
		b.ReportMetric((askDDB.WriteUnits()+answerDDB.WriteUnits())/n, "wcu-approved-call")
		b.ReportMetric(freeDDB.WriteUnits()/n, "wcu-plain-call")
	}
}

// BenchmarkApprovalSQLite: an approved tool call through the local stack on SQLite.
func BenchmarkApprovalSQLite(b *testing.B) {
	tc := &toolClock{}
	s := setup(b, nil, nil, config.Config{}, withApprovalTools(tc))
	runApproval(b, s, tc, nil)
}

// BenchmarkApprovalDynamo: the same against dynalite, with DynamoDB requests and write units per turn.
func BenchmarkApprovalDynamo(b *testing.B) {
	tc := &toolClock{}
	s, counter := dynamoStack(b, config.Config{}, withApprovalTools(tc))
	runApproval(b, s, tc, counter)
}

// addCounts sums what the benchmark reports of two counts.
func addCounts(a, b dynamo.Counts) dynamo.Counts {
	return dynamo.Counts{Reads: a.Reads + b.Reads, Writes: a.Writes + b.Writes,
		TableWriteUnits: a.TableWriteUnits + b.TableWriteUnits, IndexWriteUnits: a.IndexWriteUnits + b.IndexWriteUnits}
}
