package dynamo

import (
	"context"
	"sort"
	"strconv"
	"strings"
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
	attrFinishedAt = "finishedAt"
)

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
	it[attrEpoch] = avN(r.Epoch)
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
		Epoch:              getN(it, attrEpoch),
		CreatedAt:          getT(it, attrCreatedAt),
		UpdatedAt:          getT(it, attrUpdatedAt),
		FinishedAt:         getT(it, attrFinishedAt),
	}
	if has(it, attrErrCode) || has(it, attrErrMessage) {
		r.Error = &agent.RunError{Code: getS(it, attrErrCode), Message: getS(it, attrErrMessage)}
	}
	return r
}

// ClaimRun is two writes. The first decides ownership: one UpdateItem on the thread item,
//
//	condition: attribute_exists(pk) AND (attribute_not_exists(claimRunId) OR claimHeartbeatAt < :now-staleAfter)
//	update:    SET claimRunId, claimHeartbeatAt, runShard  REMOVE claimCancel, claimCancelAt  ADD epoch 1
//
// returning the old item, which yields the new epoch (old+1) and, on a stale takeover, the previous claim. The
// second write puts the run item. Nothing reads the run item to decide ownership (heartbeats fence on the
// thread), so a crash between the two leaves a claim that goes stale and is taken over, never a split brain.
func (s *Store) ClaimRun(ctx context.Context, req agent.ClaimRequest) (agent.ClaimResult, error) {
	e := newExpr()
	cutoff := req.Now.Add(-req.StaleAfter)
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND (attribute_not_exists(" + e.n(attrClaimRun) + ") OR " +
		e.n(AttrClaimHeartbeat) + " < " + e.v(avT(cutoff)) + ")"
	update := "SET " + e.n(attrClaimRun) + " = " + e.v(avS(req.RunID)) + ", " +
		e.n(AttrClaimHeartbeat) + " = " + e.v(avT(req.Now)) + ", " +
		e.n(AttrRunShard) + " = " + e.v(avS(s.runShard(req.ThreadID))) +
		" REMOVE " + e.n(attrClaimCancel) + ", " + e.n(attrCancelAt) +
		" ADD " + e.n(attrEpoch) + " " + e.v(avN(1))
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 key(threadPK(req.ThreadID), threadSK),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if old, ok := conditionFailed(err); ok {
		if len(old) == 0 {
			return agent.ClaimResult{}, threadNotFound(req.ThreadID)
		}
		c := decodeClaim(old)
		return agent.ClaimResult{}, agent.E(agent.KindConflict, agent.CodeRunActive, "thread %q is running %s", req.ThreadID, c.RunID)
	}
	if err != nil {
		return agent.ClaimResult{}, storeErr(err, "claim run")
	}
	run := agent.Run{
		ID:                 req.RunID,
		ThreadID:           req.ThreadID,
		Trigger:            req.Trigger,
		Status:             agent.RunRunning,
		AssistantMessageID: req.AssistantMessageID,
		Epoch:              getN(res.Attributes, attrEpoch) + 1,
		CreatedAt:          req.Now,
		UpdatedAt:          req.Now,
	}
	if _, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.table),
		Item:      runItem(run),
	}); err != nil {
		// The caller sees a failed claim, so give the thread back rather than leave it blocked until the claim
		// goes stale. Best effort, and fenced like any release: it removes only this claim.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := s.release(rctx, req.ThreadID, req.RunID, run.Epoch); rerr != nil {
			s.log.WarnContext(ctx, "dynamo: releasing a claim whose run item failed", "thread", req.ThreadID, "run", req.RunID, "err", rerr)
		}
		return agent.ClaimResult{}, storeErr(err, "put run")
	}
	return agent.ClaimResult{Run: run, Previous: decodeClaim(res.Attributes)}, nil
}

// claimRemoval lists the claim attributes; removing them releases the claim and takes the thread out of the
// running index in the same write.
func claimRemoval(e *expr) string {
	return strings.Join([]string{e.n(attrClaimRun), e.n(AttrClaimHeartbeat), e.n(AttrRunShard),
		e.n(attrClaimCancel), e.n(attrCancelAt)}, ", ")
}

// release removes the claim if it still names runID at epoch; a claim that moved on is left alone (no error).
func (s *Store) release(ctx context.Context, threadID, runID string, epoch int64) error {
	e := newExpr()
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(threadID), threadSK),
		UpdateExpression:          aws.String("REMOVE " + claimRemoval(e)),
		ConditionExpression:       aws.String(e.n(attrClaimRun) + " = " + e.v(avS(runID)) + " AND " + e.n(attrEpoch) + " = " + e.v(avN(epoch))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if _, ok := conditionFailed(err); ok {
		return nil
	}
	return storeErr(err, "release claim")
}

