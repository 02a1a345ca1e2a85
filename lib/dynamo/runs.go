package dynamo

import (
	"cmp"
	"context"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// Run item attributes.
const (
	attrThreadID   = "threadId"
	attrTrigger    = "trigger"
	attrStatus     = "status"
	attrErrCode    = "errorCode"
	attrErrMessage = "errorMessage"
	attrSteps      = "steps"
	attrModel      = "model"
	attrAssistant  = "assistantMessageId"
	attrUserMsg    = "userMessageId" // the user message the run writes, for the reaper's stub (fence B)
	attrTakes      = "takes"         // the queued messages the run noted before storing them (NoteTakes), a string set
	attrFinishedAt = "finishedAt"
	attrFirstSeq   = "firstSeq" // the first message position the claim reserved for the run
	attrReserved   = "reserved" // how many positions it reserved
	// The run's store cost (agent.StoreUsage), set by FinishRun when measured; units in thousandths.
	attrStoreRequests  = "storeRequests"
	attrStoreRead      = "storeReadMilli"
	attrStoreWrite     = "storeWriteMilli"
	attrStoreThrottled = "storeThrottled"
	// attrUnrecorded is the thread item's string set of the runs whose claim was released but whose outcome may
	// not be recorded yet (REVIEW D15): every release adds its run, and the orphan sweep (ListOrphanRuns) takes out
	// the ones it finds recorded. While it is not empty the thread stays in the running index.
	attrUnrecorded = "unrecorded"
	// attrReleased prefixes the thread item's attribute that keeps, per run whose claim a release gave back with
	// usage, the usage that release added (released.go): "rel#<runId>". The orphan sweep removes it with the run
	// from the unrecorded set.
	attrReleased = "rel#"
	// attrLate marks a run whose late usage (RecordLateUsage) is in its usage counters; the late usage itself is
	// kept beside it (attrLate + the usage attribute names).
	attrLate = "late"
)

// storeSets renders the SET clauses that record a run's store cost.
func storeSets(e *expr, su agent.StoreUsage) []string {
	return []string{
		e.n(attrStoreRequests) + " = " + e.v(avN(su.Requests)),
		e.n(attrStoreRead) + " = " + e.v(avN(int64(math.Round(su.ReadUnits*1000)))),
		e.n(attrStoreWrite) + " = " + e.v(avN(int64(math.Round(su.WriteUnits*1000)))),
		e.n(attrStoreThrottled) + " = " + e.v(avN(su.Throttled)),
	}
}

func decodeStore(it item) *agent.StoreUsage {
	if !has(it, attrStoreRequests) {
		return nil
	}
	return &agent.StoreUsage{Requests: getN(it, attrStoreRequests), ReadUnits: float64(getN(it, attrStoreRead)) / 1000,
		WriteUnits: float64(getN(it, attrStoreWrite)) / 1000, Throttled: getN(it, attrStoreThrottled)}
}

func runItem(r agent.Run) item {
	it := key(threadPK(r.ThreadID), runSK(r.ID))
	it[attrKind] = avS("run")
	it[attrID] = avS(r.ID)
	it[attrThreadID] = avS(r.ThreadID)
	it[attrTrigger] = avS(string(r.Trigger))
	it[attrStatus] = avS(string(r.Status))
	if r.Error != nil {
		it[attrErrCode] = avS(r.Error.Code)
		it[attrErrMessage] = avS(truncateUTF8(r.Error.Message, maxRunErrorBytes))
	}
	usageAttrs(it, r.Usage)
	it[attrSteps] = avN(int64(r.Steps))
	if r.Model != "" {
		it[attrModel] = avS(r.Model)
	}
	it[attrAssistant] = avS(r.AssistantMessageID)
	if r.UserMessageID != "" {
		it[attrUserMsg] = avS(r.UserMessageID)
	}
	if len(r.Takes) > 0 {
		it[attrTakes] = avSS(r.Takes...)
	}
	it[attrEpoch] = avN(r.Epoch)
	it[attrFirstSeq] = avN(r.FirstSeq)
	it[attrReserved] = avN(int64(r.Reserved))
	it[attrCreatedAt] = avT(r.CreatedAt)
	it[attrUpdatedAt] = avT(r.UpdatedAt)
	if !r.FinishedAt.IsZero() {
		it[attrFinishedAt] = avT(r.FinishedAt)
	}
	return it
}

func decodeRun(it item) agent.Run {
	r := agent.Run{
		ID:                 getS(it, attrID),
		ThreadID:           getS(it, attrThreadID),
		Trigger:            agent.Trigger(getS(it, attrTrigger)),
		Status:             agent.RunStatus(getS(it, attrStatus)),
		Usage:              decodeUsage(it),
		Steps:              int(getN(it, attrSteps)),
		Model:              getS(it, attrModel),
		AssistantMessageID: getS(it, attrAssistant),
		UserMessageID:      getS(it, attrUserMsg),
		Takes:              getSS(it, attrTakes),
		Epoch:              getN(it, attrEpoch),
		FirstSeq:           getN(it, attrFirstSeq),
		Reserved:           int(getN(it, attrReserved)),
		CreatedAt:          getT(it, attrCreatedAt),
		UpdatedAt:          getT(it, attrUpdatedAt),
		FinishedAt:         getT(it, attrFinishedAt),
	}
	if has(it, attrErrCode) || has(it, attrErrMessage) {
		r.Error = &agent.RunError{Code: getS(it, attrErrCode), Message: getS(it, attrErrMessage)}
	}
	r.Store = decodeStore(it)
	r.Signal = decodeSignal(it)
	if getBool(it, attrLate) {
		late := decodeLate(it)
		r.LateUsage = &late
	}
	return r
}

// legacySeqBase is where the message counter of a thread written before the counter existed starts: far above any
// position the engine of that time assigned (it numbered a thread's messages from 0, one by one), so new messages
// sort after the old ones without reading them, and far below 2^53, so positions stay exact in JSON clients.
const legacySeqBase = 1 << 40

func runNotFound(threadID, runID string) error {
	return agent.E(agent.KindNotFound, agent.CodeRunNotFound, "run %s of thread %q not found", runID, threadID)
}

func fenced(f agent.Fence) error {
	return agent.E(agent.KindConflict, agent.CodeRunFenced, "run %s at epoch %d no longer holds its thread", f.RunID, f.Epoch)
}

// ClaimRun is two writes. The first decides ownership: one UpdateItem on the thread item,
//
//	condition: attribute_exists(pk) AND attribute_not_exists(deleting) AND owner = :owner
//	           AND (attribute_not_exists(claimRunId) OR claimHeartbeatAt < :now-staleAfter)
//	update:    SET claimRunId, claimHeartbeatAt, claimBucket, runShard,
//	               claimPrevRunId = if_not_exists(claimRunId, ""), claimPrevHeartbeatAt = ..., claimPrevCancel = ...
//	               nextSeq = if_not_exists(nextSeq, 2^40) + :reserve
//	           REMOVE claimCancel, claimReadersUntil  ADD epoch 1
//	returns:   ALL_NEW
//
// The new item is the whole answer: the thread after the claim, the new epoch, the reserved positions
// (nextSeq-reserve onwards: the reservation is part of the deciding write, so no other claim can get them; a
// thread from before the counter starts at legacySeqBase) and the claim taken over (copied into claimPrev* by the
// same write; right-hand sides read the item as it was before the update). With StaleAfter <= 0 the heartbeat
// clause is left out: every claim is live.
//
// The second write puts the run item, conditioned on attribute_not_exists(pk). Nothing reads the run item to
// decide ownership (heartbeats fence on the thread), so a crash between the two leaves a claim that goes stale
// and is reaped, never a split brain.
//
// Retries (REVIEW L20). A failed condition is classified from the item it was checked against (see failedItem):
// no item or another owner is not found, a tombstone is thread_deleting, a claim naming req.RunID is this very
// claim applied by an earlier attempt whose answer was lost (an SDK retry, or the caller's), and anything else is
// run_active. A recognised claim is answered from the stored item and goes on to the run write; a run write that
// fails its condition on a run item at the same epoch is the same kind of retry and returns the stored run. A run
// item at another epoch means the run id ran before and lost the thread since: the fresh claim is given back and
// the caller gets run_fenced, as a run id is never started twice.
func (s *Store) ClaimRun(ctx context.Context, req agent.ClaimRequest) (agent.ClaimResult, error) {
	if req.ThreadID == "" {
		return agent.ClaimResult{}, agent.E(agent.KindInvalid, agent.CodeInvalidThreadID, "claim needs a thread id")
	}
	if req.RunID == "" {
		return agent.ClaimResult{}, agent.E(agent.KindInvalid, agent.CodeInvalidRunID, "claim needs a run id")
	}
	reserve := int64(max(req.Reserve, 1))
	k := key(threadPK(req.ThreadID), threadSK)
	e := newExpr()
	owner := "attribute_not_exists(" + e.n(AttrOwner) + ")"
	if req.Owner != "" {
		owner = e.n(AttrOwner) + " = " + e.v(avS(req.Owner))
	}
	free := "attribute_not_exists(" + e.n(attrClaimRun) + ")"
	if req.StaleAfter > 0 {
		free = "(" + free + " OR " + e.n(AttrClaimHeartbeat) + " < " + e.v(avT(req.Now.Add(-req.StaleAfter))) + ")"
	}
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND " + notDeleting(e) + " AND " + owner + " AND " + free
	none := e.v(avS(""))
	update := "SET " + strings.Join([]string{
		e.n(attrClaimRun) + " = " + e.v(avS(req.RunID)),
		e.n(AttrClaimHeartbeat) + " = " + e.v(avT(req.Now)),
		e.n(AttrClaimBucket) + " = " + e.v(avS(s.bucketOf(req.Now))),
		e.n(AttrRunShard) + " = " + e.v(avS(s.runShard(req.ThreadID))),
		e.n(attrPrevRun) + " = if_not_exists(" + e.n(attrClaimRun) + ", " + none + ")",
		e.n(attrPrevHeartbeat) + " = if_not_exists(" + e.n(AttrClaimHeartbeat) + ", " + none + ")",
		e.n(attrPrevCancel) + " = if_not_exists(" + e.n(attrClaimCancel) + ", " + e.v(avBool(false)) + ")",
	}, ", ") +
		", " + e.n(attrNextSeq) + " = if_not_exists(" + e.n(attrNextSeq) + ", " + e.v(avN(legacySeqBase)) + ") + " + e.v(avN(reserve)) +
		" REMOVE " + e.n(attrClaimCancel) + ", " + e.n(attrClaimReaders) +
		" ADD " + e.n(attrEpoch) + " " + e.v(avN(1))
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
	var claimed item
	switch {
	case err == nil:
		claimed = res.Attributes
	case isConditionFailed(err):
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return agent.ClaimResult{}, err
		}
		switch {
		case len(old) == 0 || getS(old, AttrOwner) != req.Owner:
			return agent.ClaimResult{}, threadNotFound(req.ThreadID)
		case has(old, attrDeleting):
			return agent.ClaimResult{}, threadDeleting(req.ThreadID)
		case getS(old, attrClaimRun) == req.RunID:
			claimed = old // our own claim, applied by an earlier attempt
		default:
			return agent.ClaimResult{}, agent.E(agent.KindConflict, agent.CodeRunActive, "thread %q is running %s", req.ThreadID, getS(old, attrClaimRun))
		}
	default:
		return agent.ClaimResult{}, storeErr(err, "claim run")
	}

	epoch := getN(claimed, attrEpoch)
	result := agent.ClaimResult{
		Run: agent.Run{
			ID:                 req.RunID,
			ThreadID:           req.ThreadID,
			Trigger:            req.Trigger,
			Status:             agent.RunRunning,
			AssistantMessageID: req.AssistantMessageID,
			UserMessageID:      req.UserMessageID,
			Epoch:              epoch,
			FirstSeq:           getN(claimed, attrNextSeq) - reserve,
			Reserved:           int(reserve),
			CreatedAt:          req.Now,
			UpdatedAt:          req.Now,
		},
		Previous: decodePrevious(claimed, epoch),
		Thread:   decodeThread(claimed),
	}
	if result.Previous != nil {
		// The run whose stale claim this one took over loses its claim without a release: it joins the unrecorded
		// runs, so the orphan sweep finds it if nobody reaps it (one write, only on a takeover; the engine reaps
		// first and never takes over here).
		if err := s.addUnrecorded(ctx, req.ThreadID, result.Run.Fence(), agent.ReapedRunID(result.Previous.RunID)); err != nil {
			s.log.WarnContext(ctx, "dynamo: noting a taken-over run for the orphan sweep", "thread", req.ThreadID, "run", result.Previous.RunID, "err", err)
		}
	}
	stored, err := s.putRun(ctx, result.Run)
	if err != nil {
		// The caller sees a failed claim, so give the thread back rather than leave it blocked until the claim
		// goes stale. Best effort, and fenced like any release: it removes only this claim.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := s.release(rctx, agent.ReleaseRequest{ThreadID: req.ThreadID, Fence: result.Run.Fence()}); rerr != nil && !isConditionFailed(rerr) {
			s.log.WarnContext(ctx, "dynamo: releasing a claim whose run item failed", "thread", req.ThreadID, "run", req.RunID, "err", rerr)
		}
		return agent.ClaimResult{}, err
	}
	result.Run = stored
	return result, nil
}

