package dynamo

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// Completion signals (agent.SignalStore): the run item is the outbox (issue 21 item 4). The outcome's own write
// (recordOutcome: FinishRun's second write, the reaper's RecordOutcome) stores an armed signal as sigStatus =
// pending, sigOwner, sigAttempts, and the dueWork index keys dueShard = "SIG#<fnv32a(thread id) mod 16>" and
// dueAt = when it is due: no extra write at a run's end, and no run recorded terminal without its signal.
// ClaimSignal (the sweep's next attempt) is one UpdateItem conditioned on sigStatus = pending AND sigAttempts =
// :seen that moves dueAt; SettleSignal one conditioned on sigStatus = pending that REMOVEs the index keys, so the
// index holds exactly the pending signals and ListDueSignals never scans (16 Queries, keys only, then one
// strongly consistent BatchGetItem per 100 nominees).
const (
	attrSigStatus   = "sigStatus"
	attrSigOwner    = "sigOwner"
	attrSigAttempts = "sigAttempts"
	prefixSignal    = "SIG#"
)

func signalShard(threadID string) string { return shardOf(prefixSignal, threadID, DefaultDueShards) }

// signalSets renders the SET clauses that store run's armed signal pending (nil: none).
func signalSets(e *expr, run agent.Run) []string {
	sg := run.Signal
	if sg == nil {
		return nil
	}
	return []string{
		e.n(attrSigStatus) + " = " + e.v(avS(string(agent.SignalPending))),
		e.n(attrSigOwner) + " = " + e.v(avS(sg.Owner)),
		e.n(attrSigAttempts) + " = " + e.v(avN(int64(sg.Attempts))),
		e.n(AttrDueShard) + " = " + e.v(avS(signalShard(run.ThreadID))),
		e.n(AttrDueAt) + " = " + e.v(avT(sg.DueAt)),
	}
}

// signalAttrs puts run's armed signal on a whole run item (StubRun's insert), as signalSets does in an update.
func signalAttrs(it item, run agent.Run) {
	if sg := run.Signal; sg != nil {
		it[attrSigStatus] = avS(string(agent.SignalPending))
		it[attrSigOwner] = avS(sg.Owner)
		it[attrSigAttempts] = avN(int64(sg.Attempts))
		it[AttrDueShard] = avS(signalShard(run.ThreadID))
		it[AttrDueAt] = avT(sg.DueAt)
	}
}

func decodeSignal(it item) *agent.RunSignal {
	if !has(it, attrSigStatus) {
		return nil
	}
	sg := &agent.RunSignal{Status: agent.SignalStatus(getS(it, attrSigStatus)), Owner: getS(it, attrSigOwner),
		Attempts: int(getN(it, attrSigAttempts))}
	if sg.Status == agent.SignalPending {
		sg.DueAt = getT(it, AttrDueAt)
	}
	return sg
}

// ListDueSignals reads the dueWork index's signal shards for dueAt < before, re-reads the nominees and keeps the
// ones still pending and due (a lagging index never hands out a settled signal).
func (s *Store) ListDueSignals(ctx context.Context, before time.Time, limit int) ([]agent.Run, error) {
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	out := []agent.Run{}
	ix := sparseIndex{name: IndexDueWork, shardAttr: AttrDueShard, shardPrefix: prefixSignal, sortAttr: AttrDueAt,
		shards: DefaultDueShards, exact: true}
	err := s.nominate(ctx, ix, before, limit, func(nominees []item) (int, error) {
		got, err := s.batchGet(ctx, nominees)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, it := range got {
			if getS(it, attrSigStatus) == string(agent.SignalPending) && getT(it, AttrDueAt).Before(before) {
				out = append(out, decodeRun(it))
				n++
			}
		}
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	sortChildren(out, func(r agent.Run) (time.Time, string, string) { return r.Signal.DueAt, r.ThreadID, r.ID })
	return out[:min(len(out), limit)], nil
}

// ClaimSignal is one UpdateItem: SET sigAttempts = :seen + 1, dueAt = :next, condition sigStatus = pending AND
// sigAttempts = :seen.
func (s *Store) ClaimSignal(ctx context.Context, c agent.SignalClaim) error {
	e := newExpr()
	k := key(threadPK(c.ThreadID), runSK(c.RunID))
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       k,
		UpdateExpression: aws.String("SET " + e.n(attrSigAttempts) + " = " + e.v(avN(int64(c.Attempts+1))) + ", " +
			e.n(AttrDueAt) + " = " + e.v(avT(c.NextDue))),
		ConditionExpression: aws.String(e.n(attrSigStatus) + " = " + e.v(avS(string(agent.SignalPending))) + " AND " +
			e.n(attrSigAttempts) + " = " + e.v(avN(int64(c.Attempts)))),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if !isConditionFailed(err) {
		return storeErr(err, "claim signal")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return err
	}
	if len(old) == 0 || !has(old, attrSigStatus) {
		return runNotFound(c.ThreadID, c.RunID)
	}
	return agent.E(agent.KindConflict, agent.CodeSignalTaken, "run %q: its signal is not pending at attempt %d", c.RunID, c.Attempts)
}

// SettleSignal is one UpdateItem: SET sigStatus = :status REMOVE dueShard, dueAt, condition sigStatus = pending.
func (s *Store) SettleSignal(ctx context.Context, threadID, runID string, status agent.SignalStatus) error {
	if status != agent.SignalDelivered && status != agent.SignalDropped {
		return agent.E(agent.KindInvalid, agent.CodeInvalidStatus, "run %q: a signal settles delivered or dropped, not %q", runID, status)
	}
	e := newExpr()
	k := key(threadPK(threadID), runSK(runID))
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       k,
		UpdateExpression: aws.String("SET " + e.n(attrSigStatus) + " = " + e.v(avS(string(status))) +
			" REMOVE " + e.n(AttrDueShard) + ", " + e.n(AttrDueAt)),
		ConditionExpression:                 aws.String(e.n(attrSigStatus) + " = " + e.v(avS(string(agent.SignalPending)))),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if !isConditionFailed(err) {
		return storeErr(err, "settle signal")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return err
	}
	if len(old) == 0 || !has(old, attrSigStatus) {
		return runNotFound(threadID, runID)
	}
	return nil // settled already
}
