package engine

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

// toolCallAt is a tool call whose part is at index part of the draft.
type toolCallAt struct {
	part int
	call agent.ToolCall
}

// toolResult is one finished (or abandoned) tool execution.
type toolResult struct {
	idx    int
	output json.RawMessage
	err    error
}

// runTools records the step's tool calls on the draft, runs server tools and returns how many calls wait for a
// human (approval) or the client (client tools). Calls that cannot run get an error result the model reads.
func (s *stepper) runTools(ctx context.Context, calls []agent.ToolCall) (pending int) {
	e := s.turn.e
	var toRun []toolCallAt
	for k, c := range calls {
		tool, known := s.tools.byName[c.Name]
		// The one check before anything acts on the input (Deps.Inputs): repaired once when it is not JSON, then
		// validated against the tool's schema. A refused input is not executed; the model reads why.
		input, inputErr := e.checkInput(tool, known, c.Arguments)
		if input == nil {
			// Keep the model's text so the transcript shows what it sent.
			input, _ = json.Marshal(c.Arguments)
		}
		s.out.send(uistream.ToolInputAvailable{ToolCallID: c.ID, ToolName: c.Name, Input: input})
		s.parts = append(s.parts, agent.Part{Type: "tool-" + c.Name, ToolCallID: c.ID, State: agent.StateInputAvailable, Input: input})
		i := len(s.parts) - 1
		switch {
		case s.overStepCap(k):
			s.result(i, toolResult{err: e.tooManyCalls(c.Name)})
			s.logTool(c.Name, c.ID, toolOverLimit, 0)
		case !known:
			s.result(i, toolResult{err: agent.E(agent.KindInvalid, agent.CodeUnknownTool, "unknown tool %q", c.Name)})
			s.logTool(c.Name, c.ID, toolUnknown, 0)
		case inputErr != nil:
			s.result(i, toolResult{err: inputErr})
			s.logToolError(c.Name, c.ID, toolInvalidInput, 0, inputErr)
		case tool.Kind == agent.ToolClient || s.needsApproval(tool, input):
			// Waits for the client (tool output) or a human (approval); the run ends interrupted.
			if err := s.ask(tool, c, input, i); err != nil {
				s.result(i, toolResult{err: agent.E(agent.KindUnavailable, agent.CodeToolFailed, "tool %q could not ask for approval", c.Name)})
				s.logToolError(c.Name, c.ID, toolError, 0, err)
				continue
			}
			s.logTool(c.Name, c.ID, pick(tool.Kind == agent.ToolClient, toolClient, toolApproval), 0)
			pending++
		case tool.Execute == nil:
			s.result(i, toolResult{err: agent.E(agent.KindInvalid, agent.CodeToolFailed, "tool %q cannot run on the server", c.Name)})
			s.logTool(c.Name, c.ID, toolError, 0)
		case tool.Kind == agent.ToolJob && s.chainTooLong(ctx):
			s.result(i, toolResult{err: e.jobChainTooLong(c.Name)})
			s.logTool(c.Name, c.ID, toolOverLimit, 0)
		case tool.Kind == agent.ToolJob && !s.takeJob():
			s.result(i, toolResult{err: e.tooManyJobs(c.Name)})
			s.logTool(c.Name, c.ID, toolOverLimit, 0)
		default:
			toRun = append(toRun, toolCallAt{part: i, call: agent.ToolCall{ID: c.ID, Name: c.Name, Arguments: string(input)}})
		}
	}
	s.execute(ctx, toRun)
	return pending
}

// result puts one tool result on the draft's part i and streams it. An error shows only its safe text
// (toolErrorText); its chain is in the agent.tool line.
func (s *stepper) result(i int, r toolResult) {
	part := &s.parts[i]
	if r.err != nil {
		part.State, part.ErrorText = agent.StateOutputError, toolErrorText(r.err)
		s.out.send(uistream.ToolOutputError{ToolCallID: part.ToolCallID, ErrorText: part.ErrorText})
		return
	}
	part.State, part.Output = agent.StateOutputAvailable, r.output
	s.out.send(uistream.ToolOutputAvailable{ToolCallID: part.ToolCallID, Output: r.output})
}

