// Package engine runs the agent loop on a thread: claim → assemble → steps → finish (DESIGN.md "Run lifecycle").
// It depends only on the domain ports, so the same engine runs under Lambda (DynamoDB, openai) and in
// `agentloop dev` (SQLite, the offline model).
package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
)

// Config bounds a run. Zero values take the defaults below.
type Config struct {
	Model           string
	System          string
	MaxSteps        int           // default 30
	MaxOutputTokens int           // default 8192
	RunTimeout      time.Duration // whole-run wall clock, default 600 s
	ToolTimeout     time.Duration // per server tool call, default 30 s
	Heartbeat       time.Duration // default 1 s
	StaleAfter      time.Duration // default 30 s
	SegmentFlush    time.Duration // default 500 ms
	ContextBytes    int           // model context budget, default 400 000
	MaxMessageBytes int           // largest accepted request message, default 2 MiB
}

func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.MaxSteps <= 0 {
		c.MaxSteps = 30
	}
	if c.MaxOutputTokens <= 0 {
		c.MaxOutputTokens = 8192
	}
	if c.ContextBytes <= 0 {
		c.ContextBytes = 400_000
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 2 << 20
	}
	def(&c.RunTimeout, 600*time.Second)
	def(&c.ToolTimeout, 30*time.Second)
	def(&c.Heartbeat, time.Second)
	def(&c.StaleAfter, 30*time.Second)
	def(&c.SegmentFlush, 500*time.Millisecond)
	return c
}

// Engine runs turns. It holds no per-thread state: everything lives in the store.
type Engine struct {
	store agent.Store
	model agent.Model
	tools map[string]agent.Tool
	specs []agent.ToolSpec
	clock agent.Clock
	ids   agent.IDs
	log   *slog.Logger
	cfg   Config
}

// Deps are the engine's ports.
type Deps struct {
	Store  agent.Store
	Model  agent.Model
	Tools  []agent.Tool
	Clock  agent.Clock
	IDs    agent.IDs
	Logger *slog.Logger
}

