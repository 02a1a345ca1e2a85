package threads_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/threads"
)

type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// deadReaders is a process whose readers die while they tail: their renewals and releases never reach the store.
type deadReaders struct{ *sqlite.Store }

func (deadReaders) RenewLease(context.Context, agent.LeaseRequest) error {
	return errors.New("the process died")
}
func (deadReaders) ReleaseLease(context.Context, string, string) error {
	return errors.New("the process died")
}

// A reader whose process died keeps its lease until the lease's TTL passes: until then a reader over the run's
// limit is refused (too_many_streams, RetryAfter = the rest of the TTL, nothing written to it), and then it
// attaches.
func TestStreamLeaseOfADeadReaderExpires(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// Near the wall clock: the fixture's segments expire an hour after it.
	clock := &manualClock{now: time.Now().UTC().Truncate(time.Millisecond)}
	store := deadReaders{st}
	rp := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: time.Hour})
	svc := threads.New(threads.Deps{Store: store, Reaper: rp, Clock: clock}, threads.Config{StaleAfter: time.Hour,
		MaxStreamsPerRun: 1, StreamLeaseTTL: 10 * time.Second,
		Follow: segments.Follower{PollMin: 5 * time.Millisecond, PollMax: 20 * time.Millisecond}})
	f := &fixture{store: st, svc: svc}
	f.claim(t, clock.Now())
	f.segment(t, 0, step, false)

	read := func() (bool, string, error) {
		// The reader tails a run that never ends, until its client (this context) goes away.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		var buf bytes.Buffer
		active, err := f.svc.Attach(ctx, "alice", "th", func() {}, &buf, func() {})
		return active, buf.String(), err
	}
	if active, out, err := read(); !active || out != step || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first reader: active %v, %q, %v; want it to tail until it dies", active, out, err)
	}
	clock.add(4 * time.Second)
	active, out, err := read()
	if active || out != "" || !errors.Is(err, agent.ErrTooManyStreams) || !agent.IsKind(err, agent.KindLimited) {
		t.Fatalf("second reader while the dead one's lease lives: active %v, %q, %v; want too_many_streams and nothing written", active, out, err)
	}
	if ra := agent.RetryAfterOf(err); ra != 6*time.Second {
		t.Fatalf("RetryAfter %s, want 6s (the rest of the dead reader's lease)", ra)
	}
	clock.add(6 * time.Second)
	if active, out, err := read(); !active || out != step || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a reader once the dead one's lease expired: active %v, %q, %v", active, out, err)
	}
}
