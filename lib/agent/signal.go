package agent

import (
	"context"
	"time"
)

// Completion signals (issue 21 item 4). When a run ends, whatever its status and whoever records it (the run's own
// FinishRun, or the reaper's RecordOutcome), the outcome's write also stores the run's signal as pending: the run
// item is the outbox, so a process that dies right after the run ended leaves a signal that a later sweep delivers.
// The deliverer (lib/signals) sends it through its sinks (lib/eventbridge, lib/webhooks, the log) and settles it;
// a failed delivery is retried by the sweep with exponential backoff; nothing of it ever changes the run.

// SignalEvent is the event type of a run's end: the EventBridge detail-type and the webhook payload's type.
const SignalEvent = "agentloop.run.finished"

// SignalStatus is where a run's completion signal is.
type SignalStatus string

const (
	SignalPending   SignalStatus = "pending"   // not delivered yet: the sweep lists it once due
	SignalDelivered SignalStatus = "delivered" // every sink took it
	SignalDropped   SignalStatus = "dropped"   // given up after its attempts (logged)
)

// RunSignal is a run's completion signal as its run item keeps it (Run.Signal).
type RunSignal struct {
	Status SignalStatus
	// Owner is the thread's owner when the run ended (the run item does not otherwise name it).
	Owner string
	// Attempts counts the attempts the sweep took (ClaimSignal); the run's own first attempt is not counted.
	Attempts int
	// DueAt is when the sweep may next try (pending only; zero once settled).
	DueAt time.Time
}

// RunFinished is what a completion signal says: the run's end, never any message text.
type RunFinished struct {
	// ID identifies this run's end, stable across every attempt (the webhook-id; receivers deduplicate by it).
	ID        string
	ThreadID  string
	RunID     string
	Owner     string
	Trigger   Trigger
	Status    RunStatus
	ErrorCode string // empty unless the run failed
	Model     string
	Steps     int
	Usage     Usage
	CreatedAt time.Time
	// FinishedAt is when the run ended (its outcome's time).
	FinishedAt time.Time
	// Attempt counts deliveries of this signal, from 1.
	Attempt int
}

// SignalID is the id of run runID's completion signal: one run ends once, so the id is stable across retries,
// processes and sweeps.
func SignalID(runID string) string { return "msg_" + runID }

// Finished is the signal of run r (terminal), owned by owner.
func Finished(r Run, owner string) RunFinished {
	f := RunFinished{ID: SignalID(r.ID), ThreadID: r.ThreadID, RunID: r.ID, Owner: owner, Trigger: r.Trigger,
		Status: r.Status, Model: r.Model, Steps: r.Steps, Usage: r.Usage, CreatedAt: r.CreatedAt, FinishedAt: r.FinishedAt}
	if r.Error != nil {
		f.ErrorCode = r.Error.Code
	}
	return f
}

// SignalSink delivers completion signals somewhere: an EventBridge bus (lib/eventbridge), an HTTPS webhook
// (lib/webhooks), the log. Send must be safe to call again with the same signal (at least once: receivers
// deduplicate by RunFinished.ID). An error means "not delivered; try again later".
type SignalSink interface {
	Send(ctx context.Context, s RunFinished) error
}

// RunSignals is the seam through which the engine and the reaper announce a run's end (lib/signals). Nothing it
// does changes the run: not its outcome, its stream, or when the run's stream ends.
type RunSignals interface {
	// Arm is the pending signal a run's outcome write stores (Run.Signal before FinishRun or RecordOutcome), for a
	// run of owner's ending at now.
	Arm(owner string, now time.Time) *RunSignal
	// Deliver sends the signal of run, whose outcome (armed) was just stored, and settles it. It returns at once
	// in a long-lived process (the delivery goes on in the background); a failure is left to Sweep.
	Deliver(ctx context.Context, run Run)
	// Sweep delivers the pending signals that are due (the reaper's tick calls it).
	Sweep(ctx context.Context) (int, error)
}

