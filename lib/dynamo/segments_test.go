package dynamo_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
)

// textFrames returns at least n bytes of the SSE frames a streaming reply's segment holds: text-delta chunks of
// one text part, one word each (seeded, so every call with the same arguments returns the same bytes).
func textFrames(n int, seed uint64) []byte {
	words := strings.Fields("the a of to and in is it that for on with as was this be by are not at from or " +
		"durable agent chat backend stream segment reply model tool thread run claim heartbeat store write unit " +
		"lambda function table item partition query reader resume frame delta text compress")
	r := mrand.New(mrand.NewPCG(seed, 1))
	var b bytes.Buffer
	for b.Len() < n {
		fmt.Fprintf(&b, "data: {\"type\":\"text-delta\",\"id\":\"txt-0\",\"delta\":\"%s \"}\n\n", words[r.IntN(len(words))])
	}
	return b.Bytes()
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func segKey(runID string, seq int64) (string, string) {
	return "RUNSEG#" + runID, fmt.Sprintf("SEG#%020d", seq)
}

// A segment's data is stored deflated (enc = "deflate") when that makes its item smaller, raw otherwise, and
// reads back byte for byte either way.
func TestSegmentsDeflated(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-zip")
	cases := []struct {
		name     string
		data     []byte
		deflated bool
	}{
		{"2 KB of text-delta frames (a 500 ms flush)", textFrames(2048, 1), true},
		{"256 KiB of text-delta frames (the segmenter's cut)", textFrames(256<<10, 2), true},
		{"one frame (a hurried 50 ms flush)", textFrames(1, 3), false},
		{"just under the threshold", textFrames(200, 4)[:200], false},
		{"1 KB of random bytes (deflate would grow it)", randomBytes(1024), false},
		{"64 KiB of random bytes", randomBytes(64 << 10), false},
	}
	for i, tc := range cases {
		run := fmt.Sprintf("r-zip-%d", i)
		seg := agent.Segment{ThreadID: th.ID, RunID: run, Seq: 0, Data: tc.data, CreatedAt: t0}
		if err := s.AppendSegment(ctx, seg); err != nil {
			t.Fatalf("%s: AppendSegment: %v", tc.name, err)
		}
		pk, sk := segKey(run, 0)
		it := rawItem(t, f, pk, sk)
		enc, _ := it["enc"].(*types.AttributeValueMemberS)
		body, _ := it["body"].(*types.AttributeValueMemberB)
		switch {
		case tc.deflated && (enc == nil || enc.Value != "deflate" || body == nil || len(body.Value) >= len(tc.data)/2):
			t.Errorf("%s: stored as enc %v, body %d bytes; want deflate, under half of %d", tc.name, enc, len(body.Value), len(tc.data))
		case !tc.deflated && (enc != nil || body == nil || !bytes.Equal(body.Value, tc.data)):
			t.Errorf("%s: stored as enc %v, want the data as it is", tc.name, enc)
		}
		got, err := s.ListSegments(ctx, run, 0, t0)
		if err != nil || len(got) != 1 || !bytes.Equal(got[0].Data, tc.data) {
			t.Fatalf("%s: ListSegments: %d segments, err %v; want the data back byte for byte", tc.name, len(got), err)
		}
		if body != nil {
			t.Logf("%s: %d bytes stored as %d (item %d bytes)", tc.name, len(tc.data), len(body.Value), dynamo.ItemSize(it))
		}
	}
}

// A repeated append of a seq is a no-op even when its bytes (and so its deflated form) differ: the condition is on
// the key alone.
func TestDeflatedSegmentRepeatIsNoOp(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-zip-dup")
	first := agent.Segment{ThreadID: th.ID, RunID: "r", Seq: 0, Data: textFrames(2048, 1), CreatedAt: t0}
	if err := s.AppendSegment(ctx, first); err != nil {
		t.Fatal(err)
	}
	for _, data := range [][]byte{first.Data, textFrames(2048, 2), randomBytes(2048)} {
		dup := first
		dup.Data = data
		if err := s.AppendSegment(ctx, dup); err != nil {
			t.Fatalf("repeated append: %v", err)
		}
	}
	got, err := s.ListSegments(ctx, "r", 0, t0)
	if err != nil || len(got) != 1 || !bytes.Equal(got[0].Data, first.Data) {
		t.Fatalf("ListSegments: %d segments, err %v; want the first append's bytes", len(got), err)
	}
}

// putSegmentItem writes a segment head directly, as an older build (or a corrupting hand) left it.
func putSegmentItem(t *testing.T, f *fixture, runID string, seq int64, body []byte, enc string) {
	t.Helper()
	pk, sk := segKey(runID, seq)
	it := map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: sk},
		"kind": &types.AttributeValueMemberS{Value: "seg"}, "threadId": &types.AttributeValueMemberS{Value: "th-old"},
		"runId": &types.AttributeValueMemberS{Value: runID}, "seq": &types.AttributeValueMemberN{Value: fmt.Sprint(seq)},
		"final": &types.AttributeValueMemberBOOL{Value: false}, "createdAt": &types.AttributeValueMemberS{Value: "2031-05-06T07:08:09.123000000Z"},
		"body": &types.AttributeValueMemberB{Value: body},
	}
	if enc != "" {
		it["enc"] = &types.AttributeValueMemberS{Value: enc}
	}
	if _, err := f.client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(f.table), Item: it}); err != nil {
		t.Fatal(err)
	}
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func deflated(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, _ := flate.NewWriter(&b, flate.BestCompression)
	_, _ = zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Segments stored before deflate (raw with no enc, or gzipped past 32 KiB) read back as they are, beside new ones.
func TestOlderSegmentsReadBack(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	raw, big := textFrames(2048, 5), textFrames(40<<10, 6)
	putSegmentItem(t, f, "r-old", 0, raw, "")
	putSegmentItem(t, f, "r-old", 1, gzipped(t, big), "gzip")
	fresh := textFrames(2048, 7)
	if err := f.store.AppendSegment(ctx, agent.Segment{ThreadID: "th-old", RunID: "r-old", Seq: 2, Data: fresh, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	got, err := f.store.ListSegments(ctx, "r-old", 0, t0)
	if err != nil || len(got) != 3 {
		t.Fatalf("ListSegments: %d segments, err %v; want 3", len(got), err)
	}
	for i, want := range [][]byte{raw, big, fresh} {
		if got[i].Seq != int64(i) || !bytes.Equal(got[i].Data, want) || got[i].RunID != "r-old" || !got[i].CreatedAt.Equal(t0) {
			t.Errorf("segment %d: seq %d, %d bytes, run %q, created %v; want %d bytes as written", i, got[i].Seq,
				len(got[i].Data), got[i].RunID, got[i].CreatedAt, len(want))
		}
	}
}

// A deflate body that is not a complete DEFLATE stream, or inflates past the bound (a bomb: 1 MiB of zeros is a
// 1 KB body), makes ListSegments fail with an internal store_corrupt error that tells a client nothing, never a
// panic or an unbounded allocation.
func TestCorruptDeflatedSegmentIsAnError(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	good := deflated(t, textFrames(2048, 8))
	cases := []struct {
		name string
		body []byte
	}{
		{"garbage", []byte("data: {\"type\":\"text-delta\"} not deflate at all \xff\xfe")},
		{"truncated", good[:len(good)/2]},
		{"empty", []byte{}},
		{"inflates past 400 KiB", deflated(t, make([]byte, 1<<20))},
	}
	for i, tc := range cases {
		run := fmt.Sprintf("r-bad-%d", i)
		putSegmentItem(t, f, run, 0, tc.body, "deflate")
		got, err := f.store.ListSegments(ctx, run, 0, t0)
		if err == nil {
			t.Errorf("%s: ListSegments = %d segments, want an error", tc.name, len(got))
			continue
		}
		var e *agent.Error
		if !errors.As(err, &e) || e.Kind != agent.KindInternal || e.Code != agent.CodeStoreCorrupt {
			t.Errorf("%s: err %v, want internal store_corrupt", tc.name, err)
		}
		if code, msg := agent.Public(err); code != agent.CodeInternal || msg != "internal error" {
			t.Errorf("%s: a client would see %s %q", tc.name, code, msg)
		}
	}
}
