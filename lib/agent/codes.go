package agent

// The one catalog of error codes a client can see. It is part of the HTTP contract: every error reply is
// {"error": {"code": <one of these>, "message": <safe for a user>}} with the status its Kind maps to (lib/httpapi),
// and run errors (GET /threads/{id}/runs, the stream's error chunk) carry the same codes. Codes are stable
// snake_case identifiers; add new ones here, never rename one. Match with errors.Is against the Err values below.
const (
	// Not found (404). Another user's thread is reported exactly like a missing one.
	CodeNotFound          = "not_found"
	CodeThreadNotFound    = "thread_not_found"
	CodeRunNotFound       = "run_not_found"
	CodeMessageNotFound   = "message_not_found"
	CodeInterruptNotFound = "interrupt_not_found"
	CodeJobNotFound       = "job_not_found"
	CodeRouteNotFound     = "route_not_found"

	// Conflict (409).
	CodeRunActive        = "run_active"        // a fresh claim exists on the thread
	CodeRunFenced        = "run_fenced"        // the caller's claim or epoch is no longer current
	CodeNoActiveRun      = "no_active_run"     // stop: the thread has no active run (or not the named one)
	CodeThreadDeleting   = "thread_deleting"   // the thread is being deleted
	CodeDuplicateMessage = "duplicate_message" // the message id was already answered
	CodeAlreadyResolved  = "already_resolved"  // an interrupt was already answered differently
	CodeExpired          = "expired"           // the interrupt expired before it was answered
	CodeNotInterrupted   = "not_interrupted"   // tool outputs or answers for a message that waits for none
	CodeQueueFull        = "queue_full"        // multitask enqueue: the thread's queue is at its bound
	CodeJobFinished      = "job_finished"      // internal: a finished job's activity cannot change
	CodeJobNotFinished   = "job_not_finished"  // internal: only a finished job can be delivered
	CodeLeaseLost        = "lease_lost"        // internal: a limit lease to renew is no longer held
	CodeSignalTaken      = "signal_taken"      // internal: a run's completion signal was taken or settled by another sweep

	// Over a per-user limit (429, with a Retry-After header in whole seconds).
	CodeTooManyRuns       = "too_many_runs"       // the user has as many active runs as allowed
	CodeTooManyStreams    = "too_many_streams"    // the user, or the run, has as many stream readers as allowed
	CodeThreadRateLimited = "thread_rate_limited" // the user created as many threads this minute as allowed

	// The server cannot keep up (503, with a Retry-After header in whole seconds): it refuses a request that
	// would start a run before writing anything, rather than admit a run it may lose (lib/engine admission.go).
	// Nothing of the request was stored; send it again after Retry-After.
	CodeOverloaded = "overloaded"
	// CodeDraining: the process is shutting down (`agentloop serve` after SIGTERM, lib/drain): it lets the runs it
	// holds finish and refuses new ones, and new stream readers, before writing anything (503, with a Retry-After).
	// Nothing of the request was stored; send it again after Retry-After (another replica takes it). GET /readyz
	// answers it too.
	CodeDraining = "draining"
	// CodeModelUnavailable: GET /readyz of `agentloop serve` could not reach the model's endpoint (503).
	CodeModelUnavailable = "model_unavailable"

	// Over a bound on what one model turn may start: never an HTTP answer, but the error result of the tool call
	// that was not executed, which the model reads (and the client sees on the tool part).
	CodeTooManyToolCalls = "too_many_tool_calls" // the model step called more tools than one step may
	CodeTooManyJobs      = "too_many_jobs"       // the run, or the user, has as many sub-agent jobs as allowed
	CodeJobChainTooDeep  = "job_chain_too_deep"  // a delivery turn's job was itself started by a chain of delivery turns

	// Canceled: the run's claim carries a cancel request (internal to a run), or the request went away (499).
	CodeRunCanceled = "run_canceled"
	CodeCanceled    = "canceled"

	// Bad request (400).
	CodeInvalidJSON       = "invalid_json"
	CodeUnreadableBody    = "unreadable_body"
	CodeMissingID         = "missing_id"
	CodeMissingTrigger    = "missing_trigger"
	CodeMissingMessages   = "missing_messages"
	CodeMissingMessage    = "missing_message"
	CodeInvalidThreadID   = "invalid_thread_id"
	CodeInvalidTrigger    = "invalid_trigger"
	CodeInvalidMultitask  = "invalid_multitask"
	CodeInvalidMessage    = "invalid_message"     // a message or part the store or the engine cannot accept
	CodeReservedMessageID = "reserved_message_id" // a client message id in the server's namespace (steer_<jobId>)
	CodeInvalidJob        = "invalid_job"         // internal: a job or job result no store keeps
	CodeUserRequired      = "user_message_required"
	CodeNothingToRegen    = "nothing_to_regenerate"
	CodeUnsupported       = "unsupported_message"
	CodeUnknownApproval   = "unknown_approval"  // an answer names no interrupt of the message
	CodeApprovalMismatch  = "approval_mismatch" // the answered tool call, name or input differs from what was signed
	CodeMissingDecision   = "missing_decision"  // a pending approval or client tool of the message has no answer
	CodeInvalidLimit      = "invalid_limit"
	CodeInvalidCursor     = "invalid_cursor" // a page cursor (or newest flag) that no page of this list gave
	CodeInvalidTitle      = "invalid_title"
	CodeInvalidRunID      = "invalid_run_id"
	CodeInvalidStatus     = "invalid_status"
	CodeInvalidSegment    = "invalid_segment"
	CodeInvalidSubject    = "invalid_subject"
	CodeInvalidTTL        = "invalid_ttl"
	CodeInvalidConfig     = "invalid_config"
	CodeInvalidLease      = "invalid_lease" // internal: a limit lease or counter request no store keeps
	CodeUnauthenticated   = "unauthenticated"
	CodeMissingToken      = "missing_token"
	CodeInvalidToken      = "invalid_token"
	CodeTokenExpired      = "token_expired"
	CodeWeakSecret        = "weak_secret"
	CodeTooLarge          = "request_too_large" // the request body is over the limit (413)
	CodeMessageTooLarge   = "message_too_large" // the newest message is over the limit or the model budget (413)
	// CodeThreadTooLarge (413): the thread holds as much as the store keeps for one thread (DynamoDB: 10 GB per
	// thread, infra/DYNAMODB.md); nothing more can be written into it, and a new thread is needed.
	CodeThreadTooLarge   = "thread_too_large"
	CodeStoreUnavailable = "store_unavailable" // the store failed in a way that may pass on retry (503)
	CodeJobsUnavailable  = "jobs_unavailable"  // the job runner (Step Functions) failed in a way that may pass on retry (503)
	// CodeLaunchUnavailable: a run could not be continued with no client attached (no run launcher here, or it
	// is closed): a background run is refused with it (503), and a hand-over stays in its invocation.
	CodeLaunchUnavailable = "launch_unavailable"
	CodeModelError        = "model_error"   // the model provider refused or failed
	CodeModelTimeout      = "model_timeout" // no first token, or too long a gap between tokens
	// CodeModelInterrupted: the model failed after its reply began (the stream was cut, the provider failed
	// mid-reply). The partial reply is kept, marked failed; regenerating it (or sending the message again) asks
	// the model anew. Before the first token such a failure is retried, and failed over (lib/modelset), instead.
	CodeModelInterrupted   = "model_interrupted"
	CodeUnknownModel       = "unknown_model"  // internal: a request names no entry of the models file (lib/modelset)
	CodeStepLimit          = "step_limit"     // the run hit its step cap
	CodeRunTimeout         = "run_timeout"    // the run hit its wall clock
	CodeStale              = "stale"          // the run stopped sending heartbeats and was reaped
	CodePersistFailed      = "persist_failed" // the reply could not be stored
	CodeInternal           = "internal"
	CodeSecretUnavailable  = "secret_unavailable" // startup only
	CodeSecretMissing      = "secret_missing"
	CodeSecretNotSecure    = "secret_not_secure"
	CodeSecretUnset        = "secret_unset"
	CodeStoreCorrupt       = "store_corrupt"
	CodeInvalidChunk       = "invalid_chunk"  // internal: a stream chunk the encoder refuses
	CodeInvalidStream      = "invalid_stream" // internal: bytes that are not SSE frames
	CodeClientGone         = "client_gone"
	CodeStreamDone         = "stream_done"
	CodeSegmenterClosed    = "segmenter_closed"
	CodeSegmentWriteFailed = "segment_write_failed"
)

