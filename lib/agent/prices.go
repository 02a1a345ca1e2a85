package agent

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Price is what one model's tokens cost, in US dollars per million tokens. CachedInput is what a cached input
// token costs (nil: the same as Input); CacheWrite what an input token written to the provider's prompt cache
// costs (nil: the same as Input; Anthropic charges 1.25 times the input price for its 5-minute cache). Reasoning
// tokens are output tokens and are billed as such.
type Price struct {
	Input       json.Number  `json:"input"`
	CachedInput *json.Number `json:"cachedInput,omitempty"`
	CacheWrite  *json.Number `json:"cacheWrite,omitempty"`
	Output      json.Number  `json:"output"`
}

// Prices is the price table: model name → price. The table is optional (nil prices nothing); ParsePrices reads
// it from JSON such as
//
//	{"gpt-4o-mini": {"input": 0.15, "cachedInput": 0.075, "output": 0.6},
//	 "claude-sonnet-4": {"input": 3, "cachedInput": 0.3, "cacheWrite": 3.75, "output": 15}}
//
// A model is looked up by its exact name, else by its name without a snapshot date, "-YYYY-MM-DD" or "-YYYYMMDD"
// (so "gpt-4o-mini" prices the dated "gpt-4o-mini-2024-07-18" a provider reports, and "gpt-4o" prices no
// "gpt-4o-mini").
type Prices struct {
	// rates in micro-USD per million tokens, so that Cost is integer arithmetic.
	rates map[string]rate
}

type rate struct{ input, cached, write, output int64 }

// ParsePrices reads a price table (see Prices). Prices are decimal numbers of US dollars per million tokens
// with at most 6 decimals (a micro-dollar per million tokens); negative prices are refused.
func ParsePrices(data []byte) (Prices, error) {
	var raw map[string]Price
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Prices{}, E(KindInvalid, CodeInvalidConfig, "price table: %v", err)
	}
	return PricesOf(raw)
}

// PricesOf builds a price table from its entries (model name → price), checked as ParsePrices checks them.
func PricesOf(table map[string]Price) (Prices, error) {
	p := Prices{rates: make(map[string]rate, len(table))}
	for model, pr := range table {
		r, err := pr.rate()
		if err != nil {
			return Prices{}, E(KindInvalid, CodeInvalidConfig, "price table: %s %v", model, err)
		}
		p.rates[model] = r
	}
	return p, nil
}

// Check reports why pr is not a price ParsePrices accepts (nil when it is), naming the field: "input: …".
func (pr Price) Check() error {
	_, err := pr.rate()
	return err
}

func (pr Price) rate() (rate, error) {
	in, err := microPerM(pr.Input)
	if err != nil {
		return rate{}, fmt.Errorf("input: %v", err)
	}
	out, err := microPerM(pr.Output)
	if err != nil {
		return rate{}, fmt.Errorf("output: %v", err)
	}
	cached := in
	if pr.CachedInput != nil {
		if cached, err = microPerM(*pr.CachedInput); err != nil {
			return rate{}, fmt.Errorf("cachedInput: %v", err)
		}
	}
	write := in
	if pr.CacheWrite != nil {
		if write, err = microPerM(*pr.CacheWrite); err != nil {
			return rate{}, fmt.Errorf("cacheWrite: %v", err)
		}
	}
	return rate{input: in, cached: cached, write: write, output: out}, nil
}

// With is p with more's models added, more's price winning for a model both name (the models file's entries
// over AGENT_PRICES).
func (p Prices) With(more Prices) Prices {
	if more.Len() == 0 {
		return p
	}
	out := Prices{rates: make(map[string]rate, len(p.rates)+len(more.rates))}
	for m, r := range p.rates {
		out.rates[m] = r
	}
	for m, r := range more.rates {
		out.rates[m] = r
	}
	return out
}

// microPerM turns a decimal USD amount into integer micro-USD, exactly (no float rounding).
func microPerM(n json.Number) (int64, error) {
	s := string(n)
	if s == "" {
		return 0, nil
	}
	if strings.ContainsAny(s, "eE-") {
		return 0, fmt.Errorf("%q: want a plain non-negative decimal", s)
	}
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) > 6 {
		return 0, fmt.Errorf("%q: more than 6 decimals", s)
	}
	frac += strings.Repeat("0", 6-len(frac))
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %v", s, err)
	}
	f, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %v", s, err)
	}
	if w > maxPricePerM {
		return 0, fmt.Errorf("%q: more than %d USD per million tokens", s, maxPricePerM)
	}
	return w*1_000_000 + f, nil
}

// maxPricePerM bounds a price (USD per million tokens) so that Cost cannot overflow: at this rate a step would
// need over 90 million tokens to overflow an int64 of micro-USD × 1e6.
const maxPricePerM = 100_000

// Len is the number of models priced.
func (p Prices) Len() int { return len(p.rates) }

// lookup finds model's rate: its exact name, else the name without a date suffix ("-YYYY-MM-DD", or "-YYYYMMDD"
// as Anthropic dates its snapshots) when that name is listed. Nothing else matches: with only "gpt-4o" listed,
// "gpt-4o-mini" is another model, not a gpt-4o (REVIEW S19).
func (p Prices) lookup(model string) (rate, bool) {
	if r, ok := p.rates[model]; ok {
		return r, true
	}
	if base, ok := undated(model); ok {
		r, ok := p.rates[base]
		return r, ok
	}
	return rate{}, false
}

// undated cuts a snapshot date off a model name: "gpt-4o-2024-08-06" and "claude-sonnet-4-20250514" name dated
// snapshots of "gpt-4o" and "claude-sonnet-4".
func undated(model string) (string, bool) {
	for _, layout := range []string{"2006-01-02", "20060102"} {
		n := len(model) - len(layout) - 1
		if n <= 0 || model[n] != '-' {
			continue
		}
		if _, err := time.Parse(layout, model[n+1:]); err == nil {
			return model[:n], true
		}
	}
	return "", false
}

// Cost prices u as spent by model, in micro-USD, rounded half up once for the whole usage (so each model step is
// priced exactly as an integer and sums of steps stay exact). Cached input tokens and cache writes are part of
// InputTokens and are billed at their own rates; reasoning tokens are part of OutputTokens. It reports false for a model the table
// does not price (cost 0), and for an empty table.
func (p Prices) Cost(model string, u Usage) (int64, bool) {
	r, ok := p.lookup(model)
	if !ok {
		return 0, false
	}
	in := max(u.InputTokens, 0)
	cached := min(max(u.CachedInputTokens, 0), in)
	written := min(max(u.CacheWriteTokens, 0), in-cached)
	uncached := in - cached - written
	// micro-USD per million tokens × tokens = micro-USD × 1e6.
	scaled := uncached*r.input + cached*r.cached + written*r.write + max(u.OutputTokens, 0)*r.output
	return (scaled + 500_000) / 1_000_000, true
}
