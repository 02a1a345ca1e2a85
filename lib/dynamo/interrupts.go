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

// Interrupt item attributes, besides the shared id, threadId, runId, epoch, status, createdAt and expiresTime (the
// exact expiry). AttrExpiresAt, the table's TTL, is set by the resolve to agent.DefaultResolvedInterruptKeep after
// it (REVIEW S7: a thread's interrupt reads then grow with its recent questions, not with all it ever asked); a
// pending interrupt has none (an expired one is resolved by the reaper first). Chunk items of a large input or
// response carry no TTL: they are never read without their head, and go with the thread's delete.
const (
	attrMessageID     = "messageId"
	attrInterruptKind = "interruptKind" // "kind" is every item's type tag
	attrToolCallID    = "toolCallId"
	attrToolName      = "toolName"
	attrSignature     = "signature"
	attrResolvedAt    = "resolvedAt"
	// attrCreateID and attrResolveID name the call that created, and the one that resolved, the interrupt (a
	// fresh id per call). A retry whose first attempt applied and lost its answer fails its condition on its own
	// write; these tell it so, and it answers as the clean call would have (created, or resolved).
	attrCreateID  = "createId"
	attrResolveID = "resolveId"
)

func interruptItem(in agent.Interrupt) item {
	it := key(threadPK(in.ThreadID), intMsgSK(in.MessageID, in.ID))
	it[attrKind] = avS("interrupt")
	it[attrID] = avS(in.ID)
	it[attrThreadID] = avS(in.ThreadID)
	it[attrRunID] = avS(in.RunID)
	it[attrEpoch] = avN(in.Epoch)
	it[attrMessageID] = avS(in.MessageID)
	it[attrInterruptKind] = avS(string(in.Kind))
	it[attrToolCallID] = avS(in.ToolCallID)
	it[attrToolName] = avS(in.ToolName)
	it[attrSignature] = avS(in.Signature)
	it[attrStatus] = avS(string(in.Status))
	it[attrCreatedAt] = avT(in.CreatedAt)
	it[attrExpires] = avT(in.ExpiresAt)
	// Created pending (checkInterrupt): the interrupt enters the pending index.
	it[AttrPendingShard] = avS(pendingShard(in.ThreadID))
	it[AttrPendingExpiry] = avT(in.ExpiresAt)
	return it
}

// decodeInterruptFields reads everything but the two values.
func decodeInterruptFields(it item) agent.Interrupt {
	return agent.Interrupt{
		ID:         getS(it, attrID),
		ThreadID:   getS(it, attrThreadID),
		RunID:      getS(it, attrRunID),
		Epoch:      getN(it, attrEpoch),
		MessageID:  getS(it, attrMessageID),
		Kind:       agent.InterruptKind(getS(it, attrInterruptKind)),
		ToolCallID: getS(it, attrToolCallID),
		ToolName:   getS(it, attrToolName),
		Signature:  getS(it, attrSignature),
		Status:     agent.InterruptStatus(getS(it, attrStatus)),
		CreatedAt:  getT(it, attrCreatedAt),
		ExpiresAt:  getT(it, attrExpires),
		ResolvedAt: getT(it, attrResolvedAt),
	}
}

// decodeInterrupt reads a head and its two values; chunks holds prefetched chunk items (nil fetches them). A
// missing chunk is errTornRead: the values never change once written, so only a delete of the thread removes
// chunks a head names.
func (s *Store) decodeInterrupt(ctx context.Context, head item, chunks map[string]item) (agent.Interrupt, error) {
	in := decodeInterruptFields(head)
	err := s.unpackValues(ctx, head, intChunkSK(in.ID), chunks, valueSlot{inputBlob, &in.Input}, valueSlot{responseBlob, &in.Response})
	return in, err
}

// loadInterrupts decodes heads with one batched read of all their chunks (none for inline values). A head whose
// chunks are gone is read again; one deleted meanwhile is left out.
func (s *Store) loadInterrupts(ctx context.Context, heads []item) ([]agent.Interrupt, error) {
	return loadHeads(ctx, s, headKind[agent.Interrupt]{
		values:  []blobNames{inputBlob, responseBlob},
		chunkSK: func(h item) chunkKeyFunc { return intChunkSK(getS(h, attrID)) },
		decode:  s.decodeInterrupt,
	}, heads)
}

func interruptNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeInterruptNotFound, "interrupt %s of thread %q not found", id, threadID)
}

func alreadyResolved(in agent.Interrupt) error {
	return agent.E(agent.KindConflict, agent.CodeAlreadyResolved, "interrupt %s was already resolved (%s)", in.ID, in.Status)
}

