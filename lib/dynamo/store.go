package dynamo

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/agentloop/agentloop/lib/agent"
)

// Names shared with template.yaml and infra/DYNAMODB.md. Changing one means changing the template too.
const (
	// IndexRunning is the sparse GSI over threads that hold a run claim, or released one whose outcome the orphan
	// sweep has not seen recorded yet (ListOrphanRuns): partition key AttrRunShard, sort key AttrClaimBucket, keys
	// only. See ListStaleClaims for why its sort key is a coarse bucket and not the heartbeat.
	IndexRunning = "running"
	// IndexByOwner is the GSI over threads by owner, most recent first: partition key AttrOwner, sort key
	// AttrRecency.
	IndexByOwner = "byOwner"
	// IndexMessagesBySeq is the local secondary index over the message heads of a thread partition by position:
	// partition key AttrPK, sort key msgOrder ("<seq, 20 digits>#<id>", which only live message heads carry),
	// keys only.
	// Local, so it can be read strongly consistently; see ListMessagesPage.
	IndexMessagesBySeq = "messagesBySeq"
	// IndexPending is the sparse GSI over pending interrupts: partition key AttrPendingShard, sort key
	// AttrPendingExpiry, keys only. An interrupt carries both attributes only while it is pending; the resolve
	// removes them in its own write. See ListExpiredInterrupts.
	IndexPending = "pendingInterrupts"
	// IndexDueWork is the sparse GSI over the reaper's other work: undelivered jobs and queued messages. Partition
	// key AttrDueShard, whose prefix tells the item type ("JOB#<n>", "Q#<n>"), sort key AttrDueAt (a job's DueAt,
	// a queued entry's CreatedAt), keys only. Items carry both attributes only while they wait (a job until its
	// delivery, an entry until it is taken); the write that ends the wait removes them. See ListDueJobs and
	// ListQueuedThreads.
	IndexDueWork = "dueWork"
	// IndexThreadJobs is the GSI over a thread's jobs in view order: partition key AttrJobThread ("R#<pk>" while
	// the job is undelivered, "F#<pk>" once MarkJobDelivered set it done or error), sort key AttrJobOrder
	// ("<createdAt>#<id>"), keys only. See ListJobsPage.
	IndexThreadJobs = "threadJobs"

	AttrPK       = "pk"
	AttrSK       = "sk"
	AttrOwner    = "owner"
	AttrRecency  = "recency"  // "<updatedAt>#<thread id>"
	AttrRunShard = "runShard" // "RUN#<n>", present while a claim exists and until the orphan sweep drops a released thread
	// AttrClaimBucket is the claim's heartbeat rounded down to the heartbeat bucket (DefaultHeartbeatBucket),
	// present only while a claim exists. It is the running index's sort key; the exact heartbeat lives in
	// AttrClaimHeartbeat, which no index contains.
	AttrClaimBucket = "claimBucket"
	// AttrClaimHeartbeat is the exact heartbeat of the claim (not an index key, not projected).
	AttrClaimHeartbeat = "claimHeartbeatAt"
	// AttrExpiresAt is the table's TTL attribute, epoch seconds.
	AttrExpiresAt = "expiresAt"
	// AttrPendingShard ("INT#<n>") and AttrPendingExpiry (the interrupt's expiry, a fixed-width time string) are
	// the pending index's keys, present only while the interrupt is pending.
	AttrPendingShard  = "pendingShard"
	AttrPendingExpiry = "pendingExpiresAt"
	// AttrDueShard ("JOB#<n>" or "Q#<n>") and AttrDueAt (a fixed-width time string) are the dueWork index's keys,
	// present only while a job is undelivered or a queue entry is queued.
	AttrDueShard = "dueShard"
	AttrDueAt    = "dueAt"

	// DefaultRunShards is how many partitions the running index spreads claims over. The reaper must query the
	// same number (see ListStaleClaims).
	DefaultRunShards = 16
	// DefaultInterruptShards is how many partitions the pending index spreads interrupts over (by thread id).
	// Writers and the reaper's ListExpiredInterrupts use the same constant.
	DefaultInterruptShards = 16
	// DefaultDueShards is how many partitions the dueWork index spreads each item type over (by thread id).
	// Writers and the reaper's lists use the same constant.
	DefaultDueShards = 16
	// DefaultHeartbeatBucket is the granularity of the running index's sort key: a heartbeat moves the thread in
	// the index (an index delete and put) only when it crosses into a new bucket, once per bucket per run.
	DefaultHeartbeatBucket = 10 * time.Second
	// MaxItemBytes is DynamoDB's item size limit.
	MaxItemBytes = 400 * 1024
)

