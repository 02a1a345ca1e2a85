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

// Per-user limits (agent.LimitStore). Every scope has its own partition, LIMIT#<scope>, and the scope names its
// user ("runs/<owner>", "streams/user/<owner>", "streams/run/<runId>", "threads/<owner>"), so users never share
// an item and no partition is hot across users.
//
// A lease scope is ONE item (sk LEASES) holding one top-level attribute per holder, "h:<holder>" = expiry in unix
// ms, plus leaseCount (how many h: attributes it holds, live or expired) and leaseVer (bumped by every write, for
// the compare-and-set below). One item rather than one item per slot: a slot scheme cannot make a re-acquire by
// the same holder idempotent (the holder's slot is not known without reading them all), and it costs a write per
// slot tried. Attributes rather than a map: SET of a top-level attribute also creates the item, so the first
// lease of a scope is one request like every other, where a map would need the item to exist first.
//
// Requests: AcquireLease is one conditional UpdateItem in the common case (a new holder while leaseCount <
// limit: "attribute_not_exists(h) AND (attribute_not_exists(leaseCount) OR leaseCount < limit)"). When that
// fails (the scope is full of entries, some possibly expired, or the holder re-acquires) it reads the item (from
// the failed condition when the server returns it, else one consistent GetItem), and either refuses (nothing
// written), extends the holder's own live entry, or purges the expired entries and adds the holder in one
// UpdateItem conditioned on leaseVer (a lost race starts over from the common case, whose winner may
// have purged; 8 tries). So leaseCount never exceeds the limit and the
// live holders never exceed it either. RenewLease and ReleaseLease are one UpdateItem each (renew conditioned on
// the holder's entry being live). ReleaseLeases (the reaper's, for a reaped run's readers) is one consistent GetItem
// and, when holders with the prefix are there, one UpdateItem conditioned on leaseVer. Every acquire and renew sets the item's TTL attribute a day past the longest
// lease TTL (agent.MaxLeaseTTL), so an abandoned scope's item goes away and a live one never does.
//
// A counter window is one item per scope and window, sk W#<window start, unix ms, 20 digits>: Count is one
// UpdateItem "ADD leaseCount 1" conditioned on "attribute_not_exists(leaseCount) OR leaseCount < limit"; a
// failed condition is the refusal. Its TTL attribute is an hour after the window ends.

const (
	leasesSK        = "LEASES"
	prefixWindow    = "W#"
	prefixHolder    = "h:"
	attrLeaseCount  = "leaseCount"
	attrLeaseVer    = "leaseVer"
	leaseAttempts   = 8
	counterKeepsFor = time.Hour
)

func limitPK(scope string) string { return "LIMIT#" + scope }

// leaseItemTTL is the TTL attribute a lease item gets on a write at now: a day past any lease it may hold.
func leaseItemTTL(now time.Time) types.AttributeValue {
	return avN(now.Add(agent.MaxLeaseTTL + 24*time.Hour).Unix())
}

