package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

var (
	errCanceled   = errors.New("run canceled")
	errRunTimeout = errors.New("run wall clock exceeded")
	errFenced     = errors.New("run fenced")
)

// Stream runs the claimed turn to its end, writing the UI message stream to client (which may be io.Discard)
// and to the run's stream segments. It never returns an error: failures are reported in-band and recorded on
// the run. A client that goes away does not stop the run; ctx's cancellation is ignored for that reason, and the
// run is bounded by its own wall clock instead.
func (t *Turn) Stream(ctx context.Context, client io.Writer) agent.Run {
	e := t.e
	ctx = context.WithoutCancel(ctx)
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	runCtx, cancelTimeout := context.WithTimeoutCause(runCtx, e.cfg.RunTimeout, errRunTimeout)
	defer cancelTimeout()

	out := newOutput(ctx, e, t.run, client)
	log := e.log.With("thread_id", t.thread.ID, "run_id", t.run.ID)

	hbDone := make(chan struct{})
	var hbWG sync.WaitGroup
	hbWG.Add(1)
	go func() {
		defer hbWG.Done()
		t.heartbeat(runCtx, cancelRun, hbDone)
	}()
	stopHeartbeat := func() { close(hbDone); hbWG.Wait() }

	s := &state{turn: t, out: out, log: log}
	s.msg = agent.Message{ID: t.run.AssistantMessageID, Role: agent.RoleAssistant}
	s.seq = t.nextSeq
	out.send(uistream.Start{MessageID: s.msg.ID, Metadata: metadataJSON(map[string]any{"runId": t.run.ID})})

	status, runErr := s.loop(runCtx)
	stopHeartbeat()
	cause := context.Cause(runCtx)
	switch {
	case errors.Is(cause, errFenced):
		// Someone else owns the thread now (reaped or taken over): write nothing more to the store.
		log.Warn("run fenced; stopping without writes")
		out.send(uistream.Error{ErrorText: "This run was taken over and stopped."})
		out.send(uistream.Finish{FinishReason: agent.FinishError})
		out.close()
		t.run.Status = agent.RunFailed
		t.run.Error = &agent.RunError{Code: agent.CodeRunFenced, Message: "the run lost its claim"}
		return t.run
	case errors.Is(cause, errCanceled):
		status, runErr = agent.RunCanceled, nil
	case errors.Is(cause, errRunTimeout):
		status, runErr = agent.RunFailed, &agent.RunError{Code: agent.CodeRunTimeout, Message: fmt.Sprintf("the run exceeded %s", e.cfg.RunTimeout)}
	}
	return s.finish(ctx, status, runErr)
}

