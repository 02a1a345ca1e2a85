// Package modelcall is what every model adapter does around one streamed call, whatever its provider's wire:
// the attempts and their retries, the watchdog that ends an attempt whose stream goes quiet, and the errors that
// mean the same for every provider (the caller cancelled, a timeout, an HTTP status, a failed connection, a
// stream cut short), each an *agent.Error with a message safe to show a user. The adapters (lib/openai,
// lib/openairesponses, lib/bedrockconverse, lib/anthropic) keep what is their provider's own: opening the stream,
// reading its events, and the errors only their provider says. It imports only lib/agent and the standard
// library, so that adapters, which never import each other, can all use it.
//
// # Timeouts
//
// An attempt fails with code model_timeout when no event arrives within Policy.FirstTokenTimeout of sending the
// request, or when, after the first event, none arrives for Policy.IdleTimeout. Time spent handling an event
// (emit included) does not count: a slow client is not a stalled model. Nothing caps the whole stream: a long
// reply that keeps streaming is never cut, and the run's wall clock bounds it.
//
// # Retries
//
// Policy.Run repeats a failed attempt whose Failure says Retry (the adapter sets it for transient failures, and
// only while nothing has been emitted) up to Policy.MaxRetries times, after an exponential backoff with jitter
// that is never shorter than the provider's Retry-After (RetryAfter, up to MaxRetryAfter). A Failure that says
// Again is sent again at once and not counted: the adapter changed the request (a model that refuses reasoning
// settings, a file the provider could not fetch left out). Once an event was emitted, an error is returned as is.
package modelcall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults for the zero values of Policy (DESIGN "Run lifecycle"). The adapters' own DefaultX constants and
// lib/config refer to these; nothing else repeats the numbers.
const (
	DefaultFirstTokenTimeout = 120 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxRetries        = 2
	DefaultBackoffBase       = 500 * time.Millisecond
	DefaultBackoffMax        = 8 * time.Second
	// DefaultMaxOutputTokens bounds a request's output when neither the request nor the adapter's configuration
	// sets a bound (DESIGN "Run lifecycle": max output tokens 8192).
	DefaultMaxOutputTokens = 8192
)

// MaxRetryAfter bounds how long a provider's Retry-After header can make a retry wait.
const MaxRetryAfter = 30 * time.Second

// Policy is how the attempts of a call are timed and retried.
type Policy struct {
	// FirstTokenTimeout bounds the wait from sending a request to its first event; IdleTimeout the gap between
	// two events after it.
	FirstTokenTimeout time.Duration
	IdleTimeout       time.Duration
	// MaxRetries is the number of retries after the first attempt; 0 means DefaultMaxRetries, negative none.
	MaxRetries int
	// BackoffBase is the wait before the first retry; it doubles per retry up to BackoffMax, with jitter.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Logger receives one warning per retry (default slog.Default()).
	Logger *slog.Logger
}

