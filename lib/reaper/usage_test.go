package reaper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/tools"
)

type countingMetrics struct {
	mu     sync.Mutex
	reaped int
}

func (m *countingMetrics) RunFinished(agent.RunMetrics) {}
func (m *countingMetrics) Reaped(n int)                 { m.mu.Lock(); m.reaped += n; m.mu.Unlock() }
func (m *countingMetrics) StoreThrottled(int)           {}

// A reaped run gets one agent.reap line with the usage (reasoning and cost included) the reaper counted from its
// draft, and one ReapedRuns count; a live run gets neither.
func TestReapedRunLineAndMetric(t *testing.T) {
	t.Parallel()
	st := sqliteStore(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	metrics := &countingMetrics{}
	clock := agent.SystemClock{}
	r := reaper.New(reaper.Deps{Store: st, Tools: tools.Demo(st, clock), Clock: clock, Metrics: metrics,
		Logger: slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))}, reaper.Config{StaleAfter: staleAfter})
	f := &fixture{store: st, r: r}
	dead := f.claim(t, "dead", "run_dead", time.Now().Add(-time.Minute))
	f.draft(t, dead, `{"status":"streaming","usage":{"inputTokens":7,"outputTokens":3,"totalTokens":10,"cachedInputTokens":2,"reasoningTokens":1,"costMicroUsd":55}}`,
		`{"type":"step-start"}`)
	f.claim(t, "live", "run_live", time.Now())
	if s, err := r.Tick(context.Background()); err != nil || s.Reaped != 1 {
		t.Fatalf("Tick = %+v, %v", s, err)
	}
	if th := f.idle(t, "dead"); th.Usage.CostMicroUSD != 55 || th.Usage.ReasoningTokens != 1 {
		t.Fatalf("thread usage %+v, want the draft's cost and reasoning tokens", th.Usage)
	}
	mu.Lock()
	defer mu.Unlock()
	var reaps []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		if rec["msg"] == "agent.reap" {
			reaps = append(reaps, rec)
		}
	}
	if len(reaps) != 1 {
		t.Fatalf("agent.reap lines %v, want one", reaps)
	}
	l := reaps[0]
	if l["run_id"] != "run_dead" || l["thread_id"] != "dead" || l["outcome"] != "reaped" || l["input_tokens"] != 7.0 ||
		l["output_tokens"] != 3.0 || l["cached_input_tokens"] != 2.0 || l["reasoning_tokens"] != 1.0 || l["cost_micro_usd"] != 55.0 {
		t.Fatalf("agent.reap = %v", l)
	}
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if metrics.reaped != 1 {
		t.Fatalf("ReapedRuns = %d, want 1", metrics.reaped)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
