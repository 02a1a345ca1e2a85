package drain_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/drain"
)

// handTimers are timers whose waits of a second or more fire only when the test fires them (fire), and whose
// shorter waits (the drain's poll) pass at once: a drain's grace and stop wait end when the test says so, never
// on the wall clock.
type handTimers struct {
	mu    sync.Mutex
	waits map[time.Duration][]chan time.Time
}

func newHandTimers() *handTimers { return &handTimers{waits: map[time.Duration][]chan time.Time{}} }

func (h *handTimers) Now() time.Time { return time.Unix(0, 0) }

func (h *handTimers) After(d time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	if d < time.Second {
		c <- time.Unix(0, 0)
		return c
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waits[d] = append(h.waits[d], c)
	return c
}

func (h *handTimers) Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-h.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *handTimers) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	fired := h.After(d)
	go func() {
		select {
		case <-fired:
			cancel(cause)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// fire fires every wait of d armed so far; false when none is.
func (h *handTimers) fire(d time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.waits[d]
	delete(h.waits, d)
	for _, c := range ws {
		c <- time.Unix(0, 0)
	}
	return len(ws) > 0
}

// fireWhenArmed fires d's wait once the drain has armed it.
func (h *handTimers) fireWhenArmed(t *testing.T, d time.Duration) {
	t.Helper()
	h.waitArmed(t, d)
	h.fire(d)
}

// waitArmed waits until a wait of d is armed (the drain reached it), without firing it.
func (h *handTimers) waitArmed(t *testing.T, d time.Duration) {
	t.Helper()
	for tries := 0; ; tries++ {
		h.mu.Lock()
		n := len(h.waits[d])
		h.mu.Unlock()
		if n > 0 {
			return
		}
		if tries == 10000 {
			t.Fatalf("no wait of %s was ever armed", d)
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeRuns are a process's runs: running of them, of which handable end when asked to hand over and stoppable
// when asked to stop.
type fakeRuns struct {
	running   atomic.Int64
	handable  int64
	stoppable int64
	asked     atomic.Int64
	handed    atomic.Bool
}

func (r *fakeRuns) HandOver() {
	if r.handed.CompareAndSwap(false, true) {
		r.running.Add(-r.handable)
	}
}

func (r *fakeRuns) Running() int { return int(r.running.Load()) }

func (r *fakeRuns) Stop(context.Context) int {
	if r.asked.Load() > 0 {
		return 0
	}
	n := r.running.Load()
	r.asked.Store(n)
	r.running.Add(-r.stoppable)
	return int(n)
}

// A drain closes the gate at once (the draining refusal, with its Retry-After), lets the runs finish within the
// grace, and only once the grace is over hands what is left over; what has not handed over within the stop wait
// is stopped, as many as still run; a run that does not end within the stop wait again is left (to the reaper of
// another replica).
func TestRun(t *testing.T) {
	t.Parallel()
	cfg := drain.Config{Grace: 10 * time.Second, StopWait: 3 * time.Second, RetryAfter: 7 * time.Second}
	tests := []struct {
		name      string
		running   int64
		finish    int64 // runs that end by themselves during the grace
		graceEnds bool
		handable  int64
		stoppable int64
		stopWaits int // stop waits that end (the hand-over's, then the stop's)
		want      drain.Stats
	}{
		{"nothing running", 0, 0, false, 0, 0, 0, drain.Stats{}},
		{"all finish within the grace", 2, 2, false, 0, 0, 0, drain.Stats{Finished: 2}},
		{"the rest handed over", 3, 1, true, 2, 0, 0, drain.Stats{Finished: 1, HandedOver: 2}},
		{"the rest stopped", 3, 1, true, 0, 2, 1, drain.Stats{Finished: 1, Stopped: 2}},
		{"one handed over, one stopped", 3, 1, true, 1, 1, 1, drain.Stats{Finished: 1, HandedOver: 1, Stopped: 1}},
		{"one will not end", 2, 0, true, 0, 1, 2, drain.Stats{Stopped: 2, Left: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			timers := newHandTimers()
			runs := &fakeRuns{handable: tt.handable, stoppable: tt.stoppable}
			runs.running.Store(tt.running)
			g := drain.NewGate(cfg.RetryAfter)
			if err := g.Admit(nil); err != nil {
				t.Fatalf("an open gate refused: %v", err)
			}
			done := make(chan drain.Stats, 1)
			go func() { done <- drain.Run(context.Background(), g, runs, cfg, timers, nil) }()
			var got drain.Stats
			if tt.running > 0 {
				timers.waitArmed(t, cfg.Grace) // the drain has begun: the gate is closed
			} else {
				got = <-done
			}
			err := g.Admit(nil)
			var ae *agent.Error
			if !errors.As(err, &ae) || ae.Code != agent.CodeDraining || agent.KindOf(err) != agent.KindUnavailable || ae.RetryAfter != cfg.RetryAfter {
				t.Fatalf("a draining gate admitted with %v, want 503 draining with Retry-After %s", err, cfg.RetryAfter)
			}
			runs.running.Add(-tt.finish)
			if tt.graceEnds {
				timers.fireWhenArmed(t, cfg.Grace)
			}
			for range tt.stopWaits {
				timers.fireWhenArmed(t, cfg.StopWait)
			}
			if tt.running > 0 {
				got = <-done
			}
			if got != tt.want {
				t.Fatalf("stats %+v, want %+v", got, tt.want)
			}
		})
	}
}

// GET /readyz: 200 with every check's name while the gate is open and every check passes; the first failing
// check's code otherwise (its error only in the log); draining (with a Retry-After) once the gate is closed,
// whatever the checks say.
func TestReady(t *testing.T) {
	t.Parallel()
	ok := func(context.Context) error { return nil }
	down := func(context.Context) error { return errors.New("connection refused") }
	tests := []struct {
		name         string
		store, model func(context.Context) error
		closed       bool
		wantStatus   int
		wantBody     string
	}{
		{"ready", ok, ok, false, 200, `{"checks":{"model":"ok","store":"ok"},"ok":true}`},
		{"store down", down, ok, false, 503, `"code":"store_unavailable"`},
		{"model down", ok, down, false, 503, `"code":"model_unavailable"`},
		{"both down", down, down, false, 503, `"code":"store_unavailable"`},
		{"draining", ok, ok, true, 503, `"code":"draining"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := drain.NewGate(0)
			if tt.closed {
				g.Close()
			}
			h := drain.Ready(g, time.Minute, nil,
				drain.Check{Name: "store", Code: agent.CodeStoreUnavailable, Probe: tt.store},
				drain.Check{Name: "model", Code: agent.CodeModelUnavailable, Probe: tt.model})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != tt.wantStatus || !strings.Contains(rec.Body.String(), tt.wantBody) || strings.Contains(rec.Body.String(), "refused") {
				t.Fatalf("%d %s, want %d with %s (and no error text)", rec.Code, rec.Body, tt.wantStatus, tt.wantBody)
			}
			if ra := rec.Header().Get("Retry-After"); tt.closed != (ra == "5") {
				t.Fatalf("Retry-After %q (draining: %t), want 5 only while draining", ra, tt.closed)
			}
		})
	}
}
