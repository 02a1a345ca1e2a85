package httpapi_test

import (
	"encoding/json"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
)

// GET /threads/{id} carries the thread's usage totals (reasoning tokens and cost included) and each reply's
// metadata.usage and metadata.model; GET /threads/{id}/runs each run's usage and store cost. The totals are the
// runs' sums and the title's spend, on both stores.
func TestUsageOverHTTP(t *testing.T) {
	t.Parallel()
	prices, err := agent.ParsePrices([]byte(`{"offline": {"input": 2, "cachedInput": 1, "output": 8}}`))
	if err != nil {
		t.Fatal(err)
	}
	for name, store := range storeKinds(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store, func(h *hitlStack) { h.cfg = func(c *config.Config) { c.Prices = prices } })
			h.send("th", "u1", "/think ponder this")
			h.send("th", "u2", "hello there")

			runs := h.runs("th")
			if len(runs) != 2 {
				t.Fatalf("%d runs, want 2", len(runs))
			}
			var sum agent.Usage
			for _, r := range runs {
				if r.Usage.CostMicroUSD <= 0 || r.Store == nil || r.Store.Requests <= 0 {
					t.Fatalf("run %+v: want a cost and a store count", r)
				}
				if name == "dynalite" && r.Store.WriteUnits <= 0 {
					t.Fatalf("run %+v: dynalite reports table write units", r.Store)
				}
				sum = sum.Add(r.Usage)
			}
			if runs[0].Usage.ReasoningTokens == 0 {
				t.Fatalf("the /think run reports no reasoning tokens: %+v", runs[0].Usage)
			}
			h.stack.Titles.Wait() // the title after the first reply (title_test.go), whose spend is the thread's too
			v := h.view("th")
			if title := v.Thread.Usage.Sub(sum); title.InputTokens <= 0 || title.OutputTokens <= 0 || title.CostMicroUSD <= 0 ||
				title.TotalTokens != title.InputTokens+title.OutputTokens || title.ReasoningTokens != 0 {
				t.Fatalf("thread usage %+v, want the runs' sum %+v and the title's spend (priced)", v.Thread.Usage, sum)
			}
			replies := 0
			for _, m := range v.Messages {
				if m.Role != agent.RoleAssistant {
					continue
				}
				md := m.Meta()
				if md.Usage == nil || md.Model != "offline" || *md.Usage != runs[replies].Usage {
					t.Fatalf("reply %d metadata %+v, want usage %+v and model offline", replies, md, runs[replies].Usage)
				}
				replies++
			}
			if replies != 2 {
				t.Fatalf("%d replies", replies)
			}

			// The wire names, as a client reads them.
			resp := h.f.do(t, "GET", "/threads/th", token(t, "alice"), nil)
			var raw struct {
				Thread struct {
					Usage map[string]json.Number `json:"usage"`
				} `json:"thread"`
			}
			if err := json.Unmarshal(readAll(t, resp), &raw); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"inputTokens", "outputTokens", "totalTokens", "cachedInputTokens", "reasoningTokens", "costMicroUsd"} {
				if _, ok := raw.Thread.Usage[k]; !ok {
					t.Fatalf("thread.usage has no %q: %v", k, raw.Thread.Usage)
				}
			}
		})
	}
}