// Heartbeat: one UpdateItem on the thread,
//
//	condition: claimRunId = :run AND epoch = :epoch AND attribute_not_exists(claimCancel)
//	update:    SET claimHeartbeatAt = :now
//
// which also moves the thread within the running index. On failure the old item (ALL_OLD) tells a cancel
// request on our own claim apart from a lost claim.
func (s *Store) Heartbeat(ctx context.Context, threadID, runID string, epoch int64, now time.Time) error {
	e := newExpr()
	cond := e.n(attrClaimRun) + " = " + e.v(avS(runID)) + " AND " + e.n(attrEpoch) + " = " + e.v(avN(epoch)) +
		" AND attribute_not_exists(" + e.n(attrClaimCancel) + ")"
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 key(threadPK(threadID), threadSK),
		UpdateExpression:                    aws.String("SET " + e.n(AttrClaimHeartbeat) + " = " + e.v(avT(now))),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if old, ok := conditionFailed(err); ok {
		if c := decodeClaim(old); c != nil && c.RunID == runID && c.Epoch == epoch && c.CancelRequested {
			return agent.E(agent.KindCanceled, agent.CodeRunCanceled, "run %s was canceled", runID)
		}
		return agent.E(agent.KindConflict, agent.CodeRunFenced, "run %s no longer holds thread %q at epoch %d", runID, threadID, epoch)
	}
	return storeErr(err, "heartbeat")
}

// RequestCancel: one UpdateItem on the thread, condition attribute_exists(claimRunId), SET claimCancel = true.
func (s *Store) RequestCancel(ctx context.Context, threadID string, now time.Time) (agent.Claim, error) {
	e := newExpr()
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       key(threadPK(threadID), threadSK),
		UpdateExpression: aws.String("SET " + e.n(attrClaimCancel) + " = " + e.v(avBool(true)) + ", " +
			e.n(attrCancelAt) + " = " + e.v(avT(now))),
		ConditionExpression:                 aws.String("attribute_exists(" + e.n(attrClaimRun) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if old, ok := conditionFailed(err); ok {
		if len(old) == 0 {
			return agent.Claim{}, threadNotFound(threadID)
		}
		return agent.Claim{}, agent.E(agent.KindConflict, agent.CodeNoActiveRun, "thread %q has no active run", threadID)
	}
	if err != nil {
		return agent.Claim{}, storeErr(err, "request cancel")
	}
	return *decodeClaim(res.Attributes), nil
}

// FinishRun is a compare-and-set on the run item (condition: status = running AND epoch = :epoch), then one
// UpdateItem on the thread that adds the usage and releases the claim,
//
//	condition: claimRunId = :run AND epoch = :epoch
//	update:    ADD usage*  REMOVE claimRunId, claimHeartbeatAt, runShard, claimCancel, claimCancelAt
//
// Only when that condition fails (the claim was taken over after going stale) does a third write add the usage
// alone. Releasing removes the running-index keys, so the thread leaves the sparse index in the same write.
//
// The two items cannot change atomically without a transaction. A process that dies between the two writes leaves
// a finished run whose claim is still held; any later FinishRun of that run (the reaper's, or a retry) is fenced
// by the first write but, seeing the run terminal at the same epoch, performs the missing release.
func (s *Store) FinishRun(ctx context.Context, run agent.Run) error {
	if !run.Status.Terminal() {
		return agent.E(agent.KindInvalid, "invalid_status", "FinishRun needs a terminal status, got %q", run.Status)
	}
	e := newExpr()
	sets := []string{
		e.n(attrStatus) + " = " + e.v(avS(string(run.Status))),
		e.n(attrSteps) + " = " + e.v(avN(int64(run.Steps))),
		e.n(attrUsageIn) + " = " + e.v(avN(run.Usage.InputTokens)),
		e.n(attrUsageOut) + " = " + e.v(avN(run.Usage.OutputTokens)),
		e.n(attrUsageTotal) + " = " + e.v(avN(run.Usage.TotalTokens)),
		e.n(attrUsageCached) + " = " + e.v(avN(run.Usage.CachedInputTokens)),
		e.n(attrUpdatedAt) + " = " + e.v(avT(run.UpdatedAt)),
	}
	var removes []string
	if run.Model != "" {
		sets = append(sets, e.n(attrModel)+" = "+e.v(avS(run.Model)))
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
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 key(threadPK(run.ThreadID), runSK(run.ID)),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if old, ok := conditionFailed(err); ok {
		// The run is already over at this very epoch. If its claim is still held, an earlier FinishRun stopped
		// between its two writes (the process died): finish that release now, without counting usage twice.
		// A claim held by a finished run can only block the thread, so releasing it is always right.
		if st := agent.RunStatus(getS(old, attrStatus)); st.Terminal() && getN(old, attrEpoch) == run.Epoch {
			if err := s.release(ctx, run.ThreadID, run.ID, run.Epoch); err != nil {
				return err
			}
		}
		return agent.E(agent.KindConflict, agent.CodeRunFenced, "run %s is no longer running at epoch %d", run.ID, run.Epoch)
	}
	if err != nil {
		return storeErr(err, "finish run")
	}

	// Release and add usage in one write.
	e = newExpr()
	add := usageAdd(e, run.Usage)
	update = "REMOVE " + claimRemoval(e)
	if add != "" {
		update += " ADD " + add
	}
	cond = e.n(attrClaimRun) + " = " + e.v(avS(run.ID)) + " AND " + e.n(attrEpoch) + " = " + e.v(avN(run.Epoch))
	if !run.FinishedAt.IsZero() {
		// The thread moves up in its owner's list when a turn ends (recency is the byOwner index key).
		update += " SET " + e.n(attrUpdatedAt) + " = " + e.v(avT(run.FinishedAt)) + ", " + e.n(AttrRecency) + " = " + e.v(avS(recency(run.FinishedAt, run.ThreadID)))
	}
	_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(run.ThreadID), threadSK),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if _, ok := conditionFailed(err); !ok {
		return storeErr(err, "release claim")
	}
	if add == "" {
		return nil
	}
	// The claim moved on: the usage still counts.
	e = newExpr()
	add = usageAdd(e, run.Usage)
	_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(run.ThreadID), threadSK),
		UpdateExpression:          aws.String("ADD " + add),
		ConditionExpression:       aws.String("attribute_exists(" + e.n(AttrPK) + ")"),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if _, ok := conditionFailed(err); ok {
		return nil // thread deleted under the run: nothing to add to
	}
	return storeErr(err, "add usage")
}

