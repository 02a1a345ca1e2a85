package offline

// POST /v1/messages: the scripted model in Anthropic's Messages format, so that lib/anthropic runs end to end
// against it. The request is validated as Anthropic validates it and answered with Anthropic's error JSON
// ({"type":"error","error":{"type","message"}}); a valid one is translated into the Chat Completions messages the
// script reads (script.go), so every command behaves as it does on /v1/chat/completions.
//
// Checked, in order (each refusal is 400 invalid_request_error unless said otherwise):
//
//	headers        a key in x-api-key or Authorization (the SDK since v2 sends "Authorization: Bearer KEY"; 401
//	               authentication_error "x-api-key header is required" without either), anthropic-version present
//	               ("anthropic-version: header is required")
//	the body       a JSON object; model a non-empty string; max_tokens an integer of at least 1 ("max_tokens:
//	               Field required"); messages a non-empty array
//	each message   role "user" or "assistant", the first one "user", roles alternating (no two of one role in a
//	               row); content a non-empty string or a non-empty array of blocks of the types the role takes
//	               (user: text, image, document, tool_result; assistant: text, tool_use, thinking,
//	               redacted_thinking); text blocks non-empty; image sources base64 of image/png, jpeg, gif or
//	               webp with data, or a url; document sources base64 application/pdf with data, or a url;
//	               tool_use with id, name and an object input
//	thinking       a replayed thinking block carries its signature ("….thinking.signature: Field required"), and
//	               the signature is the one this server issued for that thinking text ("Invalid `signature` in
//	               `thinking` block"); a redacted_thinking block carries data
//	tool results   every tool_use id of an assistant message is answered by a tool_result in the very next
//	               message, which is a user message; a tool_result answers a tool_use of the message right
//	               before it (Anthropic's own wording for both)
//	with thinking  when the request enables thinking, an assistant message with tool_use that the request ends
//	               on (it and its tool results are the newest) starts with a thinking or redacted_thinking block
//	tools          each {name, input_schema: {type: "object", …}}, name matching ^[a-zA-Z0-9_-]{1,128}$
//	cache_control  on a tool, a system block or a content block (a tool_result's own blocks included) is
//	               {"type": "ephemeral"} with an optional ttl of "5m" or "1h" ("….cache_control.type: Input
//	               should be 'ephemeral'"); thinking blocks take none ("….thinking.cache_control: Extra inputs
//	               are not permitted"); at most 4 in a request ("A maximum of 4 blocks with cache_control may
//	               be provided. Found N.")
//	files by URL   every image and document with a url source is downloaded (WithFileClient, within the file
//	               timeout); one that cannot be gets "messages.N.content.M.image.source.url: Unable to download
//	               the file. Please verify the URL and try again." These are the only requests that reach the
//	               network.
//	the context    as on Chat Completions, the system prompt included (WithContextTokens): "prompt is too
//	               long: N tokens > M maximum"
//
// The reply streams (stream: true) message_start, a ping, one content block per piece (thinking with
// thinking_delta and signature_delta; text with text_delta; tool_use with input_json_delta fragments),
// message_delta with the stop reason (end_turn, max_tokens, tool_use) and the output tokens, and message_stop.
// When the request enables thinking every reply starts with a thinking block ("Thinking about: <text>", as
// /think does). Thinking signatures are derived from the thinking text (thinkingSignature), so a replay is
// checked without state. Usage counts the system prompt as Chat Completions counts its system message (a
// message before the others), so the same transcript reports the same total on every route (the engine's
// context scale compares them): input_tokens counts the newest message, cache_read_input_tokens every message
// but the two newest, cache_creation_input_tokens the second newest (as if each request cached the previous
// one's prefix); a request with no cache_control caches nothing, as on Anthropic: all of it is input_tokens;
// output_tokens is counted as on Chat Completions, and message_delta's
// output_tokens_details.thinking_tokens counts the thinking's words when the reply thinks. /error STATUS after N sends an "error" event
// of Anthropic's type for STATUS (529 overloaded_error, 429 rate_limit_error, 5xx api_error, …).

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// The Anthropic request shapes, reduced to the fields this server reads.
type msgRequest struct {
	Model     string          `json:"model"`
	MaxTokens int             `json:"max_tokens"`
	Messages  []msgMessage    `json:"messages"`
	Tools     []msgTool       `json:"tools"`
	Stream    bool            `json:"stream"`
	Thinking  *msgThinking    `json:"thinking"`
	System    json.RawMessage `json:"system"`

	breakpoints int // the cache_control breakpoints it holds
}

