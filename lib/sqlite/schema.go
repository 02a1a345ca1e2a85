package sqlite

import (
	"context"
	"fmt"

	"github.com/agentloop/agentloop/lib/agent"
)

// schemaVersion is stored in PRAGMA user_version. A file written by a newer schema is refused rather than
// misread; a file of an older version is migrated in place (see migrations).
const schemaVersion = 17

// schema creates every table and index of the current version on a fresh file.
var schema = []string{
	// One row per thread. The active-run claim lives on the thread row (claim_run_id NULL when idle), so a claim
	// is one conditional update of one row. next_seq is the first message position no claim has reserved yet;
	// only ClaimRun advances it. queue_seq is the last queue position Enqueue handed out (version 4).
	`CREATE TABLE IF NOT EXISTS threads (
		id                 TEXT PRIMARY KEY,
		owner              TEXT NOT NULL,
		title              TEXT NOT NULL,
		settings           TEXT NOT NULL, -- JSON of agent.ThreadSettings
		usage_input        INTEGER NOT NULL,
		usage_output       INTEGER NOT NULL,
		usage_total        INTEGER NOT NULL,
		usage_cached       INTEGER NOT NULL,
		created_at         INTEGER NOT NULL, -- unix ms
		updated_at         INTEGER NOT NULL,
		epoch              INTEGER NOT NULL,
		claim_run_id       TEXT,
		claim_epoch        INTEGER,
		claim_heartbeat_at INTEGER,
		claim_cancel       INTEGER NOT NULL DEFAULT 0,
		next_seq           INTEGER NOT NULL DEFAULT 0,
		queue_seq          INTEGER NOT NULL DEFAULT 0,
		usage_reasoning    INTEGER NOT NULL DEFAULT 0,
		usage_cost         INTEGER NOT NULL DEFAULT 0, -- micro-USD
		claim_readers_until INTEGER, -- unix ms, agent.Claim.ReadersUntil (version 12); NULL when none
		title_by_user      INTEGER NOT NULL DEFAULT 0, -- 1 once the owner set a title (version 13): SetGeneratedTitle leaves it
		usage_cache_write  INTEGER NOT NULL DEFAULT 0, -- agent.Usage.CacheWriteTokens (version 14)
		title_generated    INTEGER NOT NULL DEFAULT 0, -- 1 once a generated title was stored (version 15)
		usage_key          TEXT -- the key of the last spend AddUsage added (version 17); NULL when none
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS threads_by_owner ON threads (owner, updated_at DESC, id DESC)`,
	claimedIndex,

	// previous is the claim this run took over (JSON of agent.Claim, NULL when none), so that a retried claim
	// returns the same ClaimResult.
	`CREATE TABLE IF NOT EXISTS runs (
		thread_id            TEXT NOT NULL,
		id                   TEXT NOT NULL,
		trigger              TEXT NOT NULL,
		status               TEXT NOT NULL,
		error                TEXT, -- JSON of agent.RunError, NULL when none
		usage_input          INTEGER NOT NULL,
		usage_output         INTEGER NOT NULL,
		usage_total          INTEGER NOT NULL,
		usage_cached         INTEGER NOT NULL,
		steps                INTEGER NOT NULL,
		model                TEXT NOT NULL,
		assistant_message_id TEXT NOT NULL,
		epoch                INTEGER NOT NULL,
		created_at           INTEGER NOT NULL,
		updated_at           INTEGER NOT NULL,
		finished_at          INTEGER,
		first_seq            INTEGER NOT NULL DEFAULT 0,
		reserved             INTEGER NOT NULL DEFAULT 0,
		previous             TEXT,
		usage_reasoning      INTEGER NOT NULL DEFAULT 0,
		usage_cost           INTEGER NOT NULL DEFAULT 0, -- micro-USD
		store                TEXT, -- JSON of agent.StoreUsage, NULL when not measured
		late_usage           TEXT, -- JSON of agent.Usage recorded by RecordLateUsage (included in usage_*), NULL when none
		usage_cache_write    INTEGER NOT NULL DEFAULT 0, -- agent.Usage.CacheWriteTokens (version 14)
		PRIMARY KEY (thread_id, id)
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS runs_by_created ON runs (thread_id, created_at, id)`,
	runsRunning,
	runsSignalStatus, runsSignalOwner, runsSignalAttempts, runsSignalDue, runsSignalsDue,
	threadsGone,
	threadsGoneEpoch,

	// writer_run_id and writer_epoch are the fence of the message's last writer, final whether that writer
	// finalized it, deleted whether it is hidden (a deleted message keeps its row so a late writer cannot bring
	// it back).
	`CREATE TABLE IF NOT EXISTS messages (
		thread_id     TEXT NOT NULL,
		id            TEXT NOT NULL,
		seq           INTEGER NOT NULL,
		role          TEXT NOT NULL,
		parts         TEXT NOT NULL, -- JSON array of the parts, each as given
		metadata      TEXT,          -- as given, NULL when empty
		created_at    INTEGER NOT NULL,
		updated_at    INTEGER NOT NULL,
		writer_run_id TEXT NOT NULL DEFAULT '',
		writer_epoch  INTEGER NOT NULL DEFAULT 0,
		final         INTEGER NOT NULL DEFAULT 0,
		deleted       INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (thread_id, id)
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS messages_by_seq ON messages (thread_id, seq, id)`,

	`CREATE TABLE IF NOT EXISTS segments (
		run_id     TEXT NOT NULL,
		seq        INTEGER NOT NULL,
		thread_id  TEXT NOT NULL,
		data       BLOB NOT NULL,
		final      INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		PRIMARY KEY (run_id, seq)
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS segments_by_thread ON segments (thread_id)`,
	`CREATE INDEX IF NOT EXISTS segments_by_expiry ON segments (expires_at)`,

	`CREATE TABLE IF NOT EXISTS kv (
		ns    TEXT NOT NULL,
		key   TEXT NOT NULL,
		value BLOB NOT NULL,
		PRIMARY KEY (ns, key)
	) STRICT, WITHOUT ROWID`,

	interruptsTable,
	interruptsByCreated,
	interruptsByMessage,
	interruptsPending,

	jobsTable,
	jobsUsage,
	jobsByCreated,
	jobsDue,
	queueTable,
	queueBySeq,
	queueWaiting,
	leasesTable,
	countersTable,
}