// putRun writes a new run item insert-if-absent and returns the stored run: r itself, or the run an earlier
// attempt of the same claim stored (same epoch). A run item at another epoch is run_fenced.
func (s *Store) putRun(ctx context.Context, r agent.Run) (agent.Run, error) {
	k := key(threadPK(r.ThreadID), runSK(r.ID))
	e := newExpr()
	_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.table),
		Item:                                runItem(r),
		ConditionExpression:                 aws.String("attribute_not_exists(" + e.n(AttrPK) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return r, nil
	}
	if !isConditionFailed(err) {
		return agent.Run{}, storeErr(err, "put run")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return agent.Run{}, err
	}
	if len(old) > 0 && getN(old, attrEpoch) == r.Epoch && getS(old, attrStatus) == string(agent.RunRunning) {
		return decodeRun(old), nil
	}
	// Another epoch's run, or the reaper's stub of this one (StubRun: the claim was reaped before this write).
	return agent.Run{}, agent.E(agent.KindConflict, agent.CodeRunFenced, "run %s was claimed before and no longer holds thread %q", r.ID, r.ThreadID)
}

// StubRun (agent.RunStubber) stores the reaper's record of a run whose claim it took while the run item was
// missing: one insert-if-absent PutItem, as putRun's, so of the two exactly one lands. The stub wins: the late
// putRun is refused (run_fenced), and no running run is left that no claim names. putRun wins: the stored run is
// returned, and the reaper finishes it as any.
func (s *Store) StubRun(ctx context.Context, r agent.Run) (agent.Run, bool, error) {
	k := key(threadPK(r.ThreadID), runSK(r.ID))
	it := runItem(r)
	signalAttrs(it, r) // a stub is the run's outcome: its signal, when armed, is stored pending with it
	if r.AssistantMessageID == "" {
		delete(it, attrAssistant)
	}
	e := newExpr()
	_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.table),
		Item:                                it,
		ConditionExpression:                 aws.String("attribute_not_exists(" + e.n(AttrPK) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return r, true, nil
	}
	if !isConditionFailed(err) {
		return agent.Run{}, false, storeErr(err, "stub run")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return agent.Run{}, false, err
	}
	return decodeRun(old), false, nil
}