type msgThinking struct {
	Type         string `json:"type"`
	BudgetTokens int    `json:"budget_tokens"`
}

type msgTool struct {
	Name         string          `json:"name"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control"`
}

type msgMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type msgBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Source    *msgSource      `json:"source"`
	Title     string          `json:"title"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	Thinking  *string         `json:"thinking"`
	Signature *string         `json:"signature"`
	Data      *string         `json:"data"`

	CacheControl json.RawMessage `json:"cache_control"`
}

type msgSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
	URL       string `json:"url"`
}

// blocks returns the message's content as blocks (a string content is one text block).
func (m msgMessage) blocks() ([]msgBlock, error) {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []msgBlock{{Type: "text", Text: &s}}, nil
	}
	var bs []msgBlock
	err := json.Unmarshal(m.Content, &bs)
	return bs, err
}

// msgError is an error answer in Anthropic's shape.
type msgError struct {
	status  int
	typ     string
	message string
}

func badRequest(format string, args ...any) *msgError {
	return &msgError{http.StatusBadRequest, "invalid_request_error", fmt.Sprintf(format, args...)}
}

type msgErrorBody struct {
	Type  string         `json:"type"`
	Error msgErrorDetail `json:"error"`
}

type msgErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func (e *msgError) write(w http.ResponseWriter) {
	writeJSON(w, e.status, msgErrorBody{Type: "error", Error: msgErrorDetail{Type: e.typ, Message: e.message}})
}

// anthropicErrorType is Anthropic's error type for an HTTP status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// thinkingSignature is the signature this server issues for a thinking text (and checks on replay).
func thinkingSignature(thinking string) string {
	sum := sha256.Sum256([]byte("offline-thinking\x00" + thinking))
	return base64.StdEncoding.EncodeToString(sum[:])
}

var anthropicToolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)

var anthropicImageTypes = []string{"image/jpeg", "image/png", "image/gif", "image/webp"}

// validateMessages checks a Messages request as Anthropic does.
func validateMessages(h http.Header, body []byte) (*msgRequest, *msgError) {
	if h.Get("X-Api-Key") == "" && h.Get("Authorization") == "" {
		return nil, &msgError{http.StatusUnauthorized, "authentication_error", "x-api-key header is required"}
	}
	if h.Get("Anthropic-Version") == "" {
		return nil, badRequest("anthropic-version: header is required")
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(body, &raw) != nil || raw == nil {
		return nil, badRequest("There was an error parsing the body of your request: not a JSON object")
	}
	for _, f := range []string{"model", "max_tokens", "messages"} {
		if v, ok := raw[f]; !ok || isNull(v) {
			return nil, badRequest("%s: Field required", f)
		}
	}
	var req msgRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, badRequest("There was an error parsing the body of your request: %v", err)
	}
	if req.Model == "" {
		return nil, badRequest("model: String should have at least 1 character")
	}
	if req.MaxTokens < 1 {
		return nil, badRequest("max_tokens: Input should be greater than or equal to 1")
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages: List should have at least 1 item after validation, not 0")
	}
	for i, t := range req.Tools {
		if !anthropicToolName.MatchString(t.Name) {
			return nil, badRequest("tools.%d.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'", i)
		}
		var schema struct {
			Type string `json:"type"`
		}
		if len(t.InputSchema) == 0 || isNull(t.InputSchema) {
			return nil, badRequest("tools.%d.custom.input_schema: Field required", i)
		}
		if json.Unmarshal(t.InputSchema, &schema) != nil || schema.Type != "object" {
			return nil, badRequest("tools.%d.custom.input_schema.type: Input should be 'object'", i)
		}
	}
	blocks := make([][]msgBlock, len(req.Messages))
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, badRequest("messages.%d.role: Input should be 'user' or 'assistant'", i)
		}
		if i == 0 && m.Role != "user" {
			return nil, badRequest("messages: first message must use the \"user\" role")
		}
		if i > 0 && req.Messages[i-1].Role == m.Role {
			return nil, badRequest("messages: roles must alternate between \"user\" and \"assistant\", but found multiple %q roles in a row", m.Role)
		}
		bs, err := m.blocks()
		if err != nil {
			return nil, badRequest("messages.%d.content: Input should be a valid list", i)
		}
		if len(bs) == 0 {
			return nil, badRequest("messages.%d: all messages must have non-empty content except for the optional final assistant message", i)
		}
		for j, b := range bs {
			if bad := checkBlock(m.Role, fmt.Sprintf("messages.%d.content.%d", i, j), b); bad != nil {
				return nil, bad
			}
		}
		blocks[i] = bs
	}
	if bad := checkToolPairs(req.Messages, blocks); bad != nil {
		return nil, bad
	}
	n, bad := checkBreakpoints(&req, blocks)
	if bad != nil {
		return nil, bad
	}
	req.breakpoints = n
	if req.Thinking != nil && req.Thinking.Type == "enabled" {
		if bad := checkThinkingFirst(req.Messages, blocks); bad != nil {
			return nil, bad
		}
	}
	return &req, nil
}

// maxBreakpoints is how many cache_control breakpoints Anthropic takes in one request.
const maxBreakpoints = 4

// checkBreakpoints checks every cache_control of the request (tools, system, content blocks and a tool_result's
// own blocks) and counts them.
func checkBreakpoints(req *msgRequest, blocks [][]msgBlock) (int, *msgError) {
	n := 0
	check := func(at string, raw json.RawMessage) *msgError {
		if len(raw) == 0 || isNull(raw) {
			return nil
		}
		var cc struct {
			Type string  `json:"type"`
			TTL  *string `json:"ttl"`
		}
		if json.Unmarshal(raw, &cc) != nil || cc.Type != "ephemeral" {
			return badRequest("%s.cache_control.type: Input should be 'ephemeral'", at)
		}
		if cc.TTL != nil && *cc.TTL != "5m" && *cc.TTL != "1h" {
			return badRequest("%s.cache_control.ttl: Input should be '5m' or '1h'", at)
		}
		n++
		return nil
	}
	for i, t := range req.Tools {
		if bad := check(fmt.Sprintf("tools.%d.custom", i), t.CacheControl); bad != nil {
			return 0, bad
		}
	}
	var system []msgBlock
	if len(req.System) > 0 && !isNull(req.System) && req.System[0] == '[' {
		if json.Unmarshal(req.System, &system) != nil {
			return 0, badRequest("system: Input should be a valid string or list")
		}
	}
	for i, b := range system {
		if bad := check(fmt.Sprintf("system.%d.text", i), b.CacheControl); bad != nil {
			return 0, bad
		}
	}
	for i, bs := range blocks {
		for j, b := range bs {
			at := fmt.Sprintf("messages.%d.content.%d.%s", i, j, b.Type)
			if (b.Type == "thinking" || b.Type == "redacted_thinking") && len(b.CacheControl) > 0 && !isNull(b.CacheControl) {
				return 0, badRequest("%s.cache_control: Extra inputs are not permitted", at)
			}
			if bad := check(at, b.CacheControl); bad != nil {
				return 0, bad
			}
			var inner []msgBlock
			if b.Type == "tool_result" && len(b.Content) > 0 && b.Content[0] == '[' && json.Unmarshal(b.Content, &inner) == nil {
				for k, c := range inner {
					if bad := check(fmt.Sprintf("%s.content.%d.%s", at, k, c.Type), c.CacheControl); bad != nil {
						return 0, bad
					}
				}
			}
		}
	}
	if n > maxBreakpoints {
		return 0, badRequest("A maximum of %d blocks with cache_control may be provided. Found %d.", maxBreakpoints, n)
	}
	return n, nil
}

var roleBlocks = map[string][]string{
	"user":      {"text", "image", "document", "tool_result"},
	"assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}

func checkBlock(role, at string, b msgBlock) *msgError {
	if !slices.Contains(roleBlocks[role], b.Type) {
		return badRequest("%s.type: Input tag '%s' found using 'type' does not match any of the expected tags: %s",
			at, b.Type, "'"+strings.Join(roleBlocks[role], "', '")+"'")
	}
	switch b.Type {
	case "text":
		if b.Text == nil {
			return badRequest("%s.text.text: Field required", at)
		}
		if *b.Text == "" {
			return badRequest("messages: text content blocks must be non-empty")
		}
	case "image", "document":
		if b.Source == nil {
			return badRequest("%s.%s.source: Field required", at, b.Type)
		}
		switch s := b.Source; s.Type {
		case "url":
			if !strings.HasPrefix(s.URL, "https://") && !strings.HasPrefix(s.URL, "http://") {
				return badRequest("%s.%s.source.url.url: Input should be a valid URL", at, b.Type)
			}
		case "base64":
			ok := s.MediaType == "application/pdf"
			if b.Type == "image" {
				ok = slices.Contains(anthropicImageTypes, s.MediaType)
			}
			if !ok {
				return badRequest("%s.%s.source.base64.media_type: Input should be %s", at, b.Type,
					map[bool]string{true: "'image/jpeg', 'image/png', 'image/gif' or 'image/webp'", false: "'application/pdf'"}[b.Type == "image"])
			}
			if _, err := base64.StdEncoding.DecodeString(s.Data); err != nil || s.Data == "" {
				return badRequest("%s.%s.source.base64.data: The %s data is not valid base64", at, b.Type, b.Type)
			}
		default:
			return badRequest("%s.%s.source.type: Input tag '%s' found using 'type' does not match any of the expected tags: 'base64', 'url'", at, b.Type, s.Type)
		}
	case "tool_use":
		if b.ID == "" || b.Name == "" {
			return badRequest("%s.tool_use.id: Field required", at)
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(b.Input, &obj) != nil || obj == nil {
			return badRequest("%s.tool_use.input: Input should be a valid dictionary", at)
		}
	case "tool_result":
		if b.ToolUseID == "" {
			return badRequest("%s.tool_result.tool_use_id: Field required", at)
		}
	case "thinking":
		if b.Thinking == nil {
			return badRequest("%s.thinking.thinking: Field required", at)
		}
		if b.Signature == nil {
			return badRequest("%s.thinking.signature: Field required", at)
		}
		if *b.Signature != thinkingSignature(*b.Thinking) {
			return badRequest("%s: Invalid `signature` in `thinking` block", at)
		}
	case "redacted_thinking":
		if b.Data == nil || *b.Data == "" {
			return badRequest("%s.redacted_thinking.data: Field required", at)
		}
	}
	return nil
}

// checkToolPairs: every tool_use is answered in the very next message, and every tool_result answers a tool_use
// of the message right before it.
func checkToolPairs(msgs []msgMessage, blocks [][]msgBlock) *msgError {
	for i := range msgs {
		var uses []string
		if msgs[i].Role == "assistant" {
			for _, b := range blocks[i] {
				if b.Type == "tool_use" {
					uses = append(uses, b.ID)
				}
			}
		}
		var prev []string
		if i > 0 && msgs[i-1].Role == "assistant" {
			for _, b := range blocks[i-1] {
				if b.Type == "tool_use" {
					prev = append(prev, b.ID)
				}
			}
		}
		for j, b := range blocks[i] {
			if b.Type == "tool_result" && !slices.Contains(prev, b.ToolUseID) {
				return badRequest("messages.%d.content.%d: unexpected `tool_use_id` found in `tool_result` blocks: %s. "+
					"Each `tool_result` block must have a corresponding `tool_use` block in the previous message.", i, j, b.ToolUseID)
			}
		}
		if len(uses) == 0 {
			continue
		}
		var answered []string
		if i+1 < len(msgs) {
			for _, b := range blocks[i+1] {
				if b.Type == "tool_result" {
					answered = append(answered, b.ToolUseID)
				}
			}
		}
		var missing []string
		for _, id := range uses {
			if !slices.Contains(answered, id) {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return badRequest("messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s. "+
				"Each `tool_use` block must have a corresponding `tool_result` block in the next message.", i, strings.Join(missing, ", "))
		}
	}
	return nil
}

// checkThinkingFirst: with thinking enabled, the assistant message of the tool round the request ends on starts
// with a thinking block.
func checkThinkingFirst(msgs []msgMessage, blocks [][]msgBlock) *msgError {
	n := len(msgs)
	if n < 2 || msgs[n-1].Role != "user" || msgs[n-2].Role != "assistant" {
		return nil
	}
	for _, b := range blocks[n-1] {
		if b.Type != "tool_result" {
			return nil // a new user turn: earlier thinking may be left out
		}
	}
	first := blocks[n-2][0]
	if first.Type == "thinking" || first.Type == "redacted_thinking" {
		return nil
	}
	return badRequest("messages.%d.content.0.type: Expected `thinking` or `redacted_thinking`, but found `%s`. When `thinking` is "+
		"enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and "+
		"`tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this requirement, "+
		"disable `thinking`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking",
		n-2, first.Type)
}