// WithDefaults is p with its zero values set to the defaults (a negative MaxRetries to 0).
func (p Policy) WithDefaults() Policy {
	if p.FirstTokenTimeout <= 0 {
		p.FirstTokenTimeout = DefaultFirstTokenTimeout
	}
	if p.IdleTimeout <= 0 {
		p.IdleTimeout = DefaultIdleTimeout
	}
	switch {
	case p.MaxRetries == 0:
		p.MaxRetries = DefaultMaxRetries
	case p.MaxRetries < 0:
		p.MaxRetries = 0
	}
	if p.BackoffBase <= 0 {
		p.BackoffBase = DefaultBackoffBase
	}
	if p.BackoffMax <= 0 {
		p.BackoffMax = max(DefaultBackoffMax, p.BackoffBase)
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	return p
}

// Failure is a failed attempt.
type Failure struct {
	Err        error
	Retry      bool          // the attempt may be repeated: transient, and nothing was emitted
	RetryAfter time.Duration // the provider's requested wait, 0 when it named none
	Again      bool          // send again at once, not counted as a retry: the adapter changed the request
}

// Run calls attempt until it succeeds, fails for good, or the retries are spent (see "Retries"); p must have its
// defaults (WithDefaults).
func (p Policy) Run(ctx context.Context, attempt func() (agent.ModelResult, *Failure)) (agent.ModelResult, error) {
	for n := 0; ; n++ {
		res, fail := attempt()
		if fail == nil {
			return res, nil
		}
		if fail.Again {
			n--
			continue
		}
		if !fail.Retry || n >= p.MaxRetries {
			return res, fail.Err
		}
		wait := p.backoff(n, fail.RetryAfter)
		p.Logger.WarnContext(ctx, "model request failed, retrying", "attempt", n+1, "retry_in", wait, "err", fail.Err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return agent.ModelResult{}, Canceled(ctx)
		case <-t.C:
		}
	}
}

// backoff is the wait before retry number n+1: BackoffBase·2^n capped at BackoffMax, of which a random half is
// kept ("equal jitter") so that clients that failed together do not retry together; never less than what the
// provider asked for.
func (p Policy) backoff(n int, providerWait time.Duration) time.Duration {
	d := p.BackoffBase << min(n, 20)
	if d <= 0 || d > p.BackoffMax {
		d = p.BackoffMax
	}
	d = d/2 + rand.N(d/2+1)
	return max(d, providerWait)
}

// The causes an attempt's context is cancelled with when the stream goes quiet.
var (
	errFirstTokenTimeout = errors.New("no first event within the first-token timeout")
	errIdleTimeout       = errors.New("no event within the idle timeout")
)

// Attempt is one attempt of a call: its context, cancelled with a timeout's cause when the stream goes quiet.
// The adapter opens its stream with Ctx, calls Arrived before handling each event and Waiting after it, Pause
// once it waits on the provider no more, and End when the attempt is over (defer it).
type Attempt struct {
	caller   context.Context
	ctx      context.Context
	cancel   context.CancelCauseFunc
	policy   *Policy
	timer    *time.Timer
	started  atomic.Bool // an event arrived: the idle timeout applies from now on
	timedOut bool
}

// Start starts an attempt under ctx, its first-token clock running.
func (p *Policy) Start(ctx context.Context) *Attempt {
	a := &Attempt{caller: ctx, policy: p}
	a.ctx, a.cancel = context.WithCancelCause(ctx)
	a.timer = time.AfterFunc(p.FirstTokenTimeout, func() {
		if a.started.Load() {
			a.cancel(errIdleTimeout)
		} else {
			a.cancel(errFirstTokenTimeout)
		}
	})
	return a
}

// Ctx is the attempt's context: the stream is opened and read with it.
func (a *Attempt) Ctx() context.Context { return a.ctx }

// CallerDone reports whether the caller's context has ended: nothing more goes to it.
func (a *Attempt) CallerDone() bool { return a.caller.Err() != nil }

// Arrived stops the clock for an event being handled; false means the attempt is over and the event is not to
// be handled: cancelled while later events sat in a read buffer, or the timer fired as this event came in (Err
// then reports the timeout).
func (a *Attempt) Arrived() bool {
	if a.ctx.Err() != nil {
		return false
	}
	if !a.timer.Stop() {
		a.timedOut = true
		return false
	}
	a.started.Store(true)
	return true
}

// Waiting restarts the clock for the gap before the next event.
func (a *Attempt) Waiting() { a.timer.Reset(a.policy.IdleTimeout) }

// Pause stops the clock: the attempt waits on the provider no more (what follows is the consumer's time).
func (a *Attempt) Pause() { a.timer.Stop() }

// End ends the attempt: the clock stopped, its context cancelled.
func (a *Attempt) End() {
	a.timer.Stop()
	a.cancel(nil)
}

// Err is the error the attempt's stream ended with: the timeout's cause when the clock ran out, else streamErr,
// else the attempt's context's cause when it ended, else nil.
func (a *Attempt) Err(streamErr error) error {
	if a.timedOut {
		<-a.ctx.Done() // the timer's func may still be on its way to cancel
		return context.Cause(a.ctx)
	}
	if streamErr == nil && a.ctx.Err() != nil {
		return context.Cause(a.ctx)
	}
	return streamErr
}

// Ended is the failure the attempt's own context says it ended with: the caller cancelled (KindCanceled), or a
// timeout (CodeModelTimeout, retried when nothing was emitted); nil when it did not end so (the adapter then
// classifies the error itself).
func (a *Attempt) Ended(emitted bool) *Failure {
	if a.caller.Err() != nil {
		return &Failure{Err: Canceled(a.caller)}
	}
	switch cause := context.Cause(a.ctx); {
	case errors.Is(cause, errFirstTokenTimeout):
		msg := fmt.Sprintf("the model sent nothing within %s", a.policy.FirstTokenTimeout)
		return &Failure{Err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelTimeout, msg), Retry: !emitted}
	case errors.Is(cause, errIdleTimeout):
		msg := fmt.Sprintf("the model stream stalled for %s", a.policy.IdleTimeout)
		return &Failure{Err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelTimeout, msg), Retry: !emitted}
	}
	return nil
}

