package dynamo

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// A thread deleted and created again on the same id is a new incarnation, and nothing of the earlier one may reach
// it (issue 16 item 2; REVIEW D10, the prior H3's residual). Without transactions a run of the deleted thread can
// still insert a new id under THREAD#<id> after the delete swept it (its reply's first write, a late run item, an
// interrupt): one conditional write cannot look at the thread item. So the epoch is the incarnation
// (infra/DYNAMODB.md, "Incarnations"):
//
//   - the delete does not remove the thread item: it leaves a small "gone" item (no owner, in no index) that keeps
//     the thread's epoch and position counter;
//   - a thread created again on a gone item starts at that epoch: attrBaseEpoch records it, and every claim of the
//     new thread is above it, so every run of the old one is fenced by the epoch on every item the new one wrote;
//   - every child a run writes carries its epoch (a message head its writerEpoch, a run item and an interrupt their
//     epoch), so a reader keeps only the children written above the thread's base: what an old run inserts late is
//     never read, and the next delete of the id sweeps it with the rest of the partition.
//
// A reader learns the base from the thread item, read beside its own request (in parallel: no added round trip);
// a thread never deleted, or one without an item (the store suite's message cases), has base 0 and hides nothing.
const (
	// attrBaseEpoch is the epoch of the incarnation before this one (absent: 0, a first incarnation).
	attrBaseEpoch = "baseEpoch"
	// attrGone marks the item a finished delete leaves (with attrDeleting, so every write that refuses a
	// tombstone refuses it): only kind, id, epoch and nextSeq are kept. CreateThread replaces it.
	attrGone = "gone"
)

// baseRead is the thread's base epoch, read beside a child read.
type baseRead struct {
	done chan struct{}
	base int64
	err  error
	item item // the attributes read (the base epoch, and any extra ones asked for)
}

// readBase starts reading the thread item's base epoch in the background (one strongly consistent GetItem,
// 1 RCU), and the thread item's attributes named in extra with it (GetRun: the run's released usage).
func (s *Store) readBase(ctx context.Context, threadID string, extra ...string) *baseRead {
	b := &baseRead{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		e := newExpr()
		proj := e.n(attrBaseEpoch)
		for _, n := range extra {
			proj += ", " + e.n(n)
		}
		out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName:                aws.String(s.table),
			Key:                      key(threadPK(threadID), threadSK),
			ConsistentRead:           aws.Bool(true),
			ProjectionExpression:     aws.String(proj),
			ExpressionAttributeNames: e.attrNames(),
		})
		if err != nil {
			b.err = storeErr(err, "get thread")
			return
		}
		b.base, b.item = getN(out.Item, attrBaseEpoch), out.Item
	}()
	return b
}

// wait returns the base epoch once read.
func (b *baseRead) wait() (int64, error) {
	<-b.done
	return b.base, b.err
}

// ofThisIncarnation reports whether a child written at epoch belongs to the thread's current incarnation.
func ofThisIncarnation(base, epoch int64) bool { return base == 0 || epoch > base }

// keep waits for the base and drops the children written in an earlier incarnation (epochAttr names each one's
// epoch).
func (b *baseRead) keep(items []item, epochAttr string) ([]item, error) {
	base, err := b.wait()
	if err != nil || base == 0 {
		return items, err
	}
	out := items[:0]
	for _, it := range items {
		if ofThisIncarnation(base, getN(it, epochAttr)) {
			out = append(out, it)
		}
	}
	return out, nil
}
