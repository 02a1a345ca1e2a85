package agent_test

import (
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// Cost is integer arithmetic on the table's decimal prices: the expected values are worked out by hand.
func TestPricesCost(t *testing.T) {
	t.Parallel()
	prices, err := agent.ParsePrices([]byte(`{
		"gpt-4o-mini": {"input": 0.15, "cachedInput": 0.075, "output": 0.6},
		"gpt-4o": {"input": 2.5, "output": 10},
		"o3": {"input": 2, "cachedInput": 0.5, "output": 8},
		"claude-sonnet-4": {"input": 3, "cachedInput": 0.3, "cacheWrite": 3.75, "output": 15}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		model string
		usage agent.Usage
		want  int64
		known bool
	}{
		// 1M uncached input at 0.15 $/M is 150000 µ$.
		{"one million input", "gpt-4o-mini", agent.Usage{InputTokens: 1_000_000}, 150_000, true},
		// 1000 in of which 400 cached: 600×0.15 + 400×0.075 = 90 + 30 = 120 µ$; 200 out × 0.6 = 120 µ$.
		{"cached and output", "gpt-4o-mini", agent.Usage{InputTokens: 1000, CachedInputTokens: 400, OutputTokens: 200}, 240, true},
		// No cachedInput price: cached tokens cost the input price. 10×2.5 + 3×10 = 55 µ$.
		{"cached at input price", "gpt-4o", agent.Usage{InputTokens: 10, CachedInputTokens: 10, OutputTokens: 3}, 55, true},
		// Cache writes at their own price: 1000 in = 200 read + 500 written + 300 plain:
		// 200×0.3 + 500×3.75 + 300×3 = 60 + 1875 + 900 = 2835 µ$; 100 out × 15 = 1500.
		{"cache writes", "claude-sonnet-4", agent.Usage{InputTokens: 1000, CachedInputTokens: 200, CacheWriteTokens: 500, OutputTokens: 100}, 4335, true},
		// No cacheWrite price: writes cost the input price. 10 in, all written: 10×2.5 = 25 µ$.
		{"writes at input price", "gpt-4o", agent.Usage{InputTokens: 10, CacheWriteTokens: 10}, 25, true},
		// Reasoning is part of output: 100 out (80 of them reasoning) × 8 = 800 µ$, plus 50×2 = 100.
		{"reasoning billed as output", "o3", agent.Usage{InputTokens: 50, OutputTokens: 100, ReasoningTokens: 80}, 900, true},
		// 3 tokens × 0.15 = 0.45 µ$ rounds to 0; 4 × 0.15 = 0.6 rounds to 1.
		{"rounds down below half", "gpt-4o-mini", agent.Usage{InputTokens: 3}, 0, true},
		{"rounds up from half", "gpt-4o-mini", agent.Usage{InputTokens: 4}, 1, true},
		// A dated model name a provider reports is priced by its family's entry.
		{"dated name", "gpt-4o-mini-2024-07-18", agent.Usage{InputTokens: 1_000_000}, 150_000, true},
		// A dated gpt-4o is gpt-4o's, not gpt-4o-mini's.
		{"dated family", "gpt-4o-2024-08-06", agent.Usage{OutputTokens: 1000}, 10_000, true},
		{"unknown model", "claude", agent.Usage{InputTokens: 1000}, 0, false},
		{"no prefix without dash", "gpt-4ox", agent.Usage{InputTokens: 1000}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, known := prices.Cost(tc.model, tc.usage)
			if got != tc.want || known != tc.known {
				t.Fatalf("Cost(%s, %+v) = %d, %v; want %d, %v", tc.model, tc.usage, got, known, tc.want, tc.known)
			}
		})
	}
	var none agent.Prices
	if got, known := none.Cost("gpt-4o", agent.Usage{InputTokens: 1000}); got != 0 || known {
		t.Fatalf("empty table: %d, %v", got, known)
	}
}

func TestParsePricesRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, json string }{
		{"not json", `{`},
		{"negative", `{"m": {"input": -1, "output": 1}}`},
		{"exponent", `{"m": {"input": 1e-3, "output": 1}}`},
		{"too many decimals", `{"m": {"input": 0.0000001, "output": 1}}`},
		{"absurd price", `{"m": {"input": 100001, "output": 1}}`},
		{"unknown field", `{"m": {"input": 1, "output": 1, "reasoning": 2}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := agent.ParsePrices([]byte(tc.json)); !agent.IsKind(err, agent.KindInvalid) {
				t.Fatalf("ParsePrices(%s) = %v, want invalid", tc.json, err)
			}
		})
	}
}

// Only a dated snapshot of a listed model takes its price (REVIEW S19): with only gpt-4o listed, gpt-4o-mini and
// its snapshots are another model, not gpt-4o.
func TestPricesMatchOnlyDatedNames(t *testing.T) {
	t.Parallel()
	prices, err := agent.ParsePrices([]byte(`{"gpt-4o": {"input": 2.5, "output": 10}, "claude-sonnet-4": {"input": 3, "output": 15}}`))
	if err != nil {
		t.Fatal(err)
	}
	for model, known := range map[string]bool{
		"gpt-4o":                   true,
		"gpt-4o-2024-08-06":        true,
		"claude-sonnet-4-20250514": true, // a date without dashes, as Anthropic names snapshots
		"gpt-4o-mini":              false,
		"gpt-4o-mini-2024-07-18":   false,
		"gpt-4o-audio-preview":     false,
		"gpt-4o-2024-08":           false,
		"gpt-4o-2024-08-06-extra":  false,
		"gpt-4o-20240806x":         false,
		"gpt-4o-2024-0a-06":        false,
	} {
		if _, got := prices.Cost(model, agent.Usage{InputTokens: 1000}); got != known {
			t.Errorf("Cost(%s) known = %v, want %v", model, got, known)
		}
	}
}