// decodePrevious reads the claim a claim took over from its claimPrev* copies; nil when it took over none.
func decodePrevious(it item, epoch int64) *agent.Claim {
	run := getS(it, attrPrevRun)
	if run == "" {
		return nil
	}
	return &agent.Claim{RunID: run, Epoch: epoch - 1, HeartbeatAt: getT(it, attrPrevHeartbeat), CancelRequested: getBool(it, attrPrevCancel)}
}

// claimRemoval lists the claim attributes; removing them releases the claim. The running index's keys
// (runShard, claimBucket) stay: a released thread stays nominated until the orphan sweep finds its released runs'
// outcomes recorded (ListOrphanRuns), and the next claim only moves its key.
func claimRemoval(e *expr) string {
	names := []string{attrClaimRun, AttrClaimHeartbeat, attrClaimCancel, attrClaimReaders, attrPrevRun, attrPrevHeartbeat, attrPrevCancel}
	for i, n := range names {
		names[i] = e.n(n)
	}
	return strings.Join(names, ", ")
}

// release is the one release write (FinishRun's first half, ReleaseClaim, a failed claim's give-back): one
// UpdateItem on the thread,
//
//	condition: claimRunId = :run AND epoch = :epoch [AND claimHeartbeatAt < :staleBefore]
//	update:    REMOVE <claim attributes>  ADD unrecorded {run}, usage*  [SET rel#<run> = usage, updatedAt, recency]
//
// so usage is added exactly once, by whichever write releases the claim, and the run (the dead run, for a
// reaper's claim) joins the thread's unrecorded runs, which keep the thread in the running index until the orphan
// sweep finds their outcomes recorded (REVIEW D15), and keeps the usage it added for the run (released.go). It returns the raw SDK error, so callers can tell a failed
// condition (isConditionFailed) from a failed request.
// holds is the condition that f holds the thread's claim (same run, same epoch) and, when staleBefore is set,
// that its heartbeat is older than staleBefore: the reap decision, shared by the reaper's release and takeover.
func holds(e *expr, f agent.Fence, staleBefore time.Time) string {
	cond := e.n(attrClaimRun) + " = " + e.v(avS(f.RunID)) + " AND " + e.n(attrEpoch) + " = " + e.v(avN(f.Epoch))
	if !staleBefore.IsZero() {
		cond += " AND " + e.n(AttrClaimHeartbeat) + " < " + e.v(avT(staleBefore))
	}
	return cond
}

func (s *Store) release(ctx context.Context, req agent.ReleaseRequest) error {
	e := newExpr()
	run := agent.ReapedRunID(req.Fence.RunID)
	update := "REMOVE " + claimRemoval(e) + " ADD " + e.n(attrUnrecorded) + " " + e.v(avSS(run))
	var sets []string
	if add := usageAdd(e, req.Usage); add != "" {
		update += ", " + add
		// Kept for the run until its outcome is recorded (Run.Released): a crash before the outcome leaves a run
		// whose draft a later run may overwrite, and the reaper records this usage for it instead.
		sets = append(sets, e.n(attrReleased+run)+" = "+e.v(avS(encodeReleased(req.Usage))))
	}
	if !req.Now.IsZero() {
		// The thread moves up in its owner's list when a turn ends (recency is the byOwner index key).
		sets = append(sets, e.n(attrUpdatedAt)+" = "+e.v(avT(req.Now)), e.n(AttrRecency)+" = "+e.v(avS(recency(req.Now, req.ThreadID))))
	}
	if len(sets) > 0 {
		update += " SET " + strings.Join(sets, ", ")
	}
	cond := holds(e, req.Fence, req.StaleBefore)
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 key(threadPK(req.ThreadID), threadSK),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return err
}

// Heartbeat: one UpdateItem on the thread,
//
//	condition: claimRunId = :run AND epoch = :epoch
//	update:    SET claimHeartbeatAt = :now, claimBucket = :bucket   (ReturnValues ALL_NEW)
//
// claimHeartbeatAt is in no index, and claimBucket (the running index's sort key) is the heartbeat rounded down to
// the bucket (10 s): within a bucket the write leaves it as it was, and DynamoDB writes to a GSI only when an
// update changes an attribute the index holds. So a heartbeat is one table write (1 WCU for a thread item up to
// 1 KB), and once per bucket the index pays a delete and a put: 1.2 WCU per second in all (TestHeartbeatCost).
// A cancel request is not a fence (REVIEW D2): the heartbeat is recorded whatever claimCancel says, and the item
// it returns (ALL_NEW costs no capacity) tells the run it was asked to stop. On failure the claim is gone.
func (s *Store) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	_, err := s.heartbeat(ctx, threadID, f, now)
	return err
}

// heartbeat is Heartbeat, also returning the claim as stored after the write (the ALL_NEW item, decoded as
// GetThread decodes it) when the heartbeat was recorded.
func (s *Store) heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) (agent.Claim, error) {
	k := key(threadPK(threadID), threadSK)
	e := newExpr()
	cond := holds(e, f, time.Time{})
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       k,
		UpdateExpression: aws.String("SET " + e.n(AttrClaimHeartbeat) + " = " + e.v(avT(now)) + ", " +
			e.n(AttrClaimBucket) + " = " + e.v(avS(s.bucketOf(now)))),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return agent.Claim{}, fenced(f)
	}
	if err != nil {
		return agent.Claim{}, storeErr(err, "heartbeat")
	}
	var claim agent.Claim
	if c := decodeThread(res.Attributes).ActiveRun; c != nil {
		claim = *c
	}
	if claim.CancelRequested {
		return claim, agent.E(agent.KindCanceled, agent.CodeRunCanceled, "run %s was canceled", f.RunID)
	}
	return claim, nil
}