// interruptsTable keeps one row per interrupt (version 3). input and response are the JSON as given (NULL when
// empty), so the signed input round-trips byte for byte.
const interruptsTable = `CREATE TABLE IF NOT EXISTS interrupts (
		thread_id    TEXT NOT NULL,
		id           TEXT NOT NULL,
		run_id       TEXT NOT NULL,
		epoch        INTEGER NOT NULL,
		message_id   TEXT NOT NULL,
		kind         TEXT NOT NULL,
		tool_call_id TEXT NOT NULL,
		tool_name    TEXT NOT NULL,
		input        TEXT,
		signature    TEXT NOT NULL,
		status       TEXT NOT NULL,
		response     TEXT,
		created_at   INTEGER NOT NULL,
		expires_at   INTEGER NOT NULL,
		resolved_at  INTEGER, -- NULL while pending
		PRIMARY KEY (thread_id, id)
	) STRICT`

// interruptsByCreated serves ListInterrupts (oldest first, ties by id) without a sort.
const interruptsByCreated = `CREATE INDEX IF NOT EXISTS interrupts_by_created ON interrupts (thread_id, created_at, id)`

// interruptsByMessage serves ListMessageInterrupts (version 11): a turn, a view or the reaper reads one message's
// interrupts, oldest first, and never the rows of the thread's other messages (REVIEW S7).
const interruptsByMessage = `CREATE INDEX IF NOT EXISTS interrupts_by_message ON interrupts (thread_id, message_id, created_at, id)`

