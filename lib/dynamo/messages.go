package dynamo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

const (
	attrRole = "role"
	attrSeq  = "seq"
	// The fence of the message's last writer, and whether that writer finalized it (final = true, else absent).
	attrWriterRun   = "writerRunId"
	attrWriterEpoch = "writerEpoch"
	// attrHidden marks a deleted message: the head stays as a tombstone with its writer's fence and no content.
	attrHidden = "hidden"
	// attrMsgOrder is the sort key of IndexMessagesBySeq: "<seq, 20 digits>#<message id>" (msgOrder), ListMessages'
	// order as one string, on live message heads only (segments and queue entries carry a seq too, and must not
	// pay for an index entry). It is set with the head's first write and kept, like seq; a delete removes both.
	attrMsgOrder = "msgOrder"
	// attrHideBefore is an edit's mark on the edited message's head (fence D): the messages positioned after it
	// and before this position are hidden, by the edit's one head write. The edit record (editSK) lets a reader
	// find it.
	attrHideBefore = "hideBefore"
)

// An edit record (sk "EDIT#<message id>", kind "edit") names an edited message for the readers of pages, which
// read a thread from one end and could otherwise meet the hidden messages before (or without) the edited one.
// It is written before the edit's head write and counts only once that write has landed (the head carries
// hideBefore). It sits in IndexMessagesBySeq above every message (msgOrder "~edit#<id>"), so a page read from
// the newest message meets it first at no extra request; other pages look the records up with one Query of
// the index. SettleEdit drops it once the hidden messages are deleted.
const (
	prefixEdit      = "EDIT#"
	editOrderPrefix = "~edit#"
)

func editSK(id string) string { return prefixEdit + id }