// checkURLs downloads every image and document a request names by URL, as Anthropic does before it answers, and
// refuses the request with Anthropic's message when one cannot be downloaded (an expired pre-signed URL: 404; a
// host that does not answer within the file timeout).
func (s *Server) checkURLs(ctx context.Context, msgs []msgMessage) *msgError {
	for i, m := range msgs {
		if m.Role != "user" {
			continue
		}
		bs, _ := m.blocks()
		for j, b := range bs {
			if (b.Type != "image" && b.Type != "document") || b.Source == nil || b.Source.Type != "url" {
				continue
			}
			if !s.downloads(ctx, b.Source.URL) {
				return badRequest("messages.%d.content.%d.%s.source.url: Unable to download the file. Please verify the URL and try again.", i, j, b.Type)
			}
		}
	}
	return nil
}

func (s *Server) downloads(ctx context.Context, u string) bool {
	ctx, cancel := context.WithTimeout(ctx, s.fileTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	res, err := s.fileClient.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 512))
	return res.StatusCode >= 200 && res.StatusCode <= 299
}

// chatMessages translates a validated Messages transcript into the Chat Completions messages the script reads:
// tool_result blocks become tool messages, tool_use blocks tool calls, image and document blocks the content
// parts /received describes.
func chatMessages(msgs []msgMessage) []wireMessage {
	var out []wireMessage
	for _, m := range msgs {
		bs, _ := m.blocks()
		if m.Role == "assistant" {
			wm := wireMessage{Role: "assistant"}
			var text strings.Builder
			for _, b := range bs {
				switch b.Type {
				case "text":
					text.WriteString(*b.Text)
				case "tool_use":
					var c strings.Builder
					_ = compactJSON(&c, b.Input)
					wm.ToolCalls = append(wm.ToolCalls, wireToolCall{ID: b.ID, Type: "function",
						Function: wireFunction{Name: b.Name, Arguments: c.String()}})
				}
			}
			wm.Content, _ = json.Marshal(text.String())
			out = append(out, wm)
			continue
		}
		var parts []map[string]any
		for _, b := range bs {
			switch b.Type {
			case "tool_result":
				out = append(out, wireMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: toolResultText(b.Content)})
			case "text":
				parts = append(parts, map[string]any{"type": "text", "text": *b.Text})
			case "image":
				parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": sourceURL(b.Source)}})
			case "document":
				if b.Source.Type == "url" {
					parts = append(parts, map[string]any{"type": "file", "file": map[string]string{"file_id": b.Source.URL}})
					continue
				}
				parts = append(parts, map[string]any{"type": "file", "file": map[string]string{"file_data": sourceURL(b.Source), "filename": b.Title}})
			}
		}
		if len(parts) > 0 {
			content, _ := json.Marshal(parts)
			out = append(out, wireMessage{Role: "user", Content: content})
		}
	}
	return out
}