// Bad request (400), continued: the newest message's files (agent.ValidateIncoming).
const (
	// CodeUnsupportedFileType: a user message's file part has a media type no model receives (images and PDFs
	// only): refused rather than silently left out of what the model sees.
	CodeUnsupportedFileType = "unsupported_file_type"
	// CodeFileUnavailable: the model provider could not download or decode an image the newest message names by
	// URL (OpenAI's invalid_image_url, invalid_image_format); the run fails with it. Older messages' files never
	// fail a run: they become a line saying so.
	CodeFileUnavailable = "file_unavailable"
)

// A tool call's error result, as its errorText names it (the client, the model and the transcript read only
// the text; REVIEW S3).
const (
	CodeUnknownTool      = "unknown_tool"       // the model named a tool that does not exist
	CodeInvalidToolInput = "invalid_tool_input" // the tool's input is not JSON, or not what the tool takes
	CodeToolTimeout      = "tool_timeout"       // the tool did not return within the tool timeout
	CodeToolFailed       = "tool_failed"        // the tool could not run, or failed in a way it described
)

// A run's error (the stream's error chunk, GET /threads/{id}/runs).
const (
	// CodeContextExhausted: what a turn must show the model (the messages it answers, its newest tool results,
	// calls still waiting) is alone over the model's context budget. The turn ends before sending a request the
	// provider would refuse; the thread's next message is answered (the reply before it can be pruned then).
	CodeContextExhausted = "context_exhausted"
)

