package dynamo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

const (
	attrRole = "role"
	attrSeq  = "seq"
)

// envelope is a message body as stored: parts and metadata. It is assembled by hand rather than with
// json.Marshal, which would compact and HTML-escape the raw parts; this way every part round-trips byte for byte.
type envelope struct {
	Parts    []json.RawMessage `json:"parts"`
	Metadata json.RawMessage   `json:"metadata"`
}

func encodeBody(m agent.Message) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if m.Parts != nil {
		b.WriteString(`"parts":[`)
		for i, p := range m.Parts {
			if !json.Valid(p) {
				return nil, agent.E(agent.KindInvalid, "invalid_message", "message %s: part %d is not valid JSON", m.ID, i)
			}
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(p)
		}
		b.WriteByte(']')
	}
	if m.Metadata != nil {
		if !json.Valid(m.Metadata) {
			return nil, agent.E(agent.KindInvalid, "invalid_message", "message %s: metadata is not valid JSON", m.ID)
		}
		if m.Parts != nil {
			b.WriteByte(',')
		}
		b.WriteString(`"metadata":`)
		b.Write(m.Metadata)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func decodeMessage(head item, body []byte) (agent.MessageRecord, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return agent.MessageRecord{}, agent.Wrap(err, agent.KindInternal, CodeCorrupt, "message "+getS(head, attrID))
	}
	return agent.MessageRecord{
		ThreadID: getS(head, attrThreadID),
		Seq:      getN(head, attrSeq),
		Message: agent.Message{
			ID:       getS(head, attrID),
			Role:     agent.Role(getS(head, attrRole)),
			Parts:    env.Parts,
			Metadata: env.Metadata,
		},
		CreatedAt: getT(head, attrCreatedAt),
		UpdatedAt: getT(head, attrUpdatedAt),
	}, nil
}

// PutMessage upserts the message head with one UpdateItem that keeps position and creation time
// (SET seq = if_not_exists(seq, :seq), createdAt = if_not_exists(createdAt, :now)). A body too large for one
// item is written as chunk items first, under a fresh version id; the head switches to that version in its one
// write, and the chunks of the version it replaced (returned as UPDATED_OLD) are deleted after.
func (s *Store) PutMessage(ctx context.Context, threadID string, seq int64, m agent.Message, now time.Time) error {
	body, err := encodeBody(m)
	if err != nil {
		return err
	}
	pk := threadPK(threadID)
	chunkSK := msgChunkSK(m.ID)
	p, err := s.pack(body, true, pk, chunkSK, nil)
	if err != nil {
		return err
	}
	if err := s.writeChunks(ctx, p); err != nil {
		return err
	}
	e := newExpr()
	sets := []string{
		e.n(attrKind) + " = " + e.v(avS("msg")),
		e.n(attrID) + " = " + e.v(avS(m.ID)),
		e.n(attrThreadID) + " = " + e.v(avS(threadID)),
		e.n(attrRole) + " = " + e.v(avS(string(m.Role))),
		e.n(attrSeq) + " = if_not_exists(" + e.n(attrSeq) + ", " + e.v(avN(seq)) + ")",
		e.n(attrCreatedAt) + " = if_not_exists(" + e.n(attrCreatedAt) + ", " + e.v(avT(now)) + ")",
		e.n(attrUpdatedAt) + " = " + e.v(avT(now)),
	}
	var removes []string
	for _, a := range blobAttrs {
		if v, ok := p.attrs[a]; ok {
			sets = append(sets, e.n(a)+" = "+e.v(v))
		} else {
			removes = append(removes, e.n(a))
		}
	}
	update := "SET " + strings.Join(sets, ", ") + " REMOVE " + strings.Join(removes, ", ")
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(pk, msgSK(m.ID)),
		UpdateExpression:          aws.String(update),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
		ReturnValues:              types.ReturnValueUpdatedOld,
	})
	if err != nil {
		return storeErr(err, "put message")
	}
	s.dropChunks(ctx, res.Attributes, pk, chunkSK, p.ver)
	return nil
}

func messageNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %s of thread %q not found", id, threadID)
}

func (s *Store) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	pk := threadPK(threadID)
	k := key(pk, msgSK(id))
	// A torn read (the head moved to a new version between our two reads) is retried from the head.
	for attempt := 0; ; attempt++ {
		head, err := s.getItem(ctx, k)
		if err != nil {
			return agent.MessageRecord{}, err
		}
		if head == nil {
			return agent.MessageRecord{}, messageNotFound(threadID, id)
		}
		body, err := s.unpack(ctx, head, pk, msgChunkSK(id), nil)
		if errors.Is(err, errTornRead) && attempt < 5 {
			continue
		}
		if err != nil {
			return agent.MessageRecord{}, err
		}
		return decodeMessage(head, body)
	}
}

// ListMessages is one Query over the thread's MSG# heads (plus one BatchGetItem for the chunks of large
// messages, if any), ordered by seq then id.
func (s *Store) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	pk := threadPK(threadID)
	var heads []item
	if err := s.queryPrefix(ctx, pk, prefixMsg, false, func(it item) error {
		heads = append(heads, it)
		return nil
	}); err != nil {
		return nil, err
	}
	bodies, err := s.readAll(ctx, heads, pk,
		func(h item) chunkKeyFunc { return msgChunkSK(getS(h, attrID)) },
		func(ctx context.Context, h item) (item, error) {
			return s.getItem(ctx, key(pk, getS(h, AttrSK)))
		})
	if err != nil {
		return nil, err
	}
	out := make([]agent.MessageRecord, 0, len(heads))
	for i, h := range heads {
		if h == nil {
			continue
		}
		r, err := decodeMessage(h, bodies[i])
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Seq != out[j].Seq {
			return out[i].Seq < out[j].Seq
		}
		return out[i].Message.ID < out[j].Message.ID
	})
	return out, nil
}

// DeleteMessage deletes the head (returning it) and then the chunks it pointed at.
func (s *Store) DeleteMessage(ctx context.Context, threadID, id string) error {
	pk := threadPK(threadID)
	res, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:    aws.String(s.table),
		Key:          key(pk, msgSK(id)),
		ReturnValues: types.ReturnValueAllOld,
	})
	if err != nil {
		return storeErr(err, "delete message")
	}
	s.dropChunks(ctx, res.Attributes, pk, msgChunkSK(id), "")
	return nil
}
