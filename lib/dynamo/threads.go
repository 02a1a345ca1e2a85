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

// Thread item attributes (besides pk/sk and the index attributes named in store.go).
const (
	attrID          = "id"
	attrTitle       = "title"
	attrSettings    = "settings"
	attrReviewTools = "reviewTools"
	attrCreatedAt   = "createdAt"
	attrUpdatedAt   = "updatedAt"
	attrEpoch       = "epoch"
	attrClaimRun    = "claimRunId"
	attrClaimCancel = "claimCancel" // true when a cancel was requested; absent otherwise
	// attrClaimReaders is agent.Claim.ReadersUntil (MarkReader); absent when no reader marked the claim. In no index.
	attrClaimReaders = "claimReadersUntil"
	// The claim this claim took over (a stale one), copied inside the claim's own write so that a retried claim
	// can report it (ClaimResult.Previous) after the first attempt's answer was lost. Present only while claimed;
	// an empty attrPrevRun means the claim took over nothing. The previous epoch is always epoch-1.
	attrPrevRun       = "claimPrevRunId"
	attrPrevHeartbeat = "claimPrevHeartbeatAt"
	attrPrevCancel    = "claimPrevCancel"
	// attrNextSeq is the thread's message position counter: each claim takes Reserve positions from it in the
	// claim's own write. CreateThread starts it at 0; a thread item without it was written before the counter
	// existed, and its first claim starts it at legacySeqBase.
	attrNextSeq = "nextSeq"
	// attrDeleting is the delete tombstone: set (true) first by DeleteThread, and from then on the thread reads as
	// missing and nothing can claim or create it until the delete removes the item.
	attrDeleting    = "deleting"
	attrUsageIn     = "usageInput"
	attrUsageOut    = "usageOutput"
	attrUsageTotal  = "usageTotal"
	attrUsageCached = "usageCached"
	// Reasoning tokens and cost (micro-USD) were added later: an item without them reads them as 0.
	attrUsageReasoning = "usageReasoning"
	attrUsageCost      = "usageCostMicroUsd"
	// Prompt-cache writes (agent.Usage.CacheWriteTokens) came later still, and are written only when not 0.
	attrUsageCacheWrite = "usageCacheWrite"
)

// Who titled the thread (issue 20 item 5; SetGeneratedTitle).
const (
	// attrTitleByUser is set (true) by UpdateThread with a title: the owner chose it (even an empty one), and
	// SetGeneratedTitle leaves the thread alone. Absent otherwise, and on items written before it existed.
	attrTitleByUser = "titleByUser"
	// attrTitleGenerated is set (true) by SetGeneratedTitle: the title was generated, and no later one replaces it.
	attrTitleGenerated = "titleGenerated"
	// attrUsageKey is the key of the last spend AddUsage added (a title's run id): the same key again adds nothing.
	attrUsageKey = "usageKey"
)

func recency(updatedAt time.Time, id string) string { return fmtTime(updatedAt) + "#" + id }

func settingsAV(st agent.ThreadSettings) types.AttributeValue {
	return &types.AttributeValueMemberM{Value: item{attrReviewTools: avBool(st.ReviewTools)}}
}

func usageAttrs(it item, u agent.Usage) {
	it[attrUsageIn] = avN(u.InputTokens)
	it[attrUsageOut] = avN(u.OutputTokens)
	it[attrUsageTotal] = avN(u.TotalTokens)
	it[attrUsageCached] = avN(u.CachedInputTokens)
	it[attrUsageReasoning] = avN(u.ReasoningTokens)
	it[attrUsageCost] = avN(u.CostMicroUSD)
	if u.CacheWriteTokens != 0 {
		it[attrUsageCacheWrite] = avN(u.CacheWriteTokens)
	}
}

func decodeUsage(it item) agent.Usage {
	return agent.Usage{
		InputTokens:       getN(it, attrUsageIn),
		OutputTokens:      getN(it, attrUsageOut),
		TotalTokens:       getN(it, attrUsageTotal),
		CachedInputTokens: getN(it, attrUsageCached),
		ReasoningTokens:   getN(it, attrUsageReasoning),
		CostMicroUSD:      getN(it, attrUsageCost),
		CacheWriteTokens:  getN(it, attrUsageCacheWrite),
	}
}

