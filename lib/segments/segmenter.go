package segments

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Segment bounds (DESIGN.md principle 6); config overrides them per deployment.
const (
	// DefaultSegmentInterval is the longest time a frame waits before its segment is written.
	DefaultSegmentInterval = 500 * time.Millisecond
	// DefaultHurryInterval is the flush period while a resumed-stream reader in another process is attached
	// (Hurry): its lag is this plus its own poll (DefaultPollAttached). Only a run someone reads pays for it.
	DefaultHurryInterval = 50 * time.Millisecond
	// DefaultMaxSegmentBytes is where a segment is cut (a single larger frame makes a larger segment).
	DefaultMaxSegmentBytes = 256 << 10
	// DefaultCloseTimeout bounds Close: a store that keeps refusing the final segment must not keep the HTTP
	// response open after [DONE] (REVIEW L16).
	DefaultCloseTimeout = 10 * time.Second
)

// Codes of the errors Flush and Close return (from the catalog in lib/agent).
const (
	CodeSegmenterClosed = agent.CodeSegmenterClosed
	CodeSegmentWrite    = agent.CodeSegmentWriteFailed
)

// Ticker is the periodic signal of a Segmenter; inject a fake in tests.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// NewRealTicker returns a Ticker backed by time.NewTicker.
func NewRealTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// SegmenterConfig configures a Segmenter.
type SegmenterConfig struct {
	ThreadID string
	RunID    string
	// StartSeq is the number of the first segment (0 for a new run).
	StartSeq int64
	// Write persists one segment, e.g. agent.Store.AppendSegment. It is called from a single goroutine, in Seq
	// order; a failed segment is retried later with identical content, so Write must be idempotent on
	// (RunID, Seq) as AppendSegment is. Required.
	Write func(ctx context.Context, s agent.Segment) error
	// Clock stamps CreatedAt/ExpiresAt. Required.
	Clock agent.Clock
	// Interval is the flush period; 0 means DefaultSegmentInterval.
	Interval time.Duration
	// MaxBytes bounds one segment's Data; 0 means DefaultMaxSegmentBytes.
	MaxBytes int
	// HurryInterval is the flush period while Hurry's deadline is ahead; 0 means DefaultHurryInterval.
	HurryInterval time.Duration
	// NewTicker makes the flush tickers (Interval's, and HurryInterval's while hurried); nil means NewRealTicker.
	NewTicker func(time.Duration) Ticker
	// Hub, when set, publishes the stream to readers of the run in this process (hub.go) until Close or Unpublish.
	Hub *Hub
	// SubscriberBacklog bounds each same-process reader's backlog; 0 means DefaultSubscriberBacklog.
	SubscriberBacklog int
	// Logger reports write failures; nil discards.
	Logger *slog.Logger
}

// SegmenterStats counts what a Segmenter did.
type SegmenterStats struct {
	Segments      int64 // segments written
	Bytes         int64 // bytes written
	WriteFailures int64 // failed Write calls (each retried)
	Dropped       int64 // bytes appended after Close (lost; a caller bug)
}

// Segmenter is a Sink that batches frames into numbered segments and writes them in the background: at
// least every Interval, whenever a segment reaches MaxBytes, on Flush and on Close. Append never waits for
// a write, so a slow store does not stall the stream; frames stay queued (and are retried after a failure)
// until written, each exactly once and in order. Segments hold whole frames only: a frame larger than MaxBytes
// is a segment of its own (readers concatenate Data in Seq order).
type Segmenter struct {
	cfg       SegmenterConfig
	ctx       context.Context
	cancel    context.CancelFunc
	ticker    Ticker
	wake      chan struct{}
	hurry     chan struct{} // a token when Hurry moved hurryUntil
	exited    chan struct{} // closed when the writer goroutine ends
	closeDone chan struct{} // closed when the first Close has its result

	mu       sync.Mutex
	pending  pending
	queue    []queued // cut, not yet written, in Seq order
	nextSeq  int64    // Seq of the next segment to cut
	written  int64    // every Seq below this is written
	closed   bool
	stopped  bool  // the writer goroutine ended
	errGen   int64 // bumps on every failed write
	lastErr  error
	progress chan struct{} // closed and replaced whenever written, errGen or stopped changes
	stats    SegmenterStats
	closeErr error
	// subs are the same-process readers fed by Append (hub.go); nil once unpublished.
	subs        map[*subscription]struct{}
	unpublished bool
	hurryUntil  time.Time
}

