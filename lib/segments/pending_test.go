package segments

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/agentloop/agentloop/lib/uistream"
)

// frame encodes c as the run's Encoder does.
func frame(t testing.TB, c uistream.Chunk) []byte {
	t.Helper()
	b, err := uistream.AppendFrame(nil, c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// held is the memory a pending segment holds for its frames.
func held(p *pending) int {
	n := 0
	for _, b := range p.blocks {
		n += cap(b)
	}
	return n
}

// The delta frames pending keeps compactly are uistream's: if its encoding of a text or reasoning delta changes,
// pending still gives the frames back exactly (every other test here), but keeps them whole.
func TestDeltaFrameShape(t *testing.T) {
	t.Parallel()
	for _, c := range []uistream.Chunk{uistream.TextDelta{ID: "txt_1", Delta: "hi \"x\""}, uistream.ReasoningDelta{ID: "rs_1", Delta: "hm"}} {
		f := frame(t, c)
		head, delta, ok := splitDelta(f)
		if !ok {
			t.Fatalf("%s frame %q is not split", c.ChunkType(), f)
		}
		if want := `","delta":"`; !bytes.HasSuffix(head, []byte(want)) || !bytes.Contains(head, []byte(`"type":"`+c.ChunkType()+`"`)) {
			t.Fatalf("%s frame %q: head %q", c.ChunkType(), f, head)
		}
		if string(head)+string(delta)+deltaEnd != string(f) {
			t.Fatalf("%s frame %q split into %q and %q", c.ChunkType(), f, head, delta)
		}
	}
}

// A pending segment gives up exactly the bytes appended, in order, in a slice with no room to spare, whatever the
// frames: delta frames of one part or of several, interleaved with other frames, frames larger than a block,
// frames that only look like delta frames, and a second segment after the first was taken.
func TestPendingGivesBackExactly(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), 3*pendingBlock+7)
	cases := []struct {
		name   string
		frames [][]byte
	}{
		{"none", nil},
		{"one delta", [][]byte{frame(t, uistream.TextDelta{ID: "t", Delta: "a"})}},
		{"one other frame", [][]byte{frame(t, uistream.Start{MessageID: "m"})}},
		{"deltas of two parts interleaved", [][]byte{
			frame(t, uistream.TextDelta{ID: "t1", Delta: "a"}), frame(t, uistream.ReasoningDelta{ID: "r1", Delta: "b"}),
			frame(t, uistream.TextDelta{ID: "t1", Delta: "c"}), frame(t, uistream.TextDelta{ID: "t1", Delta: "d"}),
			frame(t, uistream.TextDelta{ID: "t2", Delta: ""}), frame(t, uistream.TextEnd{ID: "t1"}),
		}},
		{"escapes and a delta field inside the delta", [][]byte{
			frame(t, uistream.TextDelta{ID: `t"1`, Delta: `","delta":"`}), frame(t, uistream.TextDelta{ID: `t"1`, Delta: "\\\n\"}\n\n"}),
		}},
		{"look-alikes", [][]byte{
			[]byte(`data: {"type":"text-delta","id":"t","delta":"a"}` + "\n"), []byte(`data: {"type":"text-delta","id":"t"}` + "\n\n"),
			[]byte(`data: {"type":"text-delta","id":"` + "\"}\n\n"), []byte("\"}\n\n"), []byte(`data: {"type":"text-delta","id":"t","delta":"`),
		}},
		{"a frame larger than a block among deltas", [][]byte{
			frame(t, uistream.TextDelta{ID: "t", Delta: "a"}), big, frame(t, uistream.TextDelta{ID: "t", Delta: "b"}),
			frame(t, uistream.TextDelta{ID: "t", Delta: string(big)}),
		}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		var fs [][]byte
		for range rng.IntN(400) {
			id := fmt.Sprintf("t%d", rng.IntN(3))
			switch rng.IntN(6) {
			case 0:
				fs = append(fs, frame(t, uistream.ReasoningDelta{ID: id, Delta: randText(rng)}))
			case 1:
				fs = append(fs, frame(t, uistream.TextEnd{ID: id}))
			case 2:
				fs = append(fs, []byte(randText(rng)))
			default:
				fs = append(fs, frame(t, uistream.TextDelta{ID: id, Delta: randText(rng)}))
			}
		}
		cases = append(cases, struct {
			name   string
			frames [][]byte
		}{fmt.Sprintf("random %d", i), fs})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var p pending
			for round := range 2 {
				var want []byte
				for _, f := range tc.frames {
					p.add(f)
					want = append(want, f...)
				}
				if p.n != len(want) {
					t.Fatalf("round %d: n = %d, want %d", round, p.n, len(want))
				}
				if got := p.bytes(); !bytes.Equal(got, want) {
					t.Fatalf("round %d: bytes() = %q, want %q", round, got, want)
				}
				got := p.take()
				if !bytes.Equal(got, want) || (len(want) == 0) != (got == nil) {
					t.Fatalf("round %d: take() = %q, want %q (nil when none)", round, got, want)
				}
				if cap(got) != len(got) {
					t.Fatalf("round %d: the segment's slice has cap %d for %d bytes", round, cap(got), len(got))
				}
				if p.n != 0 || len(p.blocks) != 0 || p.head != nil {
					t.Fatalf("round %d: not empty after take: n %d, %d blocks", round, p.n, len(p.blocks))
				}
			}
		})
	}
}