// CreateInterrupt is insert-then-verify (insertChild), two requests:
//
//  1. PutItem of the head (after the chunks of a large input), condition attribute_not_exists(pk): it never
//     overwrites an interrupt, so a retried insert converges on the first one (ALL_OLD returns it with the
//     failure; dynalite's failure carries nothing, and the next read fetches it). The head carries createId, a
//     fresh id per call: a failure on a head with our own createId is our put applied by an attempt whose answer
//     was lost, and the call answers created = true as the clean one would have;
//  2. GetItem of the thread item (strongly consistent; one BatchGetItem of thread and interrupt when the failure
//     carried no item). A missing or tombstoned thread refuses the interrupt: one this call created is deleted
//     again (with its chunks) and the answer is not found.
//
// insertChild says why the thread is checked after the insert, not before: that order leaves no window in which
// an interrupt can outlive its thread's delete.
func (s *Store) CreateInterrupt(ctx context.Context, in agent.Interrupt) (agent.Interrupt, bool, error) {
	if err := in.Check(); err != nil {
		return agent.Interrupt{}, false, err
	}
	pk := threadPK(in.ThreadID)
	head := interruptItem(in)
	head[attrCreateID] = avS(s.ids.New("c"))
	if err := guardSize(head, maxChildFieldBytes, "interrupt"); err != nil {
		return agent.Interrupt{}, false, err
	}
	chunks, err := s.packValue(inputBlob, head, pk, intChunkSK(in.ID), in.Input)
	if err != nil {
		return agent.Interrupt{}, false, err
	}
	stored, mine, _, err := s.insertChild(ctx, childInsert{threadID: in.ThreadID, head: head, chunks: chunks,
		callAttr: attrCreateID, what: "interrupt"})
	if err != nil {
		return agent.Interrupt{}, false, err
	}
	if mine {
		got := decodeInterruptFields(head)
		got.Input = in.Input
		return got, true, nil
	}
	list, err := s.loadInterrupts(ctx, []item{stored})
	if err != nil {
		return agent.Interrupt{}, false, err
	}
	if len(list) == 0 { // deleted with its thread between our reads
		return agent.Interrupt{}, false, threadNotFound(in.ThreadID)
	}
	return list[0], false, nil
}

// GetInterrupt is one strongly consistent GetItem (plus one BatchGetItem when a value is chunked), and a second
// GetItem of the older key (INT#<id>) when the first finds nothing (see legacyInterrupts).
func (s *Store) GetInterrupt(ctx context.Context, threadID, messageID, id string) (agent.Interrupt, error) {
	base := s.readBase(ctx, threadID)
	head, err := s.getItem(ctx, key(threadPK(threadID), intMsgSK(messageID, id)))
	if err == nil && head == nil {
		head, err = s.getItem(ctx, key(threadPK(threadID), intSK(id)))
		if head != nil && getS(head, attrMessageID) != messageID {
			head = nil
		}
	}
	if err != nil {
		_, _ = base.wait()
		return agent.Interrupt{}, err
	}
	if kept, err := base.keep([]item{head}, attrEpoch); err != nil {
		return agent.Interrupt{}, err
	} else if len(kept) == 0 {
		head = nil // of an earlier incarnation of the thread
	}
	if head == nil {
		return agent.Interrupt{}, interruptNotFound(threadID, id)
	}
	got, err := s.loadInterrupts(ctx, []item{head})
	if err != nil {
		return agent.Interrupt{}, err
	}
	if len(got) == 0 {
		return agent.Interrupt{}, interruptNotFound(threadID, id)
	}
	return got[0], nil
}

// ListMessageInterrupts is one strongly consistent Query over the message's heads, begins_with(sk,
// "INTM#<messageId>#") (plus one BatchGetItem for chunked values), ordered by creation, then id: it reads that
// message's interrupts and no other's (REVIEW S7). A message with none there is looked up among the interrupts an
// older build stored (legacyInterrupts): one more Query, which finds nothing once those are gone.
func (s *Store) ListMessageInterrupts(ctx context.Context, threadID, messageID string) ([]agent.Interrupt, error) {
	base := s.readBase(ctx, threadID)
	heads, err := s.interruptHeads(ctx, threadID, intMsgPrefix(messageID), messageID)
	if err == nil && len(heads) == 0 {
		heads, err = s.interruptHeads(ctx, threadID, prefixInt, messageID)
	}
	if err != nil {
		_, _ = base.wait()
		return nil, err
	}
	return s.keptInterrupts(ctx, base, heads)
}

// legacyInterrupts: before REVIEW S7 an interrupt's key was INT#<interruptId>, so a message's interrupts could be
// found only by reading the thread's every one. This build writes INTM#<messageId>#<interruptId> and reads the old
// shape only where the new one finds nothing: GetInterrupt and ResolveInterrupt try INT#<id> after a miss, and
// ListMessageInterrupts queries begins_with(sk, "INT#") (old heads only: INTC# chunks and INTM# heads sort
// elsewhere) when the message has no new-shape interrupt. No build writes INT# heads any more; a pending one
// ends within DefaultInterruptTTL (answered, settled or expired by the reaper, which finds it through the pending
// index as before) and a resolved one leaves by TTL a day after its answer, after which that Query reads nothing.

