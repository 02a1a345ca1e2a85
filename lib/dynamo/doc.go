// Package dynamo is the agent.Store adapter over one DynamoDB table (single-table design; the table is the Table
// resource of template.yaml, and infra/DYNAMODB.md documents every item and access pattern in full).
//
// # Items
//
//	item            pk                 sk                              notes
//	thread          THREAD#<id>        THREAD                          claim fields live here (see below)
//	message head    THREAD#<id>        MSG#<messageId>                 seq, role, body
//	message chunk   THREAD#<id>        MSGC#<messageId>#<ver>#<nnnn>   a slice of a large body
//	run             THREAD#<id>        RUN#<runId>
//	segment         RUNSEG#<runId>     SEG#<seq, 20 digits>            TTL expiresAt
//	segment chunk   RUNSEG#<runId>     SEGC#<seq>#<ver>#<nnnn>         TTL expiresAt
//	value           KV#<namespace>     V#<key>
//	value chunk     KV#<namespace>     VC#<key>#<ver>#<nnnn>
//
// The active-run claim is a set of top-level attributes on the thread item (claimRunId, claimHeartbeatAt,
// claimCancel, and runShard = "RUN#<fnv32a(thread id) mod 16>"); its epoch is the thread's epoch, which only a
// claim advances. They are top-level rather than a nested map because runShard and claimHeartbeatAt are the keys
// of the sparse "running" index, and index keys must be top-level attributes. Claim, heartbeat, cancel and
// release are each one conditional UpdateItem on that one item. The "byOwner" index (owner, recency =
// "<updatedAt>#<id>") lists a user's threads; it is keys-only, and ListThreads reads the items it names.
//
// Runs and messages live in the thread partition, so DeleteThread finds everything with one key-only Query, plus
// one per run for its segment partition. Segments get a partition per run because ListSegments knows only the
// run id.
//
// Every timestamp is stored as a fixed-width UTC string with nanoseconds (2006-01-02T15:04:05.000000000Z), so
// string order is time order and times round-trip exactly.
//
// # Large values
//
// No item may exceed 400 KB, whatever a message, a stream segment or a tool value holds. One scheme serves all
// three. A value up to 32 KiB is stored inline in the head item's body attribute (a string when it is UTF-8 text).
// A larger one is gzipped (kept raw if gzip does not shrink it); if the payload is then at most 300 KiB it is still
// inline. Beyond that it is split into 300 KiB chunk items, and the head carries ver (a fresh version id) and
// chunks (their count) instead of a body.
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
// Base-table reads are strongly consistent. The two indexes are eventually consistent in DynamoDB: ListThreads may
// miss a thread created a moment ago (the items it returns are re-read and current), and ListStaleClaims returns
// hints that the reaper re-checks with the epoch-fenced FinishRun. DynamoDB Local updates indexes synchronously.
//
// # Requests
//
// Counter is an SDK middleware that counts requests per operation; the tests pin the budget of each method and
// the benchmarks report requests per turn (claim 2 writes, heartbeat 1, finish 2, message upsert 1, segment 1,
// transcript load 1 read).
package dynamo
