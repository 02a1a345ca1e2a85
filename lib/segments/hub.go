package segments

import (
	"bytes"
	"sync"
)

// DefaultSubscriberBacklog bounds what a same-process reader may fall behind its run's Segmenter (bytes published
// to it and not yet taken). Append never waits for a reader: one that falls further behind is dropped from the hub
// and goes on from the store, where nothing is lost.
const DefaultSubscriberBacklog = 1 << 20

// Hub connects the Segmenters of the runs this process writes to the Followers of those runs in this process
// (issue 18 item 4): such a reader gets each frame as the run appends it, with no flush tick and no store poll
// between, as the run's own client does. The stored segments stay the truth: a reader elsewhere, or one whose
// writer went away, follows the store.
//
// The handover has no gap and no duplicate. Under the Segmenter's lock a subscriber takes a snapshot: the seq
// below which every segment is written (it reads those from the store), the cut segments not yet written and the
// pending bytes (it gets their data from the snapshot), and from then on every appended frame, tagged with the seq
// of the segment it goes into. When the final segment is written the subscriber has every byte of the stream
// and ends. When the Segmenter stops publishing first (the run lost its claim and detached, its Close gave up on
// the final segment, or the reader fell DefaultSubscriberBacklog behind), the reader goes on from the store at the
// segment it was in, skipping the bytes of it it already has; a segment found there that does not begin with those
// bytes was written by someone else (the reaper's end of a run whose writes it fenced) and is delivered whole.
//
// Frames reach a same-process reader as they reach the run's own client: a run that loses its claim may have sent
// both a few frames that its segments will not hold (DESIGN principle 8 bounds that window at the claim's
// horizon); the reader then ends as the store says.
//
// A Hub is safe for concurrent use; the zero value is not usable, nil is (it has no runs).
type Hub struct {
	mu   sync.Mutex
	runs map[string]*Segmenter
}

// NewHub returns an empty Hub.
func NewHub() *Hub { return &Hub{runs: map[string]*Segmenter{}} }

// Live returns how many runs the hub publishes now.
func (h *Hub) Live() int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.runs)
}

// add publishes s as runID's writer, unless the run has one here already.
func (h *Hub) add(runID string, s *Segmenter) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.runs[runID]; !ok {
		h.runs[runID] = s
	}
}

// remove stops publishing s as runID's writer.
func (h *Hub) remove(runID string, s *Segmenter) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.runs[runID] == s {
		delete(h.runs, runID)
	}
}

// subscribe attaches a reader to runID's Segmenter; nil when this process does not write the run (or no longer
// publishes it).
func (h *Hub) subscribe(runID string) *subscription {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	s := h.runs[runID]
	h.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.subscribe()
}

// subEnd is how a subscription stands.
type subEnd int

const (
	subLive     subEnd = iota // frames keep coming
	subComplete               // the final segment is written: the subscriber has every byte
	subFallback               // publishing stopped early: go on from the store
)

// chunk is published data of one segment.
type chunk struct {
	seq  int64
	data []byte
}

// subscription is one same-process reader's feed from a Segmenter.
type subscription struct {
	seg *Segmenter
	// from is the snapshot's seq: every segment below it is written; the feed begins at it.
	from  int64
	ready chan struct{} // a token whenever items or end change

	mu      sync.Mutex
	items   []chunk
	size    int
	backlog int
	end     subEnd
}

func newSubscription(s *Segmenter, from int64) *subscription {
	return &subscription{seg: s, from: from, ready: make(chan struct{}, 1), backlog: s.cfg.SubscriberBacklog}
}

// push adds data of segment seq; false when the subscriber is no longer fed (it fell too far behind, or ended).
func (b *subscription) push(seq int64, data []byte) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.end != subLive {
		return false
	}
	if b.size+len(data) > b.backlog {
		b.items, b.size, b.end = nil, 0, subFallback
		b.signal()
		return false
	}
	if n := len(b.items); n > 0 && b.items[n-1].seq == seq {
		b.items[n-1].data = append(b.items[n-1].data, data...)
	} else {
		b.items = append(b.items, chunk{seq: seq, data: bytes.Clone(data)})
	}
	b.size += len(data)
	b.signal()
	return true
}

// finish ends the feed (subComplete or subFallback) unless it has ended.
func (b *subscription) finish(end subEnd) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.end == subLive {
		b.end = end
		b.signal()
	}
}

// take returns what was published since the last take, and how the feed stands after it.
func (b *subscription) take() ([]chunk, subEnd) {
	b.mu.Lock()
	defer b.mu.Unlock()
	items := b.items
	b.items, b.size = nil, 0
	return items, b.end
}

func (b *subscription) signal() {
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// cancel detaches the reader from its Segmenter.
func (b *subscription) cancel() { b.seg.unsubscribe(b) }
