package dynamo

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// The thread's children that are created insert-if-absent and carry JSON values (interrupts, jobs, queue entries)
// share what is below: the layout of one or two large values on one head, the batched read of many heads with
// their chunks, and the insert tied to a live thread.

// blobNames are the head attributes holding one large value. A head may hold two: the first under the names every
// other head uses (inputBlob: an interrupt's input, a job's input, a queued message), the second under its own
// (responseBlob: an interrupt's response, a job's result).
type blobNames struct{ body, enc, ver, chunks string }

var (
	inputBlob    = blobNames{attrBody, attrEnc, attrVer, attrChunks}
	responseBlob = blobNames{"respBody", "respEnc", "respVer", "respChunks"}
)

// of maps one of pack's attribute names to this value's.
func (n blobNames) of(a string) string {
	switch a {
	case attrBody:
		return n.body
	case attrEnc:
		return n.enc
	case attrVer:
		return n.ver
	case attrChunks:
		return n.chunks
	}
	return a
}

// view returns the value's attributes of head under the names unpack reads; nil when head holds no such value.
func (n blobNames) view(head item) item {
	v := item{}
	for _, a := range blobAttrs {
		if x, ok := head[n.of(a)]; ok {
			v[a] = x
		}
	}
	if !has(v, attrBody) && !has(v, attrVer) {
		return nil
	}
	if sk, ok := head[AttrSK]; ok {
		v[AttrSK] = sk // for error messages
	}
	return v
}

const (
	// pairBlobBytes is the most of each of a head's two values kept inline; a larger one (after gzip) goes to
	// chunk items. Two values share one head, so each gets well under half the item limit, and a write whose cost
	// is the size of the head (a resolve, a finish, a delivery) stays cheap for large values.
	pairBlobBytes = 64 * 1024
	// maxChildFieldBytes bounds a child head without its values (ids, names, an activity line, an error text): a
	// head that would exceed it is refused with KindTooLarge. With both values at their inline bound the head stays
	// under 200 KB.
	maxChildFieldBytes = 64 * 1024
)

// pairLimits are the large-value limits for a head that holds two values.
func (s *Store) pairLimits() blobLimits {
	chunk := min(s.blob.chunkBytes, pairBlobBytes)
	return blobLimits{compressAbove: min(s.blob.compressAbove, chunk), chunkBytes: chunk}
}

// packValue lays data out as the value n of a head holding two: its head attributes go onto head, and the chunk
// items (none for a value that fits inline) are returned, to be written before the head. An empty value is no
// attribute.
func (s *Store) packValue(n blobNames, head item, pk string, chunkSK chunkKeyFunc, data json.RawMessage) ([]item, error) {
	if len(data) == 0 {
		return nil, nil
	}
	p, err := s.packWith(s.pairLimits(), data, true, pk, chunkSK, nil)
	if err != nil {
		return nil, err
	}
	for a, v := range p.attrs {
		head[n.of(a)] = v
	}
	return p.chunks, nil
}

// valueSlot names one value of a head and where its bytes go.
type valueSlot struct {
	names blobNames
	dst   *json.RawMessage
}

// unpackValues reads the values of head into their slots; chunks holds prefetched chunk items (nil fetches them).
func (s *Store) unpackValues(ctx context.Context, head item, chunkSK chunkKeyFunc, chunks map[string]item, slots ...valueSlot) error {
	pk := getS(head, AttrPK)
	for _, v := range slots {
		view := v.names.view(head)
		if view == nil {
			continue
		}
		b, err := s.unpack(ctx, view, pk, chunkSK, chunks)
		if err != nil {
			return err
		}
		*v.dst = b
	}
	return nil
}

// headKind describes one kind of child head for loadHeads: its values and how chunk keys are named, and how a
// head is decoded (with prefetched chunks; nil fetches them).
type headKind[T any] struct {
	values  []blobNames
	chunkSK func(head item) chunkKeyFunc
	decode  func(ctx context.Context, head item, chunks map[string]item) (T, error)
}

