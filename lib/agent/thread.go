package agent

import "time"

// Thread is one conversation. ID comes from the client (the useChat id); Owner is the authenticated subject.
type Thread struct {
	ID        string         `json:"id"`
	Owner     string         `json:"owner"`
	Title     string         `json:"title"`
	Settings  ThreadSettings `json:"settings"`
	Usage     Usage          `json:"usage"`
	CreatedAt time.Time      `json:"createdAt"`
	UpdatedAt time.Time      `json:"updatedAt"`
	// Epoch is the last fencing token handed out on this thread; every claim takes Epoch+1.
	Epoch int64 `json:"epoch"`
	// ActiveRun is the run claim, nil when the thread is idle.
	ActiveRun *Claim `json:"activeRun,omitempty"`
}

// ThreadSettings are user-editable per-thread options.
type ThreadSettings struct {
	// ReviewTools requires approval for every mutating tool.
	ReviewTools bool `json:"reviewTools"`
}

// ThreadPatch changes the user-editable fields of a thread; nil fields are left alone.
type ThreadPatch struct {
	Title    *string
	Settings *ThreadSettings
}

// Claim is the active-run claim stored on the thread. It is the single item a heartbeat touches, and the item
// the reaper's sparse index of running runs is built over.
type Claim struct {
	RunID           string    `json:"runId"`
	Epoch           int64     `json:"epoch"`
	HeartbeatAt     time.Time `json:"heartbeatAt"`
	CancelRequested bool      `json:"cancelRequested,omitempty"`
	// ReadersUntil is how long resumed-stream readers said they stay attached (RunStore.MarkReader): while it is
	// in the future the run flushes its stream segments faster (segments.DefaultHurryInterval) so that a reader in
	// another process sees text as smoothly as the run's own client does. Zero: nobody is attached. A new claim
	// starts without it.
	ReadersUntil time.Time `json:"readersUntil,omitzero"`
}

// Readers reports whether a resumed-stream reader said at some moment up to now that it is still attached.
func (c *Claim) Readers(now time.Time) bool { return c != nil && c.ReadersUntil.After(now) }

// Claim timing defaults (DESIGN.md "Run lifecycle"), owned by the domain because the engine (which heartbeats),
// the reaper (which reaps) and readers (which decide a writer is gone) must agree on them.
const (
	DefaultHeartbeat  = time.Second
	DefaultStaleAfter = 30 * time.Second
	// DefaultReaderPresence is how far ahead a resumed-stream reader marks itself attached (RunStore.MarkReader);
	// it marks again every half of it while it stays. A reader that went away stops hurrying the writer after at
	// most this long.
	DefaultReaderPresence = 5 * time.Second
)

// StaleClaim is a claim found by the reaper, with its thread.
type StaleClaim struct {
	ThreadID string
	Claim    Claim
}

// Stale reports whether the claim's heartbeat is older than staleAfter at now.
func (c *Claim) Stale(now time.Time, staleAfter time.Duration) bool {
	return c != nil && now.Sub(c.HeartbeatAt) > staleAfter
}

// Usage counts model tokens, and what they cost when a price table is configured. CachedInputTokens and
// ReasoningTokens are parts of InputTokens and OutputTokens (as providers report them), not additions.
type Usage struct {
	InputTokens       int64 `json:"inputTokens"`
	OutputTokens      int64 `json:"outputTokens"`
	TotalTokens       int64 `json:"totalTokens"`
	CachedInputTokens int64 `json:"cachedInputTokens"` // of InputTokens: read from the provider's prompt cache
	ReasoningTokens   int64 `json:"reasoningTokens,omitempty"`
	// CacheWriteTokens is the part of InputTokens the provider wrote to its prompt cache (Anthropic's
	// cache_creation_input_tokens), priced apart from plain input by providers that charge for writes.
	CacheWriteTokens int64 `json:"cacheWriteTokens,omitempty"`
	// CostMicroUSD is the price of these tokens in millionths of a US dollar (0 without a price table), kept as an
	// integer so that sums stay exact however many runs add to a thread.
	CostMicroUSD int64 `json:"costMicroUsd,omitempty"`
}

// Sub returns u-o.
func (u Usage) Sub(o Usage) Usage {
	return u.Add(Usage{InputTokens: -o.InputTokens, OutputTokens: -o.OutputTokens, TotalTokens: -o.TotalTokens,
		CachedInputTokens: -o.CachedInputTokens, ReasoningTokens: -o.ReasoningTokens, CacheWriteTokens: -o.CacheWriteTokens,
		CostMicroUSD: -o.CostMicroUSD})
}

// Add returns u+o.
func (u Usage) Add(o Usage) Usage {
	return Usage{
		InputTokens:       u.InputTokens + o.InputTokens,
		OutputTokens:      u.OutputTokens + o.OutputTokens,
		TotalTokens:       u.TotalTokens + o.TotalTokens,
		CachedInputTokens: u.CachedInputTokens + o.CachedInputTokens,
		ReasoningTokens:   u.ReasoningTokens + o.ReasoningTokens,
		CacheWriteTokens:  u.CacheWriteTokens + o.CacheWriteTokens,
		CostMicroUSD:      u.CostMicroUSD + o.CostMicroUSD,
	}
}

// FirstReply is a thread's first reply, stored completed: what a generated title is made from (lib/titles).
type FirstReply struct {
	ThreadID string
	RunID    string
	// Title is the thread's title when the run claimed it (the provisional one, its first message's text): the
	// generated title replaces it only if it still is (agent.GeneratedTitle.Replaces). CreatedAt names the
	// thread's incarnation (agent.GeneratedTitle.CreatedAt).
	Title     string
	CreatedAt time.Time
	// User is the text of the thread's first user message; Reply the text of the reply.
	User  string
	Reply string
}