// keepParallel bounds the heartbeats one KeepClaims call has in flight at once.
const keepParallel = 16

// KeepClaims is one Heartbeat per claim (the same conditional UpdateItem, ReturnValues ALL_NEW, so the claim
// comes back at no extra cost), up to keepParallel of them in flight at once. DynamoDB has no condition over
// several items outside transactions, which the store does not use (DESIGN principle 2), so a batch costs what
// its heartbeats cost one by one: 1.2 WCU per claim per second (TestHeartbeatCost), and what the batch saves is
// the process's goroutines and timers, not requests. A chat Lambda holds one run per execution environment, so
// its keeper sends one write per second, as the run's own heartbeat did; a process running N runs on DynamoDB
// (a container, `agentloop dev -store dynamo`) sends N (infra/DYNAMODB.md "Heartbeats"). Each claim's gate rides
// on its request's context (agent.WithWriteGate), so the client's write-gate middleware asks it before every
// attempt, the SDK's retries included.
func (s *Store) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	out := make([]agent.KeepResult, len(claims))
	sem := make(chan struct{}, keepParallel)
	var wg sync.WaitGroup
	for i, k := range claims {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			cctx := ctx
			if k.Gate != nil {
				cctx = agent.WithWriteGate(ctx, k.Gate)
			}
			out[i].Claim, out[i].Err = s.heartbeat(cctx, k.ThreadID, k.Fence, now)
		}()
	}
	wg.Wait()
	return out
}

// RequestCancel: one UpdateItem on the thread, condition attribute_exists(claimRunId) [AND claimRunId = :run],
// SET claimCancel = true, returning the claim (ALL_NEW). A repeated request returns the same claim.
func (s *Store) RequestCancel(ctx context.Context, threadID, runID string, now time.Time) (agent.Claim, error) {
	k := key(threadPK(threadID), threadSK)
	e := newExpr()
	cond := "attribute_exists(" + e.n(attrClaimRun) + ")"
	if runID != "" {
		cond += " AND " + e.n(attrClaimRun) + " = " + e.v(avS(runID))
	}
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String("SET " + e.n(attrClaimCancel) + " = " + e.v(avBool(true))),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if isConditionFailed(err) {
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return agent.Claim{}, err
		}
		if !live(old) {
			return agent.Claim{}, threadNotFound(threadID)
		}
		if runID != "" && has(old, attrClaimRun) {
			return agent.Claim{}, agent.E(agent.KindConflict, agent.CodeNoActiveRun, "run %s is not the active run of thread %q", runID, threadID)
		}
		return agent.Claim{}, agent.E(agent.KindConflict, agent.CodeNoActiveRun, "thread %q has no active run", threadID)
	}
	if err != nil {
		return agent.Claim{}, storeErr(err, "request cancel")
	}
	return *decodeClaim(res.Attributes), nil
}

// MarkReader: one UpdateItem on the thread,
//
//	condition: claimRunId = :run AND (attribute_not_exists(claimReadersUntil) OR claimReadersUntil < :until)
//	update:    SET claimReadersUntil = :until
//
// claimReadersUntil is in no index, so a mark is one table write: 1 WCU for a thread item up to 1 KB (a refused
// condition costs the same). A reader marks itself every half of agent.DefaultReaderPresence (5 s): 0.4 WCU per
// attached reader per second. A failed condition is classified from the item it was checked against: a claim of
// runID already marked as far (another reader) is success, no claim or another run's is no_active_run.
func (s *Store) MarkReader(ctx context.Context, threadID, runID string, until time.Time) error {
	k := key(threadPK(threadID), threadSK)
	e := newExpr()
	cond := e.n(attrClaimRun) + " = " + e.v(avS(runID)) + " AND (attribute_not_exists(" + e.n(attrClaimReaders) + ") OR " +
		e.n(attrClaimReaders) + " < " + e.v(avT(until)) + ")"
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String("SET " + e.n(attrClaimReaders) + " = " + e.v(avT(until))),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if isConditionFailed(err) {
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return err
		}
		switch {
		case !live(old):
			return threadNotFound(threadID)
		case getS(old, attrClaimRun) == runID:
			return nil // marked as far already
		}
		return agent.E(agent.KindConflict, agent.CodeNoActiveRun, "run %s is not the active run of thread %q", runID, threadID)
	}
	if err != nil {
		return storeErr(err, "mark reader")
	}
	return nil
}

// readersParallel bounds the BatchGetItem requests one ReadersOf call has in flight at once; readersAttempts
// bounds how often it asks again for the keys DynamoDB left unprocessed before it gives up (the keeper's next
// probe asks anew).
const (
	readersParallel = 4
	readersAttempts = 3
)

// ReadersOf is one BatchGetItem per 100 threads (up to readersParallel in flight), eventually consistent and
// projected onto the key and the claim's run and reader mark: 0.5 RCU per thread item up to 4 KB (the projection
// saves bytes on the wire, not units: DynamoDB bills the whole item). A chat Lambda holds one run, so its keeper's
// probe is one item, 0.5 RCU, per probe (infra/DYNAMODB.md "Resumed-stream readers"). An eventually consistent
// read may miss a mark written a moment before; the next probe sees it. Keys left unprocessed are asked again up
// to readersAttempts times; after that, or on any failed request, the call fails as a whole.
func (s *Store) ReadersOf(ctx context.Context, threadIDs []string) ([]agent.ReaderMark, error) {
	out := make([]agent.ReaderMark, len(threadIDs))
	at := make(map[string][]int, len(threadIDs)) // thread item pk -> positions in threadIDs
	var keys []item
	for i, id := range threadIDs {
		out[i].ThreadID = id
		pk := threadPK(id)
		if _, ok := at[pk]; !ok {
			keys = append(keys, key(pk, threadSK))
		}
		at[pk] = append(at[pk], i)
	}
	e := newExpr()
	proj := aws.String(e.n(AttrPK) + ", " + e.n(attrClaimRun) + ", " + e.n(attrClaimReaders))
	names := e.attrNames()
	var (
		mu      sync.Mutex
		firstEr error
		wg      sync.WaitGroup
	)
	sem := make(chan struct{}, readersParallel)
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 100)]
		keys = keys[len(batch):]
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			got, err := s.readersBatch(ctx, batch, proj, names)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstEr = cmp.Or(firstEr, err)
				return
			}
			for _, it := range got {
				run := getS(it, attrClaimRun)
				if run == "" {
					continue
				}
				for _, i := range at[getS(it, AttrPK)] {
					out[i].RunID, out[i].Until = run, getT(it, attrClaimReaders)
				}
			}
		}()
	}
	wg.Wait()
	if firstEr != nil {
		return nil, firstEr
	}
	return out, nil
}