// Canceled reports the end of ctx, keeping the code of an *agent.Error cause (e.g. a run timeout).
func Canceled(ctx context.Context) error {
	cause := context.Cause(ctx)
	code := agent.CodeRunCanceled
	var ae *agent.Error
	if errors.As(cause, &ae) && ae.Code != "" {
		code = ae.Code
	}
	return &agent.Error{Kind: agent.KindCanceled, Code: code, Message: "model call canceled", Err: cause}
}

// HTTPStatus is a provider's answer with an error status: retried (after its Retry-After, from res when there
// is one) for 429 and 5xx while nothing was emitted. cause keeps what the provider said (ProviderSaid).
func HTTPStatus(cause error, status int, res *http.Response, emitted bool) *Failure {
	transient := status == http.StatusTooManyRequests || status >= 500
	return &Failure{
		Err:        agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelError, fmt.Sprintf("the model provider returned HTTP %d", status)),
		Retry:      transient && !emitted,
		RetryAfter: RetryAfter(res),
	}
}

// ConnectionFailed is what failed below HTTP (refused or reset connections, a body cut mid-stream, a malformed
// event): retried while nothing was emitted. The cause names the address; the message does not.
func ConnectionFailed(err error, emitted bool) *Failure {
	return &Failure{Err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, "the connection to the model provider failed"), Retry: !emitted}
}

// Truncated is a stream that ended before the model finished (a proxy or the provider cut it short): retried
// while nothing was emitted. err is the cause, or nil.
func Truncated(err error, emitted bool) *Failure {
	return &Failure{Err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, "the model stream ended before the model finished"), Retry: !emitted}
}

// ProviderSaid keeps the provider's own message beside err for the logs, without the query of any URL it quotes
// (a pre-signed URL's is a credential: REVIEW S16).
func ProviderSaid(err error, said string) error {
	if said == "" {
		return err
	}
	return fmt.Errorf("%w (provider said: %s)", err, urlQuery.ReplaceAllString(said, "$1?…"))
}

var urlQuery = regexp.MustCompile(`(https?://[^\s?#]+)[?#]\S*`)

// RetryAfter reads the provider's requested wait from retry-after-ms or retry-after (seconds), MaxRetryAfter at
// most; 0 when res is nil or names none.
func RetryAfter(res *http.Response) time.Duration {
	if res == nil {
		return 0
	}
	if v, err := strconv.ParseFloat(res.Header.Get("Retry-After-Ms"), 64); err == nil && v > 0 {
		return min(time.Duration(v*float64(time.Millisecond)), MaxRetryAfter)
	}
	if v, err := strconv.ParseFloat(res.Header.Get("Retry-After"), 64); err == nil && v > 0 {
		return min(time.Duration(v*float64(time.Second)), MaxRetryAfter)
	}
	return 0
}
