package segments_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/sqlite"
)

var h0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// notifyStore is a real SQLite store whose segment writes wake the followers' waits: a follower's poll waits for
// the next write after its last list (waitClock), so a test follows the store with no sleep and no busy loop.
type notifyStore struct {
	*sqlite.Store
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every write
}

func newNotifyStore(t *testing.T) *notifyStore {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return &notifyStore{Store: st, changed: make(chan struct{})}
}

func (s *notifyStore) AppendSegment(ctx context.Context, seg agent.Segment) error {
	err := s.Store.AppendSegment(ctx, seg)
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return err
}

func (s *notifyStore) now() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// stored is the run's stream as the store has it.
func (s *notifyStore) stored(t *testing.T, runID string) []byte {
	t.Helper()
	segs, err := s.ListSegments(context.Background(), runID, 0, h0)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for i, seg := range segs {
		if seg.Seq != int64(i) {
			t.Fatalf("segment %d has seq %d", i, seg.Seq)
		}
		out = append(out, seg.Data...)
	}
	if len(segs) == 0 || !segs[len(segs)-1].Final {
		t.Fatalf("the stored stream has no final segment")
	}
	return out
}

// waitClock is one follower's clock: a fixed Now, and waits that end at the first segment write after the
// follower's last list began.
type waitClock struct {
	store *notifyStore
	mu    sync.Mutex
	seen  chan struct{}
}

func (c *waitClock) Now() time.Time { return h0 }

func (c *waitClock) After(time.Duration) <-chan time.Time {
	c.mu.Lock()
	seen := c.seen
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	go func() { <-seen; ch <- h0 }()
	return ch
}

func (c *waitClock) Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-c.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *waitClock) WithTimeoutCause(ctx context.Context, _ time.Duration, _ error) (context.Context, context.CancelFunc) {
	return context.WithCancel(ctx)
}

// listing is the follower's view of the store: it notes, before each list, which write its wait waits for.
type listing struct {
	*notifyStore
	clock *waitClock
}

func (l listing) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	l.clock.mu.Lock()
	l.clock.seen = l.notifyStore.now()
	l.clock.mu.Unlock()
	return l.notifyStore.ListSegments(ctx, runID, from, now)
}

// tickers hands out fake tickers by interval: the flush ticker, and the hurry ticker when one is made.
type tickers struct {
	mu    sync.Mutex
	made  chan time.Duration
	ticks map[time.Duration]chan time.Time
	stops map[time.Duration]int
}

func newTickers() *tickers {
	return &tickers{made: make(chan time.Duration, 100), ticks: map[time.Duration]chan time.Time{}, stops: map[time.Duration]int{}}
}

type tick struct {
	ts *tickers
	d  time.Duration
	c  chan time.Time
}

func (t tick) C() <-chan time.Time { return t.c }
func (t tick) Stop() {
	t.ts.mu.Lock()
	t.ts.stops[t.d]++
	t.ts.mu.Unlock()
}

func (ts *tickers) new(d time.Duration) segments.Ticker {
	ts.mu.Lock()
	c, ok := ts.ticks[d]
	if !ok {
		c = make(chan time.Time)
		ts.ticks[d] = c
	}
	ts.mu.Unlock()
	ts.made <- d
	return tick{ts: ts, d: d, c: c}
}

func (ts *tickers) ch(d time.Duration) chan time.Time {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.ticks[d]
}

// follower is a same-process reader running in its own goroutine.
type follower struct {
	out  bytes.Buffer
	err  error
	done chan struct{}
}

func follow(ctx context.Context, store *notifyStore, hub *segments.Hub, runID string) *follower {
	clock := &waitClock{store: store, seen: store.now()}
	f := segments.Follower{Segments: listing{notifyStore: store, clock: clock}, Clock: clock, Hub: hub,
		Ended: func(context.Context) (bool, error) { return false, nil }}
	r := &follower{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		_, r.err = f.Follow(ctx, runID, &r.out, func() {})
	}()
	return r
}

func frame(i int) []byte {
	return fmt.Appendf(nil, "data: {\"type\":\"text-delta\",\"delta\":\"w%d \"}\n\n", i)
}

