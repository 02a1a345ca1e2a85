package dynamo

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// attrLateRuns is the thread's string set of the runs whose late usage its totals hold: the idempotency marker
// that makes RecordLateUsage count once with a single-item write (no transaction: DESIGN principle 2). It grows
// by one run id per run that lost its claim while it still spent tokens, which is rare (a run is fenced only when
// its heartbeats stopped reaching the store); ~30 bytes an entry keep even thousands of them far below the item
// limit.
const attrLateRuns = "lateRuns"

// lateAttr names the run item's copy of its late usage ("late" + the usage attribute).
func lateAttr(usageAttr string) string { return attrLate + "_" + usageAttr }

func decodeLate(it item) agent.Usage {
	return agent.Usage{InputTokens: getN(it, lateAttr(attrUsageIn)), OutputTokens: getN(it, lateAttr(attrUsageOut)),
		TotalTokens: getN(it, lateAttr(attrUsageTotal)), CachedInputTokens: getN(it, lateAttr(attrUsageCached)),
		ReasoningTokens: getN(it, lateAttr(attrUsageReasoning)), CostMicroUSD: getN(it, lateAttr(attrUsageCost)),
		CacheWriteTokens: getN(it, lateAttr(attrUsageCacheWrite))}
}

// RecordLateUsage is two conditional UpdateItems, the thread's first (it is the one that counts):
//
//	thread: condition attribute_exists(pk) AND attribute_not_exists(deleting) AND NOT contains(lateRuns, :run)
//	                  AND NOT (claimRunId = :run AND epoch = :epoch) [AND createdAt = :created]
//	        update    ADD usage* :u, lateRuns {:run}
//	run:    condition epoch = :epoch AND status <> running AND attribute_not_exists(late)
//	        update    ADD usage* :u  SET late = true, late_usage* = :u
//
// Each half is insert-once on its own marker, so a retried or duplicated call applies neither twice. A process
// that dies between the halves leaves the thread's totals right and the run item without its late part; calling
// again completes it.
func (s *Store) RecordLateUsage(ctx context.Context, late agent.LateUsage) error {
	f := late.Fence
	tk := key(threadPK(late.ThreadID), threadSK)
	e := newExpr()
	update := "ADD " + e.n(attrLateRuns) + " " + e.v(&types.AttributeValueMemberSS{Value: []string{f.RunID}})
	if add := usageAdd(e, late.Usage); add != "" {
		update += ", " + add
	}
	run := e.v(avS(f.RunID))
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND attribute_not_exists(" + e.n(attrDeleting) + ") AND NOT contains(" +
		e.n(attrLateRuns) + ", " + run + ") AND NOT (" + e.n(attrClaimRun) + " = " + run + " AND " + e.n(attrEpoch) +
		" = " + e.v(avN(f.Epoch)) + ")"
	if !late.ThreadCreatedAt.IsZero() {
		cond += " AND " + e.n(attrCreatedAt) + " = " + e.v(avT(late.ThreadCreatedAt))
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 tk,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if isConditionFailed(err) {
		old, err := s.failedItem(ctx, err, tk)
		if err != nil {
			return err
		}
		switch c := decodeClaim(old); {
		case !live(old), !late.ThreadCreatedAt.IsZero() && !getT(old, attrCreatedAt).Equal(late.ThreadCreatedAt):
			return threadNotFound(late.ThreadID)
		case c != nil && c.RunID == f.RunID && c.Epoch == f.Epoch:
			return agent.E(agent.KindConflict, agent.CodeRunActive, "run %s still holds its claim", f.RunID)
		}
		// The marker is there: the thread half applied before; finish the run half.
	} else if err != nil {
		return storeErr(err, "record late usage")
	}

	rk := key(threadPK(late.ThreadID), runSK(f.RunID))
	e = newExpr()
	update = "SET " + e.n(attrLate) + " = " + e.v(avBool(true))
	for _, c := range []struct {
		attr string
		n    int64
	}{{attrUsageIn, late.Usage.InputTokens}, {attrUsageOut, late.Usage.OutputTokens}, {attrUsageTotal, late.Usage.TotalTokens},
		{attrUsageCached, late.Usage.CachedInputTokens}, {attrUsageReasoning, late.Usage.ReasoningTokens},
		{attrUsageCost, late.Usage.CostMicroUSD}, {attrUsageCacheWrite, late.Usage.CacheWriteTokens}} {
		if c.attr == attrUsageCacheWrite && c.n == 0 {
			continue // written only when not 0 (an item without it reads 0)
		}
		update += ", " + e.n(lateAttr(c.attr)) + " = " + e.v(avN(c.n))
	}
	if add := usageAdd(e, late.Usage); add != "" {
		update += " ADD " + add
	}
	cond = e.n(attrEpoch) + " = " + e.v(avN(f.Epoch)) + " AND " + e.n(attrStatus) + " <> " + e.v(avS(string(agent.RunRunning))) +
		" AND attribute_not_exists(" + e.n(attrLate) + ")"
	_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 rk,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if !isConditionFailed(err) {
		return storeErr(err, "record late usage on the run")
	}
	old, err := s.failedItem(ctx, err, rk)
	switch {
	case err != nil:
		return err
	case len(old) == 0:
		return runNotFound(late.ThreadID, f.RunID)
	case getBool(old, attrLate):
		return nil // recorded before
	case getN(old, attrEpoch) != f.Epoch:
		return fenced(f)
	}
	return agent.E(agent.KindConflict, agent.CodeRunActive, "run %s is still recorded as running", f.RunID)
}