// readersBatch is one ReadersOf request of up to 100 keys, with its unprocessed keys asked again.
func (s *Store) readersBatch(ctx context.Context, batch []item, proj *string, names map[string]string) ([]item, error) {
	var got []item
	for attempt := 0; len(batch) > 0; attempt++ {
		if attempt > 0 {
			if attempt >= readersAttempts {
				return nil, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "dynamo readers of: %d keys left unprocessed", len(batch))
			}
			if err := (agent.SystemClock{}).Sleep(ctx, backoff(attempt)); err != nil {
				return nil, storeErr(err, "readers of")
			}
		}
		res, err := s.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
			RequestItems: map[string]types.KeysAndAttributes{s.table: {Keys: batch, ConsistentRead: aws.Bool(false),
				ProjectionExpression: proj, ExpressionAttributeNames: names}},
		})
		if err != nil {
			return nil, storeErr(err, "readers of")
		}
		got = append(got, res.Responses[s.table]...)
		batch = res.UnprocessedKeys[s.table].Keys
	}
	return got, nil
}

// FinishRun is fence C: the release write first (see release; condition: the claim still names the run at its
// epoch), which is the decision and adds the usage, then the outcome's compare-and-set on the run item
// (recordOutcome). A refused release is run_fenced and writes nothing more: the reaper (which takes a stale claim
// at epoch+1) or a later run holds the thread, and the run's outcome is theirs to record.
//
// The two items cannot change atomically without a transaction. A release that fails its condition on a thread
// that is idle at the run's own epoch was this very release, applied by an earlier attempt whose answer was lost
// (every takeover and every later claim moves the epoch): the outcome is then recorded. A crash between the two
// writes leaves the thread idle and the run item running: the reaper's orphan sweep finishes it from its stored
// final message (ReapOrphan), as it does for a run item written late, or, when a later run has continued that
// message since, records it interrupted with the usage the release kept (Run.Released, released.go).
func (s *Store) FinishRun(ctx context.Context, run agent.Run) error {
	if !run.Status.Terminal() {
		return agent.E(agent.KindInvalid, agent.CodeInvalidStatus, "FinishRun needs a terminal status, got %q", run.Status)
	}
	err := s.release(ctx, agent.ReleaseRequest{ThreadID: run.ThreadID, Fence: run.Fence(), Usage: run.Usage, Now: run.FinishedAt})
	if isConditionFailed(err) {
		k := key(threadPK(run.ThreadID), threadSK)
		old, err := s.failedItem(ctx, err, k)
		if err != nil {
			return err
		}
		if !live(old) || has(old, attrClaimRun) || getN(old, attrEpoch) != run.Epoch {
			return fenced(run.Fence())
		}
		// Idle at our epoch: our own release applied before; record the outcome.
	} else if err != nil {
		return storeErr(err, "release claim")
	}
	return s.recordOutcome(ctx, run, false)
}

// RecordOutcome is the reaper's write of a dead run's outcome: the compare-and-set of recordOutcome alone. The
// reaper holds the thread (TakeOver) while it writes; one item cannot check another, so holder is not checked
// here: the compare-and-set from running at the run's epoch is what keeps a second reaper from overwriting it.
func (s *Store) RecordOutcome(ctx context.Context, run agent.Run, holder agent.Fence) error {
	if !run.Status.Terminal() {
		return agent.E(agent.KindInvalid, agent.CodeInvalidStatus, "RecordOutcome needs a terminal status, got %q", run.Status)
	}
	return s.recordOutcome(ctx, run, true)
}

// NoteTakes is one UpdateItem on the run item: ADD takes :ids, condition status = running AND epoch = :epoch.
// The reaper's RecordOutcome seals the set (it applies only to the set the reaper fenced), so an id noted after
// the reaper read the run makes its outcome fail, and it reads the run again; once the outcome is recorded every
// note is refused. A run item cannot check the thread's claim: the seal is what fences a note.
func (s *Store) NoteTakes(ctx context.Context, run agent.Run, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	e := newExpr()
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:        aws.String(s.table),
		Key:              key(threadPK(run.ThreadID), runSK(run.ID)),
		UpdateExpression: aws.String("ADD " + e.n(attrTakes) + " " + e.v(avSS(ids...))),
		ConditionExpression: aws.String(e.n(attrStatus) + " = " + e.v(avS(string(agent.RunRunning))) + " AND " +
			e.n(attrEpoch) + " = " + e.v(avN(run.Epoch))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if isConditionFailed(err) {
		return fenced(run.Fence())
	}
	return storeErr(err, "note takes")
}

// setIs renders the condition that the string set attribute name holds exactly ids (absent when ids is empty).
func setIs(e *expr, name string, ids []string) string {
	if len(ids) == 0 {
		return "attribute_not_exists(" + e.n(name) + ")"
	}
	cond := "size(" + e.n(name) + ") = " + e.v(avN(int64(len(ids))))
	for _, id := range ids {
		cond += " AND contains(" + e.n(name) + ", " + e.v(avS(id)) + ")"
	}
	return cond
}

// recordOutcome is one UpdateItem on the run item, condition status = running AND epoch = :epoch, and for the
// reaper (seal) the run's takes are exactly run.Takes. A failed condition on an item that already holds this
// outcome at this epoch is a retry whose answer was lost: success.
func (s *Store) recordOutcome(ctx context.Context, run agent.Run, seal bool) error {
	k := key(threadPK(run.ThreadID), runSK(run.ID))
	e := newExpr()
	sets := []string{
		e.n(attrStatus) + " = " + e.v(avS(string(run.Status))),
		e.n(attrSteps) + " = " + e.v(avN(int64(run.Steps))),
		e.n(attrUsageIn) + " = " + e.v(avN(run.Usage.InputTokens)),
		e.n(attrUsageOut) + " = " + e.v(avN(run.Usage.OutputTokens)),
		e.n(attrUsageTotal) + " = " + e.v(avN(run.Usage.TotalTokens)),
		e.n(attrUsageCached) + " = " + e.v(avN(run.Usage.CachedInputTokens)),
		e.n(attrUsageReasoning) + " = " + e.v(avN(run.Usage.ReasoningTokens)),
		e.n(attrUsageCost) + " = " + e.v(avN(run.Usage.CostMicroUSD)),
	}
	if run.Usage.CacheWriteTokens != 0 {
		sets = append(sets, e.n(attrUsageCacheWrite)+" = "+e.v(avN(run.Usage.CacheWriteTokens)))
	}
	if run.Store != nil {
		sets = append(sets, storeSets(e, *run.Store)...)
	}
	sets = append(sets, signalSets(e, run)...) // the outbox: the signal is pending from this very write
	var removes []string
	// UpdatedAt as given, else the finish time, else left as stored.
	if updated := cmp.Or(run.UpdatedAt, run.FinishedAt); !updated.IsZero() {
		sets = append(sets, e.n(attrUpdatedAt)+" = "+e.v(avT(updated)))
	}
	if run.Model != "" {
		sets = append(sets, e.n(attrModel)+" = "+e.v(avS(run.Model)))
	} else {
		removes = append(removes, e.n(attrModel))
	}
	if run.FinishedAt.IsZero() {
		removes = append(removes, e.n(attrFinishedAt))
	} else {
		sets = append(sets, e.n(attrFinishedAt)+" = "+e.v(avT(run.FinishedAt)))
	}
	if run.Error != nil {
		sets = append(sets, e.n(attrErrCode)+" = "+e.v(avS(run.Error.Code)),
			e.n(attrErrMessage)+" = "+e.v(avS(truncateUTF8(run.Error.Message, maxRunErrorBytes))))
	} else {
		removes = append(removes, e.n(attrErrCode), e.n(attrErrMessage))
	}
	update := "SET " + strings.Join(sets, ", ")
	if len(removes) > 0 {
		update += " REMOVE " + strings.Join(removes, ", ")
	}
	cond := e.n(attrStatus) + " = " + e.v(avS(string(agent.RunRunning))) + " AND " + e.n(attrEpoch) + " = " + e.v(avN(run.Epoch))
	if seal {
		cond += " AND " + setIs(e, attrTakes, run.Takes)
	}
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
		return storeErr(err, "finish run")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return err
	}
	if len(old) == 0 {
		return runNotFound(run.ThreadID, run.ID)
	}
	if getS(old, attrStatus) == string(run.Status) && getN(old, attrEpoch) == run.Epoch &&
		getS(old, attrErrCode) == errCode(run.Error) && getN(old, attrUsageTotal) == run.Usage.TotalTokens {
		return nil // this outcome, recorded by an earlier attempt whose answer was lost
	}
	return fenced(run.Fence())
}

