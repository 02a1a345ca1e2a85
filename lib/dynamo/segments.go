package dynamo

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

const (
	attrRunID   = "runId"
	attrFinal   = "final"
	attrExpires = "expiresTime" // exact expiry; AttrExpiresAt holds it rounded up to seconds for the TTL
)

// ttlSeconds rounds up, so DynamoDB's TTL never deletes an item before its exact expiry.
func ttlSeconds(t time.Time) int64 {
	sec := t.Unix()
	if t.Nanosecond() > 0 {
		sec++
	}
	return sec
}

// finalSK is the run's end-of-stream marker: the lowest seq of a final segment, written when a final segment is
// appended. It sorts after every SEG#<20 digits> key ('~' is above the digits) and before every SEGC# chunk key
// ('#' is below 'C'), so the one Query ListSegments makes over [SEG#<from>, finalSK] reads it last, at the cost of
// one tiny item, and a reader that starts past the end learns where the stream ended.
const finalSK = prefixSeg + "~final"

// AppendSegment: one PutItem with attribute_not_exists(pk) on SEG#<seq> in the run's segment partition. A
// repeated append finds the item there and is a no-op, whatever bytes it would have written (the condition is on
// the key alone). The data is stored deflated when that makes the item smaller (see packSegment). A segment too
// large for one item (the encoder bounds them to 256 KiB, so only deflate-resistant data near that bound) has its
// chunks written first and deleted again if the append turns out to be a repeat. A final segment then lowers the
// run's end marker to its seq (one more UpdateItem, once per run, conditioned on the marker being absent or
// higher).
func (s *Store) AppendSegment(ctx context.Context, seg agent.Segment) error {
	if seg.RunID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidSegment, "segment needs a run id")
	}
	if seg.Seq < 0 {
		return agent.E(agent.KindInvalid, agent.CodeInvalidSegment, "segment seq %d is negative", seg.Seq)
	}
	pk := segmentsPK(seg.RunID)
	chunkSK := segChunkSK(seg.Seq)
	ttl := item{}
	if !seg.ExpiresAt.IsZero() {
		ttl[AttrExpiresAt] = avN(ttlSeconds(seg.ExpiresAt))
	}
	p, err := s.packSegment(seg.Data, pk, chunkSK, ttl)
	if err != nil {
		return err
	}
	if err := s.writeChunks(ctx, p); err != nil {
		return err
	}
	it := key(pk, segSK(seg.Seq))
	it[attrKind] = avS("seg")
	it[attrThreadID] = avS(seg.ThreadID)
	it[attrRunID] = avS(seg.RunID)
	it[attrSeq] = avN(seg.Seq)
	it[attrFinal] = avBool(seg.Final)
	it[attrCreatedAt] = avT(seg.CreatedAt)
	if !seg.ExpiresAt.IsZero() {
		it[attrExpires] = avT(seg.ExpiresAt)
		it[AttrExpiresAt] = ttl[AttrExpiresAt]
	}
	for k, v := range p.attrs {
		it[k] = v
	}
	e := newExpr()
	_, err = s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.table),
		Item:                                it,
		ConditionExpression:                 aws.String("attribute_not_exists(" + e.n(AttrPK) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if isConditionFailed(err) {
		s.dropChunks(ctx, p.attrs, pk, chunkSK, "")
		if !seg.Final {
			return nil
		}
		// A repeat of a final segment: the first append may have died before its marker write, so the marker is
		// written again, but only if the stored segment is final (another writer's segment may hold the seq).
		stored, err := s.failedItem(ctx, err, key(pk, segSK(seg.Seq)))
		if err != nil || !getBool(stored, attrFinal) {
			return err
		}
		return s.markFinal(ctx, seg, ttl)
	}
	if err != nil || !seg.Final {
		return storeErr(err, "append segment")
	}
	return s.markFinal(ctx, seg, ttl)
}

const (
	// segDeflateAbove is the smallest segment worth deflating. A smaller one (a hurried 50 ms flush holds a frame
	// or two) is stored as it is: its item is well within its first write unit, and the few bytes deflate would save
	// barely pay for the enc attribute.
	segDeflateAbove = 256
	// encAttrBytes is what the marker costs an item: the name "enc" and the value "deflate".
	encAttrBytes = len(attrEnc) + len(encDeflate)
)