const (
	// maxRunErrorBytes bounds a run's stored error message: it is prose for humans, and an unbounded one could
	// push the run item past the item limit.
	maxRunErrorBytes = 16 * 1024
	// maxThreadBytes bounds a thread item (title and owner are the only free-form fields). A thread that would
	// exceed it is refused with KindTooLarge rather than split: titles are short by nature.
	maxThreadBytes = 64 * 1024
)

// Store is agent.Store over one DynamoDB table. See the package doc for the item layout.
type Store struct {
	client    *dynamodb.Client
	table     string
	ids       agent.IDs
	log       *slog.Logger
	runShards int
	bucket    time.Duration
	blob      blobLimits
	sweeps    sweepStarts
	reads     sweepReads // a reaper sweep's reads of the running index, for its next list (ListOrphanRuns)
	zip       deflaters  // pooled compressors for stream segments (deflate.go)
}

// Option configures a Store.
type Option func(*Store)

// WithIDs sets the id source used for blob version ids (default agent.RandomIDs over the wall clock).
func WithIDs(ids agent.IDs) Option { return func(s *Store) { s.ids = ids } }

// WithLogger sets the logger for background clean-up failures (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// WithRunShards sets the number of running-index shards (default DefaultRunShards). Every writer and the reaper
// must agree on it.
func WithRunShards(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.runShards = n
		}
	}
}

// WithSweepStart sets the shard the first sweep of each sharded index starts at (default: a random one, so that
// reapers that start cold do not all begin with shard 0); every later sweep of that index starts one shard further
// on (REVIEW D11). Tests set it for a deterministic order.
func WithSweepStart(shard int) Option {
	return func(s *Store) { s.sweeps.seed = max(shard, 0) }
}

// WithHeartbeatBucket sets the granularity of the running index's sort key (default DefaultHeartbeatBucket).
// Writers need not agree on it: the bucket is always at or below the heartbeat, which is all ListStaleClaims
// relies on.
func WithHeartbeatBucket(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.bucket = d
		}
	}
}

// WithBlobLimits overrides the thresholds of the large-value scheme: values longer than compressAbove bytes are
// gzipped, and payloads longer than chunkBytes are split into chunk items of that size. The defaults (32 KiB,
// 300 KiB) keep every item well under 400 KB; tests lower them to exercise chunking with small values.
func WithBlobLimits(compressAbove, chunkBytes int) Option {
	return func(s *Store) {
		if compressAbove >= 0 {
			s.blob.compressAbove = compressAbove
		}
		if chunkBytes > 0 && chunkBytes <= maxChunkBytes {
			s.blob.chunkBytes = chunkBytes
		}
	}
}

