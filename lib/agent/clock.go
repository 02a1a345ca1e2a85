package agent

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"strings"
	"time"
)

// Clock is the time source. Inject it; never call time.Now in domain or engine code.
type Clock interface {
	Now() time.Time
}

// Timers is the wait source that goes with a Clock: every wait a component makes on time (a retry's backoff, a
// poll, a tool's timeout, the deadline at a claim's horizon) comes from it, so that a virtual clock moves the waits
// too (the simulation, internal/sim). Inject it with the Clock: a Clock that is also Timers supplies its own
// (TimersOf); never call time.Sleep, time.After, time.NewTimer or context.WithTimeout for such a wait.
type Timers interface {
	// Sleep waits for d, or until ctx is done (then ctx's error).
	Sleep(ctx context.Context, d time.Duration) error
	// After is time.After on this clock.
	After(d time.Duration) <-chan time.Time
	// WithTimeoutCause is context.WithTimeoutCause on this clock: ctx canceled with cause once d has passed.
	WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc)
}

// TimersOf is c's own timers when it has them, else real time (SystemClock's).
func TimersOf(c Clock) Timers {
	if t, ok := c.(Timers); ok {
		return t
	}
	return SystemClock{}
}

// IDs makes new identifiers. prefix is a short type tag ("run", "msg").
type IDs interface {
	New(prefix string) string
}

// SystemClock is the wall clock, truncated to milliseconds so stored and re-read times compare equal.
type SystemClock struct{}

func (SystemClock) Now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// Sleep waits for d of real time, or until ctx is done.
func (SystemClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// After is time.After.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// WithTimeoutCause is context.WithTimeoutCause.
func (SystemClock) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, cause)
}

// RandomIDs makes ids of the form prefix_<26 lowercase base32 chars>, time-ordered in their first 10 chars
// so ids sort roughly by creation.
type RandomIDs struct{ Clock Clock }

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

func (r RandomIDs) New(prefix string) string {
	var b [16]byte
	var now time.Time
	if r.Clock != nil {
		now = r.Clock.Now()
	} else {
		now = time.Now()
	}
	ms := uint64(now.UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	_, _ = rand.Read(b[6:])
	s := strings.ToLower(idEncoding.EncodeToString(b[:]))
	if prefix == "" {
		return s
	}
	return prefix + "_" + s
}
