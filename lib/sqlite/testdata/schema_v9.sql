CREATE TABLE threads (
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
		usage_cost         INTEGER NOT NULL DEFAULT 0 -- micro-USD
	) STRICT;
CREATE INDEX threads_by_owner ON threads (owner, updated_at DESC, id DESC);
CREATE INDEX threads_claimed ON threads (id) WHERE claim_run_id IS NOT NULL;
CREATE TABLE runs (
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
		PRIMARY KEY (thread_id, id)
	) STRICT;
CREATE INDEX runs_by_created ON runs (thread_id, created_at, id);
CREATE INDEX runs_running ON runs (updated_at, thread_id, id) WHERE status = 'running';
CREATE TABLE threads_gone (id TEXT PRIMARY KEY) STRICT, WITHOUT ROWID;
CREATE TABLE messages (
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
	) STRICT;
CREATE INDEX messages_by_seq ON messages (thread_id, seq, id);
CREATE TABLE segments (
		run_id     TEXT NOT NULL,
		seq        INTEGER NOT NULL,
		thread_id  TEXT NOT NULL,
		data       BLOB NOT NULL,
		final      INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		PRIMARY KEY (run_id, seq)
	) STRICT;
CREATE INDEX segments_by_thread ON segments (thread_id);
CREATE INDEX segments_by_expiry ON segments (expires_at);
CREATE TABLE kv (
		ns    TEXT NOT NULL,
		key   TEXT NOT NULL,
		value BLOB NOT NULL,
		PRIMARY KEY (ns, key)
	) STRICT, WITHOUT ROWID;
CREATE TABLE interrupts (
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
	) STRICT;
CREATE INDEX interrupts_by_created ON interrupts (thread_id, created_at, id);
CREATE INDEX interrupts_pending ON interrupts (expires_at, thread_id, id)
	WHERE status = 'pending';
CREATE TABLE jobs (
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
		finished_at     INTEGER, usage TEXT, -- NULL until FinishJob
		PRIMARY KEY (thread_id, id)
	) STRICT;
CREATE INDEX jobs_by_created ON jobs (thread_id, created_at, id);
CREATE INDEX jobs_due ON jobs (due_at, thread_id, id) WHERE steer_delivered = 0;
CREATE TABLE queue (
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
	) STRICT;
CREATE INDEX queue_by_seq ON queue (thread_id, seq) WHERE status = 'queued';
CREATE INDEX queue_waiting ON queue (created_at, thread_id) WHERE status = 'queued';
CREATE TABLE leases (
		scope      TEXT NOT NULL,
		holder     TEXT NOT NULL,
		expires_at INTEGER NOT NULL, -- unix ms
		PRIMARY KEY (scope, holder)
	) STRICT, WITHOUT ROWID;
CREATE TABLE counters (
		scope        TEXT NOT NULL,
		window_start INTEGER NOT NULL, -- unix ms
		n            INTEGER NOT NULL,
		PRIMARY KEY (scope, window_start)
	) STRICT, WITHOUT ROWID;
