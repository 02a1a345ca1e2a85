package dynamo

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

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

// AppendSegment: one PutItem with attribute_not_exists(pk) on SEG#<seq> in the run's segment partition. A
// repeated append finds the item there and is a no-op. A segment too large for one item (the encoder bounds
// them to 256 KiB, so only gzip-resistant data near that bound) has its chunks written first and deleted again if
// the append turns out to be a repeat.
func (s *Store) AppendSegment(ctx context.Context, seg agent.Segment) error {
	if seg.Seq < 0 {
		return agent.E(agent.KindInvalid, "invalid_segment", "segment seq %d is negative", seg.Seq)
	}
	pk := segmentsPK(seg.RunID)
	chunkSK := segChunkSK(seg.Seq)
	ttl := item{}
	if !seg.ExpiresAt.IsZero() {
		ttl[AttrExpiresAt] = avN(ttlSeconds(seg.ExpiresAt))
	}
	p, err := s.pack(seg.Data, false, pk, chunkSK, ttl)
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
		TableName:                aws.String(s.table),
		Item:                     it,
		ConditionExpression:      aws.String("attribute_not_exists(" + e.n(AttrPK) + ")"),
		ExpressionAttributeNames: e.attrNames(),
	})
	if _, ok := conditionFailed(err); ok {
		s.dropChunks(ctx, p.attrs, pk, chunkSK, "")
		return nil
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

// ListSegments is one Query on the run's segment partition, sk BETWEEN SEG#<from> AND SEG#<max>. Items past
// their expiry that the TTL sweeper has not removed yet (it may lag by days) are dropped here.
func (s *Store) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	pk := segmentsPK(runID)
	e := newExpr()
	in := &dynamodb.QueryInput{
		KeyConditionExpression: aws.String(e.n(AttrPK) + " = " + e.v(avS(pk)) + " AND " + e.n(AttrSK) + " BETWEEN " +
			e.v(avS(segSK(max(from, 0)))) + " AND " + e.v(avS(segSK(math.MaxInt64)))),
	}
	in.ExpressionAttributeNames = e.attrNames()
	in.ExpressionAttributeValues = e.attrValues()
	var heads []item
	err := s.query(ctx, in, func(it item) error {
		if has(it, attrExpires) && getT(it, attrExpires).Before(now) {
			return nil
		}
		heads = append(heads, it)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Segments are written once and never replaced, so a torn read cannot happen; reread only guards against
	// chunks that are missing for good (a crashed append), which then surfaces as an error.
	datas, err := s.readAll(ctx, heads, pk,
		func(h item) chunkKeyFunc { return segChunkSK(getN(h, attrSeq)) },
		func(ctx context.Context, h item) (item, error) { return s.getItem(ctx, key(pk, getS(h, AttrSK))) })
	if errors.Is(err, errTornRead) {
		return nil, agent.E(agent.KindInternal, CodeCorrupt, "run %s: a segment's chunks are missing", runID)
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