func sourceURL(s *msgSource) string {
	if s.Type == "url" {
		return s.URL
	}
	return "data:" + s.MediaType + ";base64," + s.Data
}

// toolResultText is a tool_result's content (a string, or text blocks) as a JSON string.
func toolResultText(content json.RawMessage) json.RawMessage {
	m := wireMessage{Content: content}
	b, _ := json.Marshal(m.text())
	return b
}

func compactJSON(b *strings.Builder, raw json.RawMessage) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	out, err := json.Marshal(v)
	b.Write(out)
	return err
}

// messages answers POST /v1/messages.
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	body, ok := readMessagesBody(w, r, anthropicWire{})
	if !ok {
		return
	}
	s.answerMessages(w, r, anthropicWire{}, r.Header, body)
}

func readMessagesBody(w http.ResponseWriter, r *http.Request, wire msgWire) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			wire.fail(w, &msgError{http.StatusRequestEntityTooLarge, "request_too_large", "Request exceeds the maximum allowed number of bytes."})
			return nil, false
		}
		wire.fail(w, badRequest("read request body: %v", err))
		return nil, false
	}
	return body, true
}

// answerMessages validates a Messages request and answers it in wire's framing.
func (s *Server) answerMessages(w http.ResponseWriter, r *http.Request, wire msgWire, h http.Header, body []byte) {
	req, bad := validateMessages(h, body)
	if bad != nil {
		wire.fail(w, bad)
		return
	}
	if bad := s.checkURLs(r.Context(), req.Messages); bad != nil {
		wire.fail(w, bad)
		return
	}
	msgs := chatMessages(req.Messages)
	counted := withSystem(wireMessage{Role: "system", Content: req.System}.text(), msgs)
	if n := contextTokens(counted); n > s.contextTokens {
		wire.fail(w, badRequest(wire.tooLong(), n, s.contextTokens))
		return
	}
	offered := make([]string, len(req.Tools))
	for i, t := range req.Tools {
		offered[i] = t.Name
	}
	rep, reqHash := s.plan(msgs, offered)
	if req.Thinking != nil && req.Thinking.Type == "enabled" && rep.reasoning == "" && rep.status == 0 {
		rep.reasoning = "Thinking about: " + lastUserText(msgs)
	}
	rep.limit(req.MaxTokens)
	if rep.delay == 0 {
		rep.delay = s.replyDelay
	}
	if rep.status > 0 {
		wire.fail(w, &msgError{rep.status, anthropicErrorType(rep.status), rep.message})
		return
	}
	for i := range rep.calls {
		rep.calls[i].ID = "toolu_" + strings.TrimPrefix(rep.calls[i].ID, "call_")
	}
	out := msgOutput{id: "msg_" + reqHash[:24], model: req.Model, usage: messagesUsage(counted, rep, req.breakpoints > 0), wire: wire}
	if !req.Stream {
		out.complete(r.Context(), w, rep)
		return
	}
	out.stream(r.Context(), w, rep)
}