// Err values to match with errors.Is (codes compare equal; kinds and messages are not compared).
var (
	ErrNotFound          = &Error{Kind: KindNotFound, Code: CodeNotFound}
	ErrThreadNotFound    = &Error{Kind: KindNotFound, Code: CodeThreadNotFound}
	ErrThreadTooLarge    = &Error{Kind: KindTooLarge, Code: CodeThreadTooLarge}
	ErrRunActive         = &Error{Kind: KindConflict, Code: CodeRunActive}
	ErrRunFenced         = &Error{Kind: KindConflict, Code: CodeRunFenced}
	ErrRunCanceled       = &Error{Kind: KindCanceled, Code: CodeRunCanceled}
	ErrNoActiveRun       = &Error{Kind: KindConflict, Code: CodeNoActiveRun}
	ErrThreadDeleting    = &Error{Kind: KindConflict, Code: CodeThreadDeleting}
	ErrDuplicateMessage  = &Error{Kind: KindConflict, Code: CodeDuplicateMessage}
	ErrAlreadyResolved   = &Error{Kind: KindConflict, Code: CodeAlreadyResolved}
	ErrInterruptNotFound = &Error{Kind: KindNotFound, Code: CodeInterruptNotFound}
	ErrJobNotFound       = &Error{Kind: KindNotFound, Code: CodeJobNotFound}
	ErrQueueFull         = &Error{Kind: KindConflict, Code: CodeQueueFull}
	ErrJobFinished       = &Error{Kind: KindConflict, Code: CodeJobFinished}
	ErrJobNotFinished    = &Error{Kind: KindConflict, Code: CodeJobNotFinished}
	ErrSignalTaken       = &Error{Kind: KindConflict, Code: CodeSignalTaken}
	ErrStoreUnavailable  = &Error{Kind: KindUnavailable, Code: CodeStoreUnavailable}
	ErrJobsUnavailable   = &Error{Kind: KindUnavailable, Code: CodeJobsUnavailable}
	ErrLeaseLost         = &Error{Kind: KindConflict, Code: CodeLeaseLost}
	ErrTooManyRuns       = &Error{Kind: KindLimited, Code: CodeTooManyRuns}
	ErrTooManyStreams    = &Error{Kind: KindLimited, Code: CodeTooManyStreams}
	ErrThreadRateLimited = &Error{Kind: KindLimited, Code: CodeThreadRateLimited}
	ErrOverloaded        = &Error{Kind: KindUnavailable, Code: CodeOverloaded}
)