// interruptsPending is the reaper's work list: a partial index holding only pending interrupts, by expiry, so
// ListExpiredInterrupts reads exactly the rows it returns and resolved interrupts cost it nothing. A resolve
// takes its row out of the index in the same statement. (SQLite uses a partial index only for a query whose WHERE
// names the same literal, so listExpiredSQL spells status = 'pending' out.)
const interruptsPending = `CREATE INDEX IF NOT EXISTS interrupts_pending ON interrupts (expires_at, thread_id, id)
	WHERE status = 'pending'`

// jobsTable keeps one row per job (version 4). input and result are the JSON as given (NULL when empty); error
// is ” unless the job failed; due_at is NULL once the job is delivered (and only then).
const jobsTable = `CREATE TABLE IF NOT EXISTS jobs (
		thread_id       TEXT NOT NULL,
		id              TEXT NOT NULL,
		owner           TEXT NOT NULL,
		kind            TEXT NOT NULL,
		tool_call_id    TEXT NOT NULL,
		input           TEXT,
		status          TEXT NOT NULL,
		activity        TEXT NOT NULL,
		result          TEXT,
		error           TEXT NOT NULL,
		steer_delivered INTEGER NOT NULL,
		execution       TEXT NOT NULL,
		due_at          INTEGER,
		created_at      INTEGER NOT NULL,
		updated_at      INTEGER NOT NULL,
		finished_at     INTEGER, -- NULL until FinishJob
		PRIMARY KEY (thread_id, id)
	) STRICT`

// jobsUsage adds the sub-agent's usage (agent.Usage as JSON, NULL when zero), set by FinishJob (version 7).
const jobsUsage = `ALTER TABLE jobs ADD COLUMN usage TEXT`

// jobsByCreated serves ListJobs (oldest first, ties by id) without a sort.
const jobsByCreated = `CREATE INDEX IF NOT EXISTS jobs_by_created ON jobs (thread_id, created_at, id)`

// jobsDue is the reaper's work list of jobs: a partial index of undelivered jobs by deadline, so ListDueJobs
// reads exactly the rows it returns; MarkJobDelivered takes the row out in its own statement (listDueSQL spells
// the same literal out, as SQLite requires to use a partial index).
const jobsDue = `CREATE INDEX IF NOT EXISTS jobs_due ON jobs (due_at, thread_id, id) WHERE steer_delivered = 0`

// queueTable keeps one row per queue entry (version 4), keyed by (thread_id, message_id). The message is kept
// like a stored one (parts as one JSON array of the parts as given, metadata as given or NULL). taken_at and
// expires_at are NULL while queued.
const queueTable = `CREATE TABLE IF NOT EXISTS queue (
		thread_id  TEXT NOT NULL,
		message_id TEXT NOT NULL,
		seq        INTEGER NOT NULL,
		kind       TEXT NOT NULL,
		role       TEXT NOT NULL,
		parts      TEXT NOT NULL,
		metadata   TEXT,
		owner      TEXT NOT NULL,
		job_id     TEXT NOT NULL,
		status     TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		taken_at   INTEGER,
		expires_at INTEGER,
		PRIMARY KEY (thread_id, message_id)
	) STRICT`

// queueBySeq serves ListQueued (seq order) and the bound's count: only queued rows, by thread and seq.
const queueBySeq = `CREATE INDEX IF NOT EXISTS queue_by_seq ON queue (thread_id, seq) WHERE status = 'queued'`

// queueWaiting is the reaper's work list of queues: only queued rows, by creation, so ListQueuedThreads reads
// the rows queued before its cutoff and nothing taken.
const queueWaiting = `CREATE INDEX IF NOT EXISTS queue_waiting ON queue (created_at, thread_id) WHERE status = 'queued'`

// claimedIndex is the reaper's work list: only claimed threads are in this partial index. Its key is the thread
// id, not the heartbeat, so a heartbeat (which sets only claim_heartbeat_at) writes no index entry at all; the
// price is that ListStaleClaims reads every claimed thread's row to compare heartbeats, which is as many rows as
// there are runs in flight.
const claimedIndex = `CREATE INDEX IF NOT EXISTS threads_claimed ON threads (id) WHERE claim_run_id IS NOT NULL`