// msgWire frames a Messages answer: Anthropic's own (SSE, its error JSON) or Bedrock's (bedrockWire).
type msgWire interface {
	fail(w http.ResponseWriter, e *msgError) // an error answer before any output
	contentType() string                     // of a streamed answer
	event(w io.Writer, event string, data []byte) error
	tooLong() string // the refusal of a prompt over the context window (format: tokens, limit)
}

type anthropicWire struct{}

func (anthropicWire) fail(w http.ResponseWriter, e *msgError) { e.write(w) }
func (anthropicWire) contentType() string                     { return "text/event-stream" }
func (anthropicWire) tooLong() string                         { return "prompt is too long: %d tokens > %d maximum" }
func (anthropicWire) event(w io.Writer, event string, data []byte) error {
	_, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
	return err
}

func lastUserText(msgs []wireMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			return strings.TrimSpace(msgs[i].text())
		}
	}
	return ""
}

// msgUsage is Anthropic's usage object.
type msgUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

// messagesUsage is the usage of a reply to msgs: the newest message input, the one before it a cache write, the
// rest cache reads when the request has a breakpoint (cached); all input otherwise.
func messagesUsage(msgs []wireMessage, rep reply, cached bool) msgUsage {
	u := usage(msgs, rep)
	var perMsg []int64
	for _, m := range msgs {
		n := 1 + countWords(m.text())
		for _, c := range m.ToolCalls {
			n += 1 + countWords(c.Function.Name+" "+c.Function.Arguments)
		}
		perMsg = append(perMsg, n)
	}
	var out msgUsage
	for i, n := range perMsg {
		switch {
		case i == len(perMsg)-1 || !cached:
			out.InputTokens += n
		case i == len(perMsg)-2:
			out.CacheCreationInputTokens += n
		default:
			out.CacheReadInputTokens += n
		}
	}
	out.OutputTokens = u.CompletionTokens
	return out
}

