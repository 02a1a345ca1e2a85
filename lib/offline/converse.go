package offline

// POST /model/{modelId}/converse-stream: the scripted model in Amazon Bedrock's ConverseStream format, so that
// lib/bedrockconverse runs end to end against it. The request is validated as Bedrock validates it and refused
// with Bedrock's error JSON ({"message": …}, the exception's name in the x-amzn-errortype header); a valid one is
// translated into the Chat Completions messages the script reads (script.go), so every command behaves as it does
// on /v1/chat/completions.
//
// Checked, in order:
//
//	headers        an Authorization header (SigV4; not verified): 403 MissingAuthenticationTokenException
//	               "Missing Authentication Token" without one
//	the body       a JSON object whose messages are a non-empty array (400 ValidationException, as all below)
//	each message   role "user" or "assistant"; the first one "user" ("A conversation must start with a user
//	               message. …"); roles alternating ("A conversation must alternate between user and assistant
//	               roles. …"); content a non-empty array of blocks, each with exactly one member of the ones the
//	               role takes (user: text, image, document, toolResult, cachePoint; assistant: text, toolUse,
//	               reasoningContent, cachePoint); text not blank; images png, jpeg, gif or webp with source bytes;
//	               documents with a format, a name and source bytes; toolUse with toolUseId, name and an object
//	               input
//	reasoning      a replayed reasoningContent.reasoningText carries its signature, and it is the one this server
//	               issued for that text (as /v1/messages issues them: thinkingSignature)
//	tool results   the toolResult ids of a user message are exactly the toolUse ids of the assistant message
//	               before it ("The number of toolResult blocks at messages.N.content exceeds the number of toolUse
//	               blocks of previous turn." / "Expected toolResult blocks at messages.N.content for the following
//	               Ids: …" / "… toolUseId … does not match …")
//	tools          toolConfig.tools each a toolSpec with a name and inputSchema.json an object, or a cachePoint;
//	               a toolConfig present when the messages hold toolUse or toolResult blocks
//	cache points   at most 4 in the request (system, messages and tools together)
//	the context    as on Chat Completions, the system prompt included (WithContextTokens): "Input is too
//	               long for requested model."
//
// The reply is an application/vnd.amazon.eventstream of messages with :message-type event, :content-type
// application/json and :event-type messageStart, then per content block contentBlockStart (toolUse only),
// contentBlockDelta (text, reasoningContent text and signature, toolUse input fragments) and contentBlockStop,
// messageStop with the stop reason (end_turn, max_tokens, tool_use), and metadata with usage (counted as on
// /v1/messages, the system prompt a message before the others: inputTokens the newest message,
// cacheReadInputTokens every message but the two newest, cacheWriteInputTokens the second newest) and metrics. Every event's JSON carries a "p" padding field, as
// Bedrock's do. ConverseStream names no model in its answer: the model id is the path's, and /model (the reply
// "Model: <modelId>") reports it back. /error STATUS refuses the request with the exception Bedrock answers that
// status with (429 ThrottlingException, 503 ServiceUnavailableException, 500 InternalServerException, 403
// AccessDeniedException, …); /error STATUS after N sends it as an exception message mid-stream.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// The ConverseStream request shapes, reduced to the fields this server reads.
type cvRequest struct {
	System []struct {
		Text       *string         `json:"text"`
		CachePoint json.RawMessage `json:"cachePoint"`
	} `json:"system"`
	Messages        []cvMessage `json:"messages"`
	InferenceConfig *struct {
		MaxTokens int `json:"maxTokens"`
	} `json:"inferenceConfig"`
	ToolConfig *struct {
		Tools []struct {
			CachePoint json.RawMessage `json:"cachePoint"`
			ToolSpec   *struct {
				Name        string `json:"name"`
				InputSchema struct {
					JSON json.RawMessage `json:"json"`
				} `json:"inputSchema"`
			} `json:"toolSpec"`
		} `json:"tools"`
	} `json:"toolConfig"`
}

type cvMessage struct {
	Role    string    `json:"role"`
	Content []cvBlock `json:"content"`
}