func errCode(e *agent.RunError) string {
	if e == nil {
		return ""
	}
	return e.Code
}

// TakeOver is the reaper's decision: one UpdateItem on the thread,
//
//	condition: attribute_exists(pk) AND attribute_not_exists(deleting) AND
//	           (claimRunId = :run AND epoch = :epoch AND claimHeartbeatAt < :staleBefore | attribute_not_exists(claimRunId))
//	update:    SET claimRunId = "reap:<run>", claimHeartbeatAt, claimBucket, runShard  REMOVE claimCancel,
//	           claimPrev*  ADD epoch 1
//	returns:   UPDATED_NEW (the epoch)
//
// The reaper's claim sits in the running index like any claim, so a reaper that dies leaves a claim the next sweep
// takes the same way.
func (s *Store) TakeOver(ctx context.Context, req agent.TakeRequest) (agent.Fence, error) {
	runID := agent.ReapRunID(req.RunID)
	e := newExpr()
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND " + notDeleting(e) + " AND "
	if req.Fence.RunID == "" {
		cond += "attribute_not_exists(" + e.n(attrClaimRun) + ")"
	} else {
		cond += holds(e, req.Fence, req.StaleBefore)
	}
	update := "SET " + strings.Join([]string{
		e.n(attrClaimRun) + " = " + e.v(avS(runID)),
		e.n(AttrClaimHeartbeat) + " = " + e.v(avT(req.Now)),
		e.n(AttrClaimBucket) + " = " + e.v(avS(s.bucketOf(req.Now))),
		e.n(AttrRunShard) + " = " + e.v(avS(s.runShard(req.ThreadID))),
	}, ", ") + " REMOVE " + strings.Join([]string{e.n(attrClaimCancel), e.n(attrClaimReaders), e.n(attrPrevRun), e.n(attrPrevHeartbeat), e.n(attrPrevCancel)}, ", ") +
		" ADD " + e.n(attrEpoch) + " " + e.v(avN(1))
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(req.ThreadID), threadSK),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
		ReturnValues:              types.ReturnValueUpdatedNew,
	})
	if isConditionFailed(err) {
		return agent.Fence{}, fenced(req.Fence)
	}
	if err != nil {
		return agent.Fence{}, storeErr(err, "take over claim")
	}
	return agent.Fence{RunID: runID, Epoch: getN(res.Attributes, attrEpoch)}, nil
}

// ReleaseClaim is the reaper's decision, one release write (see release) conditioned on the claim still naming
// req.Fence with a heartbeat before req.StaleBefore. It looks only at the thread item, so a claim whose run item
// is missing or already terminal is released the same way. Anything else, an unknown thread included, is
// run_fenced and changes nothing.
func (s *Store) ReleaseClaim(ctx context.Context, req agent.ReleaseRequest) error {
	err := s.release(ctx, req)
	if isConditionFailed(err) {
		return fenced(req.Fence)
	}
	return storeErr(err, "release claim")
}

// usageAdd renders the ADD clause for non-zero usage counters; "" when all are zero.
func usageAdd(e *expr, u agent.Usage) string {
	var parts []string
	for _, c := range []struct {
		attr string
		n    int64
	}{{attrUsageIn, u.InputTokens}, {attrUsageOut, u.OutputTokens}, {attrUsageTotal, u.TotalTokens},
		{attrUsageCached, u.CachedInputTokens}, {attrUsageReasoning, u.ReasoningTokens}, {attrUsageCost, u.CostMicroUSD},
		{attrUsageCacheWrite, u.CacheWriteTokens}} {
		if c.n != 0 {
			parts = append(parts, e.n(c.attr)+" "+e.v(avN(c.n)))
		}
	}
	return strings.Join(parts, ", ")
}

func (s *Store) GetRun(ctx context.Context, threadID, runID string) (agent.Run, error) {
	base := s.readBase(ctx, threadID, attrReleased+runID, attrClaimRun)
	it, err := s.getItem(ctx, key(threadPK(threadID), runSK(runID)))
	if err != nil {
		return agent.Run{}, err
	}
	if kept, err := base.keep([]item{it}, attrEpoch); err != nil {
		return agent.Run{}, err
	} else if len(kept) == 0 {
		it = nil // of an earlier incarnation of the thread
	}
	if it == nil {
		return agent.Run{}, runNotFound(threadID, runID)
	}
	return withReleased(decodeRun(it), base.item), nil
}

