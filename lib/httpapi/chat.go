package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// chatBody is what the AI SDK's DefaultChatTransport posts. Extra body fields are ignored.
type chatBody struct {
	ID        *string           `json:"id"`
	Messages  []json.RawMessage `json:"messages"`
	Trigger   *string           `json:"trigger"`
	MessageID string            `json:"messageId"`
	Multitask string            `json:"multitask"`
	// Background asks for a background run (background.go): 202 at once, the run goes on with no client.
	Background bool `json:"background"`
}

// The AI SDK's wire words: triggers sent by DefaultChatTransport, and our multitask extension.
const (
	wireSubmit     = "submit-message"
	wireRegenerate = "regenerate-message"
)

var multitasks = map[string]engine.Multitask{"": engine.MultitaskReject, "reject": engine.MultitaskReject,
	"interrupt": engine.MultitaskInterrupt, "enqueue": engine.MultitaskEnqueue}

// decodeChat reads and validates the body shape and maps the wire words onto the engine's values; it reads only
// the newest message.
func decodeChat(r io.Reader, limit int64) (engine.Request, error) {
	req, _, err := decodeChatBody(r, limit)
	return req, err
}

// chatOptions are the body's fields beyond the engine's request.
type chatOptions struct {
	background bool
}

// decodeChatBody is decodeChat with the body's other options.
func decodeChatBody(r io.Reader, limit int64) (engine.Request, chatOptions, error) {
	req, body, err := decodeChatRequest(r, limit)
	return req, chatOptions{background: body.Background}, err
}

func decodeChatRequest(r io.Reader, limit int64) (engine.Request, chatBody, error) {
	var req engine.Request
	var body chatBody
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return req, body, agent.Wrap(err, agent.KindInvalid, agent.CodeUnreadableBody, "could not read the request body")
	}
	if int64(len(data)) > limit {
		return req, body, agent.E(agent.KindTooLarge, agent.CodeTooLarge, "request body exceeds %d bytes", limit)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&body); err != nil {
		return req, body, agent.E(agent.KindInvalid, agent.CodeInvalidJSON, "the body is not a valid JSON object: %v", err)
	}
	if dec.More() {
		return req, body, agent.E(agent.KindInvalid, agent.CodeInvalidJSON, "the body holds more than one JSON value")
	}
	if body.ID == nil || *body.ID == "" {
		return req, body, agent.E(agent.KindInvalid, agent.CodeMissingID, "id (the thread id) is required")
	}
	if body.Trigger == nil || *body.Trigger == "" {
		return req, body, agent.E(agent.KindInvalid, agent.CodeMissingTrigger, "trigger is required (submit-message or regenerate-message)")
	}
	req.ThreadID, req.MessageID = *body.ID, body.MessageID
	switch *body.Trigger {
	case wireSubmit:
		req.Kind = engine.TurnSubmit
	case wireRegenerate:
		req.Kind = engine.TurnRegenerate
	default:
		return req, body, agent.E(agent.KindInvalid, agent.CodeInvalidTrigger, "trigger must be %q or %q, got %q", wireSubmit, wireRegenerate, *body.Trigger)
	}
	mt, ok := multitasks[body.Multitask]
	if !ok {
		return req, body, agent.E(agent.KindInvalid, agent.CodeInvalidMultitask, "multitask must be reject, interrupt or enqueue, got %q", body.Multitask)
	}
	req.Multitask = mt
	if body.Messages == nil && req.Kind == engine.TurnSubmit {
		return req, body, agent.E(agent.KindInvalid, agent.CodeMissingMessages, "messages is required")
	}
	if n := len(body.Messages); n > 0 {
		var m agent.Message
		if err := json.Unmarshal(body.Messages[n-1], &m); err != nil {
			return req, body, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "the newest message is not a valid UIMessage: %v", err)
		}
		req.Message = &m
	}
	return req, body, nil
}

func (s *server) postChat(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if s.RequestDeadline > 0 {
		ctx = engine.WithDeadline(ctx, s.Clock.Now().Add(s.RequestDeadline)) // from the request's arrival
	}
	req, opts, err := decodeChatBody(r.Body, s.MaxBodyBytes)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if opts.background && !s.Engine.CanLaunch() {
		s.fail(w, r, errNoBackground())
		return
	}
	req.Owner, req.UserToken = subjectOf(r.Context()), userTokenOf(r.Context())
	turn, err := s.Engine.Begin(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if q := turn.Queued(); q != nil {
		// Queued behind the active run: the message is stored, and its answer is a turn of its own once the
		// thread frees, resumable through GET /chat/{threadId}/stream. A 202 rather than a held stream: a request
		// waiting for its turn would hold a Lambda (billed) for as long as the runs before it take.
		writeJSON(w, http.StatusAccepted, map[string]any{"queued": q})
		return
	}
	if opts.background {
		s.background(w, r, turn)
		return
	}
	beginStream(w)
	turn.Stream(ctx, w)
}

// beginStream sends the 200 and the stream headers and flushes them at once, not with the stream's first byte: a
// turn may write nothing for a while (an answer-only turn's tool, a resumed run that has saved nothing yet),
// longer than a client's response-header timeout. No body byte goes with them, so every AI SDK parser is content.
// A function URL's writer (lambdaurl) cannot flush; it sends its prelude, status and headers, on WriteHeader.
func beginStream(w http.ResponseWriter) {
	setStreamHeaders(w)
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
}

func setStreamHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Vercel-Ai-Ui-Message-Stream", "v1")
	h.Set("X-Accel-Buffering", "no")
}

// resumeStream replays the active run's stream and follows it to its end; 204 when there is nothing to resume.
func (s *server) resumeStream(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	begin := func() { setStreamHeaders(w); w.WriteHeader(http.StatusOK) } // Attach flushes them at once
	active, err := s.Threads.Attach(r.Context(), subjectOf(r.Context()), r.PathValue("threadId"), begin, w, func() { _ = rc.Flush() })
	switch {
	case err != nil && !active:
		s.fail(w, r, err)
	case err != nil:
		s.Logger.InfoContext(r.Context(), "resume ended early", "thread_id", r.PathValue("threadId"), "err", err)
	case !active:
		w.WriteHeader(http.StatusNoContent)
	}
}

// fail writes err as a JSON error; its http.refused line (refusals.go) logs it, with the causes of a 5xx.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	writeError(w, err)
}