// stopReason is Anthropic's name for the script's finish reason.
func stopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls":
		return "tool_use"
	}
	return "end_turn"
}

type msgOutput struct {
	id, model string
	usage     msgUsage
	wire      msgWire
}

// content is the reply's content blocks, as a non-streamed message holds them.
func (o msgOutput) content(rep reply) []map[string]any {
	var out []map[string]any
	if rep.reasoning != "" {
		out = append(out, map[string]any{"type": "thinking", "thinking": rep.reasoning, "signature": thinkingSignature(rep.reasoning)})
	}
	if t := rep.text(); t != "" {
		out = append(out, map[string]any{"type": "text", "text": t})
	}
	for _, c := range rep.calls {
		out = append(out, map[string]any{"type": "tool_use", "id": c.ID, "name": c.Function.Name, "input": json.RawMessage(c.Function.Arguments)})
	}
	return out
}

func (o msgOutput) complete(ctx context.Context, w http.ResponseWriter, rep reply) {
	if rep.drop {
		panic(http.ErrAbortHandler)
	}
	if rep.failAfter > 0 {
		o.wire.fail(w, &msgError{rep.failAfter, anthropicErrorType(rep.failAfter), rep.message})
		return
	}
	if err := sleep(ctx, rep.delay*time.Duration(len(rep.pieces))); err != nil {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": o.id, "type": "message", "role": "assistant", "model": o.model, "content": o.content(rep),
		"stop_reason": stopReason(rep.finish), "stop_sequence": nil, "usage": o.usage,
	})
}