func (s *Store) threadItem(t agent.Thread) item {
	it := key(threadPK(t.ID), threadSK)
	it[attrKind] = avS("thread")
	it[attrID] = avS(t.ID)
	// An empty owner cannot be a GSI key (DynamoDB refuses empty key strings), so an ownerless thread is simply
	// left out of the owner index.
	if t.Owner != "" {
		it[AttrOwner] = avS(t.Owner)
		it[AttrRecency] = avS(recency(t.UpdatedAt, t.ID))
	}
	it[attrTitle] = avS(t.Title)
	it[attrSettings] = settingsAV(t.Settings)
	usageAttrs(it, t.Usage)
	it[attrCreatedAt] = avT(t.CreatedAt)
	it[attrUpdatedAt] = avT(t.UpdatedAt)
	it[attrEpoch] = avN(t.Epoch)
	it[attrNextSeq] = avN(0)
	if c := t.ActiveRun; c != nil {
		it[attrClaimRun] = avS(c.RunID)
		it[AttrClaimHeartbeat] = avT(c.HeartbeatAt)
		it[AttrClaimBucket] = avS(s.bucketOf(c.HeartbeatAt))
		it[AttrRunShard] = avS(s.runShard(t.ID))
		if c.CancelRequested {
			it[attrClaimCancel] = avBool(true)
		}
	}
	return it
}

func decodeThread(it item) agent.Thread {
	t := agent.Thread{
		ID:        getS(it, attrID),
		Owner:     getS(it, AttrOwner),
		Title:     getS(it, attrTitle),
		Usage:     decodeUsage(it),
		CreatedAt: getT(it, attrCreatedAt),
		UpdatedAt: getT(it, attrUpdatedAt),
		Epoch:     getN(it, attrEpoch),
		ActiveRun: decodeClaim(it),
	}
	if m, ok := it[attrSettings].(*types.AttributeValueMemberM); ok {
		t.Settings.ReviewTools = getBool(m.Value, attrReviewTools)
	}
	return t
}

// decodeClaim reads the claim attributes; nil when the thread is idle. A claim's epoch is always the thread's
// epoch: only a claim advances it.
func decodeClaim(it item) *agent.Claim {
	run := getS(it, attrClaimRun)
	if run == "" {
		return nil
	}
	return &agent.Claim{
		RunID:           run,
		Epoch:           getN(it, attrEpoch),
		HeartbeatAt:     getT(it, AttrClaimHeartbeat),
		CancelRequested: getBool(it, attrClaimCancel),
		ReadersUntil:    getT(it, attrClaimReaders),
	}
}

func threadNotFound(id string) error {
	return agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", id)
}

func threadDeleting(id string) error {
	return agent.E(agent.KindConflict, agent.CodeThreadDeleting, "thread %q is being deleted", id)
}

// live reports whether a thread item exists and is not tombstoned: the only threads the store shows.
func live(it item) bool { return len(it) > 0 && !has(it, attrDeleting) }

// notDeleting is the condition fragment every write that must not touch a tombstoned thread carries.
func notDeleting(e *expr) string { return "attribute_not_exists(" + e.n(attrDeleting) + ")" }