func (s *Store) AcquireLease(ctx context.Context, r agent.LeaseRequest) (time.Duration, error) {
	if err := r.Check(false); err != nil {
		return 0, err
	}
	k := key(limitPK(r.Scope), leasesSK)
	now, exp := r.Now.UnixMilli(), r.Now.Add(r.TTL).UnixMilli()
	holder := prefixHolder + r.Holder
	for attempt := 1; ; attempt++ {
		if attempt > leaseAttempts {
			return 0, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "dynamo acquire lease: %d lost races on %q", leaseAttempts, r.Scope)
		}
		// The common case: a new holder in a scope with room (after a lost race too: whoever won may have purged).
		it, err := s.addHolder(ctx, k, holder, r, exp)
		if err != nil || it == nil {
			return 0, err
		}
		mine, live, first, expired := getN(it, holder), 0, int64(0), []string(nil)
		for name := range it {
			if !strings.HasPrefix(name, prefixHolder) || name == holder {
				continue
			}
			switch x := getN(it, name); {
			case x > now:
				live++
				if first == 0 || x < first {
					first = x
				}
			default:
				expired = append(expired, name)
			}
		}
		if mine <= now && live >= r.Limit {
			return max(time.Duration(first-now)*time.Millisecond, time.Millisecond), nil
		}
		// Room (or the holder's own live lease): purge the expired entries and set the holder's, if nobody wrote
		// since the read.
		e := newExpr()
		ver := getN(it, attrLeaseVer)
		update := "SET " + e.n(holder) + " = " + e.v(avN(exp)) + ", " + e.n(attrLeaseCount) + " = " + e.v(avN(int64(live+1))) +
			", " + e.n(attrLeaseVer) + " = " + e.v(avN(ver+1)) + ", " + e.n(AttrExpiresAt) + " = " + e.v(leaseItemTTL(r.Now))
		if len(expired) > 0 {
			names := make([]string, len(expired))
			for i, x := range expired {
				names[i] = e.n(x)
			}
			update += " REMOVE " + strings.Join(names, ", ")
		}
		_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(s.table),
			Key:                       k,
			UpdateExpression:          aws.String(update),
			ConditionExpression:       aws.String(e.n(attrLeaseVer) + " = " + e.v(avN(ver))),
			ExpressionAttributeNames:  e.attrNames(),
			ExpressionAttributeValues: e.attrValues(),
		})
		if err == nil {
			return 0, nil
		}
		if !isConditionFailed(err) {
			return 0, storeErr(err, "acquire lease")
		}
	}
}

// addHolder is the common case's one write: it adds holder to the scope's item when the holder holds no entry
// and the item has fewer than r.Limit (creating the item for a scope's first lease). It returns nil when it
// applied, otherwise the item its condition saw (from the failure, or one consistent GetItem).
func (s *Store) addHolder(ctx context.Context, k item, holder string, r agent.LeaseRequest, exp int64) (item, error) {
	e := newExpr()
	zero, one := e.v(avN(0)), e.v(avN(1))
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       k,
		UpdateExpression: aws.String("SET " + e.n(holder) + " = " + e.v(avN(exp)) + ", " +
			e.n(attrLeaseCount) + " = if_not_exists(" + e.n(attrLeaseCount) + ", " + zero + ") + " + one + ", " +
			e.n(attrLeaseVer) + " = if_not_exists(" + e.n(attrLeaseVer) + ", " + zero + ") + " + one + ", " +
			e.n(AttrExpiresAt) + " = " + e.v(leaseItemTTL(r.Now))),
		ConditionExpression: aws.String("attribute_not_exists(" + e.n(holder) + ") AND (attribute_not_exists(" +
			e.n(attrLeaseCount) + ") OR " + e.n(attrLeaseCount) + " < " + e.v(avN(int64(r.Limit))) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return nil, nil
	}
	if !isConditionFailed(err) {
		return nil, storeErr(err, "acquire lease")
	}
	it, err := s.failedItem(ctx, err, k)
	if err == nil && it == nil {
		// The condition failed on an item that has gone since (its TTL): the next attempt creates it again.
		it = item{}
	}
	return it, err
}

