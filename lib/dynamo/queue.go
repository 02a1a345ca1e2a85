package dynamo

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// Queue entry attributes, besides the shared threadId, messageId, seq, role, status, createdAt, expiresTime (the
// exact ExpiresAt of a taken entry), ownedBy, the TTL expiresAt, epoch (the incarnation it belongs to,
// incarnation.go), and the index keys dueShard/dueAt (the entry's CreatedAt, present while queued). The message ({"parts":[…],"metadata":…}, as a message head stores it) is the
// head's large value.
const (
	attrQueueKind = "queueKind"
	attrJobID     = "jobId"
	attrTakenAt   = "takenAt"
	// attrEnqueueID names the call that stored the entry (a fresh id per call), as createId does for interrupts.
	attrEnqueueID = "enqueueId"
	// attrQueueSeq is the thread item's queue counter: each Enqueue takes the next seq from it with ADD.
	attrQueueSeq = "queueSeq"
)

func queueItem(q agent.QueuedMessage) item {
	it := key(threadPK(q.ThreadID), queueSK(q.Message.ID))
	it[attrKind] = avS("queued")
	it[attrThreadID] = avS(q.ThreadID)
	it[attrMessageID] = avS(q.Message.ID)
	it[attrRole] = avS(string(q.Message.Role))
	it[attrQueueKind] = avS(string(q.Kind))
	it[attrStatus] = avS(string(agent.QueueQueued))
	it[attrCreatedAt] = avT(q.CreatedAt)
	for a, v := range map[string]string{attrChildOwner: q.Owner, attrJobID: q.JobID} {
		if v != "" {
			it[a] = avS(v)
		}
	}
	// Created queued (QueuedMessage.Check): the entry enters the dueWork index.
	it[AttrDueShard] = avS(queueShard(q.ThreadID))
	it[AttrDueAt] = avT(q.CreatedAt)
	return it
}

// decodeQueuedFields reads everything but the message's parts and metadata.
func decodeQueuedFields(it item) agent.QueuedMessage {
	return agent.QueuedMessage{
		ThreadID:  getS(it, attrThreadID),
		Seq:       getN(it, attrSeq),
		Kind:      agent.QueueKind(getS(it, attrQueueKind)),
		Message:   agent.Message{ID: getS(it, attrMessageID), Role: agent.Role(getS(it, attrRole))},
		Owner:     getS(it, attrChildOwner),
		JobID:     getS(it, attrJobID),
		Status:    agent.QueueStatus(getS(it, attrStatus)),
		CreatedAt: getT(it, attrCreatedAt),
		TakenAt:   getT(it, attrTakenAt),
		ExpiresAt: getT(it, attrExpires),
	}
}

func (s *Store) decodeQueued(ctx context.Context, head item, chunks map[string]item) (agent.QueuedMessage, error) {
	q := decodeQueuedFields(head)
	if q.Status == agent.QueueTaken {
		return q, nil // its message was dropped by the take
	}
	b, err := s.unpack(ctx, head, getS(head, AttrPK), queueChunkSK(q.Message.ID), chunks)
	if err != nil {
		return agent.QueuedMessage{}, err
	}
	rec, err := decodeMessage(head, b)
	if err != nil {
		return agent.QueuedMessage{}, err
	}
	q.Message.Parts, q.Message.Metadata = rec.Message.Parts, rec.Message.Metadata
	return q, nil
}

// loadQueued decodes entry heads with one batched read of all their chunks.
func (s *Store) loadQueued(ctx context.Context, heads []item) ([]agent.QueuedMessage, error) {
	return loadHeads(ctx, s, headKind[agent.QueuedMessage]{
		values:  []blobNames{inputBlob},
		chunkSK: func(h item) chunkKeyFunc { return queueChunkSK(getS(h, attrMessageID)) },
		decode:  s.decodeQueued,
	}, heads)
}

func queuedNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "queued message %s of thread %q not found", id, threadID)
}

// gone reports whether a stored entry no longer holds its id for an enqueue at now: taken, and past its keep (the
// TTL sweeper may not have removed it yet).
func gone(it item, now time.Time) bool {
	return getS(it, attrStatus) == string(agent.QueueTaken) && getT(it, attrExpires).Before(now)
}

