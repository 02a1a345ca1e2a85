package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
	"github.com/agentloop/agentloop/lib/uistream"
)

// Stream runs the claimed turn to its end, writing the UI message stream to client (which may be io.Discard)
// and to the run's stream segments. It never returns an error: failures are reported in-band and recorded on
// the run. A client that goes away does not stop the run; ctx's cancellation is ignored for that reason, and the
// run is bounded by its own wall clock instead.
func (t *Turn) Stream(ctx context.Context, client io.Writer) agent.Run {
	t.streaming = true
	defer t.signal(ctx) // once the stream's end reached the client (signal.go)
	if t.plan.answerOnly {
		return t.coalesce(ctx, client)
	}
	return t.stream(ctx, client)
}

// stream runs the turn (Stream without continuation coalescing).
func (t *Turn) stream(ctx context.Context, client io.Writer) agent.Run {
	e := t.e
	deadlineCtx := ctx
	ctx = agent.WithStoreMeter(context.WithoutCancel(ctx), t.meter)
	defer t.releaseSlot(ctx) // the run has ended, whatever happened to it (a hand-over keeps it: handover.go)
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	t.ho.arm(deadlineCtx, e) // before ctx loses its deadline below: the invocation's, which a hand-over comes before
	runCtx, cancelTimeout := e.timers.WithTimeoutCause(runCtx, t.runTimeLeft(), errRunTimeout)
	defer cancelTimeout()

	s := &stepper{turn: t, out: newOutput(ctx, e, t.run, client, t.ho.segment()), logCtx: ctx,
		log:   e.log.With("thread_id", t.thread.ID, "run_id", t.run.ID),
		parts: slices.Clone(t.plan.draft)} // a continuation goes on with the stored message's parts
	s.tools = e.turnTools(runCtx, s)
	tcfg := t.plan.transcriptConfig(e.cfg.Transcript)
	tcfg.FixedTokens += s.routedExtra(runCtx)
	tcfg.Scale = contextScale(t.plan.history)
	s.history = transcript.NewHistory(t.plan.history, tcfg)
	s.guard = startGuard(t, cancelRun) // the keeper's heartbeats go on after a stop (REVIEW D2)
	s.usage = s.deliveredUsage()       // the sub-agents' whose results this turn delivers (jobusage.go)
	s.resume()                         // a continuation goes on with the run's steps and usage (handover.go)
	s.out.turn = t
	t.outp.Store(s.out)
	start := map[string]any{"runId": t.run.ID}
	if n := t.plan.newMessages(); n > 0 {
		// The thread gained messages the client did not send (steers, queued messages) before this reply: it
		// re-syncs from GET /threads/{id} (README). Plain metadata: every supported AI SDK version accepts it.
		start["threadChanged"], start["newMessages"] = true, n
	}
	if t.ho.from == nil { // a continuation's stream goes on: its start went out before the hand-over
		s.out.send(uistream.Start{MessageID: t.run.AssistantMessageID, Metadata: metadataJSON(start)})
	}
	if t.plan.noop {
		s.guard.stop()
		return s.report(s.finishNoop(ctx))
	}

	answered := s.applyAnswers(runCtx)
	status, runErr := agent.RunCompleted, (*agent.RunError)(nil)
	if !answered {
		// No approved tool ran; finish marks those calls "not executed", which is true.
		status, runErr = agent.RunFailed, &agent.RunError{Code: agent.CodePersistFailed, Message: "Your answer could not be saved, so the tool did not run."}
	} else if t.plan.answerOnly {
		// Coalescing: the message ends with its answers; the chained delivery pass answers them with the steers.
		if runCtx.Err() != nil || t.awaitUser() != nil {
			status = agent.RunFailed
		}
	} else {
		status, runErr = s.loop(runCtx)
	}
	s.guard.stop()
	if s.handedOver {
		return s.endHandedOver()
	}
	switch cause := context.Cause(runCtx); {
	case errors.Is(cause, errFenced), errors.Is(cause, errInDoubt):
		return s.report(s.abandon(ctx, cause))
	case errors.Is(cause, errCanceled):
		status, runErr = agent.RunCanceled, nil
	case errors.Is(cause, errRunTimeout):
		status, runErr = agent.RunFailed, &agent.RunError{Code: agent.CodeRunTimeout, Message: fmt.Sprintf("The run exceeded its time limit of %s.", e.cfg.RunTimeout)}
	}
	run := s.finish(ctx, status, runErr)
	t.pump(ctx)
	run = s.report(run)
	s.title(run)
	return run
}

