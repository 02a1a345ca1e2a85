// Package dynamo is the agent.Store adapter over one DynamoDB table (single-table design; the table is the Table
// resource of template.yaml, defined in Go once as Table, and infra/DYNAMODB.md documents every item, access
// pattern and condition in full).
//
// # Items
//
//	item            pk                 sk                              notes
//	thread          THREAD#<id>        THREAD                          claim, message counter, delete tombstone
//	message head    THREAD#<id>        MSG#<messageId>                 seq, role, body, writer's fence, final/hidden
//	message chunk   THREAD#<id>        MSGC#<messageId>#<ver>#<nnnn>   a slice of a large body
//	run             THREAD#<id>        RUN#<runId>                     outcome, epoch, reserved positions
//	interrupt       THREAD#<id>        INTM#<messageId>#<interruptId>  status, input, response; index keys while pending
//	                                   (INT#<interruptId> when an older build stored it: read, never written)
//	interrupt chunk THREAD#<id>        INTC#<interruptId>#<ver>#<nnnn> a slice of a large input or response
//	job             THREAD#<id>        JOB#<jobId>                     input, activity, result; index keys till delivery
//	job chunk       THREAD#<id>        JOBC#<jobId>#<ver>#<nnnn>       a slice of a large input or result
//	queue entry     THREAD#<id>        Q#<messageId>                   seq, message; index keys while queued, then TTL
//	queue chunk     THREAD#<id>        QC#<messageId>#<ver>#<nnnn>     a slice of a large message
//	segment         RUNSEG#<runId>     SEG#<seq, 20 digits>            TTL expiresAt
//	stream end      RUNSEG#<runId>     SEG#~final                      lowest seq of a stored final segment
//	segment chunk   RUNSEG#<runId>     SEGC#<seq>#<ver>#<nnnn>         TTL expiresAt
//	value           KV#<namespace>     V#<key>
//	value chunk     KV#<namespace>     VC#<key>#<ver>#<nnnn>
//	lease scope     LIMIT#<scope>      LEASES                          h:<holder> = expiry (ms), leaseCount, leaseVer; TTL
//	counter window  LIMIT#<scope>      W#<window start ms, 20 digits>  leaseCount; TTL an hour after the window
//
// Per-user limits (limits.go): a lease scope is one item of holders-as-attributes, one conditional UpdateItem to
// acquire (in the common case), renew or release; a counter window is one item, one conditional UpdateItem per
// count. A scope names its user, so each user's limits are partitions of their own. No scans, no transactions.
//
// The active-run claim is a set of top-level attributes on the thread item (claimRunId, claimHeartbeatAt,
// claimBucket, runShard = "RUN#<fnv32a(thread id) mod 16>", claimCancel, and the claim it took over in claimPrev*);
// its epoch is the thread's epoch, which only a claim advances, and each claim also takes its message positions
// from the thread's nextSeq counter with ADD in the same write. runShard and claimBucket (the heartbeat rounded down
// to 10 s) are the keys of the sparse, keys-only "running" index; the exact heartbeat is in no index, so the 1 s
// heartbeat moves the index entry once per 10 s, not every second (1.2 WCU per second in all). Claim, heartbeat,
// cancel and release are each one conditional UpdateItem on that one item. The "byOwner" index (owner, recency =
// "<updatedAt>#<id>") lists a user's threads; it is keys-only, and ListThreads reads the items it names.
//
// Interrupts live in their thread's partition. CreateInterrupt is one insert-if-absent PutItem followed by a read of
// the thread (a missing or tombstoned thread makes it take the interrupt back: see CreateInterrupt for why this
// order leaves no window); ResolveInterrupt is one UpdateItem conditioned on status = pending. While pending, an
// interrupt carries pendingShard ("INT#<fnv32a(thread id) mod 16>") and pendingExpiresAt, the keys of the sparse,
// keys-only "pendingInterrupts" index; the resolve removes them in its own write, so the index holds exactly the
// pending interrupts and the reaper's ListExpiredInterrupts never scans. An interrupt head holds two large values
// (input, response), each inline up to 64 KiB and chunked beyond.
//
// Jobs and queue entries live in their thread's partition too. CreateJob is insert-then-verify like
// CreateInterrupt (the shared insertChild); FinishJob, SetJobActivity and MarkJobDelivered are each one UpdateItem
// conditioned on the job's state (not finished; not finished; finished and not delivered). Enqueue counts the
// queue with one Query (the bound, best-effort under concurrent senders: see Enqueue), takes its seq from the
// thread item with ADD queueSeq 1 (conditioned on a live thread), then inserts the entry like any child;
// TakeQueued is one UpdateItem conditioned on status = queued that also sets the table's TTL. Undelivered jobs and
// queued entries carry dueShard ("JOB#<n>" or "Q#<n>", fnv32a(thread id) mod 16) and dueAt (a job's DueAt, an
// entry's CreatedAt), the keys of the one sparse, keys-only "dueWork" index that the reaper's ListDueJobs and
// ListQueuedThreads read (each its own 16 shards); the delivery and the take remove them in their own write. A job
// head holds two large values (input, result) like an interrupt; an entry one (its message, as a message head
// stores it).
//
// A thread being deleted carries deleting = true (the tombstone, written only when no claim is held): it reads as
// missing, and CreateThread and ClaimRun refuse it in their conditions, until DeleteThread has removed everything
// under it and then the tombstone.
//
// Message heads remember their last writer's fence (writerRunId, writerEpoch) and whether it finalized them
// (final); every head write is conditioned on it, so a fenced run can change nothing a reader sees. A deleted
// message stays as a hidden head with its fence.
//
// Runs, messages, interrupts, jobs and queue entries live in the thread partition, so DeleteThread finds
// everything with one key-only
// Query, plus one per run for its segment partition. Segments get a partition per run because ListSegments knows
// only the run id.
//
// Every timestamp is stored as a fixed-width UTC string with nanoseconds (2006-01-02T15:04:05.000000000Z), so
// string order is time order and times round-trip exactly.
//
// # Failed conditions
//
// Every conditional write that must say why it failed (run_active, run_canceled, run_fenced, thread_deleting, not
// found, or "this is my own earlier attempt") asks for ReturnValuesOnConditionCheckFailure=ALL_OLD and classifies
// the failure from the item DynamoDB returns with it. When the failure carries no item (the item does not exist,
// or the server ignores the parameter, as dynalite does) one strongly consistent GetItem reads it instead. So the
// adapter is correct with and without the parameter; a retried write whose first attempt applied (a lost answer)
// is recognised from that item and converges (ClaimRun's two writes, a final PutMessage, FinishRun).
//
// # Large values
//
// No item may exceed 400 KB, whatever a message, a stream segment or a tool value holds. One scheme serves all
// three. A value up to 32 KiB is stored inline in the head item's body attribute (a string when it is UTF-8 text).
// A larger one is gzipped (kept raw if gzip does not shrink it); if the payload is then at most 300 KiB it is still
// inline. Beyond that it is split into 300 KiB chunk items, and the head carries ver (a fresh version id) and
// chunks (their count) instead of a body. Stream segments are compressed at smaller sizes too: from 256 bytes to
// 400 KiB a segment is stored deflated (enc = "deflate", flate.BestSpeed) when that makes its item smaller, so a
// 500 ms flush of text-delta frames is one write unit, not two or three (segments.go's packSegment). A deflate
// payload is inflated to at most 400 KiB (MaxItemBytes), and one that is corrupt or inflates further is an
// internal store_corrupt error. Items without enc (small segments, older builds) are read as they are.
//
// Writes are ordered so that a reader never sees a half-written value: the chunks of the new version are written
// first (BatchWriteItem), then the head switches to the new version in its one write (which also returns the old
// head, UPDATED_OLD/ALL_OLD), and only then are the chunks of the replaced version deleted. A reader reads the
// head, then fetches exactly the chunk keys it names (BatchGetItem, strongly consistent); if one is missing, a
// writer replaced the value between the two reads, and the reader starts again from the head. A crash between
// the steps leaves unreferenced chunks (never a broken value); DeleteThread removes those with everything else,
// and segment chunks carry the segment's TTL.
//
// # Consistency
//
// Base-table reads are strongly consistent. The indexes are eventually consistent in DynamoDB: ListThreads may
// miss a thread created a moment ago (the items it returns are re-read and current), and ListStaleClaims re-reads
// the threads the running index names and returns only claims whose exact heartbeat is stale, still only as
// nominations that the reaper's ReleaseClaim re-checks in its condition; ListExpiredInterrupts re-reads the
// interrupts the pending index names and returns only those still pending (a just-created one may be missing);
// ListDueJobs re-reads the jobs dueWork names and returns only undelivered ones still due; ListQueuedThreads
// returns the threads dueWork names as they are (the caller reads the queue itself). dynalite updates indexes
// synchronously.
//
// # Requests and capacity
//
// Counter is an SDK middleware that counts requests per operation and the capacity units they consume (as the
// server reports them; index write units computed by DynamoDB's rules where the server reports none, as dynalite
// does). The tests pin the budget of each method (TestRequestCounts) and the heartbeat's cost (TestHeartbeatCost);
// the benchmarks report requests and units per turn, per heartbeat and per reaper sweep.
//
// In production the Store meters itself per run: a request whose context carries an agent.StoreMeter is counted
// on it with the capacity the response reports (see meter.go), which the engine records in the run's outcome.
package dynamo