// NewSegmenter starts a Segmenter. ctx is used for every Write: pass one that outlives the cancellation of
// the run (context.WithoutCancel) so the final segment is still written after a stop. Close must be called to
// write the final segment and end the background goroutine.
func NewSegmenter(ctx context.Context, cfg SegmenterConfig) (*Segmenter, error) {
	if cfg.Write == nil || cfg.Clock == nil {
		return nil, agent.E(agent.KindInternal, agent.CodeInvalidConfig, "segmenter needs Write and Clock")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultSegmentInterval
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxSegmentBytes
	}
	if cfg.HurryInterval <= 0 {
		cfg.HurryInterval = DefaultHurryInterval
	}
	if cfg.SubscriberBacklog <= 0 {
		cfg.SubscriberBacklog = DefaultSubscriberBacklog
	}
	if cfg.NewTicker == nil {
		cfg.NewTicker = NewRealTicker
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Segmenter{
		cfg:       cfg,
		ctx:       ctx,
		cancel:    cancel,
		ticker:    cfg.NewTicker(cfg.Interval),
		wake:      make(chan struct{}, 1),
		hurry:     make(chan struct{}, 1),
		exited:    make(chan struct{}),
		closeDone: make(chan struct{}),
		nextSeq:   cfg.StartSeq,
		written:   cfg.StartSeq,
		progress:  make(chan struct{}),
		subs:      map[*subscription]struct{}{},
	}
	cfg.Hub.add(cfg.RunID, s)
	go s.run()
	return s, nil
}

// Append copies frame into the current segment, cutting segments at MaxBytes.
func (s *Segmenter) Append(frame []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.stats.Dropped += int64(len(frame))
		return
	}
	cut := false
	if s.pending.n > 0 && s.pending.n+len(frame) > s.cfg.MaxBytes {
		s.cutLocked(false)
		cut = true
	}
	// A frame is never split (REVIEW L17): a reader that stops between two segments, or a reaper that appends
	// its final segment after the last one written, must always find whole frames. A frame larger than MaxBytes
	// becomes a segment of its own; the stores keep large values under their item limits themselves.
	s.pending.add(frame)
	for sub := range s.subs {
		if !sub.push(s.nextSeq, frame) {
			delete(s.subs, sub)
		}
	}
	if s.pending.n >= s.cfg.MaxBytes {
		s.cutLocked(false)
		cut = true
	}
	if cut {
		s.signal()
	}
}

// Flush cuts the frames appended so far into a segment and waits until every segment cut so far is written.
// It returns early with the write error when a write fails meanwhile (the data stays queued and is retried),
// or with ctx's error.
func (s *Segmenter) Flush(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return agent.E(agent.KindInternal, CodeSegmenterClosed, "flush after close")
	}
	s.cutLocked(false)
	target, gen := s.nextSeq, s.errGen
	s.mu.Unlock()
	s.signal()
	return s.wait(ctx, target, gen, true)
}