func randText(rng *rand.Rand) string {
	const alphabet = "ab \"\\\n{}:,é"
	r := []rune(alphabet)
	b := make([]rune, rng.IntN(12))
	for i := range b {
		b[i] = r[rng.IntN(len(r))]
	}
	return string(b)
}

// A reply's words wait for the store in a third of their frames' bytes (issue 18 item 2: under load the rest of a
// 200-word reply waits pending while the store writes the segment before it).
func TestPendingKeepsAReplyCompact(t *testing.T) {
	t.Parallel()
	var p pending
	p.add(frame(t, uistream.Start{MessageID: "msg_01jb2c3d4e5f6g7h8j9k"}))
	for i := range 200 {
		p.add(frame(t, uistream.TextDelta{ID: "txt_01jb2c3d4e5f6g7h8j9k", Delta: fmt.Sprintf("w%06x ", i*7919)}))
	}
	if h := held(&p); h*3 > p.n {
		t.Fatalf("%d bytes of frames held in %d bytes: more than a third", p.n, h)
	}
}

// The segments a Segmenter writes hold no spare capacity: under load a segment waits for the store with the
// frames of the next one gathering, and room to spare in either is memory held for nothing (issue 18 item 2).
func TestSegmentsHoldNoSpareRoom(t *testing.T) {
	t.Parallel()
	s, _, store := setupSegmenter(t, nil)
	var want []byte
	for i := range 200 {
		f := frame(t, uistream.TextDelta{ID: "txt_1", Delta: fmt.Sprintf("w%d ", i)})
		s.Append(f)
		want = append(want, f...)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Append([]byte(uistream.DoneFrame))
	want = append(want, uistream.DoneFrame...)
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, seg := range store.checkStream(t, 0, DefaultMaxSegmentBytes, want) {
		if cap(seg.Data) != len(seg.Data) {
			t.Errorf("segment %d: cap %d for %d bytes", seg.Seq, cap(seg.Data), len(seg.Data))
		}
	}
}

// A segment cut while the store still writes the one before it waits in the queue as compactly as it was pending,
// and its bytes are what was appended once its turn comes (issue 18 item 2: at 1,000 streams a run's step-end
// Flush cuts the rest of its reply behind a first segment that waits 1.7 s for the store).
func TestQueuedSegmentStaysCompact(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	s, _, store := setupSegmenter(t, func(_ *SegmenterConfig, st *segStore) { st.gate = gate })
	ctx := hangGuard(t)

	start := frame(t, uistream.Start{MessageID: "msg_1"})
	s.Append(start)
	first := make(chan error, 1)
	go func() { first <- s.Flush(ctx) }()
	<-store.attempts // the writer is held in Write(seq 0)

	want := append([]byte(nil), start...)
	for i := range 200 {
		f := frame(t, uistream.TextDelta{ID: "txt_01jb2c3d4e5f6g7h8j9k", Delta: fmt.Sprintf("w%06x ", i*7919)})
		s.Append(f)
		want = append(want, f...)
	}
	s.mu.Lock()
	s.cutLocked(false) // as a Flush or a tick would
	q := s.queue[len(s.queue)-1]
	s.mu.Unlock()
	if q.seg.Data != nil || held(&q.frames)*3 > q.frames.n {
		t.Fatalf("the queued segment holds %d bytes of data and %d of records for %d bytes of frames",
			len(q.seg.Data), held(&q.frames), q.frames.n)
	}
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	store.checkStream(t, 0, DefaultMaxSegmentBytes, want)
}
