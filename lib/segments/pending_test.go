package segments

import (
	"bytes"
	"context"
	"testing"
)

// A pending segment gives up exactly the bytes appended, in order, in a slice with no room to spare, whatever the
// frames' sizes against the block size; and it holds at most one block's room unused meanwhile.
func TestPendingGathersExactly(t *testing.T) {
	t.Parallel()
	frame := func(n int, c byte) []byte { return bytes.Repeat([]byte{c}, n) }
	cases := []struct {
		name   string
		frames [][]byte
	}{
		{"none", nil},
		{"one small frame", [][]byte{frame(75, 'a')}},
		{"frames that fill a block exactly", [][]byte{frame(pendingBlock/2, 'a'), frame(pendingBlock/2, 'b')}},
		{"a frame across two blocks", [][]byte{frame(pendingBlock-10, 'a'), frame(30, 'b'), frame(5, 'c')}},
		{"a frame larger than a block", [][]byte{frame(10, 'a'), frame(3*pendingBlock+7, 'b'), frame(9, 'c')}},
		{"a 200-word reply", func() [][]byte {
			var fs [][]byte
			for i := range 200 {
				fs = append(fs, frame(70+i%9, byte('a'+i%26)))
			}
			return fs
		}()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var p pending
			for round := range 2 { // a second segment in the same buffer after the first was taken
				var want []byte
				for _, f := range tc.frames {
					p.add(f)
					want = append(want, f...)
					room := 0
					for _, b := range p.blocks {
						room += cap(b) - len(b)
					}
					if room >= pendingBlock {
						t.Fatalf("round %d: %d bytes of room unused in %d blocks", round, room, len(p.blocks))
					}
				}
				if p.n != len(want) {
					t.Fatalf("round %d: n = %d, want %d", round, p.n, len(want))
				}
				if snap := p.bytes(); !bytes.Equal(snap, want) {
					t.Fatalf("round %d: bytes() differs from what was appended", round)
				}
				got := p.take()
				if !bytes.Equal(got, want) || (len(want) == 0) != (got == nil) {
					t.Fatalf("round %d: take() = %d bytes, want %d (nil when none)", round, len(got), len(want))
				}
				if cap(got) != len(got) {
					t.Fatalf("round %d: the segment's slice has cap %d for %d bytes", round, cap(got), len(got))
				}
				if p.n != 0 || len(p.blocks) != 0 {
					t.Fatalf("round %d: not empty after take: n %d, %d blocks", round, p.n, len(p.blocks))
				}
			}
		})
	}
}

// The segments a Segmenter writes hold no spare capacity: under load a segment waits for the store with the
// frames of the next one gathering, and room to spare in either is memory held for nothing (issue 18 item 2).
func TestSegmentsHoldNoSpareRoom(t *testing.T) {
	t.Parallel()
	s, _, store := setupSegmenter(t, nil)
	var want []byte
	for i := range 200 {
		f := bytes.Repeat([]byte{byte('a' + i%26)}, 70+i%9)
		s.Append(f)
		want = append(want, f...)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Append([]byte("data: [DONE]\n\n"))
	want = append(want, "data: [DONE]\n\n"...)
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, seg := range store.checkStream(t, 0, DefaultMaxSegmentBytes, want) {
		if cap(seg.Data) != len(seg.Data) {
			t.Errorf("segment %d: cap %d for %d bytes", seg.Seq, cap(seg.Data), len(seg.Data))
		}
	}
}