// Close cuts the final segment (Final set; empty Data when nothing is pending), waits until it and every
// earlier segment are written, retrying failed writes every Interval, then stops the background goroutine.
// When ctx ends first, the pending writes are abandoned and Close returns an error. Later calls return the
// first call's result.
func (s *Segmenter) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.closeDone
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closeErr
	}
	s.closed = true
	s.cutLocked(true)
	target := s.nextSeq
	s.mu.Unlock()
	s.signal()

	err := s.wait(ctx, target, 0, false)
	s.cancel()
	<-s.exited
	s.ticker.Stop()
	// Readers whose final segment was not written (drain ends them when it is) go on from the store.
	s.Unpublish()

	s.mu.Lock()
	defer s.mu.Unlock()
	defer close(s.closeDone)
	switch {
	case err != nil:
		s.closeErr = agent.Wrap(err, agent.KindUnavailable, CodeSegmentWrite,
			"stream segments not written before close gave up (last write error: "+errString(s.lastErr)+")")
	case s.stats.Dropped > 0:
		s.closeErr = agent.E(agent.KindInternal, CodeSegmenterClosed, "%d bytes appended after close were dropped", s.stats.Dropped)
	}
	return s.closeErr
}

// Hurry makes the Segmenter flush every HurryInterval until until (then every Interval again): a reader in
// another process is attached (agent.Claim.ReadersUntil) and polls the store that often. A later until extends
// it; an earlier one changes nothing.
func (s *Segmenter) Hurry(until time.Time) {
	s.mu.Lock()
	moved := !s.closed && until.After(s.hurryUntil)
	if moved {
		s.hurryUntil = until
	}
	s.mu.Unlock()
	if moved {
		select {
		case s.hurry <- struct{}{}:
		default:
		}
	}
}

// Cut cuts the frames appended so far into a segment and wakes the writer, without waiting for the write (Flush
// waits): a reader in another process has just attached (lib/engine's reader probe), and what the run appended
// since its last flush should reach the store now, not at the next tick. After Close it does nothing.
func (s *Segmenter) Cut() {
	s.mu.Lock()
	cut := !s.closed && s.pending.n > 0
	if cut {
		s.cutLocked(false)
	}
	s.mu.Unlock()
	if cut {
		s.signal()
	}
}

// Unpublish stops feeding same-process readers (the run lost its claim, so what it appends from now on is not
// the run's story): they go on from the store. Close unpublishes too.
func (s *Segmenter) Unpublish() {
	s.mu.Lock()
	s.unpublished = true
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for sub := range subs {
		sub.finish(subFallback)
	}
	s.cfg.Hub.remove(s.cfg.RunID, s)
}

// subscribe takes a same-process reader's snapshot (hub.go); nil once the Segmenter no longer publishes.
func (s *Segmenter) subscribe() *subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unpublished || s.stopped {
		return nil
	}
	sub := newSubscription(s, s.written)
	for _, q := range s.queue {
		if data := q.data(); len(data) > 0 {
			sub.items = append(sub.items, chunk{seq: q.seg.Seq, data: data})
			sub.size += len(data)
		}
	}
	if s.pending.n > 0 {
		sub.items = append(sub.items, chunk{seq: s.nextSeq, data: s.pending.bytes()})
		sub.size += s.pending.n
	}
	s.subs[sub] = struct{}{}
	return sub
}

// unsubscribe stops feeding sub.
func (s *Segmenter) unsubscribe(sub *subscription) {
	s.mu.Lock()
	delete(s.subs, sub)
	s.mu.Unlock()
}

// Stats returns the counters so far.
func (s *Segmenter) Stats() SegmenterStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// queued is a segment cut and not yet written. Its frames stay compact (pending) until its write begins: under
// load a segment can wait in the queue behind a slow write (a Flush cuts it at once), and the bytes are
// materialized once, so a retry writes the same.
type queued struct {
	seg    agent.Segment // Data set once its write begins
	frames pending
}

// materialize sets seg.Data from the frames (once).
func (q *queued) materialize() {
	if q.frames.n > 0 {
		q.seg.Data = q.frames.take()
	}
}