// ListRuns queries the RUN# items of the thread partition and orders them by creation (ties by id).
func (s *Store) ListRuns(ctx context.Context, threadID string) ([]agent.Run, error) {
	base := s.readBase(ctx, threadID)
	var items []item
	err := s.queryPrefix(ctx, threadPK(threadID), prefixRun, false, func(it item) error {
		items = append(items, it)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if items, err = base.keep(items, attrEpoch); err != nil {
		return nil, err
	}
	runs := make([]agent.Run, 0, len(items))
	for _, it := range items {
		runs = append(runs, decodeRun(it))
	}
	sort.SliceStable(runs, func(i, j int) bool {
		if !runs[i].CreatedAt.Equal(runs[j].CreatedAt) {
			return runs[i].CreatedAt.Before(runs[j].CreatedAt)
		}
		return runs[i].ID < runs[j].ID
	})
	return runs, nil
}

// ListRunsPage reads the thread's run items (one Query of the RUN# prefix: run items are small, about 1 KB, so
// a thread's runs cost about one read unit per four of them) and returns the page newest first. Runs are keyed
// by id, and ids order creation only to the millisecond, so the page is cut from ListRuns' order in memory; this
// is the API's read of a thread's runs, never a turn's.
func (s *Store) ListRunsPage(ctx context.Context, threadID string, p agent.RunPage) (agent.Page[agent.Run], error) {
	all, err := s.ListRuns(ctx, threadID)
	if err != nil {
		return agent.Page[agent.Run]{}, err
	}
	return agent.RunsPage(all, p), nil
}

// ListStaleClaims reads the sparse running index, which holds only claimed threads, keys only: one Query per shard
// for claimBucket < :before. The bucket is the heartbeat rounded down, so every claim with a heartbeat before
// `before` is among the answers, along with claims up to one bucket (10 s) fresher. The nominees' thread items are
// then read with strongly consistent BatchGetItem requests (one per 100) and only claims whose exact heartbeat is
// before `before` are returned, with their exact claim. The work is proportional to the claimed threads near or
// past the cutoff, never to the table (finished runs are not in the index; BenchmarkReaperSweep). The answers are
// still only nominations: the index may lag, and a claim may be refreshed right after the read, so callers
// decide in a conditional write (ReleaseClaim). Results are ordered by heartbeat, then thread id.
func (s *Store) ListStaleClaims(ctx context.Context, before time.Time, limit int) ([]agent.StaleClaim, error) {
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	out := []agent.StaleClaim{}
	ix := sparseIndex{name: IndexRunning, shardAttr: AttrRunShard, shardPrefix: "RUN#", sortAttr: AttrClaimBucket, shards: s.runShards,
		keep: true}
	err := s.nominate(ctx, ix, before, limit, func(nominees []item) (int, error) {
		got, err := s.batchGet(ctx, nominees)
		if err != nil {
			return 0, err
		}
		n := len(out)
		for _, it := range got {
			if c := decodeClaim(it); c != nil && c.HeartbeatAt.Before(before) {
				out = append(out, agent.StaleClaim{ThreadID: getS(it, attrID), Claim: *c})
			}
		}
		return len(out) - n, nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Claim.HeartbeatAt.Equal(out[j].Claim.HeartbeatAt) {
			return out[i].Claim.HeartbeatAt.Before(out[j].Claim.HeartbeatAt)
		}
		return out[i].ThreadID < out[j].ThreadID
	})
	return out[:min(len(out), limit)], nil
}

// sparseIndex is a sharded sparse index whose sort key is a time: the reapers' work lists (claims by heartbeat
// bucket, pending interrupts by expiry). Its keys only nominate items; the caller re-reads them.
type sparseIndex struct {
	name, shardAttr, shardPrefix, sortAttr string
	shards                                 int
	// exact: the sort key is the item's own time, so every nominee qualifies and a page needs no more than limit
	// (the claims index is a coarse bucket, so its pages read on).
	exact bool
	// keep: the sweep's complete reads of a shard are kept for a later list of the same sweep (sweepReads);
	// reuse: this list takes them instead of querying those shards.
	keep, reuse bool
}

// sweepReads keeps, for the running index, the keys one list of a reaper sweep read from each shard it read whole,
// and the cutoff it read them under, so that the sweep's next list with the same condition (the orphan runs' after
// the stale claims') takes them instead of querying the shards again: an idle tick queries the running index's
// shards once, not twice. Each kept read serves one list, and only in the same sweep (agent.SweepOf: the reaper's
// Tick marks its context). Nominations only: the taker re-reads every item it is handed. A key that came below
// the cutoff between the two reads is not in the kept read, and is read by the next tick: so an orphan waits at
// most one tick longer than its cutoff says (and no longer than that: every tick reads the index afresh first).
type sweepReads struct {
	mu     sync.Mutex
	sweep  *agent.Sweep
	before time.Time
	shards map[int][]item
}

// put keeps keys as shard's whole read under before in sweep (nothing outside a sweep).
func (r *sweepReads) put(sweep *agent.Sweep, before time.Time, shard int, keys []item) {
	if sweep == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sweep != sweep || !r.before.Equal(before) {
		r.sweep, r.before, r.shards = sweep, before, map[int][]item{}
	}
	r.shards[shard] = keys
}

// take hands out (once) the keys kept for shard in sweep, read under a cutoff no later than before.
func (r *sweepReads) take(sweep *agent.Sweep, before time.Time, shard int) ([]item, bool) {
	if sweep == nil || r == nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	keys, ok := r.shards[shard]
	if !ok || r.sweep != sweep || before.Before(r.before) {
		return nil, false
	}
	delete(r.shards, shard)
	return keys, true
}

// sweepStarts rotates the first shard of each sharded index's sweeps (REVIEW D11): a sweep stops once its batch
// is full, so one that always began at shard 0 would leave the high shards waiting for as long as the low ones
// hold a batch's worth of work. Each index (its name and shard prefix) has its own turn, so the four lists of one
// reaper tick do not move each other's.
type sweepStarts struct {
	mu   sync.Mutex
	seed int
	next map[string]int
}

// start returns the shard the next sweep of ix begins at.
func (w *sweepStarts) start(ix sparseIndex) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next == nil {
		w.next = map[string]int{}
	}
	k := ix.name + "/" + ix.shardPrefix
	n, ok := w.next[k]
	if !ok {
		n = w.seed
	}
	w.next[k] = n + 1
	return n % ix.shards
}

// nominate queries every shard of ix for keys whose sort key is before `before` and hands them to keep in
// batches (as soon as enough may fill the answer, and at the end); keep re-reads them and reports how many still
// qualify. It stops once limit were kept. It starts at the shard after the one the previous sweep of ix started
// at (sweepStarts), so a full batch never starves the shards after it.
func (s *Store) nominate(ctx context.Context, ix sparseIndex, before time.Time, limit int, keep func([]item) (int, error)) error {
	kept := 0
	var nominees []item
	flush := func() error {
		n, err := keep(nominees)
		nominees, kept = nominees[:0], kept+n
		return err
	}
	page := int32(1000)
	if ix.exact {
		page = int32(min(limit, 1000))
	}
	// add nominates k, checking the nominees once enough may fill the answer; stop: the answer is full.
	add := func(k item) (stop bool, err error) {
		nominees = append(nominees, k)
		if len(nominees) >= limit-kept {
			// Enough nominees to possibly fill the answer: check them before reading on.
			if err := flush(); err != nil {
				return true, err
			}
			return kept >= limit, nil
		}
		return false, nil
	}
	sweep := agent.SweepOf(ctx)
	var reads *sweepReads // kept reads this list may take (nil: it queries every shard)
	if ix.reuse {
		reads = &s.reads
	}
	first := s.sweeps.start(ix)
	for i := 0; i < ix.shards && kept < limit; i++ {
		shard := (first + i) % ix.shards
		if keys, ok := reads.take(sweep, before, shard); ok {
			for _, k := range keys {
				if stop, err := add(k); err != nil || stop {
					return err
				}
			}
			continue
		}
		var read []item
		whole := true
		e := newExpr()
		in := &dynamodb.QueryInput{
			TableName: aws.String(s.table),
			IndexName: aws.String(ix.name),
			KeyConditionExpression: aws.String(e.n(ix.shardAttr) + " = " + e.v(avS(ix.shardPrefix+strconv.Itoa(shard))) + " AND " +
				e.n(ix.sortAttr) + " < " + e.v(avT(before))),
			ExpressionAttributeNames:  e.attrNames(),
			ExpressionAttributeValues: e.attrValues(),
			Limit:                     aws.Int32(page),
		}
		err := s.query(ctx, in, func(it item) error {
			k := key(getS(it, AttrPK), getS(it, AttrSK))
			if ix.keep {
				read = append(read, k)
			}
			stop, err := add(k)
			if err == nil && stop {
				whole = false
				return errStopQuery
			}
			return err
		})
		if err != nil {
			return err
		}
		if ix.keep && whole {
			s.reads.put(sweep, before, shard, read)
		}
	}
	if len(nominees) > 0 && kept < limit {
		return flush()
	}
	return nil
}

func avSS(v ...string) types.AttributeValue { return &types.AttributeValueMemberSS{Value: v} }

func getSS(it item, name string) []string {
	if v, ok := it[name].(*types.AttributeValueMemberSS); ok {
		return v.Value
	}
	return nil
}

// addUnrecorded adds runID to the thread's unrecorded runs while f holds the claim: one UpdateItem.
func (s *Store) addUnrecorded(ctx context.Context, threadID string, f agent.Fence, runID string) error {
	e := newExpr()
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(threadID), threadSK),
		UpdateExpression:          aws.String("ADD " + e.n(attrUnrecorded) + " " + e.v(avSS(runID))),
		ConditionExpression:       aws.String(holds(e, f, time.Time{})),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if isConditionFailed(err) {
		return nil // the claim moved on: whoever took it released or reaped it
	}
	return storeErr(err, "note unrecorded run")
}