// New returns a Store over table, which must have the layout of template.yaml's Table resource.
func New(client *dynamodb.Client, table string, opts ...Option) *Store {
	s := &Store{
		client:    withMiddleware(client, registerMeter, registerWriteGate),
		table:     table,
		ids:       agent.RandomIDs{},
		log:       slog.Default(),
		runShards: DefaultRunShards,
		bucket:    DefaultHeartbeatBucket,
		blob:      blobLimits{compressAbove: defaultCompressAbove, chunkBytes: defaultChunkBytes},
		sweeps:    sweepStarts{seed: rand.IntN(1 << 16)},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

var _ agent.Store = (*Store)(nil)

// Key construction. Ids are used verbatim after a fixed prefix; see the package doc for why '#' inside ids cannot
// make two keys collide.
const (
	threadSK      = "THREAD"
	prefixMsg     = "MSG#"
	prefixMsgPart = "MSGC#"
	prefixRun     = "RUN#"
	prefixSeg     = "SEG#"
	prefixSegPart = "SEGC#"
	prefixVal     = "V#"
	prefixValPart = "VC#"
	prefixInt     = "INT#" // before REVIEW S7: INT#<interruptId>, read only for what an older build stored
	prefixIntMsg  = "INTM#"
	prefixIntPart = "INTC#"
	prefixJob     = "JOB#"
	prefixJobPart = "JOBC#"
	prefixQ       = "Q#"
	prefixQPart   = "QC#"
)

func threadPK(id string) string       { return "THREAD#" + id }
func segmentsPK(runID string) string  { return "RUNSEG#" + runID }
func valuesPK(ns string) string       { return "KV#" + ns }
func msgSK(id string) string          { return prefixMsg + id }
func runSK(id string) string          { return prefixRun + id }
func valSK(key string) string         { return prefixVal + key }
func intSK(id string) string          { return prefixInt + id }
func jobSK(id string) string          { return prefixJob + id }
func queueSK(messageID string) string { return prefixQ + messageID }

// intMsgSK is an interrupt's key: the message that asked it, then its id (which holds no '#', agent.Interrupt.Check),
// so the key splits at its last '#' and two interrupts cannot share one; intMsgPrefix is what the message's
// interrupts begin with (a message whose id extends this one's with '#' shares it: readers keep only theirs).
func intMsgSK(messageID, id string) string { return intMsgPrefix(messageID) + id }
func intMsgPrefix(messageID string) string { return prefixIntMsg + messageID + "#" }

// segSK pads seq to 20 digits so sort-key order is seq order.
func segSK(seq int64) string { return prefixSeg + padSeq(seq) }

func padSeq(seq int64) string {
	s := strconv.FormatInt(seq, 10)
	return strings.Repeat("0", 20-len(s)) + s
}

func key(pk, sk string) item { return item{AttrPK: avS(pk), AttrSK: avS(sk)} }

// bucketOf is the running index's sort key for a heartbeat at t: t rounded down to the bucket, so it never
// exceeds the heartbeat.
func (s *Store) bucketOf(t time.Time) string { return fmtTime(t.UTC().Truncate(s.bucket)) }

// runShard spreads claims over the running index: hash(thread id) mod shards.
func (s *Store) runShard(threadID string) string { return shardOf("RUN#", threadID, s.runShards) }

// pendingShard spreads pending interrupts over the pending index the same way.
func pendingShard(threadID string) string {
	return shardOf(prefixInt, threadID, DefaultInterruptShards)
}

// jobShard and queueShard spread waiting jobs and queue entries over the dueWork index; the prefix keeps the two
// item types in separate index partitions, so each list reads only its own.
func jobShard(threadID string) string   { return shardOf(prefixJob, threadID, DefaultDueShards) }
func queueShard(threadID string) string { return shardOf(prefixQ, threadID, DefaultDueShards) }

func shardOf(prefix, threadID string, shards int) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(threadID))
	return prefix + strconv.Itoa(int(h.Sum32()%uint32(shards)))
}

// storeErr maps an SDK error to an *agent.Error: cancellation stays recognisable, throttling and transport
// failures are KindUnavailable (retry may pass), a thread partition at the local index's 10 GB cap is
// thread_too_large (REVIEW D12: no retry passes, and the client must start a new thread), anything else is
// internal.
func storeErr(err error, op string) error {
	if err == nil {
		return nil
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return agent.Wrap(err, agent.KindCanceled, agent.CodeCanceled, "dynamo "+op)
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
			"InternalServerError", "ServiceUnavailable", "TransactionConflictException", "LimitExceededException":
			return agent.Wrap(err, agent.KindUnavailable, agent.CodeStoreUnavailable, "dynamo "+op)
		case "ResourceNotFoundException":
			return agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "dynamo "+op+": table missing")
		case "ItemCollectionSizeLimitExceededException":
			return agent.Wrap(err, agent.KindTooLarge, agent.CodeThreadTooLarge,
				"this thread is full (it holds as much as one thread can); start a new thread")
		}
		return agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "dynamo "+op)
	}
	// No API error: the request never got an answer (connection refused, reset, timeout).
	return agent.Wrap(err, agent.KindUnavailable, agent.CodeStoreUnavailable, "dynamo "+op)
}

// isConditionFailed reports whether err is a failed ConditionExpression.
func isConditionFailed(err error) bool {
	var cf *types.ConditionalCheckFailedException
	return errors.As(err, &cf)
}

// failedItem returns the item a failed conditional write was checked against, to tell why it failed. DynamoDB
// sends it with the failure when the request asked for ReturnValuesOnConditionCheckFailure=ALL_OLD and the item
// exists, at no extra cost. When the failure carries none (the item does not exist, or the server does not
// implement the parameter, as dynalite does not), one strongly consistent GetItem reads it; nil means there is no
// item. The read may see a later state than the one the condition saw, which the callers' classifications
// tolerate (each says how).
func (s *Store) failedItem(ctx context.Context, err error, k item) (item, error) {
	var cf *types.ConditionalCheckFailedException
	if errors.As(err, &cf) && len(cf.Item) > 0 {
		return cf.Item, nil
	}
	return s.getItem(ctx, k)
}

// guardSize refuses an item that DynamoDB would refuse, with an error a caller can map to 413.
func guardSize(it item, limit int, what string) error {
	if n := ItemSize(it); n > limit {
		return agent.E(agent.KindTooLarge, agent.CodeTooLarge, "%s is %d bytes, more than the %d this store keeps in one item", what, n, limit)
	}
	return nil
}