// data is a copy of the segment's bytes.
func (q *queued) data() []byte {
	if q.seg.Data != nil {
		return bytes.Clone(q.seg.Data)
	}
	return q.frames.bytes()
}

// cutLocked moves the pending bytes into a queued segment. An empty segment is cut only when final.
func (s *Segmenter) cutLocked(final bool) {
	if s.pending.n == 0 && !final {
		return
	}
	now := s.cfg.Clock.Now()
	s.queue = append(s.queue, queued{seg: agent.Segment{
		ThreadID:  s.cfg.ThreadID,
		RunID:     s.cfg.RunID,
		Seq:       s.nextSeq,
		Final:     final,
		CreatedAt: now,
		ExpiresAt: now.Add(agent.SegmentTTL),
	}, frames: s.pending})
	s.pending = pending{}
	s.nextSeq++
}

// signal wakes the writer without blocking.
func (s *Segmenter) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// notifyLocked wakes every waiter.
func (s *Segmenter) notifyLocked() {
	close(s.progress)
	s.progress = make(chan struct{})
}

// wait blocks until every segment below target is written. With failFast it also returns when a write fails
// after errGen gen.
func (s *Segmenter) wait(ctx context.Context, target, gen int64, failFast bool) error {
	s.mu.Lock()
	for {
		switch {
		case s.written >= target:
			s.mu.Unlock()
			return nil
		case failFast && s.errGen != gen:
			err := s.lastErr
			s.mu.Unlock()
			return agent.Wrap(err, agent.KindUnavailable, CodeSegmentWrite, "write stream segment")
		case s.stopped:
			s.mu.Unlock()
			return agent.Wrap(context.Cause(s.ctx), agent.KindUnavailable, CodeSegmentWrite, "segmenter stopped")
		}
		ch := s.progress
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
}

// run is the writer goroutine: it cuts a segment on every tick and writes queued segments in order.
func (s *Segmenter) run() {
	defer close(s.exited)
	var fast Ticker // HurryInterval's, while hurried
	var fastC <-chan time.Time
	defer func() {
		if fast != nil {
			fast.Stop()
		}
		s.mu.Lock()
		s.stopped = true
		s.notifyLocked()
		s.mu.Unlock()
	}()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.ticker.C():
			s.mu.Lock()
			s.cutLocked(false)
			s.mu.Unlock()
		case <-fastC:
			s.mu.Lock()
			hurried := s.cfg.Clock.Now().Before(s.hurryUntil)
			if hurried {
				s.cutLocked(false)
			}
			s.mu.Unlock()
			if !hurried {
				fast.Stop()
				fast, fastC = nil, nil
			}
		case <-s.hurry:
			if fast == nil {
				fast = s.cfg.NewTicker(s.cfg.HurryInterval)
				fastC = fast.C()
			}
		case <-s.wake:
		}
		s.drain()
	}
}

// drain writes queued segments until the queue is empty or a write fails (then the next tick or wake
// retries the same segment).
func (s *Segmenter) drain() {
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		s.queue[0].materialize()
		seg := s.queue[0].seg
		s.mu.Unlock()

		err := s.cfg.Write(s.ctx, seg)

		s.mu.Lock()
		if err != nil {
			s.lastErr = err
			s.errGen++
			s.stats.WriteFailures++
			s.notifyLocked()
			s.mu.Unlock()
			s.cfg.Logger.LogAttrs(s.ctx, slog.LevelWarn, "stream segment write failed; will retry",
				slog.String("runId", seg.RunID), slog.Int64("seq", seg.Seq), slog.Any("error", err))
			return
		}
		s.queue[0] = queued{}
		s.queue = s.queue[1:]
		s.written = seg.Seq + 1
		if seg.Final {
			for sub := range s.subs {
				sub.finish(subComplete)
			}
		}
		s.stats.Segments++
		s.stats.Bytes += int64(len(seg.Data))
		s.notifyLocked()
		s.mu.Unlock()
	}
}

func errString(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}