// loadHeads decodes heads with one batched read of all their chunks (none for inline values). A head whose chunks
// are gone (errTornRead: replaced or deleted between the reads) is read again; one deleted meanwhile is left out.
func loadHeads[T any](ctx context.Context, s *Store, k headKind[T], heads []item) ([]T, error) {
	var keys []item
	for _, h := range heads {
		for _, n := range k.values {
			if v := n.view(h); v != nil {
				keys = append(keys, chunkKeys(v, getS(h, AttrPK), k.chunkSK(h))...)
			}
		}
	}
	chunks := map[string]item{}
	if len(keys) > 0 {
		got, err := s.batchGet(ctx, keys)
		if err != nil {
			return nil, err
		}
		chunks = got
	}
	out := make([]T, 0, len(heads))
	for _, h := range heads {
		v, err := k.decode(ctx, h, chunks)
		for attempt := 0; errors.Is(err, errTornRead) && attempt < 5; attempt++ {
			if h, err = s.getItem(ctx, key(getS(h, AttrPK), getS(h, AttrSK))); err != nil {
				return nil, err
			}
			if h == nil {
				break
			}
			v, err = k.decode(ctx, h, nil)
		}
		switch {
		case h == nil:
			continue // deleted with its thread while we read
		case errors.Is(err, errTornRead):
			return nil, tornRead(getS(h, AttrSK))
		case err != nil:
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// dropItems deletes items nothing refers to (chunks of a refused write, a head taken back). A failure only leaves
// garbage that the thread's delete sweeps, so it is logged, not returned.
func (s *Store) dropItems(ctx context.Context, items []item) {
	if len(items) == 0 {
		return
	}
	reqs := make([]types.WriteRequest, len(items))
	for i, it := range items {
		reqs[i] = deleteReq(key(getS(it, AttrPK), getS(it, AttrSK)))
	}
	if err := s.batchWrite(ctx, reqs); err != nil {
		s.log.WarnContext(ctx, "dynamo: dropping unreferenced items failed", "pk", getS(items[0], AttrPK), "err", err)
	}
}

// childInsert is one insert-if-absent of a child head into a live thread's partition.
type childInsert struct {
	threadID string
	head     item   // the whole head; head[callAttr] names this call (a fresh id per call)
	chunks   []item // the chunk items of its values, written before it
	callAttr string
	// replaceable, when set, is a condition under which the put may overwrite an existing item after all (a
	// queue entry past its keep): the insert's condition is attribute_not_exists(pk) OR (replaceable).
	replaceable func(e *expr) string
	what        string
	// epoch, when set, is the incarnation the child belongs to (issue 16 item 2): a thread created again on the
	// id since (its base epoch at or above it) refuses the child as a missing thread does.
	epoch int64
}

// refuses reports whether the thread item th (read after the put) refuses the child: missing, tombstoned, or of a
// later incarnation than the child's.
func (c childInsert) refuses(th item) bool {
	return !live(th) || c.epoch > 0 && !ofThisIncarnation(getN(th, attrBaseEpoch), c.epoch)
}

// insertChild is insert-then-verify, two requests: a PutItem of the head (after its chunks), condition
// attribute_not_exists(pk), then a strongly consistent GetItem of the thread item (one BatchGetItem of thread and
// head when a failed put carried no item). It returns the stored head (ours, or the one already there), whether it
// is ours, and the item ours replaced (only under replaceable, from ALL_OLD; nil otherwise).
//
// The put never overwrites a head (unless replaceable allows it), so a retried insert converges on the first one.
// A failure on a head with our own call id is our put, applied by an attempt whose answer was lost (the SDK
// retried it): the insert answers as the clean call would have. A missing or tombstoned thread refuses the child:
// one this call stored is deleted again (with its chunks), and the answer is not found.
//
// One conditional write cannot check another item, so the thread is checked after the insert rather than before:
// that order leaves no window. A DeleteThread that tombstones the thread before our read is seen by it (we take
// the head back, whether or not the delete's sweep already ran); one that tombstones after our read also sweeps
// after our insert, so it finds the head and removes it. Reading first would leave the interval between the read
// and the insert, in which a whole delete could run and the insert then leave an orphan. What remains: a process
// that dies between the two requests leaves a child on a thread being deleted (the next DeleteThread of that id
// sweeps it), and for a moment between insert and take-back a read may show a child of a dying thread. The
// take-back is an unconditional delete: child ids are derived from the thread (and the run or tool call), so
// nobody else can have written the same key under a thread that is being deleted.
func (s *Store) insertChild(ctx context.Context, c childInsert) (stored item, mine bool, replaced item, err error) {
	pk := threadPK(c.threadID)
	k, tk := key(pk, getS(c.head, AttrSK)), key(pk, threadSK)
	call := getS(c.head, c.callAttr)
	// The stored item can vanish between the failed put and the read that explains it (the thread's delete
	// finishing, and the thread created again): then the put is simply tried again.
	for attempt := 0; ; attempt++ {
		if err := s.writeChunks(ctx, packed{chunks: c.chunks}); err != nil {
			return nil, false, nil, err
		}
		e := newExpr()
		cond := "attribute_not_exists(" + e.n(AttrPK) + ")"
		if c.replaceable != nil {
			cond += " OR (" + c.replaceable(e) + ")"
		}
		in := &dynamodb.PutItemInput{
			TableName:                           aws.String(s.table),
			Item:                                c.head,
			ConditionExpression:                 aws.String(cond),
			ExpressionAttributeNames:            e.attrNames(),
			ExpressionAttributeValues:           e.attrValues(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}
		if c.replaceable != nil {
			in.ReturnValues = types.ReturnValueAllOld
		}
		out, err := s.client.PutItem(ctx, in)
		var old item
		if isConditionFailed(err) {
			var cf *types.ConditionalCheckFailedException
			if errors.As(err, &cf) && getS(cf.Item, c.callAttr) == call {
				err = nil // our own put, applied by an attempt whose answer was lost
			}
			if errors.As(err, &cf) {
				old = cf.Item
			}
		}
		if err == nil {
			th, err := s.getItem(ctx, tk)
			if err != nil {
				// The head stays: the caller's retry converges on it, or the thread's delete sweeps it.
				return nil, false, nil, err
			}
			if c.refuses(th) {
				s.dropItems(context.WithoutCancel(ctx), append([]item{c.head}, c.chunks...))
				return nil, false, nil, threadNotFound(c.threadID)
			}
			if out != nil && len(out.Attributes) > 0 {
				replaced = out.Attributes
			}
			return c.head, true, replaced, nil
		}
		if !isConditionFailed(err) {
			// The put may or may not have applied; its chunks stay (it may need them), as for messages.
			return nil, false, nil, storeErr(err, "create "+c.what)
		}
		var th item
		if len(old) > 0 {
			th, err = s.getItem(ctx, tk)
		} else {
			var got map[string]item
			got, err = s.batchGet(ctx, []item{k, tk})
			old, th = got[itemKey(k)], got[itemKey(tk)]
		}
		if err != nil {
			return nil, false, nil, err
		}
		mine := getS(old, c.callAttr) == call
		if !mine {
			s.dropItems(ctx, c.chunks) // ours, and no head points at them
		}
		if c.refuses(th) {
			if mine {
				s.dropItems(context.WithoutCancel(ctx), append([]item{c.head}, c.chunks...))
			}
			return nil, false, nil, threadNotFound(c.threadID)
		}
		if len(old) > 0 {
			return old, mine, nil, nil
		}
		if attempt == 3 {
			return nil, false, nil, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable,
				"%s %s keeps appearing and vanishing", c.what, getS(c.head, AttrSK))
		}
	}
}