// execute runs server tool calls concurrently, each under the tool timeout (which holds even for a tool that
// ignores its context), and puts their results on the draft. No tool starts once the run's claim is in doubt.
func (s *stepper) execute(ctx context.Context, calls []toolCallAt) {
	t := s.turn
	if len(calls) == 0 {
		return
	}
	// Before any tool has an effect, everything that names its call is stored: the user message it answers, and
	// the stream segment that carries the call (so a crash after the effect is recovered with the outcome the
	// tool recorded, not lost: principle 9). A run that stopped, or whose claim is in doubt, starts no tool;
	// finish then marks those calls "not executed", which is true.
	if t.awaitUser() != nil || ctx.Err() != nil || !s.guard.writable() {
		for _, c := range calls {
			s.logTool(c.call.Name, c.call.ID, toolNotExecuted, 0)
		}
		return
	}
	s.out.flush()
	results := make(chan toolResult, len(calls))
	progress := make(chan uistream.Chunk, progressBuffer)
	for k, c := range calls {
		tool := s.tools.byName[c.call.Name]
		msgID := t.run.AssistantMessageID
		inv := agent.ToolInvocation{ThreadID: t.thread.ID, Owner: t.owner, RunID: t.run.ID, Epoch: t.run.Epoch, ToolCallID: c.call.ID, MessageID: msgID,
			Input: json.RawMessage(c.call.Arguments), IdempotencyKey: agent.IdempotencyKey(t.thread.ID, msgID, c.call.ID), UserToken: t.userToken,
			Progress: progressTo(progress, c.call.ID), Preliminary: preliminaryTo(progress, c.call.ID)}
		go s.executeOne(k, tool, inv, s.toolDeadline(ctx), results)
	}
	// The stepper alone writes the stream: the tools' progress reports come to it while it waits for their results.
	// Before a result, every report already made goes out (a tool's reports precede its result in the stream).
	drain := func() {
		for {
			select {
			case d := <-progress:
				s.out.send(d)
			default:
				return
			}
		}
	}
	for pending := len(calls); pending > 0; {
		select {
		case r := <-results:
			drain()
			s.result(calls[r.idx].part, r)
			pending--
		case d := <-progress:
			s.out.send(d)
		}
	}
}

// Bounds of the tools' progress reports (agent.ToolInvocation.Progress, Preliminary).
const (
	progressBuffer       = 64 // reports waiting for the stream; more are dropped
	progressStageBytes   = 64
	progressMessageBytes = 1 << 10
	preliminaryBytes     = 64 << 10 // a bigger preliminary output is dropped
)

// progressTo is a tool call's Progress: a transient data-tool-progress chunk for the stream (never the draft,
// so never the transcript nor the model), dropped when the stream is behind.
func progressTo(ch chan<- uistream.Chunk, toolCallID string) func(stage, message string) {
	return func(stage, message string) {
		data, err := json.Marshal(map[string]string{"toolCallId": toolCallID, "stage": clipText(stage, progressStageBytes),
			"message": clipText(message, progressMessageBytes)})
		if err != nil {
			return
		}
		select {
		case ch <- uistream.Data{Type: "data-tool-progress", ID: toolCallID, Data: data, Transient: true}:
		default:
		}
	}
}

// preliminaryTo is a tool call's Preliminary: a preliminary tool-output-available for the stream (never the
// draft), dropped when the stream is behind or the output is not JSON or over the preliminary bound.
func preliminaryTo(ch chan<- uistream.Chunk, toolCallID string) func(output json.RawMessage) {
	return func(output json.RawMessage) {
		if len(output) > preliminaryBytes || !json.Valid(output) {
			return
		}
		select {
		case ch <- uistream.ToolOutputAvailable{ToolCallID: toolCallID, Output: append(json.RawMessage(nil), output...), Preliminary: true}:
		default:
		}
	}
}

// clipText is s, valid UTF-8, cut to at most n bytes on a rune boundary.
func clipText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// toolWait is what one tool call waits on: its context, canceled at the tool timeout, the timeout itself, and
// the claim's horizon as it was when the call started, all on the engine's timers (so a virtual clock moves
// them). They are set for every call of the step before any of the step's tools starts.
type toolWait struct {
	ctx     context.Context
	cancel  context.CancelFunc
	timeout <-chan time.Time
	horizon <-chan time.Time
}

func (s *stepper) toolDeadline(ctx context.Context) toolWait {
	e := s.turn.e
	tctx, cancel := e.timers.WithTimeoutCause(ctx, e.cfg.ToolTimeout, context.DeadlineExceeded)
	return toolWait{ctx: tctx, cancel: cancel, timeout: e.timers.After(e.cfg.ToolTimeout),
		horizon: e.timers.After(s.turn.horizon().Sub(e.clock.Now()))}
}