// msgOrder is a message's key in IndexMessagesBySeq.
func msgOrder(seq int64, id string) string { return fmt.Sprintf("%020d#%s", seq, id) }

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
				return nil, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message %s: part %d is not valid JSON", m.ID, i)
			}
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(p)
		}
		b.WriteByte(']')
	}
	if len(m.Metadata) > 0 {
		if !json.Valid(m.Metadata) {
			return nil, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message %s: metadata is not valid JSON", m.ID)
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
		return agent.MessageRecord{}, agent.Wrap(err, agent.KindInternal, agent.CodeStoreCorrupt, "message "+getS(head, attrID))
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

// fenceCond is the condition that fences every message head write: the write applies to a new id, to a message
// last written at a lower epoch (or by this store before fences existed), or at the same epoch by a writer that
// did not finalize it.
func fenceCond(e *expr, f agent.Fence) string {
	ep := e.v(avN(f.Epoch))
	return "attribute_not_exists(" + e.n(AttrPK) + ") OR attribute_not_exists(" + e.n(attrWriterEpoch) + ") OR " +
		e.n(attrWriterEpoch) + " < " + ep + " OR (" + e.n(attrWriterEpoch) + " = " + ep + " AND attribute_not_exists(" +
		e.n(attrFinal) + "))"
}

func messageFenced(id string, f agent.Fence) error {
	return agent.E(agent.KindConflict, agent.CodeRunFenced,
		"message %s was written by a newer run, or finalized, before run %s at epoch %d", id, f.RunID, f.Epoch)
}

// PutMessage upserts the message head with one UpdateItem, fenced by fenceCond. The head keeps position and
// creation time (SET seq = if_not_exists(seq, :seq), createdAt = if_not_exists(createdAt, :now)); a deleted
// message has neither (DeleteMessage removes them), so one brought back by a newer writer is a new message at the
// position given. A body too large for one item is written as chunk items first, under a fresh version id; the
// fenced head write switches to that version, and the chunks of the version it replaced (UPDATED_OLD) are deleted
// after. A refused head write deletes the chunks it would have pointed at.
//
// A final write whose answer was lost fails its own retry (the message is now final at this epoch). The failed
// condition's item tells that apart from a real fence: final, at this fence, with this content, is our write.
func (s *Store) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	m := w.Message
	if w.ThreadID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidThreadID, "message needs a thread id")
	}
	if m.ID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message needs an id")
	}
	body, err := encodeBody(m)
	if err != nil {
		return err
	}
	pk := threadPK(w.ThreadID)
	k := key(pk, msgSK(m.ID))
	chunkSK := msgChunkSK(m.ID)
	p, err := s.pack(body, true, pk, chunkSK, nil)
	if err != nil {
		return err
	}
	if err := s.writeChunks(ctx, p); err != nil {
		return err
	}
	if w.HideBefore > 0 {
		if err := s.putEditRecord(ctx, w); err != nil {
			s.dropChunks(ctx, p.attrs, pk, chunkSK, "")
			return err
		}
	}
	e := newExpr()
	sets := []string{
		e.n(attrKind) + " = " + e.v(avS("msg")),
		e.n(attrID) + " = " + e.v(avS(m.ID)),
		e.n(attrThreadID) + " = " + e.v(avS(w.ThreadID)),
		e.n(attrRole) + " = " + e.v(avS(string(m.Role))),
		e.n(attrSeq) + " = if_not_exists(" + e.n(attrSeq) + ", " + e.v(avN(w.Seq)) + ")",
		e.n(attrMsgOrder) + " = if_not_exists(" + e.n(attrMsgOrder) + ", " + e.v(avS(msgOrder(w.Seq, m.ID))) + ")",
		e.n(attrCreatedAt) + " = if_not_exists(" + e.n(attrCreatedAt) + ", " + e.v(avT(w.Now)) + ")",
		e.n(attrUpdatedAt) + " = " + e.v(avT(w.Now)),
		e.n(attrWriterRun) + " = " + e.v(avS(w.Fence.RunID)),
		e.n(attrWriterEpoch) + " = " + e.v(avN(w.Fence.Epoch)),
	}
	removes := []string{e.n(attrHidden)}
	cond := fenceCond(e, w.Fence)
	if w.HideBefore > 0 {
		// The edit commits here: the mark and the new content in one write, on a message that is stored.
		sets = append(sets, e.n(attrHideBefore)+" = "+e.v(avN(w.HideBefore)))
		cond = "attribute_exists(" + e.n(attrMsgOrder) + ") AND (" + cond + ")"
	}
	if w.Final {
		sets = append(sets, e.n(attrFinal)+" = "+e.v(avBool(true)))
	} else {
		removes = append(removes, e.n(attrFinal))
	}
	for _, a := range blobAttrs {
		if v, ok := p.attrs[a]; ok {
			sets = append(sets, e.n(a)+" = "+e.v(v))
		} else {
			removes = append(removes, e.n(a))
		}
	}
	update := "SET " + strings.Join(sets, ", ") + " REMOVE " + strings.Join(removes, ", ")
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueUpdatedOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		s.dropChunks(ctx, res.Attributes, pk, chunkSK, p.ver)
		return nil
	}
	if !isConditionFailed(err) {
		// The write may or may not have applied; the chunks stay (a reader may already need them), and an
		// unreferenced set is removed with the thread.
		return storeErr(err, "put message")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return err
	}
	if p.ver == "" || getS(old, attrVer) != p.ver {
		s.dropChunks(ctx, p.attrs, pk, chunkSK, "") // chunks of ours that no head points at
	}
	ours, err := s.isOwnFinalWrite(ctx, old, w, body)
	if err != nil {
		return err
	}
	if ours {
		return nil
	}
	if w.HideBefore > 0 && !has(old, attrMsgOrder) {
		return agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %q (to edit) not found", m.ID)
	}
	return messageFenced(m.ID, w.Fence)
}

// putEditRecord writes the edit record of w (an edit) before its head write: a PutItem fenced like the head (a
// record written at a higher epoch stays).
func (s *Store) putEditRecord(ctx context.Context, w agent.MessageWrite) error {
	it := key(threadPK(w.ThreadID), editSK(w.Message.ID))
	it[attrKind] = avS("edit")
	it[attrID] = avS(w.Message.ID)
	it[attrMsgOrder] = avS(editOrderPrefix + w.Message.ID)
	it[attrWriterRun] = avS(w.Fence.RunID)
	it[attrWriterEpoch] = avN(w.Fence.Epoch)
	e := newExpr()
	_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.table),
		Item:      it,
		ConditionExpression: aws.String("attribute_not_exists(" + e.n(AttrPK) + ") OR " + e.n(attrWriterEpoch) + " <= " +
			e.v(avN(w.Fence.Epoch))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if isConditionFailed(err) {
		return messageFenced(w.Message.ID, w.Fence)
	}
	return storeErr(err, "put edit record")
}

