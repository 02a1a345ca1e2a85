package modelcall

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	p := Policy{BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}.WithDefaults()
	tests := []struct {
		attempt      int
		providerWait time.Duration
		lo, hi       time.Duration
	}{
		{0, 0, 50 * time.Millisecond, 100 * time.Millisecond},
		{1, 0, 100 * time.Millisecond, 200 * time.Millisecond},
		{3, 0, 400 * time.Millisecond, 800 * time.Millisecond},
		{4, 0, 500 * time.Millisecond, time.Second}, // capped
		{60, 0, 500 * time.Millisecond, time.Second},
		{0, 3 * time.Second, 3 * time.Second, 3 * time.Second}, // the provider's wait wins
	}
	for _, tt := range tests {
		for range 50 {
			if d := p.backoff(tt.attempt, tt.providerWait); d < tt.lo || d > tt.hi {
				t.Fatalf("backoff(%d, %s) = %s, want within [%s, %s]", tt.attempt, tt.providerWait, d, tt.lo, tt.hi)
			}
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header, value string
		want          time.Duration
	}{
		{"Retry-After", "2", 2 * time.Second},
		{"Retry-After-Ms", "250", 250 * time.Millisecond},
		{"Retry-After", "3600", MaxRetryAfter},
		{"Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT", 0},
		{"Retry-After", "-1", 0},
		{"X-Other", "5", 0},
	}
	for _, tt := range tests {
		res := &http.Response{Header: http.Header{}}
		res.Header.Set(tt.header, tt.value)
		if got := RetryAfter(res); got != tt.want {
			t.Fatalf("%s: %s = %s, want %s", tt.header, tt.value, got, tt.want)
		}
	}
	if RetryAfter(nil) != 0 {
		t.Fatal("nil response")
	}
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	p := Policy{}.WithDefaults()
	if p.FirstTokenTimeout != DefaultFirstTokenTimeout || p.IdleTimeout != DefaultIdleTimeout || p.MaxRetries != DefaultMaxRetries ||
		p.BackoffBase != DefaultBackoffBase || p.BackoffMax != DefaultBackoffMax || p.Logger == nil {
		t.Fatalf("defaults %+v", p)
	}
	if p := (Policy{MaxRetries: -1, BackoffBase: time.Minute}).WithDefaults(); p.MaxRetries != 0 || p.BackoffMax != time.Minute {
		t.Fatalf("no retries, a base over the default max: %+v", p)
	}
}

// Run retries what says Retry, MaxRetries times at most; sends again at once, uncounted, what says Again; and
// returns at once what says neither.
func TestRun(t *testing.T) {
	t.Parallel()
	p := Policy{MaxRetries: 2, BackoffBase: time.Microsecond, BackoffMax: time.Microsecond}.WithDefaults()
	failing := errors.New("down")
	tests := []struct {
		name     string
		failures []*Failure // one per attempt; past the end, success
		calls    int
		err      error
	}{
		{"success", nil, 1, nil},
		{"retried, then success", []*Failure{{Err: failing, Retry: true}, {Err: failing, Retry: true}}, 3, nil},
		{"retries spent", []*Failure{{Err: failing, Retry: true}, {Err: failing, Retry: true}, {Err: failing, Retry: true}}, 3, failing},
		{"not retried", []*Failure{{Err: failing}}, 1, failing},
		{"again, uncounted", []*Failure{{Again: true}, {Err: failing, Retry: true}, {Again: true}, {Err: failing, Retry: true}}, 5, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			res, err := p.Run(context.Background(), func() (agent.ModelResult, *Failure) {
				calls++
				if calls <= len(tt.failures) {
					return agent.ModelResult{FinishReason: agent.FinishError}, tt.failures[calls-1]
				}
				return agent.ModelResult{FinishReason: agent.FinishStop}, nil
			})
			if calls != tt.calls || !errors.Is(err, tt.err) || (err == nil) != (res.FinishReason == agent.FinishStop) {
				t.Fatalf("calls %d, err %v, result %+v; want %d calls, err %v", calls, err, res, tt.calls, tt.err)
			}
		})
	}
}

