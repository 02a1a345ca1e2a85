package segments

// pendingBlock is the size of the blocks a segment's bytes are gathered in until it is cut.
const pendingBlock = 2 << 10

// pending holds the frames appended since the last cut, in blocks of pendingBlock bytes (a frame too large for
// the block being filled gets a block of its own size), and gives them up as one slice of exactly their length
// when the segment is cut.
//
// One slice grown by append, as before, carried up to a third more capacity than bytes (its growth step, then
// the allocator's size class) for as long as the segment was pending, and again while it was written, and under
// load a segment is pending for as long as the store takes to write the one before it: at 1,000 streams in
// agentloop dev, the first segment's write took 1.7 s (median) and the rest of each 200-word reply gathered
// meanwhile, 16.8 KB of frames in a 21.3 KB slice (issue 18 item 2). Blocks leave at most one block's room
// unused, and the slice that is written is the bytes' size; gathering them costs one copy at the cut, about what
// the growing slice's re-copies cost, and fewer allocations.
type pending struct {
	blocks [][]byte
	n      int // bytes in blocks
}

// add copies data in.
func (p *pending) add(data []byte) {
	p.n += len(data)
	if k := len(p.blocks); k > 0 {
		last := p.blocks[k-1]
		m := copy(last[len(last):cap(last)], data)
		p.blocks[k-1] = last[:len(last)+m]
		data = data[m:]
	}
	if len(data) > 0 {
		b := make([]byte, len(data), max(pendingBlock, len(data)))
		copy(b, data)
		p.blocks = append(p.blocks, b)
	}
}

// bytes returns a copy of the bytes, exactly their length (nil when there are none).
func (p *pending) bytes() []byte {
	if p.n == 0 {
		return nil
	}
	out := make([]byte, 0, p.n)
	for _, b := range p.blocks {
		out = append(out, b...)
	}
	return out
}

// take returns the bytes as bytes does and empties p.
func (p *pending) take() []byte {
	out := p.bytes()
	clear(p.blocks)
	p.blocks = p.blocks[:0]
	p.n = 0
	return out
}