func (o msgOutput) stream(ctx context.Context, w http.ResponseWriter, rep reply) {
	h := w.Header()
	h.Set("Content-Type", o.wire.contentType())
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(event string, v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if err := o.wire.event(w, event, b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	start := o.usage
	start.OutputTokens = 1 // Anthropic reports a provisional count here and the real one in message_delta
	if !send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": o.id, "type": "message", "role": "assistant", "model": o.model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": start,
	}}) {
		return
	}
	if !send("ping", map[string]string{"type": "ping"}) {
		return
	}
	index := 0
	block := func(start map[string]any, deltas []map[string]any) bool {
		if !send("content_block_start", map[string]any{"type": "content_block_start", "index": index, "content_block": start}) {
			return false
		}
		for _, d := range deltas {
			if !send("content_block_delta", map[string]any{"type": "content_block_delta", "index": index, "delta": d}) {
				return false
			}
		}
		ok := send("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
		return ok
	}
	if rep.reasoning != "" {
		var ds []map[string]any
		for _, p := range splitWords(rep.reasoning) {
			ds = append(ds, map[string]any{"type": "thinking_delta", "thinking": p})
		}
		ds = append(ds, map[string]any{"type": "signature_delta", "signature": thinkingSignature(rep.reasoning)})
		if !block(map[string]any{"type": "thinking", "thinking": "", "signature": ""}, ds) {
			return
		}
	}
	if len(rep.pieces) > 0 {
		if !send("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": map[string]any{"type": "text", "text": ""}}) {
			return
		}
		for _, p := range rep.pieces {
			if sleep(ctx, rep.delay) != nil {
				return
			}
			if !send("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
				"delta": map[string]any{"type": "text_delta", "text": p}}) {
				return
			}
		}
		if rep.drop {
			panic(http.ErrAbortHandler)
		}
		if rep.failAfter > 0 {
			send("error", msgErrorBody{Type: "error", Error: msgErrorDetail{Type: anthropicErrorType(rep.failAfter), Message: rep.message}})
			return
		}
		if !send("content_block_stop", map[string]any{"type": "content_block_stop", "index": index}) {
			return
		}
		index++
	} else if rep.drop {
		panic(http.ErrAbortHandler)
	} else if rep.failAfter > 0 {
		send("error", msgErrorBody{Type: "error", Error: msgErrorDetail{Type: anthropicErrorType(rep.failAfter), Message: rep.message}})
		return
	}
	for _, c := range rep.calls {
		var ds []map[string]any
		for _, frag := range fragments(c.Function.Arguments, 3) {
			ds = append(ds, map[string]any{"type": "input_json_delta", "partial_json": frag})
		}
		if !block(map[string]any{"type": "tool_use", "id": c.ID, "name": c.Function.Name, "input": map[string]any{}}, ds) {
			return
		}
	}
	final := map[string]any{"output_tokens": o.usage.OutputTokens}
	if n := countWords(rep.reasoning); n > 0 {
		final["output_tokens_details"] = map[string]int64{"thinking_tokens": n}
	}
	if !send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stopReason(rep.finish), "stop_sequence": nil}, "usage": final}) {
		return
	}
	send("message_stop", map[string]string{"type": "message_stop"})
}