// ListOrphanRuns (agent.OrphanRunLister, REVIEW D15) finds the runs recorded as running that no claim names. A
// released thread stays in the running index (release keeps its keys) with the runs it released in its
// unrecorded set, so the sweep reads the same index as ListStaleClaims, keys only, one Query per shard for
// claimBucket < :before, and then:
//
//  1. the nominees' thread items (strongly consistent BatchGetItem, one per 100);
//  2. the run items their unrecorded sets name (one BatchGetItem): a run still running, last changed before
//     `before`, is an answer, unless the thread's claim is its own (a reaper's claim finishing it);
//  3. one UpdateItem per thread with runs to forget, condition attribute_exists(pk): DELETE from the set
//     the runs found recorded (a terminal status never changes) or missing (a run item never written, or
//     deleted); and when that empties the set, REMOVE the index keys in the same write, on condition that the
//     thread is still idle and its set is still exactly what was read (size and contains), so a release that
//     came in between keeps the thread nominated.
//
// So a thread leaves the index once per idle period, one write (1 WCU, and the index delete) after its last
// release is older than `before`; a chained turn only moves its key (BenchmarkTurn; infra/DYNAMODB.md). The
// answers are nominations: the caller finishes each through ReapOrphan, which re-checks everything. Ordered by
// UpdatedAt, thread id, run id. In a reaper sweep (agent.WithSweep) that listed the stale claims first, the Queries
// of the shards that list read whole are not made again: their keys are reused (sweepReads), so an idle tick costs
// 16 Queries for both lists, not 32, and an orphan that came below the cutoff between the two reads is named by the
// next tick.
func (s *Store) ListOrphanRuns(ctx context.Context, before time.Time, limit int) ([]agent.Run, error) {
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	out := []agent.Run{}
	ix := sparseIndex{name: IndexRunning, shardAttr: AttrRunShard, shardPrefix: "RUN#", sortAttr: AttrClaimBucket, shards: s.runShards,
		reuse: true}
	err := s.nominate(ctx, ix, before, limit, func(nominees []item) (int, error) {
		threads, err := s.batchGet(ctx, nominees)
		if err != nil {
			return 0, err
		}
		var runKeys []item
		nominated := map[string]item{}
		for _, it := range threads {
			if !live(it) {
				continue
			}
			id := getS(it, attrID)
			nominated[id] = it
			for _, run := range getSS(it, attrUnrecorded) {
				runKeys = append(runKeys, key(threadPK(id), runSK(run)))
			}
		}
		runs, err := s.batchGet(ctx, runKeys)
		if err != nil {
			return 0, err
		}
		n := len(out)
		for id, th := range nominated {
			claim := decodeClaim(th)
			var forget []string
			for _, runID := range getSS(th, attrUnrecorded) {
				it, ok := runs[itemKey(key(threadPK(id), runSK(runID)))]
				switch {
				case claim != nil && agent.ReapedRunID(claim.RunID) == runID:
					// Claimed again by its own id (a recognised retry), or held by a reaper finishing it: kept,
					// recorded or not, with the usage its release kept (a reaper that died after the outcome
					// leaves its claim, and the next one must not count that usage again).
				case !ok:
					forget = append(forget, runID)
				case getS(it, attrStatus) != string(agent.RunRunning):
					forget = append(forget, runID)
				case getT(it, attrUpdatedAt).Before(before):
					out = append(out, withReleased(decodeRun(it), th))
				}
			}
			if err := s.forgetRecorded(ctx, id, getSS(th, attrUnrecorded), forget, claim == nil); err != nil {
				s.log.WarnContext(ctx, "dynamo: forgetting recorded runs", "thread", id, "err", err)
			}
		}
		return len(out) - n, nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.UpdatedAt.Equal(b.UpdatedAt) {
			return a.UpdatedAt.Before(b.UpdatedAt)
		}
		if a.ThreadID != b.ThreadID {
			return a.ThreadID < b.ThreadID
		}
		return a.ID < b.ID
	})
	return out[:min(len(out), limit)], nil
}

// forgetRecorded takes the runs of forget out of an idle thread's unrecorded set (read as set), and the thread out
// of the running index when that leaves the set empty: one conditional UpdateItem (see ListOrphanRuns). A failed
// condition changes nothing (a claim or a release came in between; the next sweep looks again).
func (s *Store) forgetRecorded(ctx context.Context, threadID string, set, forget []string, idle bool) error {
	e := newExpr()
	cond := "attribute_exists(" + e.n(AttrPK) + ")"
	var update string
	switch {
	case idle && len(forget) == len(set):
		// All recorded (or none to look at): the thread leaves the index, if nothing changed since the read.
		cond += " AND attribute_not_exists(" + e.n(attrClaimRun) + ")"
		cond += " AND " + setIs(e, attrUnrecorded, set)
		update = "REMOVE " + e.n(AttrRunShard) + ", " + e.n(AttrClaimBucket)
		if len(set) > 0 {
			update += ", " + e.n(attrUnrecorded)
		}
		for _, run := range set {
			update += ", " + e.n(attrReleased+run)
		}
	case len(forget) > 0:
		update = "DELETE " + e.n(attrUnrecorded) + " " + e.v(avSS(forget...)) + " REMOVE "
		for i, run := range forget {
			if i > 0 {
				update += ", "
			}
			update += e.n(attrReleased + run)
		}
	default:
		return nil
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(threadID), threadSK),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if isConditionFailed(err) {
		return nil
	}
	return storeErr(err, "forget recorded runs")
}