// title hands the thread's first reply to the titler (Deps.Titles), after everything else the run does: a reply
// stored completed with the run's outcome (the claim was the run's to the end), answering a history with no
// earlier reply, in a thread whose title was still the provisional one (its first message's: titleOf) when the
// run claimed it; a regenerated or edited first reply of a thread titled since asks nothing. The titler's
// conditional write decides the rest: it replaces the thread's title only if it still is that one and nobody
// chose or generated one meanwhile.
func (s *stepper) title(run agent.Run) {
	t, e := s.turn, s.turn.e
	if e.titles == nil || run.Status != agent.RunCompleted || !s.out.released.Load() {
		return
	}
	var first *agent.Message
	for i, m := range t.plan.history {
		if m.Role == agent.RoleAssistant {
			return
		}
		if m.Role == agent.RoleUser && first == nil {
			first = &t.plan.history[i]
		}
	}
	if first == nil || t.thread.Title != titleOf(first) {
		return
	}
	user := first.Text()
	reply := s.message(agent.MessageCompleted).Text()
	if strings.TrimSpace(user) == "" && strings.TrimSpace(reply) == "" {
		return
	}
	// Not the run's store usage (its meter), and not canceled with the request.
	ctx := agent.WithStoreMeter(context.WithoutCancel(s.logCtx), nil)
	e.titles.FirstReply(ctx, agent.FirstReply{ThreadID: t.thread.ID, RunID: run.ID, Title: t.thread.Title,
		CreatedAt: t.thread.CreatedAt, User: user, Reply: reply})
}

// stepper is one run's loop state: the draft assistant message as typed parts (encoded once per write), the
// usage so far, and where the stream goes.
type stepper struct {
	turn  *Turn
	out   *output
	guard *guard
	// tools are what this turn offers (toolset.go): the Go tools and the sources' tools listed at its start.
	tools *toolset
	// query is what the router reads of the turn's history (toolset.go offer), once it asked.
	query *agent.ToolQuery
	log   *slog.Logger
	// logCtx is the request's context (never canceled), for the agent.* lines: a handler such as Lambda's
	// (lambdacontext) adds the request id from it (REVIEW S23).
	logCtx  context.Context
	history *transcript.History
	parts   []agent.Part
	usage   agent.Usage
	steps   int
	model   string
	// finishReason of the last model step.
	finishReason agent.FinishReason
	// waiting holds the interrupts the run asks for, stored before it ends interrupted.
	waiting waiting
	// unpriced is set once a step's model was missing from a non-empty price table (logged once per run).
	unpriced bool
	// failure is the error of a failed reply the run stores: the reply and its stream end with the part that
	// shows it (agent.RunErrorPart, as the reaper's replies do) and carry it in their metadata (issue 16 item 11).
	failure *agent.RunError
	// late is what the run recorded as spent after it lost its claim (RecordLateUsage), nil when nothing.
	late *agent.Usage
	// handedOver: the run stopped at a step boundary and a continuation goes on with it (handover.go).
	handedOver bool
	// handing is the continuation a hand-over is storing the reply for (MessageMetadata.HandedOver).
	handing *agent.Continuation
	// jobs counts the job tool calls the run executed (limits.go: MaxJobsPerRun); chain, once known, is how many
	// server-side turns in a row this one ends (limits.go: MaxJobChain).
	jobs  int
	chain *int
}