// interruptHeads reads the heads under one prefix of the thread, keeping those of messageID ("" keeps all).
func (s *Store) interruptHeads(ctx context.Context, threadID, prefix, messageID string) ([]item, error) {
	var heads []item
	err := s.queryPrefix(ctx, threadPK(threadID), prefix, false, func(it item) error {
		if messageID == "" || getS(it, attrMessageID) == messageID {
			heads = append(heads, it)
		}
		return nil
	})
	return heads, err
}

// keptInterrupts drops the heads of an earlier incarnation of the thread, decodes the rest and orders them by
// creation, then id.
func (s *Store) keptInterrupts(ctx context.Context, base *baseRead, heads []item) ([]agent.Interrupt, error) {
	heads, err := base.keep(heads, attrEpoch)
	if err != nil {
		return nil, err
	}
	out, err := s.loadInterrupts(ctx, heads)
	if err != nil {
		return nil, err
	}
	sortChildren(out, func(in agent.Interrupt) (time.Time, string, string) { return in.CreatedAt, in.ThreadID, in.ID })
	return out, nil
}

// ListInterrupts reads the thread's whole history: one Query over its INTM# heads and one over the INT# heads an
// older build stored (plus one BatchGetItem for chunked values), ordered by creation, then id. No turn, view or
// reaper calls it (ListMessageInterrupts).
func (s *Store) ListInterrupts(ctx context.Context, threadID string) ([]agent.Interrupt, error) {
	base := s.readBase(ctx, threadID)
	heads, err := s.interruptHeads(ctx, threadID, prefixIntMsg, "")
	if err == nil {
		var old []item
		old, err = s.interruptHeads(ctx, threadID, prefixInt, "")
		heads = append(heads, old...)
	}
	if err != nil {
		_, _ = base.wait()
		return nil, err
	}
	return s.keptInterrupts(ctx, base, heads)
}

// sortChildren orders a thread's children (interrupts, jobs) by a time, then thread and id.
func sortChildren[T any](list []T, by func(T) (at time.Time, threadID, id string)) {
	sort.Slice(list, func(i, j int) bool {
		at, th, id := by(list[i])
		bt, th2, id2 := by(list[j])
		if !at.Equal(bt) {
			return at.Before(bt)
		}
		if th != th2 {
			return th < th2
		}
		return id < id2
	})
}