// queryQueue reads the thread's Q# entries (strongly consistent), only the queued ones when queued is set (a
// filter: it saves transfer, not read units), projected to attrs when given.
func (s *Store) queryQueue(ctx context.Context, threadID string, queued bool, attrs []string, fn func(item) error) error {
	e := newExpr()
	in := &dynamodb.QueryInput{
		KeyConditionExpression: aws.String(e.n(AttrPK) + " = " + e.v(avS(threadPK(threadID))) + " AND begins_with(" +
			e.n(AttrSK) + ", " + e.v(avS(prefixQ)) + ")"),
	}
	if queued {
		in.FilterExpression = aws.String(e.n(attrStatus) + " = " + e.v(avS(string(agent.QueueQueued))))
	}
	if len(attrs) > 0 {
		names := make([]string, len(attrs))
		for i, a := range attrs {
			names[i] = e.n(a)
		}
		in.ProjectionExpression = aws.String(strings.Join(names, ", "))
	}
	in.ExpressionAttributeNames = e.attrNames()
	in.ExpressionAttributeValues = e.attrValues()
	return s.query(ctx, in, fn)
}

// Enqueue is four requests for a new entry:
//
//  1. a strongly consistent Query of the thread's Q# entries, projected to (sk, status, expiresTime, epoch): it
//     finds an entry stored under the id (then one BatchGetItem of it and the thread returns it, created = false,
//     or not found for a thread that is gone or of another incarnation than q.Epoch) and counts the queued ones
//     for the bound (queue_full, nothing written);
//  2. UpdateItem of the thread: ADD queueSeq 1, condition attribute_exists(pk) AND attribute_not_exists(deleting),
//     and with a q.Epoch, (attribute_not_exists(baseEpoch) OR baseEpoch < :e) AND epoch >= :e; ALL_NEW: the
//     entry's seq, and the check that the thread is live and of the enqueuer's incarnation (unknown, tombstoned,
//     gone or created again since: not found, nothing written);
//  3. PutItem of the entry (after the chunks of a large message), condition attribute_not_exists(pk) OR (status =
//     taken AND expiresTime < :createdAt) OR, in a thread created again, an entry of an earlier incarnation,
//     carrying enqueueId and epoch (q.Epoch, or with none named one above the thread's base): insert-if-absent,
//     where a taken entry past its keep counts as absent (and its chunks are dropped after the overwrite,
//     ALL_OLD);
//  4. GetItem of the thread, as insertChild does for every child: a thread tombstoned meanwhile, or created again
//     on the id since step 2 (its base at or above the entry's epoch), takes the entry back (not found).
//
// Incarnations (issue 16 item 2): step 4 leaves an entry of an earlier incarnation in the thread's partition only
// when the process dies between 3 and 4, as it does for a tombstone. Such an entry is never read: ListQueued keeps
// only entries above the thread's base, step 1 treats one stored under the id as absent, and the next delete of
// the id sweeps it. Until then it counts toward the bound, and stays in dueWork (ListQueuedThreads may name the
// thread: its callers read ListQueued, which finds nothing).
//
// A concurrent enqueue of the same id loses step 3 and returns the winner's entry (created = false; the seq it
// took is a gap); an attempt whose answer was lost is recognised by its enqueueId and answers created = true.
//
// The bound is best-effort under concurrency: the count (1) and the insert (3) are separate requests, and no
// single-item condition can count the items of a partition (DESIGN principle 2: no transactions), so concurrent
// senders that all count max-1 may all insert: the queue can overshoot max by the number of concurrent senders
// (one user's tabs; steers of one thread's jobs). Sequential enqueues never overshoot. A thread being deleted whose
// queue is still full answers queue_full rather than not found.
func (s *Store) Enqueue(ctx context.Context, q agent.QueuedMessage, max int) (agent.QueuedMessage, bool, error) {
	if err := q.Check(); err != nil {
		return agent.QueuedMessage{}, false, err
	}
	if max <= 0 {
		max = agent.DefaultMaxQueued
	}
	body, err := encodeBody(q.Message)
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	pk := threadPK(q.ThreadID)
	k, tk := key(pk, queueSK(q.Message.ID)), key(pk, threadSK)
	head := queueItem(q)
	head[attrEnqueueID] = avS(s.ids.New("q"))
	head[attrSeq] = avN(1 << 62) // the widest seq, for the size guard; the real one is set below
	if err := guardSize(head, maxChildFieldBytes, "queued message"); err != nil {
		return agent.QueuedMessage{}, false, err
	}

	queued, stored := 0, false
	err = s.queryQueue(ctx, q.ThreadID, false, []string{AttrSK, attrStatus, attrExpires, attrEpoch}, func(it item) error {
		switch {
		case getS(it, AttrSK) == queueSK(q.Message.ID):
			stored = !gone(it, q.CreatedAt)
		case getS(it, attrStatus) == string(agent.QueueQueued):
			queued++
		}
		return nil
	})
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	if stored {
		got, err := s.batchGet(ctx, []item{k, tk})
		if err != nil {
			return agent.QueuedMessage{}, false, err
		}
		th := got[itemKey(tk)]
		if !live(th) || !incarnationAllows(th, q.Epoch) {
			return agent.QueuedMessage{}, false, threadNotFound(q.ThreadID)
		}
		if old, ok := got[itemKey(k)]; ok && !gone(old, q.CreatedAt) &&
			ofThisIncarnation(getN(th, attrBaseEpoch), getN(old, attrEpoch)) {
			list, err := s.loadQueued(ctx, []item{old})
			if err != nil {
				return agent.QueuedMessage{}, false, err
			}
			if len(list) == 1 {
				return list[0], false, nil
			}
		}
		// Gone between the two reads (a thread deleted and created again), or an entry of an earlier incarnation:
		// enqueue it afresh.
	}
	if queued >= max {
		return agent.QueuedMessage{}, false, agent.E(agent.KindConflict, agent.CodeQueueFull,
			"thread %q has %d queued messages already", q.ThreadID, queued)
	}

	th, err := s.nextQueueSeq(ctx, q.ThreadID, q.Epoch)
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	base := getN(th, attrBaseEpoch)
	epoch := q.Epoch
	if epoch == 0 { // none named: the incarnation the seq write found
		epoch = getN(th, attrEpoch)
		if epoch <= base {
			epoch = base + 1 // a thread created again that no run claimed yet
		}
	}
	head[attrSeq], head[attrEpoch] = avN(getN(th, attrQueueSeq)), avN(epoch)
	p, err := s.pack(body, true, pk, queueChunkSK(q.Message.ID), nil)
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	for a, v := range p.attrs {
		head[a] = v
	}
	got, mine, replaced, err := s.insertChild(ctx, childInsert{threadID: q.ThreadID, head: head, chunks: p.chunks,
		callAttr: attrEnqueueID, what: "queued message", epoch: epoch,
		replaceable: func(e *expr) string {
			cond := e.n(attrStatus) + " = " + e.v(avS(string(agent.QueueTaken))) + " AND " + e.n(attrExpires) + " < " +
				e.v(avT(q.CreatedAt))
			if base > 0 { // an entry of an earlier incarnation counts as absent (DynamoDB refuses redundant parentheses)
				cond = "(" + cond + ") OR attribute_not_exists(" + e.n(attrEpoch) + ") OR " + e.n(attrEpoch) + " <= " + e.v(avN(base))
			}
			return cond
		}})
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	if len(replaced) > 0 {
		s.dropChunks(ctx, replaced, pk, queueChunkSK(q.Message.ID), p.ver)
	}
	if mine {
		out := decodeQueuedFields(head)
		out.Message.Parts, out.Message.Metadata = q.Message.Parts, q.Message.Metadata
		return out, true, nil
	}
	list, err := s.loadQueued(ctx, []item{got})
	if err != nil {
		return agent.QueuedMessage{}, false, err
	}
	if len(list) == 0 {
		return agent.QueuedMessage{}, false, threadNotFound(q.ThreadID) // deleted with its thread between our reads
	}
	return list[0], false, nil
}