// loop runs the steps. It returns the run's outcome; a canceled runCtx is resolved by the caller.
func (s *stepper) loop(ctx context.Context) (agent.RunStatus, *agent.RunError) {
	e := s.turn.e
	for step := s.steps; ; step++ { // a continuation goes on counting (part ids, the step cap)
		if ctx.Err() != nil {
			return agent.RunFailed, nil
		}
		if t := s.turn; t.userDone && t.userErr != nil {
			// The user message was never stored: the tools were not run, and the model must not be asked
			// again as if they had answered; finish reports it.
			return agent.RunFailed, nil
		}
		if s.handOverDue() && s.handOver(ctx) { // a step boundary: a fresh invocation goes on (handover.go)
			return agent.RunRunning, nil
		}
		if step >= e.cfg.MaxSteps {
			return agent.RunFailed, &agent.RunError{Code: agent.CodeStepLimit, Message: fmt.Sprintf("The run stopped after %d steps.", e.cfg.MaxSteps)}
		}
		s.steps++
		begin := time.Now()
		s.out.send(uistream.StartStep{})
		s.parts = append(s.parts, agent.Part{Type: "step-start"})
		res, calls, err := s.modelStep(ctx, step)
		if res.Model != "" {
			s.model = res.Model
		}
		used := s.price(cmp.Or(res.Model, s.model, e.cfg.Model), res.Usage)
		s.usage = s.usage.Add(used)
		s.logStep(step, res, used, len(calls), time.Since(begin), err)
		if err != nil {
			s.out.send(uistream.FinishStep{})
			if ctx.Err() != nil {
				return agent.RunFailed, nil
			}
			s.log.Warn("model step failed", "step", step, "err", err)
			code, msg := agent.Public(err)
			if code == agent.CodeInternal {
				code, msg = agent.CodeModelError, "The model request failed."
			}
			return agent.RunFailed, &agent.RunError{Code: code, Message: msg}
		}
		s.finishReason = res.FinishReason
		pending := s.runTools(ctx, calls)
		s.out.send(uistream.FinishStep{})
		last := pending > 0 || len(calls) == 0
		if !last {
			// The final step skips these: finish writes the message and the final segment right away.
			s.persistDraft(ctx)
			s.out.flush()
		}
		if pending > 0 {
			if err := s.storeInterrupts(ctx); err != nil {
				s.log.Error("store interrupts", "err", err)
				return agent.RunFailed, &agent.RunError{Code: agent.CodePersistFailed, Message: "The request for approval could not be saved."}
			}
			return agent.RunInterrupted, nil
		}
		if len(calls) == 0 {
			return agent.RunCompleted, nil
		}
	}
}

// modelStep calls the model once, forwarding events as they arrive and assembling the step's text, reasoning
// and tool-call parts (the engine is the only assembler: DESIGN "Models and tools").
func (s *stepper) modelStep(ctx context.Context, step int) (agent.ModelResult, []agent.ToolCall, error) {
	t, e := s.turn, s.turn.e
	req := agent.ModelRequest{
		Model:           e.cfg.Model,
		System:          s.tools.system(e.cfg.System),
		Messages:        s.history.Build(s.parts),
		Tools:           s.offer(ctx, step),
		MaxOutputTokens: e.cfg.MaxOutputTokens,
		CacheKey:        t.run.ThreadID, // one prompt cache per thread: its requests share their prefix
	}
	if r := s.history.Last(); r.ReasoningDropped+r.PairsStubbed+r.FilesStubbed+r.MessagesDropped > 0 || r.Over {
		// Only when a tier beyond 0 ran: what the model did not see explains what it did.
		s.log.InfoContext(s.logCtx, "agent.prune", "step", step, "estimated_tokens", r.EstimatedTokens, "budget_tokens", r.BudgetTokens,
			"over", r.Over, "blocks", r.Blocks, "drop_blocks", r.DropBlocks, "superseded", r.Superseded, "reasoning_dropped", r.ReasoningDropped,
			"pairs_stubbed", r.PairsStubbed, "files_stubbed", r.FilesStubbed, "messages_dropped", r.MessagesDropped)
	}
	if r := s.history.Last(); r.Over {
		return agent.ModelResult{}, nil, contextExhausted(r) // never a request the provider refuses (REVIEW S1)
	}
	// Part ids include the run id: a later run that continues this message restarts at step 0.
	textID := fmt.Sprintf("%s-t%d", t.run.ID, step)
	reasonID := fmt.Sprintf("%s-r%d", t.run.ID, step)
	var text, reasoning strings.Builder
	var textOpen, reasonOpen bool
	// One delta chunk per step, refilled per event and handed to the encoder by pointer: a chunk value made
	// an interface escaped to the heap once per streamed word (the encoder keeps no chunk past the call).
	textDelta, reasonDelta := &uistream.TextDelta{ID: textID}, &uistream.ReasoningDelta{ID: reasonID}
	var calls []agent.ToolCall
	began := false // an event arrived: the reply began, and a failure now interrupts it
	// Each event's frames reach the client with the event's last one, or with the next event's when the adapter
	// has it at hand already (More): words that arrived together go out in one write (issue 18).
	res, err := e.model.Stream(ctx, req, func(ev agent.ModelEvent) error {
		began = true
		switch ev.Type {
		case agent.EventTextDelta:
			if !textOpen {
				textOpen = true
				s.out.sendMore(uistream.TextStart{ID: textID})
			}
			text.WriteString(ev.Delta)
			textDelta.Delta = ev.Delta
			s.out.sendMore(textDelta)
		case agent.EventReasoningDelta:
			if !reasonOpen {
				reasonOpen = true
				s.out.sendMore(uistream.ReasoningStart{ID: reasonID})
			}
			reasoning.WriteString(ev.Delta)
			reasonDelta.Delta = ev.Delta
			s.out.sendMore(reasonDelta)
		case agent.EventToolCallStart:
			s.out.sendMore(uistream.ToolInputStart{ToolCallID: ev.ToolCallID, ToolName: ev.ToolName})
		case agent.EventToolCallDelta:
			if ev.Delta != "" {
				s.out.sendMore(uistream.ToolInputDelta{ToolCallID: ev.ToolCallID, InputTextDelta: ev.Delta})
			}
		case agent.EventToolCall:
			calls = append(calls, agent.ToolCall{ID: ev.ToolCallID, Name: ev.ToolName, Arguments: ev.Arguments})
		}
		if !ev.More {
			s.out.flushClient()
		}
		return nil
	})
	if err == nil {
		s.history.Reported(int(res.Usage.InputTokens)) // the provider's count beats the chars/4 estimate
		s.history.Downloaded(res.FileBytes)            // PDFs by URL count by their size from now on
	}
	if reasonOpen {
		s.out.send(uistream.ReasoningEnd{ID: reasonID})
	}
	if reasonOpen || (err == nil && len(res.ReasoningData) > 0) {
		// The provider's own state of the reasoning (signatures, encrypted items) stays with the part, in
		// providerMetadata, for the next request (lib/transcript gives it back); the stream never carries it.
		// A step whose reasoning was all redacted has a part with no text, for its data.
		p := agent.Part{Type: "reasoning", Text: reasoning.String(), State: "done"}
		if err == nil && len(res.ReasoningData) > 0 {
			p.ProviderMetadata = agent.WithReasoningData(res.ReasoningData)
		}
		s.parts = append(s.parts, p)
	}
	if textOpen {
		s.out.send(uistream.TextEnd{ID: textID})
		s.parts = append(s.parts, agent.Part{Type: "text", Text: text.String(), State: "done"})
	}
	if err != nil {
		calls = nil // a failed step's calls never run (they get no part either)
		err = interrupted(ctx, err, began)
	}
	return res, calls, err
}