// A retry's wait ends when the caller cancels, with the caller's code.
func TestRunCanceledDuringBackoff(t *testing.T) {
	t.Parallel()
	p := Policy{BackoffBase: time.Hour, BackoffMax: time.Hour}.WithDefaults()
	ctx, cancel := context.WithCancelCause(context.Background())
	_, err := p.Run(ctx, func() (agent.ModelResult, *Failure) {
		cancel(agent.E(agent.KindCanceled, agent.CodeRunTimeout, "run timeout"))
		return agent.ModelResult{}, &Failure{Err: errors.New("down"), Retry: true}
	})
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.Kind != agent.KindCanceled || ae.Code != agent.CodeRunTimeout {
		t.Fatalf("err %v, want canceled with %s", err, agent.CodeRunTimeout)
	}
}

// An attempt whose first event does not come, or whose stream then goes quiet, ends with its timeout's failure
// (retried while nothing was emitted); one whose caller cancels ends canceled.
func TestAttemptTimeouts(t *testing.T) {
	t.Parallel()
	p := Policy{FirstTokenTimeout: 5 * time.Millisecond, IdleTimeout: 5 * time.Millisecond}.WithDefaults()
	t.Run("first token", func(t *testing.T) {
		t.Parallel()
		at := p.Start(context.Background())
		defer at.End()
		<-at.Ctx().Done()
		f := at.Ended(false)
		if f == nil || !f.Retry || agent.CodeOf(f.Err) != agent.CodeModelTimeout || !strings.Contains(f.Err.Error(), "the model sent nothing within 5ms") {
			t.Fatalf("failure %+v", f)
		}
	})
	t.Run("idle", func(t *testing.T) {
		t.Parallel()
		at := p.Start(context.Background())
		defer at.End()
		if !at.Arrived() {
			t.Fatal("the first event did not arrive")
		}
		at.Waiting()
		<-at.Ctx().Done()
		if at.Arrived() {
			t.Fatal("an event arrived after the timeout")
		}
		f := at.Ended(true)
		if f == nil || f.Retry || agent.CodeOf(f.Err) != agent.CodeModelTimeout || !strings.Contains(f.Err.Error(), "the model stream stalled for 5ms") {
			t.Fatalf("failure %+v", f)
		}
		if err := at.Err(nil); err == nil {
			t.Fatal("no error after a timeout")
		}
	})
	t.Run("caller canceled", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		at := (&Policy{FirstTokenTimeout: time.Hour, IdleTimeout: time.Hour}).Start(ctx)
		defer at.End()
		cancel()
		if at.Arrived() || !at.CallerDone() {
			t.Fatal("an event arrived after the caller cancelled")
		}
		f := at.Ended(false)
		if f == nil || f.Retry || agent.KindOf(f.Err) != agent.KindCanceled || agent.CodeOf(f.Err) != agent.CodeRunCanceled {
			t.Fatalf("failure %+v", f)
		}
	})
}

// What the provider said is kept for the logs, without the query of a URL it quotes.
func TestProviderSaid(t *testing.T) {
	t.Parallel()
	err := ProviderSaid(errors.New("HTTP 400"), "cannot fetch https://bucket.example/a.png?X-Amz-Signature=secret now")
	if got := err.Error(); got != "HTTP 400 (provider said: cannot fetch https://bucket.example/a.png?… now)" {
		t.Fatalf("%q", got)
	}
	if base := errors.New("x"); ProviderSaid(base, "") != base {
		t.Fatal("nothing said: the error as it is")
	}
}

// An event is held back until the next is at hand (More: true) or Release (More: false); a caller that has
// cancelled gets nothing more.
func TestEmitter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	at := (&Policy{FirstTokenTimeout: time.Hour, IdleTimeout: time.Hour}).Start(ctx)
	defer at.End()
	var got []agent.ModelEvent
	e := at.Emitter(func(ev agent.ModelEvent) error { got = append(got, ev); return nil })
	if e.Release() != nil || len(got) != 0 || e.Emitted {
		t.Fatal("a release with nothing held emitted")
	}
	e.Send(agent.ModelEvent{Delta: "a"})
	e.Send(agent.ModelEvent{Delta: "b"})
	e.Release()
	if len(got) != 2 || !got[0].More || got[1].More || got[0].Delta != "a" || got[1].Delta != "b" || !e.Emitted {
		t.Fatalf("events %+v", got)
	}
	e.Send(agent.ModelEvent{Delta: "c"})
	cancel()
	e.Send(agent.ModelEvent{Delta: "d"})
	e.Release()
	if len(got) != 2 {
		t.Fatalf("events after the caller cancelled: %+v", got[2:])
	}
}