// ResolveInterrupt is the compare-and-set, one UpdateItem on the interrupt head (INTM#<messageId>#<id>; when that
// finds no interrupt, a second on INT#<id>, where an older build stored it: legacyInterrupts):
//
//	condition: #status = :pending AND messageId = :message
//	update:    SET status = :status, resolvedAt = :now, resolveId = :call, expiresAt = :now + keep (TTL)
//	           [, respBody | respVer, respChunks [, respEnc]]
//	           REMOVE pendingShard, pendingExpiresAt
//	returns:   ALL_NEW; on a failed condition ALL_OLD
//
// Removing the index keys takes the interrupt out of the pending index in the same write. The condition fails on
// a missing item too (it has no status), so an unknown interrupt is never created; the failure's item (or one
// GetItem, when it carries none) tells not found from already resolved, and a resolved one is returned as stored
// with CodeAlreadyResolved. The write also sets resolveId, a fresh id per call: a failure on a head carrying our
// own resolveId is this very resolve, applied by an attempt whose answer was lost (the SDK retried it), and it
// answers success as the clean call would have, so of concurrent resolves exactly one succeeds even under
// retries. A large response has its chunks written first; a refused write deletes them unless the stored head is
// our own lost attempt.
func (s *Store) ResolveInterrupt(ctx context.Context, req agent.ResolveRequest) (agent.Interrupt, error) {
	if err := req.Check(); err != nil {
		return agent.Interrupt{}, err
	}
	pk := threadPK(req.ThreadID)
	resp := item{}
	chunks, err := s.packValue(responseBlob, resp, pk, intChunkSK(req.ID), req.Response)
	if err != nil {
		return agent.Interrupt{}, err
	}
	if err := s.writeChunks(ctx, packed{chunks: chunks}); err != nil {
		return agent.Interrupt{}, err
	}
	call := s.ids.New("r")
	e := newExpr()
	sets := []string{
		e.n(attrStatus) + " = " + e.v(avS(string(req.Status))),
		e.n(attrResolvedAt) + " = " + e.v(avT(req.Now)),
		e.n(attrResolveID) + " = " + e.v(avS(call)),
		e.n(AttrExpiresAt) + " = " + e.v(avN(ttlSeconds(req.Now.Add(agent.DefaultResolvedInterruptKeep)))),
	}
	for a, v := range resp {
		sets = append(sets, e.n(a)+" = "+e.v(v))
	}
	sort.Strings(sets[4:]) // a stable request, for the recorded tests and for people reading logs
	update := "SET " + strings.Join(sets, ", ") + " REMOVE " + e.n(AttrPendingShard) + ", " + e.n(AttrPendingExpiry)
	// The message is in the new key; an interrupt an older build stored (legacyInterrupts) names it only here.
	cond := e.n(attrStatus) + " = " + e.v(avS(string(agent.InterruptPending))) + " AND " + e.n(attrMessageID) + " = " + e.v(avS(req.MessageID))
	var old item
	for _, sk := range []string{intMsgSK(req.MessageID, req.ID), intSK(req.ID)} {
		k := key(pk, sk)
		res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                           aws.String(s.table),
			Key:                                 k,
			UpdateExpression:                    aws.String(update),
			ConditionExpression:                 aws.String(cond),
			ExpressionAttributeNames:            e.attrNames(),
			ExpressionAttributeValues:           e.attrValues(),
			ReturnValues:                        types.ReturnValueAllNew,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if err == nil {
			got, err := s.loadInterrupts(ctx, []item{res.Attributes})
			if err != nil {
				return agent.Interrupt{}, err
			}
			if len(got) == 0 {
				return agent.Interrupt{}, interruptNotFound(req.ThreadID, req.ID) // deleted with its thread meanwhile
			}
			return got[0], nil
		}
		if !isConditionFailed(err) {
			return agent.Interrupt{}, storeErr(err, "resolve interrupt")
		}
		if old, err = s.failedItem(ctx, err, k); err != nil {
			return agent.Interrupt{}, err
		}
		if len(old) > 0 && getS(old, attrMessageID) != req.MessageID {
			old = nil // another message's interrupt (older key shape): not this one
		}
		if len(old) > 0 {
			break
		}
	}
	mine := len(old) > 0 && getS(old, attrResolveID) == call
	if !mine {
		s.dropItems(ctx, chunks) // ours, and no head points at them
	}
	if len(old) == 0 {
		return agent.Interrupt{}, interruptNotFound(req.ThreadID, req.ID)
	}
	got, err := s.loadInterrupts(ctx, []item{old})
	if err != nil {
		return agent.Interrupt{}, err
	}
	if len(got) == 0 {
		return agent.Interrupt{}, interruptNotFound(req.ThreadID, req.ID)
	}
	if mine {
		return got[0], nil // our own resolve, applied by an attempt whose answer was lost
	}
	return got[0], alreadyResolved(got[0])
}

// ListExpiredInterrupts reads the sparse pending index, keys only: one Query per shard (16) for
// pendingExpiresAt < :before. Only pending interrupts carry the index keys, so resolved ones cost the read
// nothing. The nominees are then read from the table with strongly consistent BatchGetItem requests (one per 100,
// plus one for the chunks of large inputs, if any) and only those still pending with an expiry before `before`
// are returned: so a resolve is never undone by a lagging index (the answer is exact for resolves), while an
// interrupt created a moment ago may be missing until the index catches up (DynamoDB's GSIs are eventually
// consistent; dynalite's are not). The answers remain nominations: callers resolve by compare-and-set. Results
// are ordered by expiry, then thread and id. Interrupts of a thread being deleted are listed until its delete
// removes them; resolving one is harmless (the delete removes it all the same).
func (s *Store) ListExpiredInterrupts(ctx context.Context, before time.Time, limit int) ([]agent.Interrupt, error) {
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	out := []agent.Interrupt{}
	ix := sparseIndex{name: IndexPending, shardAttr: AttrPendingShard, shardPrefix: prefixInt, sortAttr: AttrPendingExpiry,
		shards: DefaultInterruptShards, exact: true}
	err := s.nominate(ctx, ix, before, limit, func(nominees []item) (int, error) {
		got, err := s.batchGet(ctx, nominees)
		if err != nil {
			return 0, err
		}
		var heads []item
		for _, it := range got {
			if getS(it, attrStatus) == string(agent.InterruptPending) && getT(it, attrExpires).Before(before) {
				heads = append(heads, it)
			}
		}
		list, err := s.loadInterrupts(ctx, heads)
		out = append(out, list...)
		return len(list), err
	})
	if err != nil {
		return nil, err
	}
	sortChildren(out, func(in agent.Interrupt) (time.Time, string, string) { return in.ExpiresAt, in.ThreadID, in.ID })
	return out[:min(len(out), limit)], nil
}