// CreateThread: one PutItem conditioned on attribute_not_exists(pk), so it never overwrites a thread or a
// tombstone. On a lost race DynamoDB returns the existing item with the failure (ALL_OLD), so the existing thread
// costs no second read; a server that does not (dynalite) costs one GetItem.
func (s *Store) CreateThread(ctx context.Context, t agent.Thread) (agent.Thread, bool, error) {
	if t.ID == "" {
		return agent.Thread{}, false, agent.E(agent.KindInvalid, agent.CodeInvalidThreadID, "thread id is empty")
	}
	it := s.threadItem(t)
	if err := guardSize(it, maxThreadBytes, "thread"); err != nil {
		return agent.Thread{}, false, err
	}
	k := key(threadPK(t.ID), threadSK)
	absent := func(e *expr) string { return "attribute_not_exists(" + e.n(AttrPK) + ")" }
	cond := absent
	// The item can vanish between the failed put and the read that explains it (a delete finishing): then the
	// put is simply tried again.
	for attempt := 0; ; attempt++ {
		e := newExpr()
		_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                           aws.String(s.table),
			Item:                                it,
			ConditionExpression:                 aws.String(cond(e)),
			ExpressionAttributeNames:            e.attrNames(),
			ExpressionAttributeValues:           e.attrValues(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if err == nil {
			return decodeThread(it), true, nil
		}
		if !isConditionFailed(err) {
			return agent.Thread{}, false, storeErr(err, "create thread")
		}
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return agent.Thread{}, false, err
		}
		switch {
		case attempt == 3 && (len(old) == 0 || has(old, attrGone)):
			return agent.Thread{}, false, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "thread %q keeps appearing and vanishing", t.ID)
		case len(old) == 0:
			it, cond = s.threadItem(t), absent
			continue
		case has(old, attrGone):
			it, cond = reincarnate(s.threadItem(t), old)
			continue
		case has(old, attrDeleting):
			return agent.Thread{}, false, threadDeleting(t.ID)
		}
		return decodeThread(old), false, nil
	}
}

// reincarnate makes it (a new thread item) the next incarnation of the thread a finished delete left as gone:
// its epochs start above every epoch of the old one (attrBaseEpoch), and its positions after the old ones. The
// put that replaces the gone item is conditioned on it being unchanged.
func reincarnate(it, gone item) (item, func(e *expr) string) {
	base := getN(gone, attrEpoch)
	it[attrBaseEpoch] = avN(base)
	it[attrEpoch] = avN(base + getN(it, attrEpoch))
	if has(gone, attrNextSeq) {
		it[attrNextSeq] = avN(getN(gone, attrNextSeq))
	}
	return it, func(e *expr) string {
		return "attribute_exists(" + e.n(attrGone) + ") AND " + e.n(attrEpoch) + " = " + e.v(avN(base))
	}
}

// GetThread is one strongly consistent GetItem; a tombstoned thread is not found.
func (s *Store) GetThread(ctx context.Context, id string) (agent.Thread, error) {
	it, err := s.getItem(ctx, key(threadPK(id), threadSK))
	if err != nil {
		return agent.Thread{}, err
	}
	if !live(it) {
		return agent.Thread{}, threadNotFound(id)
	}
	return decodeThread(it), nil
}

// ListThreads is the first page of ListThreadsPage.
func (s *Store) ListThreads(ctx context.Context, owner string, limit int) ([]agent.Thread, error) {
	page, err := s.ListThreadsPage(ctx, owner, agent.ThreadPage{Limit: limit})
	return page.Items, err
}

// ListThreadsPage queries the keys-only owner index newest first, below the cursor (the key condition
// recency < "<updatedAt>#<id>" is the cursor: it names a place in the index, whether or not a thread is still
// there), one key more than the page to know whether more remain, then reads the thread items themselves with one
// strongly consistent BatchGetItem. A key whose thread was deleted or tombstoned meanwhile is dropped and the read
// goes on below it, so a page is short only at the end. GSI reads are eventually consistent in DynamoDB: a thread
// created or renamed a moment ago may be missing from the index or still in its old place for a fraction of a
// second (the items returned are current, and re-sorted by their current updatedAt, so a walk may meet such a
// thread twice). dynalite applies index updates synchronously, which the conformance suite relies on.
func (s *Store) ListThreadsPage(ctx context.Context, owner string, p agent.ThreadPage) (agent.Page[agent.Thread], error) {
	limit := p.Limit
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	page := agent.Page[agent.Thread]{Items: []agent.Thread{}}
	if owner == "" {
		return page, nil
	}
	below := ""
	if !p.From.IsZero() {
		below = recency(p.From.UpdatedAt, p.From.ID)
	}
	for {
		keys, last, more, err := s.ownerKeys(ctx, owner, below, limit-len(page.Items))
		if err != nil {
			return agent.Page[agent.Thread]{}, err
		}
		got, err := s.batchGet(ctx, keys)
		if err != nil {
			return agent.Page[agent.Thread]{}, err
		}
		for _, it := range got {
			if t := decodeThread(it); live(it) && t.Owner == owner {
				page.Items = append(page.Items, t)
			}
		}
		page.More = more
		if !more || len(page.Items) >= limit {
			break
		}
		below = last
	}
	sort.Slice(page.Items, func(i, j int) bool {
		a, b := page.Items[i], page.Items[j]
		if !a.UpdatedAt.Equal(b.UpdatedAt) {
			return a.UpdatedAt.After(b.UpdatedAt)
		}
		return a.ID > b.ID
	})
	return page, nil
}

