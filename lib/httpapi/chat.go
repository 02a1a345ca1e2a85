package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"time"

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
}

// Stable request error codes.
const (
	CodeInvalidJSON     = "invalid_json"
	CodeMissingID       = "missing_id"
	CodeMissingTrigger  = "missing_trigger"
	CodeMissingMessages = "missing_messages"
	CodeInvalidMessage  = "invalid_message"
)

// decodeChat reads and validates the body shape; it reads only the newest message.
func decodeChat(r io.Reader, limit int64) (engine.Request, error) {
	var req engine.Request
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return req, agent.Wrap(err, agent.KindInvalid, "unreadable_body", "could not read the request body")
	}
	if int64(len(data)) > limit {
		return req, agent.E(agent.KindTooLarge, agent.CodeTooLarge, "request body exceeds %d bytes", limit)
	}
	var body chatBody
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&body); err != nil {
		return req, agent.E(agent.KindInvalid, CodeInvalidJSON, "the body is not a valid JSON object: %v", err)
	}
	if dec.More() {
		return req, agent.E(agent.KindInvalid, CodeInvalidJSON, "the body holds more than one JSON value")
	}
	if body.ID == nil || *body.ID == "" {
		return req, agent.E(agent.KindInvalid, CodeMissingID, "id (the thread id) is required")
	}
	if body.Trigger == nil || *body.Trigger == "" {
		return req, agent.E(agent.KindInvalid, CodeMissingTrigger, "trigger is required (submit-message or regenerate-message)")
	}
	req.ThreadID, req.Trigger, req.MessageID, req.Multitask = *body.ID, *body.Trigger, body.MessageID, body.Multitask
	if body.Messages == nil && req.Trigger == engine.WireSubmit {
		return req, agent.E(agent.KindInvalid, CodeMissingMessages, "messages is required")
	}
	if n := len(body.Messages); n > 0 {
		var m agent.Message
		if err := json.Unmarshal(body.Messages[n-1], &m); err != nil {
			return req, agent.E(agent.KindInvalid, CodeInvalidMessage, "the newest message is not a valid UIMessage: %v", err)
		}
		req.Message = &m
	}
	return req, nil
}

func (s *server) postChat(w http.ResponseWriter, r *http.Request) {
	req, err := decodeChat(r.Body, s.MaxBodyBytes)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req.Owner = subjectOf(r.Context())
	turn, err := s.Engine.Begin(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	setStreamHeaders(w)
	w.WriteHeader(http.StatusOK)
	turn.Stream(r.Context(), w)
}

func setStreamHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Vercel-Ai-Ui-Message-Stream", "v1")
	h.Set("X-Accel-Buffering", "no")
}

// resumeStream replays the active run's segments from the start and tails new ones until the final segment.
func (s *server) resumeStream(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	th, err := s.ownedThread(r, r.PathValue("threadId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if th.ActiveRun == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	claim := *th.ActiveRun
	rc := http.NewResponseController(w)
	started := false
	var next int64
	deadline := time.Now().Add(s.Engine.Config().RunTimeout + time.Minute)
	idleSince := time.Now()
	for {
		segs, err := s.Store.ListSegments(ctx, claim.RunID, next, s.Clock.Now())
		if err != nil {
			if !started {
				s.fail(w, r, err)
			}
			return
		}
		for _, seg := range segs {
			if !started {
				setStreamHeaders(w)
				w.WriteHeader(http.StatusOK)
				started = true
			}
			if _, err := w.Write(seg.Data); err != nil {
				return
			}
			_ = rc.Flush()
			next = seg.Seq + 1
			idleSince = time.Now()
			if seg.Final {
				return
			}
		}
		if len(segs) == 0 && time.Since(idleSince) > s.Engine.Config().StaleAfter {
			// Nothing new for a whole stale window: the run may have died. Reap it lazily, which writes the final
			// segment this loop then reads.
			if cur, err := s.Store.GetThread(ctx, th.ID); err == nil && cur.ActiveRun != nil && cur.ActiveRun.RunID == claim.RunID &&
				cur.ActiveRun.Stale(s.Clock.Now(), s.Engine.Config().StaleAfter) {
				_ = s.Engine.ReapRun(ctx, th.ID, claim.RunID, claim.Epoch)
			}
			idleSince = time.Now()
		}
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.ResumePoll):
		}
	}
}

// fail writes err as a JSON error and logs internal ones.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if statusOf(err) >= 500 {
		s.Logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, err)
}