// TestHubFollowerMatchesStore: whatever the interleaving of appends, flush ticks, flushes, cuts at MaxBytes, a
// reader's attach, a reader that falls behind its backlog, and the writer's unpublishing (a run that lost its
// claim), every same-process reader ends with the run's stored stream, byte for byte.
func TestHubFollowerMatchesStore(t *testing.T) {
	t.Parallel()
	for seed := range uint64(30) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 18))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			store := newNotifyStore(t)
			hub := segments.NewHub()
			ts := newTickers()
			runID := fmt.Sprintf("run_%d", seed)
			cfg := segments.SegmenterConfig{ThreadID: "th", RunID: runID, Write: store.AppendSegment, Clock: &waitClock{},
				NewTicker: ts.new, Hub: hub, MaxBytes: 64 + rng.IntN(200)}
			if rng.IntN(3) == 0 {
				cfg.SubscriberBacklog = 40 + rng.IntN(100) // readers fall behind and go on from the store
			}
			seg, err := segments.NewSegmenter(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			<-ts.made
			var readers []*follower
			n := 20 + rng.IntN(60)
			for i := range n {
				switch r := rng.IntN(10); {
				case r == 0:
					readers = append(readers, follow(ctx, store, hub, runID))
				case r == 1:
					select {
					case ts.ch(segments.DefaultSegmentInterval) <- h0:
					case <-ctx.Done():
					}
				case r == 2:
					if err := seg.Flush(ctx); err != nil {
						t.Fatal(err)
					}
				case r == 3 && rng.IntN(8) == 0:
					seg.Unpublish()
				}
				seg.Append(frame(i))
			}
			readers = append(readers, follow(ctx, store, hub, runID))
			seg.Append([]byte("data: [DONE]\n\n"))
			if err := seg.Close(ctx); err != nil {
				t.Fatal(err)
			}
			readers = append(readers, follow(ctx, store, hub, runID)) // after the end: the store alone
			want := store.stored(t, runID)
			for i, r := range readers {
				<-r.done
				if r.err != nil {
					t.Fatalf("reader %d: %v", i, r.err)
				}
				if !bytes.Equal(r.out.Bytes(), want) {
					t.Fatalf("reader %d got\n%q\nthe store holds\n%q", i, r.out.Bytes(), want)
				}
			}
			if hub.Live() != 0 {
				t.Errorf("the hub still publishes %d runs after Close", hub.Live())
			}
		})
	}
}