// ownerKeys reads the first n keys of owner's threads in the owner index below the recency key below (empty: from
// the top), with the recency of the last one and whether a key follows it.
func (s *Store) ownerKeys(ctx context.Context, owner, below string, n int) ([]item, string, bool, error) {
	e := newExpr()
	cond := e.n(AttrOwner) + " = " + e.v(avS(owner))
	if below != "" {
		cond += " AND " + e.n(AttrRecency) + " < " + e.v(avS(below))
	}
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.table),
		IndexName:                 aws.String(IndexByOwner),
		KeyConditionExpression:    aws.String(cond),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
		ScanIndexForward:          aws.Bool(false),
		Limit:                     aws.Int32(int32(min(n+1, 1000))),
	}
	var keys []item
	last := ""
	for {
		res, err := s.client.Query(ctx, in)
		if err != nil {
			return nil, "", false, storeErr(err, "list threads")
		}
		for _, it := range res.Items {
			if len(keys) == n {
				return keys, last, true, nil
			}
			keys = append(keys, key(getS(it, AttrPK), getS(it, AttrSK)))
			last = getS(it, AttrRecency)
		}
		if len(res.LastEvaluatedKey) == 0 {
			return keys, last, false, nil
		}
		in.ExclusiveStartKey = res.LastEvaluatedKey
	}
}

// UpdateThread: one UpdateItem conditioned on attribute_exists(pk) AND attribute_not_exists(deleting), returning
// the new item.
func (s *Store) UpdateThread(ctx context.Context, id string, p agent.ThreadPatch, now time.Time) (agent.Thread, error) {
	e := newExpr()
	sets := []string{
		e.n(attrUpdatedAt) + " = " + e.v(avT(now)),
		e.n(AttrRecency) + " = " + e.v(avS(recency(now, id))),
	}
	if p.Title != nil {
		if len(*p.Title) > maxThreadBytes/2 {
			return agent.Thread{}, agent.E(agent.KindTooLarge, agent.CodeTooLarge, "title is %d bytes, more than %d", len(*p.Title), maxThreadBytes/2)
		}
		sets = append(sets, e.n(attrTitle)+" = "+e.v(avS(*p.Title)), e.n(attrTitleByUser)+" = "+e.v(avBool(true)))
	}
	if p.Settings != nil {
		sets = append(sets, e.n(attrSettings)+" = "+e.v(settingsAV(*p.Settings)))
	}
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(id), threadSK),
		UpdateExpression:          aws.String("SET " + strings.Join(sets, ", ")),
		ConditionExpression:       aws.String("attribute_exists(" + e.n(AttrPK) + ") AND " + notDeleting(e)),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return agent.Thread{}, threadNotFound(id)
	}
	if err != nil {
		return agent.Thread{}, storeErr(err, "update thread")
	}
	return decodeThread(res.Attributes), nil
}