type cvBlock struct {
	Text  *string `json:"text"`
	Image *struct {
		Format string   `json:"format"`
		Source cvSource `json:"source"`
	} `json:"image"`
	Document *struct {
		Format string   `json:"format"`
		Name   string   `json:"name"`
		Source cvSource `json:"source"`
	} `json:"document"`
	ToolUse *struct {
		ToolUseID string          `json:"toolUseId"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
	} `json:"toolUse"`
	ToolResult *struct {
		ToolUseID string `json:"toolUseId"`
		Content   []struct {
			Text *string         `json:"text"`
			JSON json.RawMessage `json:"json"`
		} `json:"content"`
	} `json:"toolResult"`
	ReasoningContent *struct {
		ReasoningText *struct {
			Text      string  `json:"text"`
			Signature *string `json:"signature"`
		} `json:"reasoningText"`
		RedactedContent []byte `json:"redactedContent"`
	} `json:"reasoningContent"`
	CachePoint json.RawMessage `json:"cachePoint"`
}

// kind is the block's one member ("" when it has none or several).
func (b cvBlock) kind() string {
	var kinds []string
	for k, set := range map[string]bool{"text": b.Text != nil, "image": b.Image != nil, "document": b.Document != nil,
		"toolUse": b.ToolUse != nil, "toolResult": b.ToolResult != nil, "reasoningContent": b.ReasoningContent != nil,
		"cachePoint": b.CachePoint != nil} {
		if set {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) != 1 {
		return ""
	}
	return kinds[0]
}

type cvSource struct {
	Bytes []byte `json:"bytes"`
}

// cvError is an error answer in Bedrock's shape.
type cvError struct {
	status    int
	exception string
	message   string
}

func cvValidation(format string, args ...any) *cvError {
	return &cvError{http.StatusBadRequest, "ValidationException", fmt.Sprintf(format, args...)}
}

func (e *cvError) write(w http.ResponseWriter) {
	w.Header().Set("X-Amzn-Errortype", e.exception+":http://internal.amazon.com/coral/com.amazon.bedrock/")
	w.Header().Set("X-Amzn-Requestid", "offline")
	writeJSON(w, e.status, map[string]string{"message": e.message})
}

// bedrockException is the exception Bedrock answers an HTTP status with.
func bedrockException(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "ValidationException"
	case http.StatusForbidden:
		return "AccessDeniedException"
	case http.StatusNotFound:
		return "ResourceNotFoundException"
	case http.StatusRequestTimeout:
		return "ModelTimeoutException"
	case http.StatusFailedDependency:
		return "ModelErrorException"
	case http.StatusTooManyRequests:
		return "ThrottlingException"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableException"
	}
	if status >= 500 {
		return "InternalServerException"
	}
	return "ValidationException"
}

var cvRoleBlocks = map[string][]string{
	"user":      {"text", "image", "document", "toolResult", "cachePoint"},
	"assistant": {"text", "toolUse", "reasoningContent", "cachePoint"},
}

// validateConverse checks a ConverseStream request as Bedrock does.
func validateConverse(h http.Header, body []byte) (*cvRequest, *cvError) {
	if h.Get("Authorization") == "" {
		return nil, &cvError{http.StatusForbidden, "MissingAuthenticationTokenException", "Missing Authentication Token"}
	}
	var req cvRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, cvValidation("Malformed input request: %v, please reformat your input and try again.", err)
	}
	if len(req.Messages) == 0 {
		return nil, cvValidation("A conversation must start with a user message. Try again with a conversation that starts with a user message.")
	}
	if req.ToolConfig != nil {
		for i, t := range req.ToolConfig.Tools {
			if t.CachePoint != nil && t.ToolSpec == nil {
				continue
			}
			if t.ToolSpec == nil || t.ToolSpec.Name == "" {
				return nil, cvValidation("The value at toolConfig.tools.%d.toolSpec.name failed to satisfy constraint: Member must not be null", i)
			}
			var obj map[string]any
			if json.Unmarshal(t.ToolSpec.InputSchema.JSON, &obj) != nil || obj == nil {
				return nil, cvValidation("The value at toolConfig.tools.%d.toolSpec.inputSchema.json must be a JSON object", i)
			}
		}
	}
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, cvValidation("Value '%s' at 'messages.%d.member.role' failed to satisfy constraint: Member must satisfy enum value set: [user, assistant]", m.Role, i+1)
		}
		if i == 0 && m.Role != "user" {
			return nil, cvValidation("A conversation must start with a user message. Try again with a conversation that starts with a user message.")
		}
		if i > 0 && req.Messages[i-1].Role == m.Role {
			return nil, cvValidation("A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.")
		}
		if len(m.Content) == 0 {
			return nil, cvValidation("The content field in the Message object at messages.%d is empty. Add a ContentBlock object to the content field and try again.", i)
		}
		for j, b := range m.Content {
			if bad := checkConverseBlock(m.Role, i, j, b); bad != nil {
				return nil, bad
			}
		}
		if bad := checkToolResults(req.Messages, i); bad != nil {
			return nil, bad
		}
	}
	if req.ToolConfig == nil || len(req.ToolConfig.Tools) == 0 {
		for _, m := range req.Messages {
			for _, b := range m.Content {
				if b.ToolUse != nil || b.ToolResult != nil {
					return nil, cvValidation("The toolConfig field must be defined when using toolUse and toolResult content blocks.")
				}
			}
		}
	}
	if n := req.cachePoints(); n > maxCachePoints {
		return nil, cvValidation("The number of cachePoint blocks in the request (%d) exceeds the maximum of %d.", n, maxCachePoints)
	}
	return &req, nil
}

// maxCachePoints is how many cache points Bedrock takes in one request (system, messages and tools together).
const maxCachePoints = 4

func (r *cvRequest) cachePoints() int {
	n := 0
	for _, b := range r.System {
		if b.CachePoint != nil {
			n++
		}
	}
	for _, m := range r.Messages {
		for _, b := range m.Content {
			if b.CachePoint != nil {
				n++
			}
		}
	}
	if r.ToolConfig != nil {
		for _, t := range r.ToolConfig.Tools {
			if t.CachePoint != nil {
				n++
			}
		}
	}
	return n
}

func checkConverseBlock(role string, i, j int, b cvBlock) *cvError {
	kind := b.kind()
	if !slices.Contains(cvRoleBlocks[role], kind) {
		return cvValidation("The content block at messages.%d.content.%d is not one a %s message may hold (%s)", i, j, role, cmpKind(kind))
	}
	switch kind {
	case "text":
		if strings.TrimSpace(*b.Text) == "" {
			return cvValidation("The text field in the ContentBlock object at messages.%d.content.%d is blank. Add text to the text field, and try again.", i, j)
		}
	case "image":
		if !slices.Contains([]string{"png", "jpeg", "gif", "webp"}, b.Image.Format) {
			return cvValidation("The format at messages.%d.content.%d.image.format must be one of png, jpeg, gif, webp", i, j)
		}
		if len(b.Image.Source.Bytes) == 0 {
			return cvValidation("The image at messages.%d.content.%d has no source bytes", i, j)
		}
	case "document":
		if b.Document.Format == "" || b.Document.Name == "" || len(b.Document.Source.Bytes) == 0 {
			return cvValidation("The document at messages.%d.content.%d needs a format, a name and source bytes", i, j)
		}
	case "toolUse":
		var obj map[string]json.RawMessage
		if b.ToolUse.ToolUseID == "" || b.ToolUse.Name == "" || json.Unmarshal(b.ToolUse.Input, &obj) != nil || obj == nil {
			return cvValidation("The toolUse at messages.%d.content.%d needs a toolUseId, a name and an object input", i, j)
		}
	case "reasoningContent":
		rt := b.ReasoningContent.ReasoningText
		if rt == nil {
			if len(b.ReasoningContent.RedactedContent) == 0 {
				return cvValidation("The reasoningContent at messages.%d.content.%d is empty", i, j)
			}
			return nil
		}
		if rt.Signature == nil {
			return cvValidation("The reasoningText at messages.%d.content.%d has no signature: reasoning is taken back only with the signature it was issued with", i, j)
		}
		if *rt.Signature != thinkingSignature(rt.Text) {
			return cvValidation("The signature of the reasoningText at messages.%d.content.%d is invalid", i, j)
		}
	}
	return nil
}

func cmpKind(k string) string {
	if k == "" {
		return "none or several members"
	}
	return k
}

// checkToolResults: the toolResult ids of message i are the toolUse ids of the assistant message before it, and
// an assistant message with toolUse blocks that another message follows is answered by it.
func checkToolResults(msgs []cvMessage, i int) *cvError {
	var results []string
	for _, b := range msgs[i].Content {
		if b.ToolResult != nil {
			results = append(results, b.ToolResult.ToolUseID)
		}
	}
	var uses []string
	if i > 0 {
		for _, b := range msgs[i-1].Content {
			if b.ToolUse != nil {
				uses = append(uses, b.ToolUse.ToolUseID)
			}
		}
	}
	if len(results) > len(uses) {
		return cvValidation("The number of toolResult blocks at messages.%d.content exceeds the number of toolUse blocks of previous turn.", i)
	}
	var missing []string
	for _, id := range uses {
		if !slices.Contains(results, id) {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		if len(results) == 0 {
			return cvValidation("Expected toolResult blocks at messages.%d.content for the following Ids: %s", i, strings.Join(missing, ", "))
		}
		return cvValidation("The toolUseId %s of the toolResult blocks at messages.%d.content does not match the toolUse blocks at messages.%d.content.", strings.Join(missing, ", "), i, i-1)
	}
	return nil
}

// converseMessages translates a validated Converse transcript into the Chat Completions messages the script
// reads: toolResult blocks become tool messages, toolUse blocks tool calls, image and document blocks the
// content parts /received describes.
func converseMessages(msgs []cvMessage) []wireMessage {
	var out []wireMessage
	for _, m := range msgs {
		if m.Role == "assistant" {
			wm := wireMessage{Role: "assistant"}
			var text strings.Builder
			for _, b := range m.Content {
				switch {
				case b.Text != nil:
					text.WriteString(*b.Text)
				case b.ToolUse != nil:
					var c strings.Builder
					_ = compactJSON(&c, b.ToolUse.Input)
					wm.ToolCalls = append(wm.ToolCalls, wireToolCall{ID: b.ToolUse.ToolUseID, Type: "function",
						Function: wireFunction{Name: b.ToolUse.Name, Arguments: c.String()}})
				}
			}
			wm.Content, _ = json.Marshal(text.String())
			out = append(out, wm)
			continue
		}
		var parts []map[string]any
		for _, b := range m.Content {
			switch {
			case b.ToolResult != nil:
				var text strings.Builder
				for _, c := range b.ToolResult.Content {
					if c.Text != nil {
						text.WriteString(*c.Text)
					} else if len(c.JSON) > 0 {
						text.Write(c.JSON)
					}
				}
				content, _ := json.Marshal(text.String())
				out = append(out, wireMessage{Role: "tool", ToolCallID: b.ToolResult.ToolUseID, Content: content})
			case b.Text != nil:
				parts = append(parts, map[string]any{"type": "text", "text": *b.Text})
			case b.Image != nil:
				u := "data:image/" + b.Image.Format + ";base64," + base64.StdEncoding.EncodeToString(b.Image.Source.Bytes)
				parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": u}})
			case b.Document != nil:
				u := "data:application/" + b.Document.Format + ";base64," + base64.StdEncoding.EncodeToString(b.Document.Source.Bytes)
				parts = append(parts, map[string]any{"type": "file", "file": map[string]string{"file_data": u, "filename": b.Document.Name}})
			}
		}
		if len(parts) > 0 {
			content, _ := json.Marshal(parts)
			out = append(out, wireMessage{Role: "user", Content: content})
		}
	}
	return out
}

// converse answers POST /model/{modelId}/converse-stream.
func (s *Server) converse(w http.ResponseWriter, r *http.Request, modelID string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			(&cvError{http.StatusRequestEntityTooLarge, "ValidationException", "Request body too large"}).write(w)
			return
		}
		cvValidation("read request body: %v", err).write(w)
		return
	}
	req, bad := validateConverse(r.Header, body)
	if bad != nil {
		bad.write(w)
		return
	}
	msgs := converseMessages(req.Messages)
	var system strings.Builder
	for _, b := range req.System {
		if b.Text != nil {
			system.WriteString(*b.Text)
		}
	}
	counted := withSystem(system.String(), msgs)
	if n := contextTokens(counted); n > s.contextTokens {
		cvValidation("Input is too long for requested model.").write(w)
		return
	}
	var offered []string
	if req.ToolConfig != nil {
		for _, t := range req.ToolConfig.Tools {
			if t.ToolSpec != nil {
				offered = append(offered, t.ToolSpec.Name)
			}
		}
	}
	var rep reply
	if text := lastUserText(msgs); text == "/model" {
		rep = textReply("Model: " + modelID)
	} else {
		rep, _ = s.plan(msgs, offered)
	}
	if req.InferenceConfig != nil {
		rep.limit(req.InferenceConfig.MaxTokens)
	}
	if rep.delay == 0 {
		rep.delay = s.replyDelay
	}
	if rep.status > 0 {
		(&cvError{rep.status, bedrockException(rep.status), rep.message}).write(w)
		return
	}
	for i := range rep.calls {
		rep.calls[i].ID = "tooluse_" + strings.TrimPrefix(rep.calls[i].ID, "call_")
	}
	s.converseStream(r, w, rep, messagesUsage(counted, rep, true))
}

// converseStream writes rep as ConverseStream's event stream.
func (s *Server) converseStream(r *http.Request, w http.ResponseWriter, rep reply, u msgUsage) {
	ctx := r.Context()
	w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
	w.Header().Set("X-Amzn-Requestid", "offline")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := eventstream.NewEncoder()
	var buf bytes.Buffer
	n := 0
	write := func(msg eventstream.Message) bool {
		buf.Reset()
		if enc.Encode(&buf, msg) != nil {
			return false
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	send := func(event string, v map[string]any) bool {
		n++
		v["p"] = strings.Repeat("abcdefghij", 1+n%3)[:3+n%7] // Bedrock pads every event's JSON
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		return write(eventstream.Message{Payload: b, Headers: eventstream.Headers{
			{Name: ":event-type", Value: eventstream.StringValue(event)},
			{Name: ":content-type", Value: eventstream.StringValue("application/json")},
			{Name: ":message-type", Value: eventstream.StringValue("event")},
		}})
	}
	exception := func(status int, message string) {
		ex := bedrockException(status)
		b, _ := json.Marshal(map[string]string{"message": message})
		write(eventstream.Message{Payload: b, Headers: eventstream.Headers{
			{Name: ":exception-type", Value: eventstream.StringValue(strings.ToLower(ex[:1]) + ex[1:])},
			{Name: ":content-type", Value: eventstream.StringValue("application/json")},
			{Name: ":message-type", Value: eventstream.StringValue("exception")},
		}})
	}
	if !send("messageStart", map[string]any{"role": "assistant"}) {
		return
	}
	index := 0
	delta := func(d map[string]any) bool {
		return send("contentBlockDelta", map[string]any{"contentBlockIndex": index, "delta": d})
	}
	stop := func() bool {
		ok := send("contentBlockStop", map[string]any{"contentBlockIndex": index})
		index++
		return ok
	}
	if rep.reasoning != "" {
		for _, p := range splitWords(rep.reasoning) {
			if !delta(map[string]any{"reasoningContent": map[string]any{"text": p}}) {
				return
			}
		}
		if !delta(map[string]any{"reasoningContent": map[string]any{"signature": thinkingSignature(rep.reasoning)}}) || !stop() {
			return
		}
	}
	for _, p := range rep.pieces {
		if sleep(ctx, rep.delay) != nil {
			return
		}
		if !delta(map[string]any{"text": p}) {
			return
		}
	}
	if rep.drop {
		panic(http.ErrAbortHandler)
	}
	if rep.failAfter > 0 {
		exception(rep.failAfter, rep.message)
		return
	}
	if len(rep.pieces) > 0 && !stop() {
		return
	}
	for _, c := range rep.calls {
		if !send("contentBlockStart", map[string]any{"contentBlockIndex": index,
			"start": map[string]any{"toolUse": map[string]string{"toolUseId": c.ID, "name": c.Function.Name}}}) {
			return
		}
		for _, frag := range fragments(c.Function.Arguments, 3) {
			if !delta(map[string]any{"toolUse": map[string]string{"input": frag}}) {
				return
			}
		}
		if !stop() {
			return
		}
	}
	if !send("messageStop", map[string]any{"stopReason": stopReason(rep.finish)}) {
		return
	}
	total := u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens + u.OutputTokens
	send("metadata", map[string]any{"usage": map[string]int64{"inputTokens": u.InputTokens, "outputTokens": u.OutputTokens,
		"totalTokens": total, "cacheReadInputTokens": u.CacheReadInputTokens, "cacheWriteInputTokens": u.CacheCreationInputTokens},
		"metrics": map[string]int64{"latencyMs": 1}})
}

// converseRoute returns the model id of a ConverseStream path ("/model/{modelId}/converse-stream"), ok false for
// any other path.
func converseRoute(path string) (modelID string, ok bool) {
	rest, ok := strings.CutPrefix(path, "/model/")
	if !ok {
		return "", false
	}
	id, ok := strings.CutSuffix(rest, "/converse-stream")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", false
	}
	if u, err := url.PathUnescape(id); err == nil {
		id = u
	}
	return id, true
}