func (s *Store) RenewLease(ctx context.Context, r agent.LeaseRequest) error {
	if err := r.Check(true); err != nil {
		return err
	}
	e := newExpr()
	holder := e.n(prefixHolder + r.Holder)
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       key(limitPK(r.Scope), leasesSK),
		UpdateExpression: aws.String("SET " + holder + " = " + e.v(avN(r.Now.Add(r.TTL).UnixMilli())) + ", " +
			e.n(attrLeaseVer) + " = " + e.n(attrLeaseVer) + " + " + e.v(avN(1)) + ", " + e.n(AttrExpiresAt) + " = " + e.v(leaseItemTTL(r.Now))),
		ConditionExpression:       aws.String(holder + " > " + e.v(avN(r.Now.UnixMilli()))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	switch {
	case isConditionFailed(err):
		return agent.E(agent.KindConflict, agent.CodeLeaseLost, "no live lease of %q in %q", r.Holder, r.Scope)
	case err != nil:
		return storeErr(err, "renew lease")
	}
	return nil
}

func (s *Store) ReleaseLease(ctx context.Context, scope, holder string) error {
	e := newExpr()
	h := e.n(prefixHolder + holder)
	one := e.v(avN(1))
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       key(limitPK(scope), leasesSK),
		UpdateExpression: aws.String("REMOVE " + h + " SET " + e.n(attrLeaseCount) + " = " + e.n(attrLeaseCount) + " - " + one +
			", " + e.n(attrLeaseVer) + " = " + e.n(attrLeaseVer) + " + " + one),
		ConditionExpression:       aws.String("attribute_exists(" + h + ")"),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	if err != nil && !isConditionFailed(err) { // a failed condition: not held, a no-op
		return storeErr(err, "release lease")
	}
	return nil
}

func (s *Store) Count(ctx context.Context, r agent.CountRequest) (time.Duration, error) {
	if err := r.Check(); err != nil {
		return 0, err
	}
	start, end := agent.WindowOf(r.Now, r.Window)
	e := newExpr()
	n := e.n(attrLeaseCount)
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:        aws.String(s.table),
		Key:              key(limitPK(r.Scope), prefixWindow+padSeq(start.UnixMilli())),
		UpdateExpression: aws.String("ADD " + n + " " + e.v(avN(1)) + " SET " + e.n(AttrExpiresAt) + " = " + e.v(avN(end.Add(counterKeepsFor).Unix()))),
		ConditionExpression: aws.String("attribute_not_exists(" + n + ") OR " + n + " < " +
			e.v(avN(int64(r.Limit)))),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	})
	switch {
	case isConditionFailed(err):
		return max(end.Sub(r.Now), time.Millisecond), nil
	case err != nil:
		return 0, storeErr(err, "count")
	}
	return 0, nil
}

// ReleaseLeases reads the scope's item (consistent) and, when some holders begin with prefix, removes them in one
// UpdateItem conditioned on leaseVer, setting leaseCount to the entries left; a lost race goes on from the item
// its failed condition returns (leaseAttempts tries). None to remove: one read, no write.
func (s *Store) ReleaseLeases(ctx context.Context, scope, prefix string) error {
	if scope == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidLease, "releasing leases needs a scope")
	}
	k := key(limitPK(scope), leasesSK)
	it, err := s.getItem(ctx, k)
	for attempt := 1; ; attempt++ {
		if err != nil || it == nil {
			return err
		}
		if attempt > leaseAttempts {
			return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "dynamo release leases: %d lost races on %q", leaseAttempts, scope)
		}
		var gone []string
		left := 0
		for name := range it {
			switch {
			case !strings.HasPrefix(name, prefixHolder):
			case strings.HasPrefix(name, prefixHolder+prefix):
				gone = append(gone, name)
			default:
				left++
			}
		}
		if len(gone) == 0 {
			return nil
		}
		e := newExpr()
		ver := getN(it, attrLeaseVer)
		names := make([]string, len(gone))
		for i, x := range gone {
			names[i] = e.n(x)
		}
		_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(s.table),
			Key:       k,
			UpdateExpression: aws.String("REMOVE " + strings.Join(names, ", ") + " SET " + e.n(attrLeaseCount) + " = " +
				e.v(avN(int64(left))) + ", " + e.n(attrLeaseVer) + " = " + e.v(avN(ver+1))),
			ConditionExpression:                 aws.String(e.n(attrLeaseVer) + " = " + e.v(avN(ver))),
			ExpressionAttributeNames:            e.attrNames(),
			ExpressionAttributeValues:           e.attrValues(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		switch {
		case err == nil:
			return nil
		case !isConditionFailed(err):
			return storeErr(err, "release leases")
		}
		it, err = s.failedItem(ctx, err, k)
	}
}