// SettleEdit deletes the edit record of message id (agent.EditSettler), unless a writer above f's epoch wrote it,
// or a message the edit hides is still stored: an earlier edit of the same message whose cleanup never ran hid
// messages this edit's run never saw, so never deleted (the record is all that hides them from a page read from
// the newest message).
func (s *Store) SettleEdit(ctx context.Context, threadID, id string, f agent.Fence) error {
	pk := threadPK(threadID)
	h, err := s.getItem(ctx, key(pk, msgSK(id)))
	if err != nil {
		return storeErr(err, "settle edit")
	}
	if sp, ok := headSpan(h); ok && sp.to > sp.from+1 {
		q := newExpr()
		left := false
		err := s.query(ctx, &dynamodb.QueryInput{
			IndexName:      aws.String(IndexMessagesBySeq),
			ConsistentRead: aws.Bool(true),
			KeyConditionExpression: aws.String(q.n(AttrPK) + " = " + q.v(avS(pk)) + " AND " + q.n(attrMsgOrder) + " BETWEEN " +
				q.v(avS(msgOrder(sp.from+1, ""))) + " AND " + q.v(avS(msgOrder(sp.to, "")))),
			ExpressionAttributeNames:  q.attrNames(),
			ExpressionAttributeValues: q.attrValues(),
			Limit:                     aws.Int32(1),
		}, func(item) error { left = true; return errStopQuery })
		if err != nil {
			return storeErr(err, "settle edit")
		}
		if left {
			return nil
		}
	}
	e := newExpr()
	_, err = s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(pk, editSK(id)),
		ConditionExpression:       aws.String("attribute_not_exists(" + e.n(AttrPK) + ") OR " + e.n(attrWriterEpoch) + " <= " + e.v(avN(f.Epoch))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if isConditionFailed(err) {
		return messageFenced(id, f)
	}
	return storeErr(err, "settle edit")
}

// HiddenByEdit names the messages the edit of message id hides that are still stored, newest first
// (agent.EditCleaner): one GetItem of the edited head for its span, and one strongly consistent Query of
// IndexMessagesBySeq (keys only) over the span, which holds only undeleted messages. The reaper calls it for an
// editing run that died before its cleanup.
func (s *Store) HiddenByEdit(ctx context.Context, threadID, id string) ([]string, error) {
	pk := threadPK(threadID)
	h, err := s.getItem(ctx, key(pk, msgSK(id)))
	if err != nil {
		return nil, storeErr(err, "hidden by edit")
	}
	sp, ok := headSpan(h)
	if !ok || sp.to <= sp.from+1 {
		return nil, nil
	}
	q := newExpr()
	var ids []string
	err = s.query(ctx, &dynamodb.QueryInput{
		IndexName:      aws.String(IndexMessagesBySeq),
		ConsistentRead: aws.Bool(true),
		KeyConditionExpression: aws.String(q.n(AttrPK) + " = " + q.v(avS(pk)) + " AND " + q.n(attrMsgOrder) + " BETWEEN " +
			q.v(avS(msgOrder(sp.from+1, ""))) + " AND " + q.v(avS(msgOrder(sp.to, "")))),
		ScanIndexForward:          aws.Bool(false),
		ExpressionAttributeNames:  q.attrNames(),
		ExpressionAttributeValues: q.attrValues(),
	}, func(it item) error {
		if hid, ok := strings.CutPrefix(getS(it, AttrSK), prefixMsg); ok {
			ids = append(ids, hid)
		}
		return nil
	})
	if err != nil {
		return nil, storeErr(err, "hidden by edit")
	}
	return ids, nil
}

// span is the positions an edit hid: after from, before to.
type span struct{ from, to int64 }

// hiddenBy reports whether a message at seq lies in one of spans.
func hiddenBy(spans []span, seq int64) bool {
	for _, sp := range spans {
		if seq > sp.from && seq < sp.to {
			return true
		}
	}
	return false
}

// headSpan is the span a head's edit mark hides (ok false: none, or the head is deleted).
func headSpan(h item) (span, bool) {
	if h == nil || has(h, attrHidden) || !has(h, attrHideBefore) {
		return span{}, false
	}
	return span{from: getN(h, attrSeq), to: getN(h, attrHideBefore)}, true
}

// editSpans reads the thread's edit records (one Query of IndexMessagesBySeq, keys only) and the heads they name.
func (s *Store) editSpans(ctx context.Context, pk string, base *baseRead) ([]span, error) {
	e := newExpr()
	var ids []string
	err := s.query(ctx, &dynamodb.QueryInput{
		IndexName:                 aws.String(IndexMessagesBySeq),
		ConsistentRead:            aws.Bool(true),
		KeyConditionExpression:    aws.String(e.n(AttrPK) + " = " + e.v(avS(pk)) + " AND begins_with(" + e.n(attrMsgOrder) + ", " + e.v(avS(editOrderPrefix)) + ")"),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	}, func(it item) error {
		ids = append(ids, strings.TrimPrefix(getS(it, attrMsgOrder), editOrderPrefix))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.spansOf(ctx, pk, ids, base)
}

// spansOf reads the heads of the edited messages ids and returns the spans their marks hide (a head of an
// earlier incarnation of the thread hides nothing).
func (s *Store) spansOf(ctx context.Context, pk string, ids []string, base *baseRead) ([]span, error) {
	var spans []span
	for _, id := range ids {
		h, err := s.getItem(ctx, key(pk, msgSK(id)))
		if err != nil {
			return nil, err
		}
		if h != nil {
			kept, err := base.keep([]item{h}, attrWriterEpoch)
			if err != nil {
				return nil, err
			}
			if len(kept) == 0 {
				continue
			}
		}
		if sp, ok := headSpan(h); ok {
			spans = append(spans, sp)
		}
	}
	return spans, nil
}

// isOwnFinalWrite reports whether head is the result of this very final write (an earlier attempt of it).
func (s *Store) isOwnFinalWrite(ctx context.Context, head item, w agent.MessageWrite, body []byte) (bool, error) {
	if !w.Final || len(head) == 0 || has(head, attrHidden) || !getBool(head, attrFinal) ||
		getS(head, attrWriterRun) != w.Fence.RunID || getN(head, attrWriterEpoch) != w.Fence.Epoch ||
		getS(head, attrRole) != string(w.Message.Role) {
		return false, nil
	}
	pk := threadPK(w.ThreadID)
	stored, err := s.unpack(ctx, head, pk, msgChunkSK(w.Message.ID), nil)
	if errors.Is(err, errTornRead) {
		return false, nil // its chunks are gone, so it was replaced: not ours to claim
	}
	if err != nil {
		return false, err
	}
	return bytes.Equal(stored, body), nil
}

func messageNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %s of thread %q not found", id, threadID)
}

// GetMessage reads the head (and its chunks); a deleted message is not found.
func (s *Store) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	pk := threadPK(threadID)
	k := key(pk, msgSK(id))
	base := s.readBase(ctx, threadID)
	// A torn read (the head moved to a new version between our two reads) is retried from the head.
	for attempt := 0; ; attempt++ {
		head, err := s.getItem(ctx, k)
		if err != nil {
			return agent.MessageRecord{}, err
		}
		kept, err := base.keep([]item{head}, attrWriterEpoch)
		if err != nil {
			return agent.MessageRecord{}, err
		}
		if len(kept) == 0 {
			head = nil // of an earlier incarnation of the thread
		}
		if head == nil || has(head, attrHidden) {
			return agent.MessageRecord{}, messageNotFound(threadID, id)
		}
		body, err := s.unpack(ctx, head, pk, msgChunkSK(id), nil)
		if errors.Is(err, errTornRead) {
			if attempt < 5 {
				continue
			}
			return agent.MessageRecord{}, tornRead("message " + id)
		}
		if err != nil {
			return agent.MessageRecord{}, err
		}
		return decodeMessage(head, body)
	}
}

// ListMessages is one Query over the thread's MSG# heads (plus one BatchGetItem for the chunks of large
// messages, if any), ordered by seq then id; deleted messages are left out.
func (s *Store) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	pk := threadPK(threadID)
	base := s.readBase(ctx, threadID)
	var heads []item
	if err := s.queryPrefix(ctx, pk, prefixMsg, false, func(it item) error {
		if !has(it, attrHidden) {
			heads = append(heads, it)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	heads, err := base.keep(heads, attrWriterEpoch)
	if err != nil {
		return nil, err
	}
	var spans []span
	for _, h := range heads {
		if sp, ok := headSpan(h); ok {
			spans = append(spans, sp)
		}
	}
	heads = slices.DeleteFunc(heads, func(h item) bool { return hiddenBy(spans, getN(h, attrSeq)) })
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
		if h == nil || has(h, attrHidden) { // deleted while we read
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

// ListMessagesPage is one strongly consistent Query of IndexMessagesBySeq, newest first (ScanIndexForward=false;
// true for p.Oldest,
// Limit = p.Limit+1 index entries, the one more telling whether older messages remain, starting after the
// cursor's head), that fetches the heads' other attributes from the table (a local index can: each fetched head
// is billed as a GetItem of it), plus one BatchGetItem for the chunks of the page's large messages, if any.
// Deleted messages carry no msgOrder, so they are not in the index and cost the read nothing. A Query stops at 1
// MB of heads: it then goes on from where that one stopped, until the page is full. The cost is the page's,
// whatever the thread holds. Messages an edit hid are left out (fence D): a read from the newest message meets
// the edit records first in the same Query; any other read looks them up first (editSpans), and the heads they
// name, one GetItem each.
func (s *Store) ListMessagesPage(ctx context.Context, threadID string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	limit := p.Limit
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	pk := threadPK(threadID)
	e := newExpr()
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.table),
		IndexName:                 aws.String(IndexMessagesBySeq),
		ConsistentRead:            aws.Bool(true),
		ScanIndexForward:          aws.Bool(p.Oldest),
		Select:                    types.SelectAllAttributes,
		KeyConditionExpression:    aws.String(e.n(AttrPK) + " = " + e.v(avS(pk))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	}
	if !fromTop(p) {
		// The edit records sort after every message: a read that does not start there leaves them out.
		in.KeyConditionExpression = aws.String(*in.KeyConditionExpression + " AND " + e.n(attrMsgOrder) + " < " + e.v(avS("~")))
		in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.attrNames(), e.attrValues()
	}
	if !p.From.IsZero() {
		in.ExclusiveStartKey = item{AttrPK: avS(pk), AttrSK: avS(msgSK(p.From.ID)), attrMsgOrder: avS(msgOrder(p.From.Seq, p.From.ID))}
	}
	base := s.readBase(ctx, threadID)
	// Edits (fence D): a read from the newest message meets the edit records first, in the same Query; any other
	// read looks them up first.
	var spans []span
	var edited []string // edit records met, whose heads are not read yet
	if !fromTop(p) {
		var err error
		if spans, err = s.editSpans(ctx, pk, base); err != nil {
			return agent.Page[agent.MessageRecord]{}, err
		}
	}
	var heads []item
	for len(heads) <= limit {
		in.Limit = aws.Int32(int32(limit + 1 - len(heads)))
		out, err := s.client.Query(ctx, in)
		if err != nil {
			return agent.Page[agent.MessageRecord]{}, storeErr(err, "list messages page")
		}
		kept, err := base.keep(out.Items, attrWriterEpoch)
		if err != nil {
			return agent.Page[agent.MessageRecord]{}, err
		}
		for _, it := range kept {
			if getS(it, attrKind) == "edit" {
				edited = append(edited, getS(it, attrID))
				continue
			}
			if len(edited) > 0 {
				more, err := s.spansOf(ctx, pk, edited, base)
				if err != nil {
					return agent.Page[agent.MessageRecord]{}, err
				}
				spans, edited = append(spans, more...), nil
			}
			if !has(it, attrHidden) && !hiddenBy(spans, getN(it, attrSeq)) {
				heads = append(heads, it)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	more := len(heads) > limit
	if more {
		heads = heads[:limit]
	}
	bodies, err := s.readAll(ctx, heads, pk,
		func(h item) chunkKeyFunc { return msgChunkSK(getS(h, attrID)) },
		func(ctx context.Context, h item) (item, error) {
			return s.getItem(ctx, key(pk, getS(h, AttrSK)))
		})
	if err != nil {
		return agent.Page[agent.MessageRecord]{}, err
	}
	page := agent.Page[agent.MessageRecord]{Items: make([]agent.MessageRecord, 0, len(heads)), More: more}
	for i, h := range heads {
		if h == nil || has(h, attrHidden) { // deleted while we read
			continue
		}
		r, err := decodeMessage(h, bodies[i])
		if err != nil {
			return agent.Page[agent.MessageRecord]{}, err
		}
		page.Items = append(page.Items, r)
	}
	return page, nil
}

// fromTop reports whether p reads from the newest message (and so meets the edit records first).
func fromTop(p agent.MessagePage) bool { return !p.Oldest && p.From.IsZero() }

// FenceMessage is the reaper's stub (fence B). A stored message (the usual case: the user message, a reply
// with a draft) takes one UpdateItem SET writerRunId, writerEpoch REMOVE final, conditioned on attribute_exists(pk)
// AND writerEpoch < :epoch (content and position kept). When that fails on an absent item (ALL_OLD is empty), a
// PutItem of a hidden head (no seq, msgOrder or content, so no index entry and no reader sees it) with the fence
// as its writer, conditioned on attribute_not_exists(pk); a message that appeared meanwhile is fenced by trying
// the update again. A message already written at the fence's epoch or above is left alone.
func (s *Store) FenceMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	k := key(threadPK(threadID), msgSK(id))
	for attempt := 0; attempt < 3; attempt++ {
		e := newExpr()
		_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(s.table),
			Key:       k,
			UpdateExpression: aws.String("SET " + e.n(attrWriterRun) + " = " + e.v(avS(f.RunID)) + ", " + e.n(attrWriterEpoch) +
				" = " + e.v(avN(f.Epoch)) + " REMOVE " + e.n(attrFinal)),
			ConditionExpression: aws.String("attribute_exists(" + e.n(AttrPK) + ") AND (attribute_not_exists(" + e.n(attrWriterEpoch) +
				") OR " + e.n(attrWriterEpoch) + " < " + e.v(avN(f.Epoch)) + ")"),
			ExpressionAttributeNames:            e.attrNames(),
			ExpressionAttributeValues:           e.attrValues(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if !isConditionFailed(err) {
			return storeErr(err, "fence message")
		}
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return err
		}
		if len(old) > 0 {
			return nil // written at the fence's epoch or above already
		}
		stub := key(threadPK(threadID), msgSK(id))
		stub[attrKind] = avS("msg")
		stub[attrID] = avS(id)
		stub[attrThreadID] = avS(threadID)
		stub[attrHidden] = avBool(true)
		stub[attrWriterRun] = avS(f.RunID)
		stub[attrWriterEpoch] = avN(f.Epoch)
		e = newExpr()
		_, err = s.client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                aws.String(s.table),
			Item:                     stub,
			ConditionExpression:      aws.String("attribute_not_exists(" + e.n(AttrPK) + ")"),
			ExpressionAttributeNames: e.attrNames(),
		})
		if !isConditionFailed(err) {
			return storeErr(err, "stub message")
		}
	}
	return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "message %s kept changing under its fence", id)
}

// DeleteMessage hides the message with one UpdateItem fenced like PutMessage (plus attribute_exists(pk): an
// unknown id stays unknown): SET hidden, the deleter's fence; REMOVE the content, seq, createdAt and final. The
// head stays as a tombstone so a late writer at a lower epoch cannot bring the message back; the chunks of a
// large body are deleted after (UPDATED_OLD names them).
func (s *Store) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	pk := threadPK(threadID)
	k := key(pk, msgSK(id))
	e := newExpr()
	removes := []string{e.n(attrSeq), e.n(attrMsgOrder), e.n(attrCreatedAt), e.n(attrFinal), e.n(attrHideBefore)}
	for _, a := range blobAttrs {
		removes = append(removes, e.n(a))
	}
	update := "SET " + e.n(attrHidden) + " = " + e.v(avBool(true)) + ", " + e.n(attrWriterRun) + " = " + e.v(avS(f.RunID)) +
		", " + e.n(attrWriterEpoch) + " = " + e.v(avN(f.Epoch)) + " REMOVE " + strings.Join(removes, ", ")
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND (" + fenceCond(e, f) + ")"
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueUpdatedOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if isConditionFailed(err) {
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return err
		}
		if len(old) == 0 {
			return nil // unknown id: a no-op
		}
		return messageFenced(id, f)
	}
	if err != nil {
		return storeErr(err, "delete message")
	}
	s.dropChunks(ctx, res.Attributes, pk, msgChunkSK(id), "")
	return nil
}