// nextQueueSeq takes the thread's next queue position: one UpdateItem ADD queueSeq 1 on a live thread of the
// incarnation epoch names (0: any). It returns the thread item as updated (queueSeq, epoch, baseEpoch).
func (s *Store) nextQueueSeq(ctx context.Context, threadID string, epoch int64) (item, error) {
	e := newExpr()
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND " + notDeleting(e)
	if epoch > 0 {
		cond += " AND (attribute_not_exists(" + e.n(attrBaseEpoch) + ") OR " + e.n(attrBaseEpoch) + " < " + e.v(avN(epoch)) +
			") AND " + e.n(attrEpoch) + " >= " + e.v(avN(epoch))
	}
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(threadID), threadSK),
		UpdateExpression:          aws.String("ADD " + e.n(attrQueueSeq) + " " + e.v(avN(1))),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return nil, threadNotFound(threadID)
	}
	if err != nil {
		return nil, storeErr(err, "enqueue")
	}
	return res.Attributes, nil
}

// incarnationAllows reports whether epoch (an enqueuer's, 0: none named) is of the incarnation of the live thread
// item th: above its base and not above its epoch.
func incarnationAllows(th item, epoch int64) bool {
	return epoch == 0 || getN(th, attrBaseEpoch) < epoch && epoch <= getN(th, attrEpoch)
}