// executeOne runs one server tool and always delivers exactly one result: the tool's own, or a timeout when the tool
// does not return in time (the goroutine is then abandoned; a late result is dropped). A tool that returned its
// output keeps it, even if the run was stopped a moment later (REVIEW L15). The deadline is min(start+ToolTimeout,
// the claim's horizon) (REVIEW D5): the horizon moves on with every accepted heartbeat, so it is checked when it
// comes due, and once it has passed the guard cancels the run (and so the tool's context) and the tool is
// abandoned: a reaper may soon hand the thread on.
func (s *stepper) executeOne(idx int, tool agent.Tool, inv agent.ToolInvocation, tw toolWait, results chan<- toolResult) {
	e := s.turn.e
	timeout := e.cfg.ToolTimeout
	tctx, timer, horizon := tw.ctx, tw.timeout, tw.horizon
	defer tw.cancel()
	begin := time.Now()
	done := make(chan toolResult, 1)
	go func() {
		out, err := tool.Execute(tctx, inv)
		if err == nil && !json.Valid(out) {
			err = agent.E(agent.KindInvalid, agent.CodeToolFailed, "tool %q returned invalid JSON", tool.Name)
		}
		done <- toolResult{idx: idx, output: out, err: err}
	}()
	// Wait for the tool's own answer until its deadline, even when the run is stopped meanwhile (the tool's
	// context is canceled then, and a tool that returned its output keeps it: REVIEW L15). Past the deadline the
	// tool is abandoned, even one that ignores its context (REVIEW L14); a late answer is dropped.
	var r toolResult
	outcome := toolOK
wait:
	for {
		select {
		case r = <-done:
			if errors.Is(r.err, context.DeadlineExceeded) {
				r.err = agent.E(agent.KindUnavailable, agent.CodeToolTimeout, "tool %q timed out after %s", tool.Name, timeout)
				outcome = toolTimeout
			}
			break wait
		case <-timer:
			r = toolResult{idx: idx, err: agent.E(agent.KindUnavailable, agent.CodeToolTimeout, "tool %q timed out after %s; its outcome is unknown", tool.Name, timeout)}
			outcome = toolTimeout
			break wait
		case <-s.guard.gone:
			r = toolResult{idx: idx, err: agent.E(agent.KindUnavailable, agent.CodeToolTimeout, "tool %q was abandoned when its run's claim was lost or in doubt; its outcome is unknown", tool.Name)}
			outcome = toolTimeout
			break wait
		case <-horizon:
			if s.guard.check() == nil { // heartbeats moved the horizon on (a failed check closes gone)
				horizon = e.timers.After(max(s.turn.horizon().Sub(e.clock.Now()), time.Millisecond))
			}
		}
	}
	if r.err != nil && outcome == toolOK {
		outcome = toolError
	}
	s.logToolError(tool.Name, inv.ToolCallID, outcome, time.Since(begin), r.err)
	results <- r
}

// Tool outcomes as the agent.tool log line names them.
const (
	toolOK           = "ok"            // executed, returned its output
	toolError        = "error"         // executed (or could not be), returned an error the model reads
	toolTimeout      = "timeout"       // did not return within the tool timeout
	toolDenied       = "denied"        // a human denied the approval: not executed
	toolApproval     = "approval"      // waits for a human's approval (the run ends interrupted)
	toolClient       = "client"        // a client tool: the browser answers it
	toolUnknown      = "unknown_tool"  // the model named a tool that does not exist
	toolInvalidInput = "invalid_input" // the model's arguments are not JSON (after one repair) or not what the schema takes
	toolNotExecuted  = "not_executed"  // the run stopped (or its claim was in doubt) before the tool could start
	toolOverLimit    = "over_limit"    // past the step's tool calls or the run's jobs (limits.go): not executed
)

// logTool writes the agent.tool line of one tool call (the logger carries the run and thread ids).
func (s *stepper) logTool(name, callID, outcome string, took time.Duration) {
	s.logToolError(name, callID, outcome, took, nil)
}

// logToolError writes the agent.tool line of one tool call with its error's whole chain, which only the log
// sees (REVIEW S3).
func (s *stepper) logToolError(name, callID, outcome string, took time.Duration, err error) {
	attrs := []any{"tool", name, "tool_call_id", callID, "outcome", outcome, "duration_ms", took.Milliseconds()}
	if err != nil {
		attrs = append(attrs, "error_code", agent.CodeOf(err), "error", err.Error())
	}
	s.log.InfoContext(s.logCtx, "agent.tool", attrs...)
}

// toolErrorText is what a tool error shows the client, the model and the stored transcript (REVIEW S3):
// "code: message" from the tool's own *agent.Error when it is not internal (a tool meant to be read returns
// agent.E(agent.KindInvalid, …)), else a generic text with the code. Nothing else of the error (an AWS error
// with its ARNs and request ids, a store's error, the causes) leaves the agent.tool log line.
func toolErrorText(err error) string {
	if agent.KindOf(err) != agent.KindInternal {
		code, msg := agent.Public(err)
		return code + ": " + msg
	}
	return "the tool failed (" + agent.CodeOf(err) + ")"
}

// pick is a conditional expression.
func pick[T any](cond bool, yes, no T) T {
	if cond {
		return yes
	}
	return no
}

// needsApproval applies the tool's approval policy: a per-input decision, always, or (mutating tools) when the
// thread's reviewTools setting is on.
func (s *stepper) needsApproval(tool agent.Tool, input json.RawMessage) bool {
	if tool.NeedsApproval != nil && tool.NeedsApproval(input) {
		return true
	}
	switch tool.Approval {
	case agent.ApprovalAlways:
		return true
	case agent.ApprovalMutating:
		return s.turn.thread.Settings.ReviewTools
	}
	return false
}