// interrupted gives a model failure after the reply began (the stream cut, the provider failed mid-reply) the
// code agent.CodeModelInterrupted: the parts streamed so far are kept (the failed reply shows them), and the
// client may regenerate. Before the first event the adapters retried and lib/modelset failed over already, so
// an error there keeps its own code; so do a cancellation and an error that is not the provider's outage.
func interrupted(ctx context.Context, err error, began bool) error {
	if !began || ctx.Err() != nil || !agent.IsKind(err, agent.KindUnavailable) {
		return err
	}
	return agent.Wrap(err, agent.KindUnavailable, agent.CodeModelInterrupted,
		"The model's reply was interrupted. Regenerate it to try again.")
}

// message is the draft as a storable message (the only place parts are encoded).
func (s *stepper) message(st agent.MessageStatus) agent.Message {
	parts := make([]json.RawMessage, len(s.parts))
	for i, p := range s.parts {
		parts[i] = agent.EncodePart(p)
	}
	u := s.usage
	md := agent.MessageMetadata{Status: st, RunID: s.turn.run.ID, Model: s.model, Usage: &u, Replaces: s.turn.plan.replaces}
	if s.history != nil && s.history.Scale() != 1 {
		md.ContextScale = s.history.Scale()
	}
	md.HandedOver = s.handing
	if f := s.failure; f != nil && st == agent.MessageFailed {
		parts, md.Error = append(parts, agent.ErrorPart(s.turn.run.ID, *f)), f
	}
	return agent.Message{ID: s.turn.run.AssistantMessageID, Role: agent.RoleAssistant, Parts: parts, Metadata: metadataJSON(md)}
}

// putMessage writes the draft, fenced with the run's claim and gated at its horizon before every attempt. A
// fenced write stops the run: someone else owns the thread now.
func (s *stepper) putMessage(ctx context.Context, st agent.MessageStatus, final bool) error {
	t, e := s.turn, s.turn.e
	if err := t.mayWrite(); err != nil {
		return err
	}
	if err := t.awaitUser(); err != nil {
		return err
	}
	w := agent.MessageWrite{ThreadID: t.thread.ID, Seq: t.run.AssistantSeq(), Message: s.message(st), Fence: t.run.Fence(), Final: final}
	var err error
	if final {
		err = t.putFinal(ctx, w)
	} else {
		err = t.fenced(ctx, func(ctx context.Context) error {
			w.Now = e.clock.Now()
			return e.store.PutMessage(ctx, w)
		})
	}
	if errors.Is(err, agent.ErrRunFenced) {
		s.guard.lose(errFenced)
	}
	return err
}