// signalWriter reports every write.
type signalWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestHubFrameWithoutTick: a frame reaches a same-process reader as it is appended, before any flush tick wrote
// it to the store.
func TestHubFrameWithoutTick(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := newNotifyStore(t)
	hub := segments.NewHub()
	ts := newTickers()
	seg, err := segments.NewSegmenter(ctx, segments.SegmenterConfig{ThreadID: "th", RunID: "run", Write: store.AppendSegment,
		Clock: &waitClock{}, NewTicker: ts.new, Hub: hub})
	if err != nil {
		t.Fatal(err)
	}
	seg.Append(frame(0))
	if err := seg.Flush(ctx); err != nil { // one segment stored before the reader comes
		t.Fatal(err)
	}
	clock := &waitClock{store: store, seen: store.now()}
	w := &signalWriter{wrote: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() {
		_, err := segments.Follower{Segments: listing{store, clock}, Clock: clock, Hub: hub,
			Ended: func(context.Context) (bool, error) { return false, nil }}.Follow(ctx, "run", w, func() {})
		done <- err
	}()
	want := string(frame(0))
	for i := 1; i <= 3; i++ {
		seg.Append(frame(i))
		want += string(frame(i))
		for w.String() != want {
			select {
			case <-w.wrote:
			case <-ctx.Done():
				t.Fatalf("after frame %d the reader has %q, want %q", i, w.String(), want)
			}
		}
	}
	if st := seg.Stats(); st.Segments != 1 {
		t.Fatalf("the live frames were written to the store (%d segments): they should still be pending", st.Segments)
	}
	seg.Append([]byte("data: [DONE]\n\n"))
	if err := seg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, stored := w.String(), string(store.stored(t, "run")); got != stored {
		t.Fatalf("reader %q, store %q", got, stored)
	}
}

// setClock is a clock the test moves.
type setClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *setClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *setClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// TestSegmenterHurry: Hurry adds a HurryInterval ticker whose ticks cut segments until the deadline; the first
// tick past it stops that ticker (back to Interval alone), and a later Hurry starts one again. An earlier
// deadline changes nothing.
func TestSegmenterHurry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := &setClock{t: h0}
	ts := newTickers()
	written := make(chan agent.Segment, 10)
	seg, err := segments.NewSegmenter(ctx, segments.SegmenterConfig{ThreadID: "th", RunID: "run", Clock: clock, NewTicker: ts.new,
		Write: func(_ context.Context, s agent.Segment) error { written <- s; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if d := <-ts.made; d != segments.DefaultSegmentInterval {
		t.Fatalf("first ticker every %s", d)
	}
	next := func(what string) agent.Segment {
		t.Helper()
		select {
		case s := <-written:
			return s
		case <-ctx.Done():
			t.Fatalf("%s: no segment written", what)
			return agent.Segment{}
		}
	}
	seg.Hurry(h0.Add(time.Second))
	if d := <-ts.made; d != segments.DefaultHurryInterval {
		t.Fatalf("hurry ticker every %s", d)
	}
	seg.Hurry(h0.Add(time.Millisecond)) // earlier: nothing changes
	fast := ts.ch(segments.DefaultHurryInterval)
	for i := range 3 {
		seg.Append(frame(i))
		fast <- h0
		if s := next("hurried tick"); s.Seq != int64(i) || string(s.Data) != string(frame(i)) {
			t.Fatalf("hurried tick %d wrote %+v", i, s)
		}
	}
	clock.set(h0.Add(time.Second))
	seg.Append(frame(3))
	fast <- h0 // past the deadline: no cut, and the ticker stops
	ts.ch(segments.DefaultSegmentInterval) <- h0
	if s := next("flush tick"); s.Seq != 3 {
		t.Fatalf("flush tick wrote seq %d", s.Seq)
	}
	ts.mu.Lock()
	stops := ts.stops[segments.DefaultHurryInterval]
	ts.mu.Unlock()
	if stops != 1 || len(ts.made) != 0 {
		t.Fatalf("after the deadline: hurry ticker stopped %d times, %d more tickers made", stops, len(ts.made))
	}
	seg.Hurry(h0.Add(2 * time.Second))
	if d := <-ts.made; d != segments.DefaultHurryInterval {
		t.Fatalf("second hurry ticker every %s", d)
	}
	seg.Append(frame(4))
	fast <- h0
	if s := next("hurried again"); s.Seq != 4 {
		t.Fatalf("hurried again wrote seq %d", s.Seq)
	}
	if err := seg.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// stepClock is a follower's clock whose waits the test ends: each After is reported with its duration, and
// moves the clock on by it when the test lets it pass.
type stepClock struct {
	setClock
	waits chan time.Duration
	pass  chan struct{}
}

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.waits <- d
	<-c.pass
	c.set(c.Now().Add(d))
	ch <- c.Now()
	return ch
}

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error { <-c.After(d); return ctx.Err() }

func (c *stepClock) WithTimeoutCause(ctx context.Context, _ time.Duration, _ error) (context.Context, context.CancelFunc) {
	return context.WithCancel(ctx)
}

// TestFollowerPresence: a reader of a run in another process marks its presence when it attaches and every half
// of the presence window, polls every PollAttached meanwhile, and asks Ended only on the backoff's schedule; once
// the mark is refused (the run is over) it backs off as a reader without presence does.
func TestFollowerPresence(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := newNotifyStore(t)
	put := func(seq int64, final bool) {
		t.Helper()
		if err := store.AppendSegment(ctx, agent.Segment{ThreadID: "th", RunID: "run", Seq: seq, Data: frame(int(seq)), Final: final,
			CreatedAt: h0, ExpiresAt: h0.Add(agent.SegmentTTL)}); err != nil {
			t.Fatal(err)
		}
	}
	put(0, false)
	clock := &stepClock{setClock: setClock{t: h0}, waits: make(chan time.Duration), pass: make(chan struct{})}
	var (
		mu     sync.Mutex
		marks  []time.Duration // when, from h0
		untils []time.Duration
		ended  int // Ended checks while present
	)
	over := h0.Add(5 * time.Second) // the run ends here: marks are refused
	f := segments.Follower{Segments: store, Clock: clock,
		Ended: func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			if clock.Now().Before(over) {
				ended++
			}
			return false, nil
		},
		MarkReader: func(_ context.Context, until time.Time) error {
			mu.Lock()
			defer mu.Unlock()
			now := clock.Now()
			marks, untils = append(marks, now.Sub(h0)), append(untils, until.Sub(h0))
			if !now.Before(over) {
				return agent.E(agent.KindConflict, agent.CodeNoActiveRun, "over")
			}
			return nil
		}}
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { _, err := f.Follow(ctx, "run", &out, func() {}); done <- err }()

	var waits []time.Duration
	for clock.Now().Before(over.Add(10 * time.Second)) {
		d := <-clock.waits
		waits = append(waits, d)
		if now := clock.Now(); now.Equal(h0.Add(time.Second)) {
			put(1, false) // data in the middle of the presence
		}
		clock.pass <- struct{}{}
	}
	put(2, true)
	var err error
	for ended := false; !ended; {
		select {
		case <-clock.waits: // the reader listed before the final segment was there
			clock.pass <- struct{}{}
		case err = <-done:
			ended = true
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := string(frame(0)) + string(frame(1)) + string(frame(2)); out.String() != want {
		t.Fatalf("reader got %q, want %q", out.String(), want)
	}
	mu.Lock()
	defer mu.Unlock()
	wantMarks := []time.Duration{0, 2500 * time.Millisecond, 5 * time.Second}
	if fmt.Sprint(marks) != fmt.Sprint(wantMarks) {
		t.Errorf("marks at %v, want %v (until %v)", marks, wantMarks, untils)
	}
	if fmt.Sprint(untils) != fmt.Sprint([]time.Duration{5 * time.Second, 7500 * time.Millisecond, 10 * time.Second}) {
		t.Errorf("marks until %v", untils)
	}
	var at time.Duration
	present := 0
	for _, d := range waits {
		if at < 5*time.Second {
			present++
			if d > segments.DefaultPollAttached {
				t.Errorf("a wait of %s at +%s while present, want at most %s", d, at, segments.DefaultPollAttached)
			}
		} else if d < segments.DefaultPollMin {
			t.Errorf("a wait of %s at +%s after the run ended, want the backoff", d, at)
		}
		at += d
	}
	if present < 90 || ended > 10 {
		t.Errorf("%d polls while present, %d Ended checks meanwhile: Ended should follow the backoff, not the polls", present, ended)
	}
}
