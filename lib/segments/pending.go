package segments

import (
	"bytes"
	"encoding/binary"
)

// pendingBlock is the size of the blocks a segment's frames are kept in until it is cut.
const pendingBlock = 2 << 10

// pending holds the frames appended since the last cut, and gives them up, byte for byte, as one slice of exactly
// their length when the segment is cut.
//
// Under load a segment is pending for as long as the store takes to write the one before it: at 1,000 streams in
// agentloop dev (issue 18 item 2) the first segment's write took 1.7 s (median) and the rest of each 200-word reply
// gathered meanwhile, 16.8 KB of frames in a 21.3 KB slice grown by append: 17 MB of the process's 50 MB live heap,
// which the collector doubles. So pending keeps them compact:
//
//   - in blocks of pendingBlock bytes (a record too large for the rest of one gets a block of its own size), so at
//     most a block's room is unused, where a slice grown by append left up to a third (growth step, size class);
//   - a text or reasoning delta frame (data: {"type":"text-delta","id":"…","delta":"…"}) as its delta only, its
//     head (everything before the delta) kept once for the frames that follow with the same one: a word's frame
//     is some 75 bytes, its record some 12.
//
// The records spell each frame exactly (head, delta, then the frame's end), so the segment written is the bytes
// appended, whatever the frames say; what is recognised only decides how compactly they wait.
type pending struct {
	blocks [][]byte // records: a tag, the body's length (uvarint), the body
	n      int      // bytes of the frames, as they will be cut
	head   []byte   // the last head record's body (in blocks), while delta records may follow it
}

// The records' tags.
const (
	recFrame byte = iota // a frame as it is
	recHead              // a delta frame's head: the delta records after it are frames with it
	recDelta             // a delta frame: the head, this body, then deltaEnd
)

// The delta frames pending keeps as their delta: uistream's text-delta and reasoning-delta frames
// (TestDeltaFrameShape holds these to uistream's encoding).
const (
	textDeltaHead      = `data: {"type":"text-delta","id":"`
	reasoningDeltaHead = `data: {"type":"reasoning-delta","id":"`
	deltaField         = `","delta":"` // between a delta frame's id and its delta
	deltaEnd           = "\"}\n\n"     // after its delta
)

// splitDelta splits a delta frame into its head (up to and with deltaField) and its delta; ok false for any other
// frame. head + delta + deltaEnd is frame, wherever the split falls.
func splitDelta(frame []byte) (head, delta []byte, ok bool) {
	if !bytes.HasSuffix(frame, []byte(deltaEnd)) {
		return nil, nil, false
	}
	for _, h := range [...]string{textDeltaHead, reasoningDeltaHead} {
		if !bytes.HasPrefix(frame, []byte(h)) {
			continue
		}
		i := bytes.Index(frame[len(h):len(frame)-len(deltaEnd)], []byte(deltaField))
		if i < 0 {
			return nil, nil, false
		}
		k := len(h) + i + len(deltaField)
		return frame[:k], frame[k : len(frame)-len(deltaEnd)], true
	}
	return nil, nil, false
}

// add copies frame in.
func (p *pending) add(frame []byte) {
	p.n += len(frame)
	head, delta, ok := splitDelta(frame)
	if !ok {
		p.put(recFrame, frame)
		return
	}
	if !bytes.Equal(head, p.head) {
		p.head = p.put(recHead, head)
	}
	p.put(recDelta, delta)
}

// put appends a record and returns its body, as stored.
func (p *pending) put(tag byte, body []byte) []byte {
	need := 1 + uvarintLen(len(body)) + len(body)
	k := len(p.blocks)
	if k == 0 || cap(p.blocks[k-1])-len(p.blocks[k-1]) < need {
		p.blocks = append(p.blocks, make([]byte, 0, max(pendingBlock, need)))
		k++
	}
	b := append(p.blocks[k-1], tag)
	b = binary.AppendUvarint(b, uint64(len(body)))
	b = append(b, body...)
	p.blocks[k-1] = b
	return b[len(b)-len(body):]
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// bytes returns a copy of the frames, exactly their length (nil when there are none).
func (p *pending) bytes() []byte {
	if p.n == 0 {
		return nil
	}
	out := make([]byte, 0, p.n)
	var head []byte
	for _, b := range p.blocks {
		for len(b) > 0 {
			tag := b[0]
			l, w := binary.Uvarint(b[1:])
			body := b[1+w : 1+w+int(l)]
			b = b[1+w+int(l):]
			switch tag {
			case recFrame:
				out = append(out, body...)
			case recHead:
				head = body
			case recDelta:
				out = append(out, head...)
				out = append(out, body...)
				out = append(out, deltaEnd...)
			}
		}
	}
	return out
}

// take returns the frames as bytes does and empties p.
func (p *pending) take() []byte {
	out := p.bytes()
	clear(p.blocks)
	p.blocks = p.blocks[:0]
	p.n = 0
	p.head = nil
	return out
}