// SetGeneratedTitle: one UpdateItem conditioned on a live thread (attribute_exists(pk) AND
// attribute_not_exists(deleting)) of the same incarnation (createdAt = g.CreatedAt) whose title is still g.Replaces (an absent title reads as empty) and is neither
// the owner's nor generated (attribute_not_exists(titleByUser) AND attribute_not_exists(titleGenerated)),
// returning the new item. On a failed condition DynamoDB returns the item (ALL_OLD; dynalite does not, and that
// costs one GetItem), which tells a titled thread from a missing one. updatedAt and recency stay as they are.
func (s *Store) SetGeneratedTitle(ctx context.Context, g agent.GeneratedTitle) (agent.Thread, bool, error) {
	if g.Title == "" {
		return agent.Thread{}, false, agent.E(agent.KindInvalid, agent.CodeInvalidTitle, "a generated title is empty")
	}
	if len(g.Title) > maxThreadBytes/2 {
		return agent.Thread{}, false, agent.E(agent.KindTooLarge, agent.CodeTooLarge, "title is %d bytes, more than %d", len(g.Title), maxThreadBytes/2)
	}
	e := newExpr()
	k := key(threadPK(g.ThreadID), threadSK)
	set := "SET " + e.n(attrTitle) + " = " + e.v(avS(g.Title)) + ", " + e.n(attrTitleGenerated) + " = " + e.v(avBool(true))
	same := e.n(attrTitle) + " = " + e.v(avS(g.Replaces))
	if g.Replaces == "" {
		same = "(attribute_not_exists(" + e.n(attrTitle) + ") OR " + same + ")"
	}
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND " + notDeleting(e) + " AND " + e.n(attrCreatedAt) + " = " + e.v(avT(g.CreatedAt)) +
		" AND attribute_not_exists(" + e.n(attrTitleByUser) + ") AND attribute_not_exists(" + e.n(attrTitleGenerated) + ") AND " + same
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(set),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if isConditionFailed(err) {
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return agent.Thread{}, false, err
		}
		if !live(old) {
			return agent.Thread{}, false, threadNotFound(g.ThreadID)
		}
		return decodeThread(old), false, nil
	}
	if err != nil {
		return agent.Thread{}, false, storeErr(err, "set generated title")
	}
	return decodeThread(res.Attributes), true, nil
}

// AddUsage: one UpdateItem, ADD usage* :u SET usageKey = :key, conditioned on a live thread (attribute_exists(pk)
// AND attribute_not_exists(deleting)) of the same incarnation (createdAt = :created) whose usageKey is not :key.
// On a failed condition the old item (ALL_OLD; one GetItem on dynalite) tells a thread that counted this key
// already (nil) from a missing one.
func (s *Store) AddUsage(ctx context.Context, u agent.ThreadUsage) error {
	e := newExpr()
	k := key(threadPK(u.ThreadID), threadSK)
	update := "SET " + e.n(attrUsageKey) + " = " + e.v(avS(u.Key))
	if add := usageAdd(e, u.Usage); add != "" {
		update += " ADD " + add
	}
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND " + notDeleting(e) + " AND " + e.n(attrCreatedAt) + " = " + e.v(avT(u.CreatedAt)) +
		" AND (attribute_not_exists(" + e.n(attrUsageKey) + ") OR " + e.n(attrUsageKey) + " <> " + e.v(avS(u.Key)) + ")"
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if !isConditionFailed(err) {
		return storeErr(err, "add usage")
	}
	old, err := s.failedItem(ctx, err, k)
	switch {
	case err != nil:
		return err
	case !live(old) || !getT(old, attrCreatedAt).Equal(u.CreatedAt):
		return threadNotFound(u.ThreadID)
	}
	return nil // the key added last: counted before
}

// DeleteThread is the tombstone protocol (infra/DYNAMODB.md, "Deleting a thread"):
//
//  1. one UpdateItem on the thread: SET deleting = true REMOVE recency, condition attribute_exists(pk) AND
//     attribute_not_exists(claimRunId). A held claim (even a stale one: the reaper frees it first) refuses the
//     delete with run_active and nothing changes. From here on the thread reads as missing, CreateThread and
//     ClaimRun refuse it (their conditions), and it has left the byOwner index (recency is its sort key);
//  2. the children: one key-only Query of the thread partition (messages, runs, interrupts, jobs, queue entries
//     and their chunks) and one per run for its segment partition, deleted with BatchWriteItem, segments first
//     (the run items lead to them). Deleting a pending interrupt takes it out of the pending index too, and an
//     undelivered job or a queued entry out of dueWork;
//  3. the tombstone itself, DeleteItem conditioned on attribute_exists(deleting).
//
// A delete interrupted anywhere leaves the tombstone (or nothing), and calling DeleteThread again redoes the
// missing steps. For an unknown id step 1 fails on a missing item: the partition is swept all the same (that is
// one Query when it is empty), so a repeated delete also removes whatever a fenced writer left behind.
func (s *Store) DeleteThread(ctx context.Context, id string) error {
	return s.deleteThread(ctx, id, false)
}

