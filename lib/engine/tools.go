package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

// pendingCall is a server tool call about to run.
type pendingCall struct {
	idx  int
	tool agent.Tool
	inv  agent.ToolInvocation
}

// toolResult is one finished (or abandoned) tool execution.
type toolResult struct {
	idx    int
	output json.RawMessage
	err    error
}

// runTools records the step's tool calls on the draft, runs server tools concurrently (each under the tool
// timeout, which holds even for a tool that ignores its context) and returns how many calls wait for a human or
// the client. No tool starts once the run's claim is in doubt.
func (s *stepper) runTools(ctx context.Context, calls []agent.ToolCall) (pending int) {
	t, e := s.turn, s.turn.e
	if len(calls) == 0 {
		return 0
	}
	partIdx := make([]int, len(calls))
	results := make(chan toolResult, len(calls))
	expect := 0 // results to collect
	var toRun []pendingCall
	for i, c := range calls {
		input := json.RawMessage(c.Arguments)
		if len(input) == 0 {
			input = json.RawMessage(`{}`)
		}
		validInput := json.Valid(input)
		if !validInput {
			// Keep the model's text so the transcript shows what it sent.
			input, _ = json.Marshal(c.Arguments)
		}
		s.out.send(uistream.ToolInputAvailable{ToolCallID: c.ID, ToolName: c.Name, Input: input})
		s.parts = append(s.parts, agent.Part{Type: "tool-" + c.Name, ToolCallID: c.ID, State: agent.StateInputAvailable, Input: input})
		partIdx[i] = len(s.parts) - 1
		tool, known := e.tools[c.Name]
		switch {
		case !known:
			expect++
			results <- toolResult{idx: i, err: fmt.Errorf("unknown tool %q", c.Name)}
		case !validInput:
			expect++
			results <- toolResult{idx: i, err: fmt.Errorf("tool input is not valid JSON")}
		case tool.Kind == agent.ToolClient || s.needsApproval(tool, input):
			// Waits for the client (tool output) or a human (approval); the run ends interrupted.
			pending++
		case tool.Execute == nil:
			expect++
			results <- toolResult{idx: i, err: fmt.Errorf("tool %q cannot run on the server", c.Name)}
		default:
			toRun = append(toRun, pendingCall{idx: i, tool: tool, inv: agent.ToolInvocation{ThreadID: t.thread.ID, Owner: t.owner,
				RunID: t.run.ID, ToolCallID: c.ID, Input: input, IdempotencyKey: agent.IdempotencyKey(t.thread.ID, c.ID)}})
		}
	}
	// Before any tool has an effect, everything that names its call is stored: the user message it answers, and
	// the stream segment that carries the call (so a crash after the effect is recovered with the outcome the
	// tool recorded, not lost: principle 9). A run that stopped, or whose claim is in doubt, starts no tool;
	// finish then marks those calls "not executed", which is true.
	if len(toRun) > 0 && (t.awaitUser() != nil || ctx.Err() != nil || !s.guard.writable()) {
		toRun = nil
	}
	if len(toRun) > 0 {
		s.out.flush()
	}
	for _, pc := range toRun {
		expect++
		go s.execute(ctx, pc.idx, pc.tool, pc.inv, results)
	}
	for range expect {
		r := <-results
		c := calls[r.idx]
		part := &s.parts[partIdx[r.idx]]
		if r.err != nil {
			part.State, part.ErrorText = agent.StateOutputError, r.err.Error()
			s.out.send(uistream.ToolOutputError{ToolCallID: c.ID, ErrorText: part.ErrorText})
		} else {
			part.State, part.Output = agent.StateOutputAvailable, r.output
			s.out.send(uistream.ToolOutputAvailable{ToolCallID: c.ID, Output: r.output})
		}
	}
	return pending
}

// execute runs one server tool and always delivers exactly one result: the tool's own, or a timeout when the tool
// does not return in time (the goroutine is then abandoned; a late result is dropped). A tool that returned its
// output keeps it, even if the run was stopped a moment later (REVIEW L15).
func (s *stepper) execute(ctx context.Context, idx int, tool agent.Tool, inv agent.ToolInvocation, results chan<- toolResult) {
	e := s.turn.e
	timeout := e.cfg.ToolTimeout
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	begin := time.Now()
	done := make(chan toolResult, 1)
	go func() {
		out, err := tool.Execute(tctx, inv)
		if err == nil && !json.Valid(out) {
			err = fmt.Errorf("tool %q returned invalid JSON", tool.Name)
		}
		done <- toolResult{idx: idx, output: out, err: err}
	}()
	// Wait for the tool's own answer until its deadline, even when the run is stopped meanwhile (the tool's
	// context is canceled then, and a tool that returned its output keeps it: REVIEW L15). Past the deadline the
	// tool is abandoned, even one that ignores its context (REVIEW L14); a late answer is dropped.
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var r toolResult
	select {
	case r = <-done:
		if errors.Is(r.err, context.DeadlineExceeded) {
			r.err = fmt.Errorf("tool %q timed out after %s", tool.Name, timeout)
		}
	case <-timer.C:
		r = toolResult{idx: idx, err: fmt.Errorf("tool %q timed out after %s; its outcome is unknown", tool.Name, timeout)}
	}
	outcome := "ok"
	if r.err != nil {
		outcome = "error"
	}
	s.log.Info("agent.tool", "tool", tool.Name, "tool_call_id", inv.ToolCallID, "outcome", outcome,
		"ms", time.Since(begin).Milliseconds())
	results <- r
}

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