// invoke answers Bedrock's InvokeModelWithResponseStream and InvokeModel for an Anthropic model
// (POST /model/{modelId}/invoke-with-response-stream, /model/{modelId}/invoke): the same Messages body without
// model and stream, with anthropic_version "bedrock-2023-05-31", signed (an Authorization header: the signature
// is not checked); the answer is the Messages events, each the base64 "bytes" of a "chunk" in AWS's event-stream
// framing; an error is Bedrock's ({"message"} with x-amzn-ErrorType), mid-stream an exception message.
func (s *Server) invoke(w http.ResponseWriter, r *http.Request) {
	wire := bedrockWire{}
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/model/")
	id, method, _ := strings.Cut(rest, "/")
	model, err := url.PathUnescape(id)
	if r.Method != http.MethodPost || err != nil || model == "" || (method != "invoke" && method != "invoke-with-response-stream") {
		wire.fail(w, &msgError{http.StatusNotFound, "not_found_error", "unknown operation " + r.Method + " " + r.URL.Path})
		return
	}
	if a := r.Header.Get("Authorization"); !strings.HasPrefix(a, "AWS4-HMAC-SHA256 ") && !strings.HasPrefix(a, "Bearer ") {
		wire.fail(w, &msgError{http.StatusForbidden, "permission_error", "Missing Authentication Token"})
		return
	}
	body, ok := readMessagesBody(w, r, wire)
	if !ok {
		return
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		wire.fail(w, badRequest("Malformed input request, please reformat your input and try again."))
		return
	}
	if v := fields["anthropic_version"]; string(v) != `"`+bedrockVersion+`"` {
		wire.fail(w, badRequest("Malformed input request: #: required key [anthropic_version] not found or not %s, please reformat your input and try again.", bedrockVersion))
		return
	}
	for _, k := range []string{"model", "stream"} {
		if _, ok := fields[k]; ok {
			wire.fail(w, badRequest("Malformed input request: #: extraneous key [%s] is not permitted, please reformat your input and try again.", k))
			return
		}
	}
	fields["model"], _ = json.Marshal(model)
	fields["stream"], _ = json.Marshal(method == "invoke-with-response-stream")
	body, _ = json.Marshal(fields)
	s.requests.Add(1)
	h := http.Header{}
	h.Set("X-Api-Key", "bedrock")
	h.Set("Anthropic-Version", bedrockVersion)
	s.answerMessages(w, r, wire, h, body)
}

const bedrockVersion = "bedrock-2023-05-31"

type bedrockWire struct{}

// bedrockErrorType is Bedrock's exception name for an HTTP status.
func bedrockErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "ValidationException"
	case http.StatusForbidden, http.StatusUnauthorized:
		return "AccessDeniedException"
	case http.StatusNotFound:
		return "ResourceNotFoundException"
	case http.StatusTooManyRequests:
		return "ThrottlingException"
	case http.StatusServiceUnavailable, 529:
		return "ServiceUnavailableException"
	}
	if status >= 500 {
		return "InternalServerException"
	}
	return "ValidationException"
}

func (bedrockWire) fail(w http.ResponseWriter, e *msgError) {
	w.Header().Set("X-Amzn-Errortype", bedrockErrorType(e.status)+":http://internal.amazon.com/coral/com.amazon.bedrock/")
	writeJSON(w, e.status, map[string]string{"message": e.message})
}

func (bedrockWire) contentType() string { return "application/vnd.amazon.eventstream" }
func (bedrockWire) tooLong() string {
	return "Input is too long for requested model. (%d tokens > %d maximum)"
}

func (bedrockWire) event(w io.Writer, event string, data []byte) error {
	enc := eventstream.NewEncoder()
	switch event {
	case "ping":
		return nil // Bedrock sends no pings
	case "error":
		var e msgErrorBody
		_ = json.Unmarshal(data, &e)
		typ := map[string]string{"overloaded_error": "serviceUnavailableException", "rate_limit_error": "throttlingException",
			"api_error": "internalServerException"}[e.Error.Type]
		if typ == "" {
			typ = "modelStreamErrorException"
		}
		payload, _ := json.Marshal(map[string]string{"message": e.Error.Message})
		return enc.Encode(w, eventstream.Message{Payload: payload, Headers: eventstream.Headers{
			{Name: ":message-type", Value: eventstream.StringValue("exception")},
			{Name: ":exception-type", Value: eventstream.StringValue(typ)},
			{Name: ":content-type", Value: eventstream.StringValue("application/json")},
		}})
	}
	payload, _ := json.Marshal(map[string]string{"bytes": base64.StdEncoding.EncodeToString(data)})
	return enc.Encode(w, eventstream.Message{Payload: payload, Headers: eventstream.Headers{
		{Name: ":message-type", Value: eventstream.StringValue("event")},
		{Name: ":event-type", Value: eventstream.StringValue("chunk")},
		{Name: ":content-type", Value: eventstream.StringValue("application/json")},
	}})
}