// FinishDelete is DeleteThread on a tombstone only (REVIEW S10): its first write is conditioned on the tombstone
// (attribute_exists(deleting) AND attribute_not_exists(gone)) instead of on no claim, and when that fails (a live
// thread, a finished delete, an unknown id) nothing is swept and nothing changes.
func (s *Store) FinishDelete(ctx context.Context, id string) error {
	return s.deleteThread(ctx, id, true)
}

func (s *Store) deleteThread(ctx context.Context, id string, tombstoneOnly bool) error {
	pk := threadPK(id)
	k := key(pk, threadSK)
	e := newExpr()
	var cond string
	if tombstoneOnly {
		cond = "attribute_exists(" + e.n(attrDeleting) + ") AND attribute_not_exists(" + e.n(attrGone) + ")"
	} else {
		cond = "attribute_exists(" + e.n(AttrPK) + ") AND attribute_not_exists(" + e.n(attrClaimRun) + ")"
	}
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String("SET " + e.n(attrDeleting) + " = " + e.v(avBool(true)) + " REMOVE " + e.n(AttrRecency)),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	tombstoned := err == nil
	var tomb item
	if tombstoned {
		tomb = res.Attributes
	}
	if isConditionFailed(err) {
		if tombstoneOnly {
			return nil
		}
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return err
		}
		// An item means a claim failed the condition (the read may already see it released: the caller's next
		// call then succeeds). No item (unknown id, or a delete that finished meanwhile): sweep below.
		if len(old) > 0 {
			return agent.E(agent.KindConflict, agent.CodeRunActive, "thread %q is running %s", id, getS(old, attrClaimRun))
		}
	} else if err != nil {
		return storeErr(err, "delete thread")
	}

	var under []types.WriteRequest
	var runs []string
	err = s.queryPrefix(ctx, pk, "", true, func(it item) error {
		sk := getS(it, AttrSK)
		if sk == threadSK {
			return nil
		}
		if rid, ok := strings.CutPrefix(sk, prefixRun); ok {
			runs = append(runs, rid)
		}
		under = append(under, deleteReq(key(pk, sk)))
		return nil
	})
	if err != nil {
		return err
	}
	var segs []types.WriteRequest
	for _, rid := range runs {
		err := s.queryPrefix(ctx, segmentsPK(rid), "", true, func(it item) error {
			segs = append(segs, deleteReq(key(getS(it, AttrPK), getS(it, AttrSK))))
			return nil
		})
		if err != nil {
			return err
		}
	}
	// Segments first: they are found through the run items, which must outlive them until they are gone.
	if err := s.batchWrite(ctx, segs); err != nil {
		return err
	}
	if err := s.batchWrite(ctx, under); err != nil {
		return err
	}
	if !tombstoned {
		return nil
	}
	// The tombstone becomes the gone item: the epoch and position counter stay, so a thread created again on the
	// id starts above them (incarnation.go).
	gone := key(pk, threadSK)
	gone[attrKind] = avS("thread")
	gone[attrID] = avS(id)
	gone[attrDeleting] = avBool(true)
	gone[attrGone] = avBool(true)
	gone[attrEpoch] = avN(getN(tomb, attrEpoch))
	if has(tomb, attrNextSeq) {
		gone[attrNextSeq] = avN(getN(tomb, attrNextSeq))
	}
	e = newExpr()
	_, err = s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                 aws.String(s.table),
		Item:                      gone,
		ConditionExpression:       aws.String("attribute_exists(" + e.n(attrDeleting) + ") AND " + e.n(attrEpoch) + " = " + e.v(avN(getN(tomb, attrEpoch)))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if isConditionFailed(err) {
		return nil // another DeleteThread finished first
	}
	return storeErr(err, "delete thread")
}