// runsRunning indexes the runs recorded as running (version 8), oldest first: the reaper's list of claimless
// running runs (ListOrphanRuns) reads it, and it holds only the runs in flight (or left running by a crash).
const runsRunning = `CREATE INDEX IF NOT EXISTS runs_running ON runs (updated_at, thread_id, id) WHERE status = 'running'`

// threadsGone names the threads deleted and not created again (version 9): a fenced write into a thread with no
// row is refused when its id is here (claimAllows), so a run of a deleted thread writes nothing between the delete
// and a new thread on the id (and the new thread's own claim fences it after that). A row stays when a thread is
// created on the id again (the thread row is checked first): one small row per deleted id.
const threadsGone = `CREATE TABLE IF NOT EXISTS threads_gone (id TEXT PRIMARY KEY) STRICT, WITHOUT ROWID`

// threadsGoneEpoch keeps the deleted thread's epoch (version 10): a thread created again on the id starts its
// epochs above it (CreateThread), as DynamoDB's gone item does, so an epoch names one incarnation of a thread id,
// and Enqueue refuses an entry named for an earlier one (issue 16 item 2). Rows of version 9 keep 0: a thread
// created again before version 10 started its epochs again.
const threadsGoneEpoch = `ALTER TABLE threads_gone ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0`

// migrations[v] takes a file from version v-1 to v.
var migrations = map[int][]string{
	2: {
		`ALTER TABLE threads ADD COLUMN next_seq INTEGER NOT NULL DEFAULT 0`,
		// Start every thread's counter above its messages (ClaimRun also checks, this keeps the column honest).
		`UPDATE threads SET next_seq = coalesce((SELECT max(seq) + 1 FROM messages WHERE thread_id = threads.id), 0)`,
		// Version 1 keyed the claimed index by heartbeat, so every heartbeat moved an index entry.
		`DROP INDEX IF EXISTS threads_claimed`,
		claimedIndex,
		`ALTER TABLE runs ADD COLUMN first_seq INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE runs ADD COLUMN reserved INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE runs ADD COLUMN previous TEXT`,
		`ALTER TABLE messages ADD COLUMN writer_run_id TEXT NOT NULL DEFAULT ''`,
		`ALTER TABLE messages ADD COLUMN writer_epoch INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE messages ADD COLUMN final INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE messages ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0`,
	},
	// Version 3 adds interrupts; nothing else changes.
	3: {interruptsTable, interruptsByCreated, interruptsPending},
	// Version 4 adds jobs and the queue, and the thread's queue counter.
	4: {
		`ALTER TABLE threads ADD COLUMN queue_seq INTEGER NOT NULL DEFAULT 0`,
		jobsTable, jobsByCreated, jobsDue, queueTable, queueBySeq, queueWaiting,
	},
	// Version 5 adds reasoning tokens and cost to usage, and a run's store cost and late usage.
	5: {
		`ALTER TABLE threads ADD COLUMN usage_reasoning INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE threads ADD COLUMN usage_cost INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE runs ADD COLUMN usage_reasoning INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE runs ADD COLUMN usage_cost INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE runs ADD COLUMN store TEXT`,
		`ALTER TABLE runs ADD COLUMN late_usage TEXT`,
	},
	// Version 6 adds the per-user limits' leases and counters; nothing else changes.
	6: {leasesTable, countersTable},
	// Version 7 keeps a sub-agent's usage with its job's result.
	7: {jobsUsage},
	// Version 8 indexes the running runs (the reaper's sweep of claimless ones, REVIEW D15).
	8: {runsRunning},
	// Version 9 remembers deleted threads (fenced writes into them are refused, issue 16).
	9: {threadsGone},
	// Version 10 keeps a deleted thread's epoch, the base of a thread created again on its id.
	10: {threadsGoneEpoch},
	// Version 11 indexes interrupts by the message that asked them (REVIEW S7); nothing else changes.
	11: {interruptsByMessage},
	// Version 12 keeps how long resumed-stream readers stay attached to the active run (MarkReader).
	12: {claimReadersUntil},
	// Version 13 remembers that the owner chose the title (a generated title never overwrites it).
	13: {titleByUser},
	// Version 14 keeps the prompt-cache writes of usage (agent.Usage.CacheWriteTokens), priced apart.
	14: {threadsCacheWrite, runsCacheWrite},
	// Version 15 remembers that the title was generated (a generated title never overwrites another).
	15: {titleGenerated},
	// Version 16 keeps each run's completion signal (its outbox, issue 21 item 4) and indexes the pending ones.
	16: {runsSignalStatus, runsSignalOwner, runsSignalAttempts, runsSignalDue, runsSignalsDue},
	// Version 17 remembers the key of the last spend added outside a run (AddUsage: a title's), so a retry counts once.
	17: {usageKey},
}

