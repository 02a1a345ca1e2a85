package agent

import (
	"context"
	"encoding/json"
)

// ToolKind says where a tool executes.
type ToolKind string

const (
	ToolServer ToolKind = "server" // executed by the engine
	ToolClient ToolKind = "client" // executed by the browser; the run stops until the output is posted
	ToolJob    ToolKind = "job"    // acknowledged at once; a sub-agent job reports back later
)

// ApprovalPolicy says when a tool call needs a human decision first.
type ApprovalPolicy string

const (
	ApprovalNever    ApprovalPolicy = ""         // never (mutating tools still ask when the thread has ReviewTools)
	ApprovalAlways   ApprovalPolicy = "always"   // every call
	ApprovalMutating ApprovalPolicy = "mutating" // only when the thread setting ReviewTools is on
)

// ToolInvocation is what a tool's Execute receives.
type ToolInvocation struct {
	ThreadID string
	Owner    string
	RunID    string
	// Epoch is the run's epoch (with RunID, the claim it holds while the tool executes; zero in Recorded).
	Epoch      int64
	ToolCallID string
	// MessageID is the assistant message that holds the call (a continuation after an approval keeps it).
	MessageID string
	Input     json.RawMessage
	// IdempotencyKey is the same for every execution of one tool call (thread + its assistant message + tool call
	// id), across retries,
	// runs and crashes: a tool with side effects applies them at most once per key, and may record its outcome
	// under it so that Recorded can report it after a crash (DESIGN principle 9).
	IdempotencyKey string
	// UserToken is the end user's bearer token from the request that runs the call, for tools that act as the
	// user at another service (HTTP tools send it as X-User-JWT). Empty when the turn has no request of the user:
	// a delivery pass (a job's report, a message queued by multitask enqueue) and recovery. Held in memory for
	// the call only: never stored, logged, or put in an output.
	UserToken string
	// Progress, when set, reports how the call's work goes (stage: a short word such as "searching" or "3/10";
	// message: a line for a person): the client and the run's resumed readers see a transient data-tool-progress
	// part {toolCallId, stage, message}; the model and the stored transcript never do. It never blocks (a report
	// the stream cannot take at once is dropped), and reports made after Execute returned may be dropped.
	Progress func(stage, message string)
	// Preliminary, when set, shows the client a partial output (any JSON value) while the call works: a
	// tool-output-available with preliminary: true, replaced by the next one of the call (the final output,
	// Execute's). Like Progress, it streams to the client and resumed readers only, never blocks, and is never
	// stored nor given to the model.
	Preliminary func(output json.RawMessage)
}

// IdempotencyKey is the key of one tool call of a thread: the assistant message that holds it is part of it, so
// a call id used again in another message (a model that derives ids from its request, a thread deleted and
// created again on its id, whose effects outlive it) never inherits an earlier call's outcome (REVIEW D13).
func IdempotencyKey(threadID, messageID, toolCallID string) string {
	return threadID + "/" + messageID + "/" + toolCallID
}

// Tool is a Go value the engine offers to the model.
type Tool struct {
	Name        string
	Description string
	InputSchema json.RawMessage
	// InputExamples are sample inputs (each a JSON value the schema accepts) shown to the model: natively where
	// the provider takes them, folded into the description otherwise (the adapter decides).
	InputExamples []json.RawMessage
	Kind          ToolKind
	Approval      ApprovalPolicy
	// NeedsApproval, when set, decides per input (overrides Approval when it returns true).
	NeedsApproval func(input json.RawMessage) bool
	// Execute runs a server tool (or acknowledges a job tool). Its output is any JSON value. An error becomes a
	// tool-output-error the model sees; the run goes on.
	Execute func(ctx context.Context, inv ToolInvocation) (json.RawMessage, error)
	// Recorded, when set, reports the outcome an earlier execution recorded under inv.IdempotencyKey (ok false:
	// the tool never ran to completion under that key). Recovery uses it so that a run that died after the tool
	// ran but before its result was stored reports what really happened, not "not executed".
	Recorded func(ctx context.Context, inv ToolInvocation) (output json.RawMessage, ok bool, err error)
	// Snapshot declares that an output of this tool is a whole snapshot of some state (a document, a list) that
	// supersedes every earlier output of the same tool: the model is shown only the newest one (the others
	// become a one-line note), so a stale copy never misleads it and N calls do not cost N copies.
	Snapshot bool
	// AlwaysOn keeps the tool in every step's offer when a router narrows a large catalog (ToolRouter): the
	// deployer's core tools (the Go demo tools are), which the model must see whatever the user wrote.
	AlwaysOn bool
}

// Spec is the model-facing description of t.
func (t Tool) Spec() ToolSpec {
	return ToolSpec{Name: t.Name, Description: t.Description, Parameters: t.InputSchema, InputExamples: t.InputExamples}
}

// ToolSource gives the engine tools from somewhere other than Go code compiled in (an MCP server, the HTTP tools
// of the tools file). The engine asks it when a turn starts and offers its tools beside the Go ones; a source
// caches what it lists (once per cold start is the rule for remote listings). An error leaves the source's tools
// out of that turn (the engine logs it; the turn goes on); the tools returned must have names unique across the
// engine's tools.
type ToolSource interface {
	// Name names the source in logs (e.g. "mcp:github").
	Name() string
	// Tools lists the source's tools as the model may be offered them now.
	Tools(ctx context.Context) ([]Tool, error)
}

// ToolRouter chooses which of a turn's tools each step offers the model, so that a large catalog (hundreds of
// MCP and HTTP tools) does not paralyse a small model. The engine asks it and holds no routing rule of its own.
type ToolRouter interface {
	// Catalog prepares the tools one turn offers (in the order offered) for its steps' choices; called once per
	// turn (or once for tools that never change).
	Catalog(tools []Tool) ToolCatalog
}

// ToolCatalog is one turn's tools, prepared by a ToolRouter.
type ToolCatalog interface {
	// Offer returns the tools one step offers, a subset of the catalog in its order, and routed true when it
	// chose (false: the whole catalog, as when it is under the router's minimum). It never fails: whatever it
	// cannot rank it leaves out, and what it must keep (always-on tools, tools the thread used) it keeps.
	Offer(ctx context.Context, q ToolQuery) (offered []ToolSpec, routed bool)
}

// ToolQuery is what one step's choice reads.
type ToolQuery struct {
	// Text is the newest user text of the thread.
	Text string
	// Used names the tools the thread called already (their calls are in the transcript the step sends).
	Used []string
}

// Embedder turns texts into vectors (a provider's embeddings endpoint), for a router's nearest-tool fallback.
type Embedder interface {
	// EmbeddingModel names the vectors' model: vectors of different models are never compared.
	EmbeddingModel() string
	// Embed returns one vector per text, in order.
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// ToolInputs checks one tool call's arguments before anything acts on them (approval, client, execution): it
// repairs arguments that are not JSON at most once, and validates the result against the tool's input schema.
// It returns the input to use (the repaired one when it repaired). A refusal is an *Error of KindInvalid with
// CodeInvalidToolInput whose message names the violations (the field's path and the rule broken) and nothing
// internal: the engine hands it to the model as the call's tool-output-error, the tool never runs, and the model
// may call again. When it refuses input that is still not JSON, the input returned is nil.
type ToolInputs interface {
	CheckInput(tool Tool, arguments string) (json.RawMessage, error)
}