// packSegment lays a segment's data out under the large-value scheme, deflated (enc = "deflate", flate.BestSpeed)
// when it is at least segDeflateAbove and at most maxInflated bytes long and deflating makes the item smaller.
// A 2 KB run of text-delta frames (a 500 ms flush) deflates to a few hundred bytes: its item is 1 write unit
// instead of 2. Segments written raw (small ones, deflate-resistant ones, and those of builds before deflate)
// carry no enc and read back as they are; a segment over maxInflated (one frame that large) goes the general
// way (gzip above 32 KiB).
func (s *Store) packSegment(data []byte, pk string, chunkSK chunkKeyFunc, extra item) (packed, error) {
	if len(data) < segDeflateAbove || len(data) > maxInflated {
		return s.pack(data, false, pk, chunkSK, extra)
	}
	z, err := s.deflate(data)
	if err != nil {
		return packed{}, err
	}
	if len(z)+encAttrBytes >= len(data) {
		return s.layout(s.blob, data, "", pk, chunkSK, extra), nil
	}
	return s.layout(s.blob, z, encDeflate, pk, chunkSK, extra), nil
}

// markFinal lowers the run's end marker to seg.Seq.
func (s *Store) markFinal(ctx context.Context, seg agent.Segment, ttl item) error {
	e := newExpr()
	seq := e.v(avN(seg.Seq))
	update := "SET " + e.n(attrSeq) + " = " + seq + ", " + e.n(attrKind) + " = " + e.v(avS("segfinal"))
	if v, ok := ttl[AttrExpiresAt]; ok {
		update += ", " + e.n(AttrExpiresAt) + " = " + e.v(v)
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(segmentsPK(seg.RunID), finalSK),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String("attribute_not_exists(" + e.n(attrSeq) + ") OR " + e.n(attrSeq) + " > " + seq),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if isConditionFailed(err) {
		return nil // an earlier final segment already ends the stream
	}
	return storeErr(err, "append segment")
}

func decodeSegment(it item, data []byte) agent.Segment {
	return agent.Segment{
		ThreadID:  getS(it, attrThreadID),
		RunID:     getS(it, attrRunID),
		Seq:       getN(it, attrSeq),
		Data:      data,
		Final:     getBool(it, attrFinal),
		CreatedAt: getT(it, attrCreatedAt),
		ExpiresAt: getT(it, attrExpires),
	}
}

// ListSegments is one Query on the run's segment partition, sk BETWEEN SEG#<from> AND the end marker, in seq
// order. It returns segments up to the first final one (expired or not): nothing a fenced writer appended after
// the reaper's final segment is returned. The end marker, read last, bounds the answer too: it holds the lowest
// seq of a stored final segment, so a reader that starts past the end gets nothing. Segments after a final one
// are still read (never returned) on the way to the marker; only a fenced writer leaves any. Items past their
// expiry that the TTL sweeper has not removed yet (it may lag by days) are dropped here.
func (s *Store) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	pk := segmentsPK(runID)
	from = max(from, 0)
	e := newExpr()
	in := &dynamodb.QueryInput{
		KeyConditionExpression: aws.String(e.n(AttrPK) + " = " + e.v(avS(pk)) + " AND " + e.n(AttrSK) + " BETWEEN " +
			e.v(avS(segSK(from))) + " AND " + e.v(avS(finalSK))),
	}
	in.ExpressionAttributeNames = e.attrNames()
	in.ExpressionAttributeValues = e.attrValues()
	var heads []item
	end, ended := int64(math.MaxInt64), false
	err := s.query(ctx, in, func(it item) error {
		switch {
		case getS(it, AttrSK) == finalSK:
			end = getN(it, attrSeq)
		case ended:
			// After the first final segment in range: a fenced writer's. Read past (the marker comes last, and
			// may say the stream ended even before `from`), never returned.
		case !has(it, attrExpires) || !getT(it, attrExpires).Before(now):
			heads = append(heads, it)
			fallthrough
		default:
			ended = getBool(it, attrFinal)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The marker is the lowest seq of a stored final segment: nothing after it is the run's stream (a final
	// segment of a fenced writer in range after the marker's, or the marker pointing before `from`).
	for len(heads) > 0 && getN(heads[len(heads)-1], attrSeq) > end {
		heads = heads[:len(heads)-1]
	}
	// Segments are written once and never replaced, so a torn read cannot happen; reread only guards against
	// chunks that are missing for good (a crashed append), which then surfaces as an error.
	datas, err := s.readAll(ctx, heads, pk,
		func(h item) chunkKeyFunc { return segChunkSK(getN(h, attrSeq)) },
		func(ctx context.Context, h item) (item, error) { return s.getItem(ctx, key(pk, getS(h, AttrSK))) })
	if errors.Is(err, errTornRead) {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeStoreCorrupt, "run "+runID+": a segment's chunks are missing")
	}
	if err != nil {
		return nil, err
	}
	out := make([]agent.Segment, 0, len(heads))
	for i, h := range heads {
		if h != nil {
			out = append(out, decodeSegment(h, datas[i]))
		}
	}
	return out, nil
}