// A run's completion signal (agent.RunSignal, version 16): signal_status NULL when the run has none, signal_due
// (unix ms) while pending. runsSignalsDue is the sweep's work list (ListDueSignals): only pending signals are in
// this partial index, and settling one takes it out in the same UPDATE.
const (
	runsSignalStatus   = `ALTER TABLE runs ADD COLUMN signal_status TEXT`
	runsSignalOwner    = `ALTER TABLE runs ADD COLUMN signal_owner TEXT NOT NULL DEFAULT ''`
	runsSignalAttempts = `ALTER TABLE runs ADD COLUMN signal_attempts INTEGER NOT NULL DEFAULT 0`
	runsSignalDue      = `ALTER TABLE runs ADD COLUMN signal_due INTEGER`
	runsSignalsDue     = `CREATE INDEX IF NOT EXISTS runs_signals_due ON runs (signal_due, thread_id, id) WHERE signal_status = 'pending'`
)

// threadsCacheWrite and runsCacheWrite: rows of an older version read 0 (their writes were not kept).
const (
	threadsCacheWrite = `ALTER TABLE threads ADD COLUMN usage_cache_write INTEGER NOT NULL DEFAULT 0`
	runsCacheWrite    = `ALTER TABLE runs ADD COLUMN usage_cache_write INTEGER NOT NULL DEFAULT 0`
)

const usageKey = `ALTER TABLE threads ADD COLUMN usage_key TEXT`

const titleGenerated = `ALTER TABLE threads ADD COLUMN title_generated INTEGER NOT NULL DEFAULT 0`

// titleByUser is set by UpdateThread with a title. A row of an older version reads 0: SetGeneratedTitle still
// replaces its title only if it is the one the caller saw (the first message's text).
const titleByUser = `ALTER TABLE threads ADD COLUMN title_by_user INTEGER NOT NULL DEFAULT 0`

// claimReadersUntil is in no index: a reader's MarkReader writes one table page and no index page.
const claimReadersUntil = `ALTER TABLE threads ADD COLUMN claim_readers_until INTEGER`

// migrate creates the schema on a fresh file or migrates an older one, in one write transaction (so concurrent
// first opens serialise and the second sees the first one's version).
func (s *Store) migrate(ctx context.Context) error {
	return s.write(ctx, "apply schema", func(c conn) error {
		var version int
		if err := c.queryRow(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
			return err
		}
		if version > schemaVersion {
			return agent.E(agent.KindInternal, agent.CodeInternal,
				"sqlite: %s has schema version %d, this build knows up to %d", s.path, version, schemaVersion)
		}
		if version == schemaVersion {
			return nil
		}
		stmts := schema
		if version > 0 {
			stmts = nil
			for v := version + 1; v <= schemaVersion; v++ {
				stmts = append(stmts, migrations[v]...)
			}
		}
		for _, stmt := range stmts {
			if _, err := c.exec(ctx, stmt); err != nil {
				return err
			}
		}
		// PRAGMA takes no bound parameters; the value is a constant.
		_, err := c.exec(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, schemaVersion))
		return err
	})
}