// SignalClaim takes the next attempt at a run's pending signal (SignalStore.ClaimSignal).
type SignalClaim struct {
	ThreadID string
	RunID    string
	// Attempts is what the claimer read (Run.Signal.Attempts): the write applies only while it still is.
	Attempts int
	// NextDue is when the signal is due again if this attempt does not settle it.
	NextDue time.Time
}

// SignalStore is the completion signals' outbox, kept on the run items (a store behaviour beside RunStore). Its
// writes are single-item conditional writes.
//
// FinishRun and RecordOutcome (and a RunStubber's StubRun, the reaper's record of a run whose item never landed)
// store run.Signal, when not nil, in the outcome's own write, so a run is never recorded terminal without its
// pending signal; GetRun and ListRuns return it (nil when the run has none).
type SignalStore interface {
	// ListDueSignals returns up to limit (<= 0: DefaultListLimit) terminal runs whose signal is pending and due
	// before before (Run.Signal set), earliest due first (then thread id, run id). It reads an index of
	// pending signals, never a scan; the index only nominates, and the answers are re-read: never a settled one.
	ListDueSignals(ctx context.Context, before time.Time, limit int) ([]Run, error)
	// ClaimSignal takes the next attempt: a compare-and-set of the run's signal from pending with c.Attempts
	// attempts to c.Attempts+1, due at c.NextDue, so of concurrent sweepers one sends. A signal that is not
	// pending at c.Attempts any more: KindConflict/CodeSignalTaken. Unknown run, or a run with no signal:
	// KindNotFound.
	ClaimSignal(ctx context.Context, c SignalClaim) error
	// SettleSignal ends the run's pending signal as status (SignalDelivered or SignalDropped), taking it out of
	// the due index. A signal settled already is left as it is (nil): settling is idempotent. Unknown run, or a
	// run with no signal: KindNotFound; another status: KindInvalid/CodeInvalidStatus.
	SettleSignal(ctx context.Context, threadID, runID string, status SignalStatus) error
}

// SignalDetail is the JSON of a completion signal, one shape for every sink: the EventBridge event's detail and
// the webhook payload's data (infra/events/run-finished.schema.json). Every field is always present (errorCode
// and model may be empty strings); times are RFC 3339 in UTC.
type SignalDetail struct {
	SignalID   string      `json:"signalId"`
	ThreadID   string      `json:"threadId"`
	RunID      string      `json:"runId"`
	Owner      string      `json:"owner"`
	Trigger    string      `json:"trigger"`
	Status     string      `json:"status"`
	ErrorCode  string      `json:"errorCode"`
	Model      string      `json:"model"`
	Steps      int         `json:"steps"`
	Usage      SignalUsage `json:"usage"`
	CreatedAt  time.Time   `json:"createdAt"`
	FinishedAt time.Time   `json:"finishedAt"`
	Attempt    int         `json:"attempt"`
}

// SignalUsage is the run's usage in a signal: tokens, and cost in millionths of a US dollar.
type SignalUsage struct {
	InputTokens       int64 `json:"inputTokens"`
	OutputTokens      int64 `json:"outputTokens"`
	TotalTokens       int64 `json:"totalTokens"`
	CachedInputTokens int64 `json:"cachedInputTokens"`
	CacheWriteTokens  int64 `json:"cacheWriteTokens"`
	ReasoningTokens   int64 `json:"reasoningTokens"`
	CostMicroUSD      int64 `json:"costMicroUsd"`
}

// Detail is f as the sinks send it.
func (f RunFinished) Detail() SignalDetail {
	u := f.Usage
	return SignalDetail{SignalID: f.ID, ThreadID: f.ThreadID, RunID: f.RunID, Owner: f.Owner, Trigger: string(f.Trigger),
		Status: string(f.Status), ErrorCode: f.ErrorCode, Model: f.Model, Steps: f.Steps,
		Usage: SignalUsage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.TotalTokens,
			CachedInputTokens: u.CachedInputTokens, CacheWriteTokens: u.CacheWriteTokens, ReasoningTokens: u.ReasoningTokens,
			CostMicroUSD: u.CostMicroUSD},
		CreatedAt: f.CreatedAt.UTC(), FinishedAt: f.FinishedAt.UTC(), Attempt: f.Attempt}
}
