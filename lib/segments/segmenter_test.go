package segments

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

type fakeTicker struct{ c chan time.Time }

func (f *fakeTicker) C() <-chan time.Time { return f.c }
func (f *fakeTicker) Stop()               {}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// segStore records segment writes. fail decides per attempt whether a write fails; gate, when set, holds every
// write until it is closed; attempts receives the seq of every attempt.
type segStore struct {
	mu       sync.Mutex
	segs     map[int64]agent.Segment
	tries    map[int64][][]byte
	fail     func(seq int64, attempt int) error
	gate     chan struct{}
	attempts chan int64
	written  chan int64
}

func (s *segStore) write(ctx context.Context, seg agent.Segment) error {
	s.attempts <- seg.Seq
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries[seg.Seq] = append(s.tries[seg.Seq], bytes.Clone(seg.Data))
	if s.fail != nil {
		if err := s.fail(seg.Seq, len(s.tries[seg.Seq])); err != nil {
			return err
		}
	}
	if _, dup := s.segs[seg.Seq]; dup {
		return fmt.Errorf("seq %d written twice", seg.Seq)
	}
	s.segs[seg.Seq] = seg
	s.written <- seg.Seq
	return nil
}

// sorted returns the written segments in seq order.
func (s *segStore) sorted() []agent.Segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []agent.Segment
	for _, seg := range s.segs {
		out = append(out, seg)
	}
	slices.SortFunc(out, func(a, b agent.Segment) int { return int(a.Seq - b.Seq) })
	return out
}

// checkStream asserts the written segments are numbered from start without gaps, only the last is final, each
// is at most max bytes, and together they hold exactly want.
func (s *segStore) checkStream(t *testing.T, start int64, max int, want []byte) []agent.Segment {
	t.Helper()
	segs := s.sorted()
	var got []byte
	for i, seg := range segs {
		if seg.Seq != start+int64(i) {
			t.Fatalf("segment %d has seq %d, want %d", i, seg.Seq, start+int64(i))
		}
		if seg.Final != (i == len(segs)-1) {
			t.Errorf("segment %d: Final = %v", seg.Seq, seg.Final)
		}
		if len(seg.Data) > max {
			t.Errorf("segment %d holds %d bytes, max %d", seg.Seq, len(seg.Data), max)
		}
		got = append(got, seg.Data...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("segments hold %q, want %q", got, want)
	}
	return segs
}

func setupSegmenter(t *testing.T, tweak func(*SegmenterConfig, *segStore)) (*Segmenter, *fakeTicker, *segStore) {
	t.Helper()
	store := &segStore{
		segs:     map[int64]agent.Segment{},
		tries:    map[int64][][]byte{},
		attempts: make(chan int64, 1000),
		written:  make(chan int64, 1000),
	}
	ticker := &fakeTicker{c: make(chan time.Time, 1)}
	cfg := SegmenterConfig{
		ThreadID:  "th_1",
		RunID:     "run_1",
		Write:     store.write,
		Clock:     fixedClock{t0},
		NewTicker: func(time.Duration) Ticker { return ticker },
	}
	if tweak != nil {
		tweak(&cfg, store)
	}
	s, err := NewSegmenter(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // never wait in cleanup: the writer goroutine is stopped either way
		_ = s.Close(ctx)
	})
	return s, ticker, store
}