// heartbeat refreshes the claim until done; a fenced or canceled claim cancels the run with the matching cause.
func (t *Turn) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, done <-chan struct{}) {
	tick := time.NewTicker(t.e.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := t.e.store.Heartbeat(ctx, t.thread.ID, t.run.ID, t.run.Epoch, t.e.clock.Now())
		switch {
		case err == nil:
		case agent.CodeOf(err) == agent.CodeRunCanceled:
			cancel(errCanceled)
			return
		case agent.CodeOf(err) == agent.CodeRunFenced:
			cancel(errFenced)
			return
		default:
			// A transient store error: keep going; staleAfter is many heartbeats long.
			t.e.log.Warn("heartbeat failed", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", err)
		}
	}
}

type state struct {
	turn  *Turn
	out   *output
	log   *slog.Logger
	msg   agent.Message
	seq   int64
	usage agent.Usage
	steps int
	model string
	// finishReason of the last model step.
	finishReason agent.FinishReason
}

// loop runs the steps. It returns the run's outcome; a canceled runCtx is resolved by the caller.
func (s *state) loop(ctx context.Context) (agent.RunStatus, *agent.RunError) {
	t, e := s.turn, s.turn.e
	for step := 0; ; step++ {
		if ctx.Err() != nil {
			return agent.RunFailed, nil
		}
		if step >= e.cfg.MaxSteps {
			return agent.RunFailed, &agent.RunError{Code: agent.CodeStepLimit, Message: fmt.Sprintf("stopped after %d steps", e.cfg.MaxSteps)}
		}
		s.steps++
		begin := e.clock.Now()
		s.out.send(uistream.StartStep{})
		s.msg.Parts = append(s.msg.Parts, agent.EncodePart(agent.Part{Type: "step-start"}))
		res, err := s.modelStep(ctx, step)
		s.usage = s.usage.Add(res.Usage)
		if res.Model != "" {
			s.model = res.Model
		}
		if err != nil {
			if ctx.Err() != nil {
				return agent.RunFailed, nil
			}
			s.out.send(uistream.FinishStep{})
			return agent.RunFailed, &agent.RunError{Code: agent.CodeOf(err), Message: err.Error()}
		}
		s.finishReason = res.FinishReason
		pending := s.runTools(ctx, t, res.ToolCalls)
		s.out.send(uistream.FinishStep{})
		last := pending > 0 || len(res.ToolCalls) == 0
		if !last {
			// The final step skips these: finish upserts the message and writes the final segment right away.
			s.persistDraft(ctx)
			s.out.flush()
		}
		s.log.Info("step", "step", step, "tool_calls", len(res.ToolCalls),
			"finish_reason", res.FinishReason, "input_tokens", res.Usage.InputTokens, "output_tokens", res.Usage.OutputTokens,
			"ms", e.clock.Now().Sub(begin).Milliseconds())
		if pending > 0 {
			return agent.RunInterrupted, nil
		}
		if len(res.ToolCalls) == 0 {
			return agent.RunCompleted, nil
		}
	}
}

// modelStep calls the model once, forwarding deltas as they arrive and recording the step's text, reasoning and
// tool-call parts on the draft message.
func (s *state) modelStep(ctx context.Context, step int) (agent.ModelResult, error) {
	t, e := s.turn, s.turn.e
	req := agent.ModelRequest{
		Model:           e.cfg.Model,
		System:          e.cfg.System,
		Messages:        buildTranscript(t.history, &s.msg, e.cfg.ContextBytes),
		Tools:           e.specs,
		MaxOutputTokens: e.cfg.MaxOutputTokens,
	}
	textID := fmt.Sprintf("%s-t%d", s.msg.ID, step)
	reasonID := fmt.Sprintf("%s-r%d", s.msg.ID, step)
	var textOpen, reasonOpen bool
	var text, reasoning string
	callIDs := map[int]string{}
	res, err := e.model.Stream(ctx, req, func(ev agent.ModelEvent) error {
		switch ev.Type {
		case agent.EventTextDelta:
			if !textOpen {
				textOpen = true
				s.out.send(uistream.TextStart{ID: textID})
			}
			text += ev.Delta
			s.out.send(uistream.TextDelta{ID: textID, Delta: ev.Delta})
		case agent.EventReasoningDelta:
			if !reasonOpen {
				reasonOpen = true
				s.out.send(uistream.ReasoningStart{ID: reasonID})
			}
			reasoning += ev.Delta
			s.out.send(uistream.ReasoningDelta{ID: reasonID, Delta: ev.Delta})
		case agent.EventToolCallStart:
			callIDs[ev.ToolIndex] = ev.ToolCallID
			s.out.send(uistream.ToolInputStart{ToolCallID: ev.ToolCallID, ToolName: ev.ToolName})
		case agent.EventToolCallDelta:
			if id, ok := callIDs[ev.ToolIndex]; ok && ev.Delta != "" {
				s.out.send(uistream.ToolInputDelta{ToolCallID: id, InputTextDelta: ev.Delta})
			}
		}
		return nil
	})
	if reasonOpen {
		s.out.send(uistream.ReasoningEnd{ID: reasonID})
		s.msg.Parts = append(s.msg.Parts, agent.EncodePart(agent.Part{Type: "reasoning", Text: reasoning, State: "done"}))
	}
	if textOpen {
		s.out.send(uistream.TextEnd{ID: textID})
		s.msg.Parts = append(s.msg.Parts, agent.EncodePart(agent.Part{Type: "text", Text: text, State: "done"}))
	}
	return res, err
}

// toolResult is one finished tool execution.
type toolResult struct {
	idx    int
	output json.RawMessage
	err    error
}

// runTools records the step's tool calls on the draft, runs server tools concurrently (each under the tool
// timeout) and returns how many calls wait for a human or the client.
func (s *state) runTools(ctx context.Context, t *Turn, calls []agent.ToolCall) (pending int) {
	e := t.e
	if len(calls) == 0 {
		return 0
	}
	partIdx := make([]int, len(calls))
	results := make(chan toolResult, len(calls))
	var wg sync.WaitGroup
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
		part := agent.Part{Type: "tool-" + c.Name, ToolCallID: c.ID, State: agent.StateInputAvailable, Input: input}
		s.msg.Parts = append(s.msg.Parts, agent.EncodePart(part))
		partIdx[i] = len(s.msg.Parts) - 1
		tool, known := e.tools[c.Name]
		switch {
		case !known:
			results <- toolResult{idx: i, err: fmt.Errorf("unknown tool %q", c.Name)}
		case !validInput:
			results <- toolResult{idx: i, err: fmt.Errorf("tool input is not valid JSON")}
		case tool.Kind == agent.ToolClient || s.needsApproval(tool, input):
			// Waits for the client (tool output) or a human (approval); the run ends interrupted.
			pending++
		case tool.Execute == nil:
			results <- toolResult{idx: i, err: fmt.Errorf("tool %q cannot run on the server", c.Name)}
		default:
			wg.Add(1)
			go func(i int, c agent.ToolCall, input json.RawMessage) {
				defer wg.Done()
				tctx, cancel := context.WithTimeout(ctx, e.cfg.ToolTimeout)
				defer cancel()
				begin := time.Now()
				out, err := tool.Execute(tctx, agent.ToolInvocation{ThreadID: t.thread.ID, Owner: t.owner, RunID: t.run.ID, ToolCallID: c.ID, Input: input})
				if err == nil && tctx.Err() != nil {
					err = tctx.Err()
				}
				if errors.Is(err, context.DeadlineExceeded) {
					err = fmt.Errorf("tool %q timed out after %s", c.Name, e.cfg.ToolTimeout)
				}
				if err == nil && !json.Valid(out) {
					err = fmt.Errorf("tool %q returned invalid JSON", c.Name)
				}
				e.log.Info("tool", "thread_id", t.thread.ID, "run_id", t.run.ID, "tool", c.Name, "tool_call_id", c.ID,
					"ok", err == nil, "ms", time.Since(begin).Milliseconds())
				results <- toolResult{idx: i, output: out, err: err}
			}(i, c, input)
		}
	}
	go func() { wg.Wait(); close(results) }()
	for r := range results {
		c := calls[r.idx]
		part, _ := agent.DecodePart(s.msg.Parts[partIdx[r.idx]])
		if r.err != nil {
			part.State, part.ErrorText = agent.StateOutputError, r.err.Error()
			s.out.send(uistream.ToolOutputError{ToolCallID: c.ID, ErrorText: part.ErrorText})
		} else {
			part.State, part.Output = agent.StateOutputAvailable, r.output
			s.out.send(uistream.ToolOutputAvailable{ToolCallID: c.ID, Output: r.output})
		}
		s.msg.Parts[partIdx[r.idx]] = agent.EncodePart(part)
	}
	return pending
}