// lostClaim reports whether err says the run's claim is gone (the store refused a fenced write, or the guard
// learned it).
func lostClaim(err error) bool {
	return errors.Is(err, agent.ErrRunFenced) || errors.Is(err, errFenced)
}

// persistDraft upserts the assistant message as it stands (one fenced write per step).
func (s *stepper) persistDraft(ctx context.Context) {
	if err := s.putMessage(ctx, agent.MessageStreaming, false); err != nil {
		s.log.Warn("persist draft", "err", err)
	}
}

// contextScale is the scale the newest assistant message of history kept (agent.MessageMetadata.ContextScale; 0:
// none).
func contextScale(history []agent.Message) float64 {
	for i := len(history) - 1; i >= 0; i-- {
		if history[i].Role != agent.RoleAssistant {
			continue
		}
		var md agent.MessageMetadata
		if json.Unmarshal(history[i].Metadata, &md) == nil && md.ContextScale > 0 {
			return md.ContextScale
		}
		return 0
	}
	return 0
}

// metadataJSON marshals server-authored metadata; the values are plain structs and cannot fail.
func metadataJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("engine: metadata: " + err.Error())
	}
	return b
}

// price puts the cost of one step's usage on it, priced for model (the one the provider reported, else the
// configured one). A model the table does not price costs 0 and is logged once per run.
func (s *stepper) price(model string, u agent.Usage) agent.Usage {
	e := s.turn.e
	if e.prices.Len() == 0 {
		return u
	}
	cost, known := e.prices.Cost(model, u)
	if !known && !s.unpriced && u != (agent.Usage{}) {
		s.unpriced = true
		s.log.Warn("agent.price_unknown", "model", model)
	}
	u.CostMicroUSD = cost
	return u
}

// logStep writes the agent.step line of one model step (the logger carries the run and thread ids).
func (s *stepper) logStep(step int, res agent.ModelResult, u agent.Usage, calls int, took time.Duration, err error) {
	attrs := []any{"step", step, "model", cmp.Or(res.Model, s.model, s.turn.e.cfg.Model), "finish_reason", res.FinishReason,
		"tool_calls", calls, "input_tokens", u.InputTokens, "output_tokens", u.OutputTokens,
		"cached_input_tokens", u.CachedInputTokens, "reasoning_tokens", u.ReasoningTokens, "total_tokens", u.TotalTokens,
		"cost_micro_usd", u.CostMicroUSD, "latency_ms", took.Milliseconds()}
	if err != nil {
		code, _ := agent.Public(err)
		s.log.WarnContext(s.logCtx, "agent.step", append(attrs, "error_code", code, "err", err)...)
		return
	}
	s.log.InfoContext(s.logCtx, "agent.step", attrs...)
}

// report writes the run's one agent.run line and hands its outcome to the metrics port; every way Stream ends
// passes here exactly once.
func (s *stepper) report(run agent.Run) agent.Run {
	t, e := s.turn, s.turn.e
	took := time.Since(t.began)
	st := t.meter.Snapshot()
	u := s.usage
	outcome, code := string(run.Status), ""
	if run.Error != nil {
		code = run.Error.Code
		if code == agent.CodeRunFenced {
			outcome = "fenced"
		}
	}
	attrs := []any{"owner", t.owner, "trigger", t.run.Trigger, "status", run.Status, "outcome", outcome, "error_code", code,
		"steps", s.steps, "model", s.model, "input_tokens", u.InputTokens, "output_tokens", u.OutputTokens,
		"cached_input_tokens", u.CachedInputTokens, "reasoning_tokens", u.ReasoningTokens, "total_tokens", u.TotalTokens,
		"cost_micro_usd", u.CostMicroUSD, "store_requests", st.Requests, "store_read_units", st.ReadUnits,
		"store_write_units", st.WriteUnits, "store_throttled", st.Throttled, "duration_ms", took.Milliseconds()}
	if t.plan.noop {
		attrs = append(attrs, "noop", true)
	}
	if s.late != nil {
		attrs = append(attrs, "late_input_tokens", s.late.InputTokens, "late_output_tokens", s.late.OutputTokens,
			"late_cost_micro_usd", s.late.CostMicroUSD)
	}
	s.log.InfoContext(s.logCtx, "agent.run", attrs...)
	e.metrics.RunFinished(agent.RunMetrics{Outcome: outcome, Model: s.model, Usage: u, Duration: took, Store: st})
	if st.Throttled > 0 {
		e.metrics.StoreThrottled(int(st.Throttled))
	}
	return run
}