// usageAdd renders the ADD clause for non-zero usage counters; "" when all are zero.
func usageAdd(e *expr, u agent.Usage) string {
	var parts []string
	for _, c := range []struct {
		attr string
		n    int64
	}{{attrUsageIn, u.InputTokens}, {attrUsageOut, u.OutputTokens}, {attrUsageTotal, u.TotalTokens}, {attrUsageCached, u.CachedInputTokens}} {
		if c.n != 0 {
			parts = append(parts, e.n(c.attr)+" "+e.v(avN(c.n)))
		}
	}
	return strings.Join(parts, ", ")
}

func (s *Store) GetRun(ctx context.Context, threadID, runID string) (agent.Run, error) {
	it, err := s.getItem(ctx, key(threadPK(threadID), runSK(runID)))
	if err != nil {
		return agent.Run{}, err
	}
	if it == nil {
		return agent.Run{}, agent.E(agent.KindNotFound, agent.CodeRunNotFound, "run %s of thread %q not found", runID, threadID)
	}
	return decodeRun(it), nil
}

// ListRuns queries the RUN# items of the thread partition and orders them by creation (ties by id).
func (s *Store) ListRuns(ctx context.Context, threadID string) ([]agent.Run, error) {
	runs := []agent.Run{}
	err := s.queryPrefix(ctx, threadPK(threadID), prefixRun, false, func(it item) error {
		runs = append(runs, decodeRun(it))
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(runs, func(i, j int) bool {
		if !runs[i].CreatedAt.Equal(runs[j].CreatedAt) {
			return runs[i].CreatedAt.Before(runs[j].CreatedAt)
		}
		return runs[i].ID < runs[j].ID
	})
	return runs, nil
}

// ListStaleClaims returns up to limit claims whose heartbeat is before cutoff, oldest first within each shard,
// by querying every shard of the sparse running index (claimHeartbeatAt < :cutoff). It reads only threads that
// hold a claim: no scan. The index is eventually consistent, so the reaper must treat each entry as a hint and
// re-check with conditional writes (FinishRun's epoch fence does exactly that).
func (s *Store) ListStaleClaims(ctx context.Context, cutoff time.Time, limit int) ([]agent.StaleClaim, error) {
	if limit <= 0 {
		limit = defaultListLimit
	}
	var out []agent.StaleClaim
	for shard := 0; shard < s.runShards && len(out) < limit; shard++ {
		e := newExpr()
		in := &dynamodb.QueryInput{
			TableName: aws.String(s.table),
			IndexName: aws.String(IndexRunning),
			KeyConditionExpression: aws.String(e.n(AttrRunShard) + " = " + e.v(avS("RUN#"+strconv.Itoa(shard))) + " AND " +
				e.n(AttrClaimHeartbeat) + " < " + e.v(avT(cutoff))),
			ExpressionAttributeNames:  e.attrNames(),
			ExpressionAttributeValues: e.attrValues(),
			Limit:                     aws.Int32(int32(min(limit-len(out), 1000))),
		}
		err := s.query(ctx, in, func(it item) error {
			if len(out) >= limit {
				return errStopQuery
			}
			if c := decodeClaim(it); c != nil {
				out = append(out, agent.StaleClaim{ThreadID: strings.TrimPrefix(getS(it, AttrPK), "THREAD#"), Claim: *c})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