// hangGuard bounds a wait that must succeed, so a bug fails the test instead of hanging it.
func hangGuard(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSegmenterFlushAndClose(t *testing.T) {
	t.Parallel()
	s, _, store := setupSegmenter(t, nil)
	ctx := hangGuard(t)

	s.Append([]byte("a\n\n"))
	s.Append([]byte("b\n\n"))
	s.Append([]byte("c\n\n"))
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The three frames were batched: without a tick nothing was written before Flush.
	segs := store.sorted()
	if len(segs) != 1 || string(segs[0].Data) != "a\n\nb\n\nc\n\n" || segs[0].Final {
		t.Fatalf("after Flush: %+v", segs)
	}
	if err := s.Flush(ctx); err != nil || len(store.sorted()) != 1 {
		t.Fatalf("an empty Flush wrote a segment (err %v)", err)
	}
	s.Append([]byte("d\n\n"))
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	segs = store.checkStream(t, 0, DefaultMaxSegmentBytes, []byte("a\n\nb\n\nc\n\nd\n\n"))
	want := agent.Segment{ThreadID: "th_1", RunID: "run_1", Seq: 1, Data: []byte("d\n\n"), Final: true,
		CreatedAt: t0, ExpiresAt: t0.Add(agent.SegmentTTL)}
	if got := segs[1]; got.ThreadID != want.ThreadID || got.RunID != want.RunID || !got.CreatedAt.Equal(want.CreatedAt) ||
		!got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Errorf("final segment = %+v, want %+v", got, want)
	}
	if err := s.Close(ctx); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := s.Flush(ctx); agent.CodeOf(err) != CodeSegmenterClosed {
		t.Errorf("Flush after Close = %v, want %s", err, CodeSegmenterClosed)
	}
	s.Append([]byte("late"))
	if st := s.Stats(); st.Dropped != 4 || st.Segments != 2 || st.Bytes != 12 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestSegmenterTickWrites(t *testing.T) {
	t.Parallel()
	s, ticker, store := setupSegmenter(t, nil)
	ctx := hangGuard(t)
	s.Append([]byte("x\n\n"))
	ticker.c <- t0
	select {
	case seq := <-store.written:
		if seq != 0 {
			t.Fatalf("first tick wrote seq %d", seq)
		}
	case <-ctx.Done():
		t.Fatal("a tick did not write the pending frame")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	store.checkStream(t, 0, DefaultMaxSegmentBytes, []byte("x\n\n"))
}

// A run that emitted nothing since the last flush still ends with a Final segment, so readers stop.
func TestSegmenterEmptyFinalSegment(t *testing.T) {
	t.Parallel()
	s, _, store := setupSegmenter(t, func(c *SegmenterConfig, _ *segStore) { c.StartSeq = 5 })
	if err := s.Close(hangGuard(t)); err != nil {
		t.Fatal(err)
	}
	segs := store.checkStream(t, 5, DefaultMaxSegmentBytes, nil)
	if len(segs) != 1 {
		t.Fatalf("got %d segments, want one empty final segment", len(segs))
	}
}

func TestSegmenterBoundsSegmentSize(t *testing.T) {
	t.Parallel()
	const max = 64
	s, _, store := setupSegmenter(t, func(c *SegmenterConfig, _ *segStore) { c.MaxBytes = max })
	var want []byte
	var frames [][2]int // [start, end) of each frame in the stream
	for i, n := range []int{10, 60, 5, 200, 64, 1, 63, 2, 128} {
		frame := bytes.Repeat([]byte{byte('a' + i)}, n)
		frames = append(frames, [2]int{len(want), len(want) + n})
		want = append(want, frame...)
		s.Append(frame)
	}
	if err := s.Close(hangGuard(t)); err != nil {
		t.Fatal(err)
	}
	segs := store.checkStream(t, 0, 200, want)
	// No frame is ever split, and a segment exceeds max only when it is a single frame.
	var bounds []int
	off := 0
	for _, seg := range segs {
		off += len(seg.Data)
		bounds = append(bounds, off)
		if len(seg.Data) > max && !slices.ContainsFunc(frames, func(f [2]int) bool { return f[1]-f[0] == len(seg.Data) && f[1] == off }) {
			t.Errorf("segment %d holds %d bytes and is not one frame", seg.Seq, len(seg.Data))
		}
	}
	for i, f := range frames {
		for _, b := range bounds {
			if f[0] < b && b < f[1] {
				t.Errorf("frame %d [%d,%d) split at %d", i, f[0], f[1], b)
			}
		}
	}
}

// A slow store must not block Append, and the frames appended meanwhile are neither lost nor duplicated.
func TestSegmenterSlowWriter(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	s, ticker, store := setupSegmenter(t, func(_ *SegmenterConfig, st *segStore) { st.gate = gate })
	ctx := hangGuard(t)

	s.Append([]byte("A"))
	flushed := make(chan error, 1)
	go func() { flushed <- s.Flush(ctx) }()
	<-store.attempts // the writer is now stuck in Write(seq 0)

	// Appends and ticks keep working while the write hangs.
	for i := range 100 {
		s.Append([]byte{byte('0' + i%10)})
	}
	select {
	case ticker.c <- t0:
	default:
	}
	close(gate)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	s.Append([]byte("Z"))
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := []byte("A")
	for i := range 100 {
		want = append(want, byte('0'+i%10))
	}
	store.checkStream(t, 0, DefaultMaxSegmentBytes, append(want, 'Z'))
}

// A failed write is retried with the same segment; Flush reports the failure instead of hiding it.
func TestSegmenterRetriesFailedWrites(t *testing.T) {
	t.Parallel()
	boom := errors.New("throttled")
	s, ticker, store := setupSegmenter(t, func(_ *SegmenterConfig, st *segStore) {
		st.fail = func(seq int64, attempt int) error {
			if seq == 0 && attempt <= 2 {
				return boom
			}
			return nil
		}
	})
	ctx := hangGuard(t)
	s.Append([]byte("first"))
	err := s.Flush(ctx)
	if !errors.Is(err, boom) || agent.CodeOf(err) != CodeSegmentWrite {
		t.Fatalf("Flush = %v, want the write error", err)
	}
	s.Append([]byte("second"))
	ticker.c <- t0 // the retry happens on the next tick: attempt 2 fails as well
	for range 2 {
		<-store.attempts
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	store.checkStream(t, 0, DefaultMaxSegmentBytes, []byte("firstsecond"))
	for seq, tries := range store.tries {
		for _, data := range tries[1:] {
			if !bytes.Equal(data, tries[0]) {
				t.Errorf("seq %d retried with different data %q vs %q", seq, data, tries[0])
			}
		}
	}
	if st := s.Stats(); st.WriteFailures != 2 || st.Segments != 3 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestSegmenterCloseGivesUp(t *testing.T) {
	t.Parallel()
	s, _, store := setupSegmenter(t, func(_ *SegmenterConfig, st *segStore) {
		st.fail = func(int64, int) error { return errors.New("store down") }
	})
	s.Append([]byte("lost"))
	ctx, cancel := context.WithCancel(hangGuard(t))
	go func() {
		<-store.attempts
		cancel()
	}()
	err := s.Close(ctx)
	if agent.CodeOf(err) != CodeSegmentWrite {
		t.Fatalf("Close = %v, want %s", err, CodeSegmentWrite)
	}
	if again := s.Close(hangGuard(t)); again != err {
		t.Errorf("second Close = %v, want the first result %v", again, err)
	}
}

// When the writer's own context ends (a misuse: it should outlive the run), waiters are released.
func TestSegmenterParentCanceled(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithCancel(context.Background())
	store := &segStore{segs: map[int64]agent.Segment{}, tries: map[int64][][]byte{},
		attempts: make(chan int64, 10), written: make(chan int64, 10)}
	s, err := NewSegmenter(parent, SegmenterConfig{Write: store.write, Clock: fixedClock{t0},
		NewTicker: func(time.Duration) Ticker { return &fakeTicker{c: make(chan time.Time)} }})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	s.Append([]byte("x"))
	if err := s.Flush(hangGuard(t)); agent.CodeOf(err) != CodeSegmentWrite {
		t.Errorf("Flush = %v, want %s", err, CodeSegmentWrite)
	}
	if err := s.Close(hangGuard(t)); agent.CodeOf(err) != CodeSegmentWrite {
		t.Errorf("Close = %v, want %s", err, CodeSegmentWrite)
	}
}

func TestSegmenterConfigRequired(t *testing.T) {
	t.Parallel()
	if _, err := NewSegmenter(context.Background(), SegmenterConfig{Clock: fixedClock{t0}}); err == nil {
		t.Error("NewSegmenter without Write succeeded")
	}
}

func TestSegmenterConcurrentAppends(t *testing.T) {
	t.Parallel()
	s, ticker, store := setupSegmenter(t, func(c *SegmenterConfig, _ *segStore) { c.MaxBytes = 100 })
	const writers, per = 4, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range per {
				s.Append(fmt.Appendf(nil, "<%d:%d>", w, i))
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			ticker.c <- t0
		}
	})
	wg.Wait()
	if err := s.Close(hangGuard(t)); err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, seg := range store.sorted() {
		all = append(all, seg.Data...)
	}
	// Every frame arrives exactly once and each writer's frames keep their order.
	next := make([]int, writers)
	for rest := all; len(rest) > 0; {
		var w, i int
		n, err := fmt.Sscanf(string(rest), "<%d:%d>", &w, &i)
		if err != nil || n != 2 || i != next[w] {
			t.Fatalf("unexpected frame at %q (err %v), want writer %d frame %d", rest[:min(20, len(rest))], err, w, next[w])
		}
		next[w]++
		rest = rest[bytes.IndexByte(rest, '>')+1:]
	}
	for w, n := range next {
		if n != per {
			t.Errorf("writer %d: %d frames arrived, want %d", w, n, per)
		}
	}
}

// The encoder fans out to the client and to the segmenter; the persisted stream equals what the client saw.
func TestEncoderWithSegmenter(t *testing.T) {
	t.Parallel()
	s, _, store := setupSegmenter(t, func(c *SegmenterConfig, _ *segStore) { c.MaxBytes = 128 })
	rec := httptest.NewRecorder()
	e := uistream.NewEncoder(rec, s)
	chunks := []uistream.Chunk{
		uistream.Start{MessageID: "msg_1"}, uistream.StartStep{},
		uistream.ToolInputStart{ToolCallID: "call_1", ToolName: "list_notes"},
		uistream.ToolInputAvailable{ToolCallID: "call_1", ToolName: "list_notes", Input: []byte(`{}`)},
		uistream.ToolOutputAvailable{ToolCallID: "call_1", Output: []byte(`{"notes":[]}`)},
		uistream.FinishStep{}, uistream.StartStep{},
		uistream.TextStart{ID: "t1"}, uistream.TextDelta{ID: "t1", Delta: "You have no notes."}, uistream.TextEnd{ID: "t1"},
		uistream.FinishStep{}, uistream.Finish{FinishReason: agent.FinishStop},
	}
	for _, c := range chunks {
		if err := e.Encode(c); err != nil {
			t.Fatal(err)
		}
		if _, step := c.(uistream.FinishStep); step {
			if err := s.Flush(hangGuard(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.Done()
	if err := s.Close(hangGuard(t)); err != nil {
		t.Fatal(err)
	}
	store.checkStream(t, 0, 1<<20, rec.Body.Bytes())
}