func (s *state) needsApproval(tool agent.Tool, input json.RawMessage) bool {
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

// persistDraft upserts the assistant message as it stands (one write per step).
func (s *state) persistDraft(ctx context.Context) {
	s.msg.Metadata = s.metadata(agent.MessageStreaming)
	if err := s.turn.e.store.PutMessage(ctx, s.turn.thread.ID, s.seq, s.msg, s.turn.e.clock.Now()); err != nil {
		s.turn.e.log.Warn("persist draft", "thread_id", s.turn.thread.ID, "run_id", s.turn.run.ID, "err", err)
	}
}

func (s *state) metadata(st agent.MessageStatus) json.RawMessage {
	u := s.usage
	return metadataJSON(agent.MessageMetadata{Status: st, RunID: s.turn.run.ID, Model: s.model, Usage: &u})
}

// finish persists the final message and the run outcome, releases the claim and ends the stream.
func (s *state) finish(ctx context.Context, status agent.RunStatus, runErr *agent.RunError) agent.Run {
	t, e := s.turn, s.turn.e
	msgStatus := map[agent.RunStatus]agent.MessageStatus{
		agent.RunCompleted: agent.MessageCompleted, agent.RunInterrupted: agent.MessageInterrupted,
		agent.RunCanceled: agent.MessageCanceled, agent.RunFailed: agent.MessageFailed,
	}[status]
	if status != agent.RunInterrupted {
		s.msg.Parts = synthesizeMissingResults(s.msg.Parts, string(status))
	}
	s.msg.Metadata = s.metadata(msgStatus)
	if err := e.store.PutMessage(ctx, t.thread.ID, s.seq, s.msg, e.clock.Now()); err != nil {
		s.log.Error("persist final message", "err", err)
	}
	t.run.Status, t.run.Error, t.run.Usage, t.run.Steps, t.run.Model = status, runErr, s.usage, s.steps, s.model
	t.run.FinishedAt = e.clock.Now()
	t.run.UpdatedAt = t.run.FinishedAt
	if err := e.store.FinishRun(ctx, t.run); err != nil {
		s.log.Error("finish run", "err", err)
	}
	if runErr != nil {
		s.out.send(uistream.Error{ErrorText: runErr.Message})
	}
	finishReason := string(s.finishReason)
	switch status {
	case agent.RunFailed:
		finishReason = string(agent.FinishError)
	case agent.RunCanceled:
		finishReason = string(agent.FinishOther)
	}
	if finishReason == "" {
		finishReason = string(agent.FinishOther)
	}
	u := s.usage
	s.out.send(uistream.Finish{FinishReason: agent.FinishReason(finishReason), Metadata: metadataJSON(agent.MessageMetadata{
		RunID: t.run.ID, Model: s.model, Status: msgStatus, Usage: &u})})
	s.out.close()
	s.log.Info("run finished", "status", status, "steps", s.steps,
		"input_tokens", u.InputTokens, "output_tokens", u.OutputTokens)
	return t.run
}