// New builds an engine.
func New(d Deps, cfg Config) *Engine {
	e := &Engine{store: d.Store, model: d.Model, clock: d.Clock, ids: d.IDs, log: d.Logger, cfg: cfg.withDefaults(),
		tools: map[string]agent.Tool{}}
	if e.clock == nil {
		e.clock = agent.SystemClock{}
	}
	if e.ids == nil {
		e.ids = agent.RandomIDs{Clock: e.clock}
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	for _, t := range d.Tools {
		e.tools[t.Name] = t
		e.specs = append(e.specs, t.Spec())
	}
	return e
}

// Config returns the effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// Wire triggers sent by the AI SDK's DefaultChatTransport.
const (
	WireSubmit     = "submit-message"
	WireRegenerate = "regenerate-message"
)

// Multitask strategies for a POST that finds a run active.
const (
	MultitaskReject    = "reject"
	MultitaskInterrupt = "interrupt"
	MultitaskEnqueue   = "enqueue"
)

// Request is one POST /chat, already authenticated and decoded.
type Request struct {
	Owner     string
	ThreadID  string
	Trigger   string         // WireSubmit or WireRegenerate
	MessageID string         // regenerate: the assistant message to replace (optional)
	Message   *agent.Message // the request's newest message; the rest of the client's history is ignored
	Multitask string
}

// Error codes the engine returns before a stream starts.
const (
	CodeInvalidTrigger   = "invalid_trigger"
	CodeInvalidMultitask = "invalid_multitask"
	CodeMissingMessage   = "missing_message"
	CodeInvalidMessage   = "invalid_message"
	CodeUserRequired     = "user_message_required"
	CodeMessageTooLarge  = "message_too_large"
	CodeDuplicateMessage = "duplicate_message"
	CodeNothingToRegen   = "nothing_to_regenerate"
	CodeUnsupported      = "unsupported_message"
)

// Validate checks a request without touching the store.
func Validate(req Request, maxMessageBytes int) error {
	if req.ThreadID == "" || len(req.ThreadID) > 200 || !utf8.ValidString(req.ThreadID) || strings.ContainsAny(req.ThreadID, "#/ \t\r\n") {
		return agent.E(agent.KindInvalid, "invalid_thread_id", "id must be 1-200 characters without '#', '/' or whitespace")
	}
	switch req.Multitask {
	case "", MultitaskReject, MultitaskInterrupt:
	case MultitaskEnqueue:
		return agent.E(agent.KindInvalid, CodeInvalidMultitask, "multitask %q is not supported yet; use reject or interrupt", req.Multitask)
	default:
		return agent.E(agent.KindInvalid, CodeInvalidMultitask, "multitask must be reject, interrupt or enqueue, got %q", req.Multitask)
	}
	switch req.Trigger {
	case WireSubmit:
		if req.Message == nil {
			return agent.E(agent.KindInvalid, CodeMissingMessage, "messages must hold at least one message")
		}
	case WireRegenerate:
	default:
		return agent.E(agent.KindInvalid, CodeInvalidTrigger, "trigger must be %q or %q, got %q", WireSubmit, WireRegenerate, req.Trigger)
	}
	if m := req.Message; m != nil {
		if m.ID == "" || len(m.ID) > 200 || strings.ContainsAny(m.ID, "#/") {
			return agent.E(agent.KindInvalid, CodeInvalidMessage, "message id must be 1-200 characters without '#' or '/'")
		}
		size := 0
		for _, p := range m.Parts {
			size += len(p)
		}
		size += len(m.Metadata)
		if size > maxMessageBytes {
			return agent.E(agent.KindTooLarge, CodeMessageTooLarge, "message is %d bytes, the limit is %d", size, maxMessageBytes)
		}
		for i, raw := range m.Parts {
			p, err := agent.DecodePart(raw)
			if err != nil || p.Type == "" {
				return agent.E(agent.KindInvalid, CodeInvalidMessage, "part %d must be an object with a type", i)
			}
		}
		if req.Trigger == WireSubmit {
			switch m.Role {
			case agent.RoleUser:
				if len(m.Parts) == 0 {
					return agent.E(agent.KindInvalid, CodeInvalidMessage, "a user message needs at least one part")
				}
			case agent.RoleAssistant:
				return agent.E(agent.KindInvalid, CodeUserRequired, "the newest message must be a user message (tool outputs and approval answers are not accepted yet)")
			default:
				return agent.E(agent.KindInvalid, CodeUserRequired, "the newest message must have role user, got %q", m.Role)
			}
		}
	}
	return nil
}

// Turn is a claimed run, ready to stream.
type Turn struct {
	e        *Engine
	run      agent.Run
	thread   agent.Thread
	owner    string
	history  []agent.MessageRecord // the transcript the run starts from (user message included)
	nextSeq  int64
	priorMsg *agent.MessageRecord // regenerate/continuation: the assistant message being continued (nil: new)
}

// Run returns the claimed run record.
func (t *Turn) Run() agent.Run { return t.run }

// Begin validates, creates the thread if absent, claims it and merges the request's newest message. Any error
// is returned before a byte is streamed; validation errors write nothing.
func (e *Engine) Begin(ctx context.Context, req Request) (*Turn, error) {
	if err := Validate(req, e.cfg.MaxMessageBytes); err != nil {
		return nil, err
	}
	now := e.clock.Now()
	th, err := e.store.GetThread(ctx, req.ThreadID)
	switch {
	case agent.IsKind(err, agent.KindNotFound):
		if req.Trigger == WireRegenerate {
			return nil, agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", req.ThreadID)
		}
		th, _, err = e.store.CreateThread(ctx, agent.Thread{ID: req.ThreadID, Owner: req.Owner, Title: titleOf(req.Message), CreatedAt: now, UpdatedAt: now})
		if err != nil {
			return nil, fmt.Errorf("create thread: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("get thread: %w", err)
	}
	if th.Owner != req.Owner {
		// Another user's thread does not exist for this caller.
		return nil, agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", req.ThreadID)
	}
	history, err := e.store.ListMessages(ctx, th.ID)
	if err != nil {
		return nil, fmt.Errorf("list messages: %w", err)
	}
	var trigger agent.Trigger
	var regenDrop string
	switch req.Trigger {
	case WireSubmit:
		trigger = agent.TriggerUser
		for i, r := range history {
			if r.Message.ID == req.Message.ID && i != len(history)-1 {
				return nil, agent.E(agent.KindConflict, CodeDuplicateMessage, "message %q was already answered", req.Message.ID)
			}
			if r.Message.ID == req.Message.ID && r.Message.Role != agent.RoleUser {
				return nil, agent.E(agent.KindConflict, CodeDuplicateMessage, "message id %q names an existing %s message", req.Message.ID, r.Message.Role)
			}
		}
	case WireRegenerate:
		trigger = agent.TriggerRegenerate
		last := len(history) - 1
		if last < 0 {
			return nil, agent.E(agent.KindInvalid, CodeNothingToRegen, "the thread has no messages")
		}
		if history[last].Message.Role == agent.RoleAssistant {
			if req.MessageID != "" && req.MessageID != history[last].Message.ID {
				return nil, agent.E(agent.KindInvalid, CodeNothingToRegen, "only the newest assistant message can be regenerated")
			}
			regenDrop = history[last].Message.ID
		} else if req.MessageID != "" {
			return nil, agent.E(agent.KindInvalid, CodeNothingToRegen, "message %q is not the newest assistant message", req.MessageID)
		}
	}

	runID := e.ids.New("run")
	claim, err := e.claim(ctx, th.ID, runID, trigger, req.Multitask)
	if err != nil {
		return nil, err
	}
	t := &Turn{e: e, run: claim.Run, thread: th, owner: req.Owner}
	// From here on the claim is ours: any failure must release it.
	fail := func(err error) (*Turn, error) {
		t.run.Status = agent.RunFailed
		t.run.Error = &agent.RunError{Code: agent.CodeInternal, Message: err.Error()}
		t.run.FinishedAt = e.clock.Now()
		if ferr := e.store.FinishRun(context.WithoutCancel(ctx), t.run); ferr != nil {
			e.log.Error("release claim after failed begin", "thread_id", th.ID, "run_id", runID, "err", ferr)
		}
		return nil, err
	}
	if claim.Previous != nil {
		if err := e.ReapRun(ctx, th.ID, claim.Previous.RunID, claim.Previous.Epoch); err != nil {
			e.log.Warn("reap previous run", "thread_id", th.ID, "run_id", claim.Previous.RunID, "err", err)
		}
		if history, err = e.store.ListMessages(ctx, th.ID); err != nil {
			return fail(fmt.Errorf("list messages: %w", err))
		}
	}
	if regenDrop != "" {
		if err := e.store.DeleteMessage(ctx, th.ID, regenDrop); err != nil {
			return fail(fmt.Errorf("delete regenerated message: %w", err))
		}
		history = history[:len(history)-1]
	}
	var next int64
	if n := len(history); n > 0 {
		next = history[n-1].Seq + 1
	}
	if req.Trigger == WireSubmit {
		n := len(history)
		if n == 0 || history[n-1].Message.ID != req.Message.ID {
			now := e.clock.Now()
			msg := sanitizeUser(*req.Message)
			if err := e.store.PutMessage(ctx, th.ID, next, msg, now); err != nil {
				return fail(fmt.Errorf("store user message: %w", err))
			}
			history = append(history, agent.MessageRecord{ThreadID: th.ID, Seq: next, Message: msg, CreatedAt: now, UpdatedAt: now})
			next++
		}
	}
	t.history = history
	t.nextSeq = next
	e.log.Info("run claimed", "thread_id", th.ID, "run_id", runID, "epoch", t.run.Epoch, "trigger", trigger)
	return t, nil
}

// claim takes the thread's run claim according to the multitask strategy.
func (e *Engine) claim(ctx context.Context, threadID, runID string, trigger agent.Trigger, multitask string) (agent.ClaimResult, error) {
	req := agent.ClaimRequest{ThreadID: threadID, RunID: runID, Trigger: trigger,
		AssistantMessageID: "msg_" + strings.TrimPrefix(runID, "run_"), StaleAfter: e.cfg.StaleAfter}
	req.Now = e.clock.Now()
	res, err := e.store.ClaimRun(ctx, req)
	if err == nil || multitask != MultitaskInterrupt || agent.CodeOf(err) != agent.CodeRunActive {
		return res, err
	}
	// interrupt: cancel the active run, then wait until it releases the claim (it stops within a heartbeat).
	if _, cerr := e.store.RequestCancel(ctx, threadID, e.clock.Now()); cerr != nil && agent.CodeOf(cerr) != agent.CodeNoActiveRun {
		return res, cerr
	}
	deadline := time.Now().Add(3*e.cfg.Heartbeat + 2*time.Second)
	for {
		req.Now = e.clock.Now()
		res, err = e.store.ClaimRun(ctx, req)
		if err == nil || agent.CodeOf(err) != agent.CodeRunActive {
			return res, err
		}
		if time.Now().After(deadline) {
			return res, agent.Wrap(err, agent.KindConflict, agent.CodeRunActive, "the active run did not stop in time")
		}
		select {
		case <-ctx.Done():
			return res, agent.Wrap(ctx.Err(), agent.KindCanceled, "canceled", "request canceled")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func titleOf(m *agent.Message) string {
	if m == nil {
		return ""
	}
	s := strings.Join(strings.Fields(m.Text()), " ")
	if utf8.RuneCountInString(s) > 80 {
		r := []rune(s)
		s = string(r[:80]) + "…"
	}
	return s
}

// sanitizeUser keeps only what a client may author on a user message: id, role, parts. Metadata is dropped
// because the server authors it.
func sanitizeUser(m agent.Message) agent.Message {
	parts := make([]json.RawMessage, len(m.Parts))
	copy(parts, m.Parts)
	return agent.Message{ID: m.ID, Role: agent.RoleUser, Parts: parts}
}