// errStopQuery, returned by a query callback, ends the query early without error.
var errStopQuery = errors.New("stop query")

// query runs a paginated strongly consistent (unless index is set) Query and calls fn for every item.
func (s *Store) query(ctx context.Context, in *dynamodb.QueryInput, fn func(item) error) error {
	in.TableName = aws.String(s.table)
	if in.IndexName == nil {
		in.ConsistentRead = aws.Bool(true)
	}
	p := dynamodb.NewQueryPaginator(s.client, in)
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return storeErr(err, "query")
		}
		for _, it := range out.Items {
			if err := fn(it); err != nil {
				if errors.Is(err, errStopQuery) {
					return nil
				}
				return err
			}
		}
	}
	return nil
}

// queryPrefix lists the items of partition pk whose sort key begins with prefix, optionally projected.
func (s *Store) queryPrefix(ctx context.Context, pk, prefix string, keysOnly bool, fn func(item) error) error {
	e := newExpr()
	in := &dynamodb.QueryInput{}
	cond := e.n(AttrPK) + " = " + e.v(avS(pk))
	if prefix != "" {
		cond += " AND begins_with(" + e.n(AttrSK) + ", " + e.v(avS(prefix)) + ")"
	}
	in.KeyConditionExpression = aws.String(cond)
	if keysOnly {
		in.ProjectionExpression = aws.String(e.n(AttrPK) + ", " + e.n(AttrSK))
	}
	in.ExpressionAttributeNames = e.attrNames()
	in.ExpressionAttributeValues = e.attrValues()
	return s.query(ctx, in, fn)
}

// getItem reads one item with a strongly consistent read; a missing item is returned as nil.
func (s *Store) getItem(ctx context.Context, k item) (item, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            k,
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, storeErr(err, "get")
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	return out.Item, nil
}

// batchWrite puts and deletes items in batches of 25, resubmitting unprocessed ones with a capped backoff.
func (s *Store) batchWrite(ctx context.Context, reqs []types.WriteRequest) error {
	for len(reqs) > 0 {
		n := min(len(reqs), 25)
		batch := reqs[:n]
		reqs = reqs[n:]
		for attempt := 0; len(batch) > 0; attempt++ {
			if attempt > 0 {
				if attempt > 10 {
					return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "dynamo batch write: %d requests left unprocessed", len(batch))
				}
				if err := (agent.SystemClock{}).Sleep(ctx, backoff(attempt)); err != nil {
					return storeErr(err, "batch write")
				}
			}
			out, err := s.client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
				RequestItems: map[string][]types.WriteRequest{s.table: batch},
			})
			if err != nil {
				return storeErr(err, "batch write")
			}
			batch = out.UnprocessedItems[s.table]
		}
	}
	return nil
}

// batchGet reads items by key in batches of 100 (strongly consistent), resubmitting unprocessed keys. Missing
// items are simply absent from the result, which is keyed by itemKey.
func (s *Store) batchGet(ctx context.Context, keys []item) (map[string]item, error) {
	got := make(map[string]item, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), 100)
		batch := keys[:n]
		keys = keys[n:]
		for attempt := 0; len(batch) > 0; attempt++ {
			if attempt > 0 {
				if attempt > 10 {
					return nil, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "dynamo batch get: %d keys left unprocessed", len(batch))
				}
				if err := (agent.SystemClock{}).Sleep(ctx, backoff(attempt)); err != nil {
					return nil, storeErr(err, "batch get")
				}
			}
			out, err := s.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
				RequestItems: map[string]types.KeysAndAttributes{s.table: {Keys: batch, ConsistentRead: aws.Bool(true)}},
			})
			if err != nil {
				return nil, storeErr(err, "batch get")
			}
			for _, it := range out.Responses[s.table] {
				got[itemKey(it)] = it
			}
			batch = out.UnprocessedKeys[s.table].Keys
		}
	}
	return got, nil
}

// itemKey is the key batchGet's result is indexed by.
func itemKey(it item) string { return getS(it, AttrPK) + "\x00" + getS(it, AttrSK) }

func backoff(attempt int) time.Duration {
	d := 25 * time.Millisecond << min(attempt, 5)
	return min(d, time.Second)
}

func deleteReq(k item) types.WriteRequest {
	return types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: k}}
}

func putReq(it item) types.WriteRequest {
	return types.WriteRequest{PutRequest: &types.PutRequest{Item: it}}
}
