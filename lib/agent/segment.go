package agent

import "time"

// SegmentTTL is how long stream segments are kept for resume.
const SegmentTTL = 24 * time.Hour

// Segment is a batch of already-encoded stream bytes (SSE frames) of one run, numbered from 0. The segment with
// Final set carries the end of the stream; readers stop after it.
type Segment struct {
	ThreadID  string
	RunID     string
	Seq       int64
	Data      []byte
	Final     bool
	CreatedAt time.Time
	ExpiresAt time.Time
}