// ListQueued is one strongly consistent Query of the thread's Q# entries, filtered to the queued ones (plus one
// BatchGetItem for chunked messages), ordered by seq. When it finds entries, one GetItem of the thread's base
// epoch keeps only those of the thread's incarnation (incarnation.go); an empty queue, most turns' answer, costs
// the Query alone.
func (s *Store) ListQueued(ctx context.Context, threadID string) ([]agent.QueuedMessage, error) {
	var heads []item
	if err := s.queryQueue(ctx, threadID, true, nil, func(it item) error {
		heads = append(heads, it)
		return nil
	}); err != nil {
		return nil, err
	}
	if len(heads) > 0 {
		var err error
		if heads, err = s.readBase(ctx, threadID).keep(heads, attrEpoch); err != nil {
			return nil, err
		}
	}
	out, err := s.loadQueued(ctx, heads)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// TakeQueued is the compare-and-set, one UpdateItem on the entry:
//
//	condition: #status = :queued
//	update:    SET status = taken, takenAt = :now, expiresTime = :expires, expiresAt = :ttl
//	           REMOVE dueShard, dueAt, body, enc, ver, chunks
//	returns:   ALL_OLD (on a failed condition too)
//
// Removing the index keys takes the entry out of dueWork in the same write. The message's body goes too: nothing
// reads a taken entry's message, and every Query of the thread's queue (two per turn) pays read units for what the
// entries hold, so a thread's past steers must not make its turns dearer (a taken entry is ~200 bytes); the
// chunks of a large message are deleted after the take (one BatchWriteItem; a chunk left by a failure stays,
// unreferenced, until the thread's delete); expiresAt is the table's TTL, so
// DynamoDB removes the entry once its keep is over. It reads no base epoch: its callers take only ids ListQueued
// returned, which never include an entry of an earlier incarnation. The condition fails on a missing item too (it has no status):
// the failure's item (or one GetItem) tells not found from taken, and taking a taken entry is a no-op. A chunked
// message's chunks get the same TTL, one UpdateItem each (best effort: a chunk left behind goes with the thread).
func (s *Store) TakeQueued(ctx context.Context, threadID, messageID string, now time.Time) error {
	pk := threadPK(threadID)
	k := key(pk, queueSK(messageID))
	expires := now.Add(agent.DefaultQueueKeep)
	ttl := avN(ttlSeconds(expires))
	e := newExpr()
	update := "SET " + e.n(attrStatus) + " = " + e.v(avS(string(agent.QueueTaken))) + ", " +
		e.n(attrTakenAt) + " = " + e.v(avT(now)) + ", " + e.n(attrExpires) + " = " + e.v(avT(expires)) + ", " +
		e.n(AttrExpiresAt) + " = " + e.v(ttl) + " REMOVE " + e.n(AttrDueShard) + ", " + e.n(AttrDueAt) + ", " +
		e.n(inputBlob.body) + ", " + e.n(inputBlob.enc) + ", " + e.n(inputBlob.ver) + ", " + e.n(inputBlob.chunks)
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(e.n(attrStatus) + " = " + e.v(avS(string(agent.QueueQueued)))),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllOld, // the chunks the removed message had
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		s.deleteChunks(ctx, res.Attributes, pk, queueChunkSK(messageID))
		return nil
	}
	if !isConditionFailed(err) {
		return storeErr(err, "take queued")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return err
	}
	if len(old) == 0 {
		return queuedNotFound(threadID, messageID)
	}
	return nil // taken already
}

// deleteChunks deletes the chunks of head's value (a taken entry's message, which the take removed from the
// head). A failure is logged: the chunk then stays until the thread's delete (nothing points at it).
func (s *Store) deleteChunks(ctx context.Context, head item, pk string, chunkSK chunkKeyFunc) {
	keys := chunkKeys(head, pk, chunkSK)
	if len(keys) == 0 {
		return
	}
	reqs := make([]types.WriteRequest, len(keys))
	for i, k := range keys {
		reqs[i] = deleteReq(k)
	}
	if err := s.batchWrite(ctx, reqs); err != nil {
		s.log.WarnContext(ctx, "dynamo: deleting a taken entry's chunks failed", "pk", pk, "err", err)
	}
}

// ListQueuedThreads reads the sparse dueWork index, keys only: one Query per queue shard (16) for dueAt <
// :before. Only queued entries carry the index keys, so taken ones cost the read nothing; the thread id is the
// nominee's partition key, so nothing else is read. The answer is the index's: in DynamoDB (eventually consistent
// index) it may name a thread whose entries were taken a moment ago, or miss an entry queued a moment ago
// (dynalite's index is synchronous); callers read ListQueued, which is exact. Each thread is named once.
func (s *Store) ListQueuedThreads(ctx context.Context, before time.Time, limit int) ([]string, error) {
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	out := []string{}
	seen := map[string]bool{}
	ix := sparseIndex{name: IndexDueWork, shardAttr: AttrDueShard, shardPrefix: prefixQ, sortAttr: AttrDueAt,
		shards: DefaultDueShards, exact: true}
	err := s.nominate(ctx, ix, before, limit, func(nominees []item) (int, error) {
		n := 0
		for _, it := range nominees {
			id, ok := strings.CutPrefix(getS(it, AttrPK), "THREAD#")
			if ok && !seen[id] {
				seen[id] = true
				out = append(out, id)
				n++
			}
		}
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	return out[:min(len(out), limit)], nil
}
