package dynamo

import (
	"context"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// HandOver is two writes, like ClaimRun. The first decides: one UpdateItem on the thread,
//
//	condition: attribute_exists(pk) AND attribute_not_exists(deleting) AND claimRunId = :run AND epoch = :epoch
//	update:    SET claimHeartbeatAt, claimBucket  ADD epoch 1   (claimCancel and claimReadersUntil stay)
//	returns:   ALL_NEW
//
// From then on every write of the old holder that checks the claim (heartbeat, FinishRun's release) is refused,
// and every message head it writes is refused once the continuation has written it at the new epoch (fenceCond:
// the continuation writes the reply back at once). The second puts the new epoch on the run item,
//
//	condition: status = running AND epoch = :epoch     update: SET epoch = :epoch+1, updatedAt   returns: ALL_NEW
//
// so the old holder's NoteTakes and outcome (compare-and-set at its epoch) are refused too. A crash between the two
// leaves the claim at the new epoch and the run item at the old one; the claim goes stale and the reaper, which
// records the outcome at the run item's epoch, finishes the run as any. A failed first condition is run_fenced,
// whatever the item says (a lost answer is not told apart from a rival's hand-over: see agent.HandOverStore).
// Cost: 2 requests, 4 WCU on a realistic thread (BenchmarkHandOver: the thread item, the running index's move to
// the new heartbeat's bucket, the run item), once per invocation of a run that outlives one.
func (s *Store) HandOver(ctx context.Context, req agent.HandOverRequest) (agent.ClaimResult, error) {
	e := newExpr()
	cond := "attribute_exists(" + e.n(AttrPK) + ") AND " + notDeleting(e) + " AND " + holds(e, req.Fence, time.Time{})
	update := "SET " + strings.Join([]string{
		e.n(AttrClaimHeartbeat) + " = " + e.v(avT(req.Now)),
		e.n(AttrClaimBucket) + " = " + e.v(avS(s.bucketOf(req.Now))),
	}, ", ") + " ADD " + e.n(attrEpoch) + " " + e.v(avN(1))
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       key(threadPK(req.ThreadID), threadSK),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return agent.ClaimResult{}, fenced(req.Fence)
	}
	if err != nil {
		return agent.ClaimResult{}, storeErr(err, "hand over claim")
	}
	th := decodeThread(res.Attributes)
	epoch := getN(res.Attributes, attrEpoch)
	r := newExpr()
	run, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       key(threadPK(req.ThreadID), runSK(req.Fence.RunID)),
		UpdateExpression: aws.String("SET " + r.n(attrEpoch) + " = " + r.v(avN(epoch)) + ", " +
			r.n(attrUpdatedAt) + " = " + r.v(avT(req.Now))),
		ConditionExpression: aws.String(r.n(attrStatus) + " = " + r.v(avS(string(agent.RunRunning))) + " AND " +
			r.n(attrEpoch) + " = " + r.v(avN(req.Fence.Epoch))),
		ExpressionAttributeNames:  r.attrNames(),
		ExpressionAttributeValues: r.attrValues(),
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		// The run item is not running at the old epoch: its outcome is recorded (the claim is a leftover the
		// reaper releases once stale) or it is missing. Nothing to continue.
		return agent.ClaimResult{}, fenced(req.Fence)
	}
	if err != nil {
		return agent.ClaimResult{}, storeErr(err, "hand over run")
	}
	return agent.ClaimResult{Run: decodeRun(run.Attributes), Thread: th}, nil
}
