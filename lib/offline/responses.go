package offline

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// POST /v1/responses: OpenAI's Responses API, with the same script as Chat Completions (script.go), for
// lib/openairesponses.
//
// The request is checked as OpenAI checks it (below), then its input items are read as the Chat Completions
// transcript they amount to (a user message; the assistant's text and function calls as one assistant message;
// each function_call_output as a tool message), so every command answers as it does there: /tool and /loop
// make function_call items (parallel ones in one response), /think streams a reasoning summary
// (response.reasoning_summary_text.delta) before the answer, /error, /drop, /flaky, /slow, /received (its lines
// name the Chat Completions part types: input_image is "image_url", input_file "file", a file_url is shown as a
// file id), /tools. The stream is OpenAI's: response.created, response.in_progress, per output item
// response.output_item.added … response.output_item.done (reasoning: summary part and text deltas; message:
// content part and output_text deltas; function_call: function_call_arguments deltas and done), then
// response.completed, or response.incomplete with incomplete_details.reason "max_output_tokens" when
// max_output_tokens cut the text (as finish_reason "length" there). Every event is "event: TYPE" and "data:
// {…, "type": TYPE, "sequence_number": N}". "/error STATUS after N" ends the stream with response.failed, whose
// error code is rate_limit_exceeded (429), server_error (5xx) or invalid_prompt. stream: false answers the final
// response object. The response's model is the request's; usage is the Chat Completions estimate (the
// instructions counted as its system message, so the same transcript reports the same numbers) as
// input_tokens (input_tokens_details.cached_tokens: every item but the last), output_tokens
// (output_tokens_details.reasoning_tokens) and total_tokens.
//
// A reasoning item carries encrypted_content when the request's include names "reasoning.encrypted_content":
// a deterministic token (offlineEncrypted) that binds the item's id and summary, so a replayed item is checked
// as OpenAI checks its own. store may be true or false.
//
// Refused with 400 invalid_request_error, in this order: a body that is not a JSON object; no model ("Missing
// required parameter: 'model'."); no input; input neither a string nor an array; an item that is not an
// object, or whose type is not message, function_call, function_call_output or reasoning; a message without a
// known role (user, assistant, system, developer) or with content parts its role does not take (input_text,
// input_image, input_file for user, system and developer; output_text and refusal for assistant) or without
// their payload (an input_image's image_url an http(s) URL or a base64 data URL of PNG, JPEG, GIF or WebP; an
// input_file's file_data a base64 data URL of a PDF, or a file_url, or a file_id); a function_call without
// call_id, name or string arguments; a function_call_output without call_id or output; a reasoning item
// without id or summary, or with an encrypted_content this server did not issue for that id and summary ("The
// encrypted content for item rs_… could not be verified.", code invalid_encrypted_content), or without
// encrypted_content ("Item with id 'rs_…' not found. …", as OpenAI answers when store was false); tools not
// function tools with a valid name; max_output_tokens below 16; then the transcript: a function_call_output
// whose call_id no earlier function_call has ("No tool call found for function call output with call_id …."),
// a function_call with no function_call_output after it ("No tool output found for function call …."), a
// reasoning item not followed by the assistant message or function call it preceded ("Item 'rs_…' of type
// 'reasoning' was provided without its required following item."); images by URL that cannot be downloaded, as
// for Chat Completions; input over the context window (WithContextTokens, counted as for Chat Completions): "Your
// input exceeds the context window of this model. …", param "input", code context_length_exceeded.

// msgInputTooLong is the Responses API's answer to input over the model's context window.
const msgInputTooLong = "Your input exceeds the context window of this model. Please adjust your input and try again."

// minOutputTokens is the least max_output_tokens OpenAI takes.
const minOutputTokens = 16

// encryptedKey keys the offline model's reasoning tokens: fixed, so that a thread stored by one dev server
// replays on the next.
const encryptedKey = "agentloop offline reasoning v1"

// offlineEncrypted is the encrypted_content of reasoning item id with summary text: the text, readable, and a
// MAC over id and text.
func offlineEncrypted(id, text string) string {
	return "offline1." + base64.RawURLEncoding.EncodeToString([]byte(text)) + "." + reasoningMAC(id, text)
}

func reasoningMAC(id, text string) string {
	h := sha256.Sum256([]byte(encryptedKey + "\x00" + id + "\x00" + text))
	return hex.EncodeToString(h[:16])
}

// verifyEncrypted reports whether enc is what this server issued for item id with summary text.
func verifyEncrypted(id, text, enc string) bool {
	rest, ok := strings.CutPrefix(enc, "offline1.")
	if !ok {
		return false
	}
	payload, mac, ok := strings.Cut(rest, ".")
	if !ok {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	return err == nil && string(b) == text && mac == reasoningMAC(id, text)
}

// responsesRequest is what the server reads of a validated request.
type responsesRequest struct {
	Model           string          `json:"model"`
	Instructions    string          `json:"instructions"`
	Input           json.RawMessage `json:"input"`
	Stream          bool            `json:"stream"`
	Store           *bool           `json:"store"`
	Include         []string        `json:"include"`
	MaxOutputTokens int             `json:"max_output_tokens"`
	PromptCacheKey  string          `json:"prompt_cache_key"`
	Tools           []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// inputItem is what the server reads of a validated input item.
type inputItem struct {
	Type             string          `json:"type"`
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Arguments        string          `json:"arguments"`
	Output           json.RawMessage `json:"output"`
	ID               string          `json:"id"`
	EncryptedContent *string         `json:"encrypted_content"`
	Summary          []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

var itemTypes = []string{"message", "function_call", "function_call_output", "reasoning"}

var responsesRoles = []string{"user", "assistant", "system", "developer"}

var responsesPartTypes = map[string][]string{
	"user":      {"input_text", "input_image", "input_file"},
	"system":    {"input_text", "input_image", "input_file"},
	"developer": {"input_text", "input_image", "input_file"},
	"assistant": {"output_text", "refusal"},
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
			return
		}
		writeError(w, http.StatusBadRequest, "read request body: "+err.Error())
		return
	}
	req, items, bad := validateResponses(body)
	if bad != nil {
		writeJSON(w, http.StatusBadRequest, bad.body())
		return
	}
	msgs := transcriptOf(items)
	if req.Instructions != "" {
		// The instructions are the system prompt: counted in the context window and usage as Chat Completions
		// counts its system message, so both protocols report the same numbers for the same transcript.
		sys, _ := json.Marshal(req.Instructions)
		msgs = append([]wireMessage{{Role: "system", Content: sys}}, msgs...)
	}
	if bad := s.checkImages(r.Context(), msgs); bad != nil {
		writeJSON(w, http.StatusBadRequest, bad.body())
		return
	}
	if n := contextTokens(msgs); n > s.contextTokens {
		writeJSON(w, http.StatusBadRequest, (&invalidRequest{msgInputTooLong, "input", "context_length_exceeded"}).body())
		return
	}
	offered := make([]string, len(req.Tools))
	for i, t := range req.Tools {
		offered[i] = t.Name
	}
	rep, reqHash := s.plan(msgs, offered)
	rep.limit(req.MaxOutputTokens)
	if rep.delay == 0 {
		rep.delay = s.replyDelay
	}
	if rep.status > 0 {
		writeError(w, rep.status, rep.message)
		return
	}
	u := s.withCache(usage(msgs, rep), req.PromptCacheKey, offered, msgs)
	o := &responsesOutput{
		id: reqHash[:24], model: req.Model, created: s.clock.Now().Unix(),
		encrypted: slices.Contains(req.Include, "reasoning.encrypted_content"),
		store:     req.Store == nil || *req.Store,
		usage: responsesUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
			InputTokensDetails: cachedDetails{CachedTokens: u.PromptTokensDetails.CachedTokens}},
	}
	if u.CompletionTokensDetails != nil {
		o.usage.OutputTokensDetails.ReasoningTokens = u.CompletionTokensDetails.ReasoningTokens
	}
	if !req.Stream {
		o.complete(r.Context(), w, rep)
		return
	}
	o.stream(r.Context(), w, rep)
}

// validateResponses checks a request as OpenAI's Responses endpoint does (see above) and returns its items.
func validateResponses(body []byte) (responsesRequest, []inputItem, *invalidRequest) {
	var req responsesRequest
	obj, ok := asObject(body)
	if !ok {
		return req, nil, &invalidRequest{message: msgUnparsable}
	}
	if raw, ok := obj["model"]; !ok || isNull(raw) {
		return req, nil, missing("model")
	} else if s, ok := str(raw); !ok {
		return req, nil, wrongType("model", "a string", raw)
	} else if s == "" {
		return req, nil, missing("model")
	}
	if bad := checkCacheKey(obj); bad != nil {
		return req, nil, bad
	}
	raw, ok := obj["input"]
	if !ok || isNull(raw) {
		return req, nil, missing("input")
	}
	var rawItems []json.RawMessage
	if text, ok := str(raw); ok {
		b, _ := json.Marshal(map[string]string{"type": "message", "role": "user", "content": text})
		rawItems = []json.RawMessage{b}
	} else if rawItems, ok = array(raw); !ok {
		return req, nil, wrongType("input", "one of a string or array of objects", raw)
	}
	for i, it := range rawItems {
		if bad := checkItem(i, it); bad != nil {
			return req, nil, bad
		}
	}
	if raw, ok := obj["tools"]; ok && !isNull(raw) {
		if bad := checkResponsesTools(raw); bad != nil {
			return req, nil, bad
		}
	}
	if raw, ok := obj["max_output_tokens"]; ok && !isNull(raw) {
		var n int
		if json.Unmarshal(raw, &n) != nil {
			return req, nil, wrongType("max_output_tokens", "an integer", raw)
		}
		if n < minOutputTokens {
			return req, nil, &invalidRequest{fmt.Sprintf("Invalid 'max_output_tokens': integer below minimum value. Expected a value >= %d, but got %d instead.", minOutputTokens, n),
				"max_output_tokens", "integer_below_min_value"}
		}
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return req, nil, &invalidRequest{message: msgUnparsable}
	}
	items := make([]inputItem, len(rawItems))
	for i, it := range rawItems {
		if err := json.Unmarshal(it, &items[i]); err != nil {
			return req, nil, &invalidRequest{message: msgUnparsable}
		}
		if items[i].Type == "" {
			items[i].Type = "message"
		}
	}
	return req, items, checkItemSequence(items)
}

// checkItem checks one input item's shape.
func checkItem(i int, raw json.RawMessage) *invalidRequest {
	at := fmt.Sprintf("input[%d]", i)
	it, ok := asObject(raw)
	if !ok {
		return wrongType(at, "an object", raw)
	}
	typ := "message"
	if t, present := it["type"]; present && !isNull(t) {
		s, ok := str(t)
		if !ok {
			return wrongType(at+".type", "a string", t)
		}
		typ = s
	}
	switch typ {
	case "message":
		role, bad := requiredString(it, at, "role")
		if bad != nil {
			return bad
		}
		if !slices.Contains(responsesRoles, role) {
			return wrongValue(at+".role", role, responsesRoles)
		}
		content, ok := it["content"]
		if !ok || isNull(content) {
			return missing(at + ".content")
		}
		return checkResponsesContent(at+".content", role, content)
	case "function_call":
		for _, k := range []string{"call_id", "name", "arguments"} {
			if _, bad := requiredString(it, at, k); bad != nil {
				return bad
			}
		}
	case "function_call_output":
		if _, bad := requiredString(it, at, "call_id"); bad != nil {
			return bad
		}
		out, ok := it["output"]
		if !ok || isNull(out) {
			return missing(at + ".output")
		}
		if _, ok := str(out); !ok {
			if _, ok := array(out); !ok {
				return wrongType(at+".output", "one of a string or array of objects", out)
			}
		}
	case "reasoning":
		if _, bad := requiredString(it, at, "id"); bad != nil {
			return bad
		}
		sum, ok := it["summary"]
		if !ok || isNull(sum) {
			return missing(at + ".summary")
		}
		if _, ok := array(sum); !ok {
			return wrongType(at+".summary", "an array of objects", sum)
		}
	default:
		return wrongValue(at+".type", typ, itemTypes)
	}
	return nil
}

func checkResponsesContent(at, role string, raw json.RawMessage) *invalidRequest {
	if _, ok := str(raw); ok {
		return nil
	}
	parts, ok := array(raw)
	if !ok {
		return wrongType(at, "one of a string or array of objects", raw)
	}
	for j, p := range parts {
		pat := fmt.Sprintf("%s[%d]", at, j)
		part, ok := asObject(p)
		if !ok {
			return wrongType(pat, "an object", p)
		}
		typ, bad := requiredString(part, pat, "type")
		if bad != nil {
			return bad
		}
		if !slices.Contains(responsesPartTypes[role], typ) {
			return wrongValue(pat+".type", typ, responsesPartTypes[role])
		}
		switch typ {
		case "input_text", "output_text":
			if _, bad := requiredString(part, pat, "text"); bad != nil {
				return bad
			}
		case "refusal":
			if _, bad := requiredString(part, pat, "refusal"); bad != nil {
				return bad
			}
		case "input_image":
			if id, ok := str(part["file_id"]); ok && id != "" {
				continue
			}
			u, bad := requiredString(part, pat, "image_url")
			if bad != nil {
				return bad
			}
			if strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
				continue
			}
			if bad := checkDataURL("Invalid image URL", pat+".image_url", "an image MIME type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU=')", u, imageTypes); bad != nil {
				return bad
			}
		case "input_file":
			if id, ok := str(part["file_id"]); ok && id != "" {
				continue
			}
			if u, ok := str(part["file_url"]); ok && (strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")) {
				continue
			}
			data, bad := requiredString(part, pat, "file_data")
			if bad != nil {
				return bad
			}
			if bad := checkDataURL("Invalid file data", pat+".file_data", "an application/pdf MIME type (e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ==')", data, []string{"application/pdf"}); bad != nil {
				return bad
			}
		}
	}
	return nil
}

func checkResponsesTools(raw json.RawMessage) *invalidRequest {
	tools, ok := array(raw)
	if !ok {
		return wrongType("tools", "an array of objects", raw)
	}
	for i, t := range tools {
		at := fmt.Sprintf("tools[%d]", i)
		tool, ok := asObject(t)
		if !ok {
			return wrongType(at, "an object", t)
		}
		typ, bad := requiredString(tool, at, "type")
		if bad != nil {
			return bad
		}
		if typ != "function" {
			return wrongValue(at+".type", typ, []string{"function"})
		}
		name, bad := requiredString(tool, at, "name")
		if bad != nil {
			return bad
		}
		if len(name) > maxToolName {
			return &invalidRequest{fmt.Sprintf(msgNameTooLong, at+".name", len(name)), at + ".name", "string_above_max_length"}
		}
		if !toolName.MatchString(name) {
			return &invalidRequest{fmt.Sprintf(msgNamePattern, at+".name"), at + ".name", codeInvalidValue}
		}
		if params, ok := tool["parameters"]; ok && !isNull(params) {
			if _, ok := asObject(params); !ok {
				return wrongType(at+".parameters", "an object", params)
			}
		}
	}
	return nil
}

// checkItemSequence applies OpenAI's rules across items: outputs answer earlier calls, every call has an
// output, reasoning items are replayed as issued and followed by what they preceded.
func checkItemSequence(items []inputItem) *invalidRequest {
	calls := map[string]bool{}
	answered := map[string]bool{}
	for i, it := range items {
		switch it.Type {
		case "function_call":
			calls[it.CallID] = true
		case "function_call_output":
			if !calls[it.CallID] {
				return &invalidRequest{message: fmt.Sprintf("No tool call found for function call output with call_id %s.", it.CallID), param: "input"}
			}
			answered[it.CallID] = true
		case "reasoning":
			if it.EncryptedContent == nil || *it.EncryptedContent == "" {
				return &invalidRequest{message: fmt.Sprintf("Item with id '%s' not found. Items are not persisted when `store` is set to false. "+
					"Try again with `store` set to true, or remove this item from your input.", it.ID), param: "input"}
			}
			var text strings.Builder
			for k, s := range it.Summary {
				if k > 0 {
					text.WriteString("\n\n")
				}
				text.WriteString(s.Text)
			}
			if !verifyEncrypted(it.ID, text.String(), *it.EncryptedContent) {
				return &invalidRequest{message: fmt.Sprintf("The encrypted content for item %s could not be verified.", it.ID),
					code: "invalid_encrypted_content"}
			}
			j := i + 1
			for j < len(items) && items[j].Type == "reasoning" {
				j++
			}
			if j == len(items) || !(items[j].Type == "function_call" || (items[j].Type == "message" && items[j].Role == "assistant")) {
				return &invalidRequest{message: fmt.Sprintf("Item '%s' of type 'reasoning' was provided without its required following item.", it.ID),
					param: "input"}
			}
		}
	}
	for _, it := range items {
		if it.Type == "function_call" && !answered[it.CallID] {
			return &invalidRequest{message: fmt.Sprintf("No tool output found for function call %s.", it.CallID), param: "input"}
		}
	}
	return nil
}

// transcriptOf reads validated input items as the Chat Completions transcript they amount to: the script,
// the image downloads, the context window and usage all read that one.
func transcriptOf(items []inputItem) []wireMessage {
	var out []wireMessage
	assistant := -1 // the index in out of the assistant message the current run of assistant items goes into
	for _, it := range items {
		switch it.Type {
		case "reasoning":
			continue // part of the assistant's turn; the script does not read it
		case "function_call":
			if assistant < 0 {
				out = append(out, wireMessage{Role: "assistant"})
				assistant = len(out) - 1
			}
			out[assistant].ToolCalls = append(out[assistant].ToolCalls, wireToolCall{ID: it.CallID, Type: "function",
				Function: wireFunction{Name: it.Name, Arguments: it.Arguments}})
			continue
		case "function_call_output":
			out = append(out, wireMessage{Role: "tool", ToolCallID: it.CallID, Content: functionOutputText(it.Output)})
		case "message":
			if it.Role == "assistant" {
				if assistant < 0 {
					out = append(out, wireMessage{Role: "assistant"})
					assistant = len(out) - 1
				}
				text := assistantText(it.Content)
				if prev, _ := str(out[assistant].Content); prev != "" {
					text = prev + text
				}
				out[assistant].Content, _ = json.Marshal(text)
				continue
			}
			role := it.Role
			if role == "developer" {
				role = "system"
			}
			out = append(out, wireMessage{Role: role, Content: chatContent(it.Content)})
		}
		assistant = -1
	}
	return out
}

// functionOutputText is a function_call_output's output as a JSON string: a string as it is, an array of parts as the
// text of its input_text parts.
func functionOutputText(raw json.RawMessage) json.RawMessage {
	if _, ok := str(raw); ok {
		return raw
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	out, _ := json.Marshal(b.String())
	return out
}

func assistantText(raw json.RawMessage) string {
	if s, ok := str(raw); ok {
		return s
	}
	var parts []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text + p.Refusal)
	}
	return b.String()
}

// chatContent is a message's Responses content as Chat Completions content: a string as it is; input_text as
// text, input_image as image_url, input_file as file (a file_url as its file_id, so /received shows it).
func chatContent(raw json.RawMessage) json.RawMessage {
	if _, ok := str(raw); ok {
		return raw
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL string `json:"image_url"`
		FileID   string `json:"file_id"`
		FileData string `json:"file_data"`
		FileURL  string `json:"file_url"`
		Filename string `json:"filename"`
	}
	_ = json.Unmarshal(raw, &parts)
	out := make([]map[string]any, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "input_text":
			out = append(out, map[string]any{"type": "text", "text": p.Text})
		case "input_image":
			u := p.ImageURL
			if u == "" {
				u = p.FileID
			}
			out = append(out, map[string]any{"type": "image_url", "image_url": map[string]string{"url": u}})
		case "input_file":
			f := map[string]string{"filename": p.Filename}
			switch {
			case p.FileData != "":
				f["file_data"] = p.FileData
			case p.FileURL != "":
				f["file_id"] = p.FileURL
			default:
				f["file_id"] = p.FileID
			}
			out = append(out, map[string]any{"type": "file", "file": f})
		}
	}
	b, _ := json.Marshal(out)
	return b
}

// The response object and its parts, as the server writes them.

type responsesUsage struct {
	InputTokens         int64           `json:"input_tokens"`
	InputTokensDetails  cachedDetails   `json:"input_tokens_details"`
	OutputTokens        int64           `json:"output_tokens"`
	OutputTokensDetails reasoningDetail `json:"output_tokens_details"`
	TotalTokens         int64           `json:"total_tokens"`
}

type cachedDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

type reasoningDetail struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

type responseObject struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	CreatedAt         int64           `json:"created_at"`
	Status            string          `json:"status"`
	Model             string          `json:"model"`
	Output            []any           `json:"output"`
	Store             bool            `json:"store"`
	Error             any             `json:"error"`
	IncompleteDetails any             `json:"incomplete_details"`
	Usage             *responsesUsage `json:"usage"`
}

type summaryText struct {
	Type string `json:"type"` // summary_text
	Text string `json:"text"`
}

type reasoningItem struct {
	ID               string        `json:"id"`
	Type             string        `json:"type"` // reasoning
	Summary          []summaryText `json:"summary"`
	EncryptedContent *string       `json:"encrypted_content"`
}

type outputText struct {
	Type        string `json:"type"` // output_text
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type messageItem struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"` // message
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type functionCallItem struct {
	ID        string `json:"id"`
	Type      string `json:"type"` // function_call
	Status    string `json:"status"`
	Arguments string `json:"arguments"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
}

// responsesOutput writes one response.
type responsesOutput struct {
	id        string // the request's hash, from which the response's and items' ids derive
	model     string
	created   int64
	encrypted bool
	store     bool
	usage     responsesUsage
	seq       int
}

func (o *responsesOutput) object(status string, output []any) responseObject {
	if output == nil {
		output = []any{}
	}
	return responseObject{ID: "resp_" + o.id, Object: "response", CreatedAt: o.created, Status: status, Model: o.model,
		Output: output, Store: o.store}
}

// items are the response's output items, complete, in order.
func (o *responsesOutput) items(rep reply) (reasoning *reasoningItem, msg *messageItem, calls []functionCallItem) {
	if rep.reasoning != "" {
		reasoning = &reasoningItem{ID: "rs_" + o.id, Type: "reasoning", Summary: []summaryText{{Type: "summary_text", Text: rep.reasoning}}}
		if o.encrypted {
			enc := offlineEncrypted(reasoning.ID, rep.reasoning)
			reasoning.EncryptedContent = &enc
		}
	}
	if len(rep.pieces) > 0 || len(rep.calls) == 0 {
		msg = &messageItem{ID: "msg_" + o.id, Type: "message", Status: "completed", Role: "assistant",
			Content: []outputText{{Type: "output_text", Text: rep.text(), Annotations: []any{}}}}
	}
	for i, c := range rep.calls {
		calls = append(calls, functionCallItem{ID: fmt.Sprintf("fc_%s%d", o.id[:20], i), Type: "function_call", Status: "completed",
			Arguments: c.Function.Arguments, CallID: c.ID, Name: c.Function.Name})
	}
	return reasoning, msg, calls
}

// final is the finished response object.
func (o *responsesOutput) final(rep reply) responseObject {
	reasoning, msg, calls := o.items(rep)
	var output []any
	if reasoning != nil {
		output = append(output, reasoning)
	}
	if msg != nil {
		output = append(output, msg)
	}
	for _, c := range calls {
		output = append(output, c)
	}
	res := o.object("completed", output)
	if rep.finish == "length" {
		res.Status = "incomplete"
		res.IncompleteDetails = map[string]string{"reason": "max_output_tokens"}
		if msg != nil {
			msg.Status = "incomplete"
		}
	}
	u := o.usage
	res.Usage = &u
	return res
}

func (o *responsesOutput) complete(ctx context.Context, w http.ResponseWriter, rep reply) {
	if rep.drop {
		panic(http.ErrAbortHandler)
	}
	if rep.failAfter > 0 {
		writeError(w, rep.failAfter, rep.message)
		return
	}
	if err := sleep(ctx, rep.delay*time.Duration(len(rep.pieces))); err != nil {
		return
	}
	writeJSON(w, http.StatusOK, o.final(rep))
}

// failureCode is response.failed's error code for an injected status.
func failureCode(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_exceeded"
	case status >= 500:
		return "server_error"
	}
	return "invalid_prompt"
}

func (o *responsesOutput) stream(ctx context.Context, w http.ResponseWriter, rep reply) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	write := func(typ string, v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	send := func(typ string, fields map[string]any) bool {
		fields["type"] = typ
		fields["sequence_number"] = o.seq
		o.seq++
		return write(typ, fields)
	}
	// sendDelta writes the events sent once per word (typed: a map per word was most of a reply's cost).
	sendDelta := func(typ string, ev deltaEvent) bool {
		ev.Type, ev.SequenceNumber = typ, o.seq
		o.seq++
		return write(typ, ev)
	}
	zero := 0
	noLogprobs := json.RawMessage(`[]`)
	if !send("response.created", map[string]any{"response": o.object("in_progress", nil)}) ||
		!send("response.in_progress", map[string]any{"response": o.object("in_progress", nil)}) {
		return
	}
	reasoning, msg, calls := o.items(rep)
	index := 0
	if reasoning != nil {
		added := reasoningItem{ID: reasoning.ID, Type: "reasoning", Summary: []summaryText{}}
		at := map[string]any{"item_id": reasoning.ID, "output_index": index, "summary_index": 0}
		if !send("response.output_item.added", map[string]any{"output_index": index, "item": added}) ||
			!send("response.reasoning_summary_part.added", with(at, "part", summaryText{Type: "summary_text"})) {
			return
		}
		for _, p := range splitWords(rep.reasoning) {
			if !sendDelta("response.reasoning_summary_text.delta", deltaEvent{ItemID: reasoning.ID, OutputIndex: index, SummaryIndex: &zero, Delta: p}) {
				return
			}
		}
		if !send("response.reasoning_summary_text.done", with(at, "text", rep.reasoning)) ||
			!send("response.reasoning_summary_part.done", with(at, "part", summaryText{Type: "summary_text", Text: rep.reasoning})) ||
			!send("response.output_item.done", map[string]any{"output_index": index, "item": reasoning}) {
			return
		}
		index++
	}
	if msg != nil {
		added := messageItem{ID: msg.ID, Type: "message", Status: "in_progress", Role: "assistant", Content: []outputText{}}
		at := map[string]any{"item_id": msg.ID, "output_index": index, "content_index": 0}
		if !send("response.output_item.added", map[string]any{"output_index": index, "item": added}) ||
			!send("response.content_part.added", with(at, "part", outputText{Type: "output_text", Annotations: []any{}})) {
			return
		}
		for _, p := range rep.pieces {
			if sleep(ctx, rep.delay) != nil {
				return
			}
			if !sendDelta("response.output_text.delta", deltaEvent{ItemID: msg.ID, OutputIndex: index, ContentIndex: &zero, Delta: p, Logprobs: noLogprobs}) {
				return
			}
		}
		if rep.drop {
			panic(http.ErrAbortHandler)
		}
		if rep.failAfter > 0 {
			failed := o.object("failed", nil)
			failed.Error = map[string]string{"code": failureCode(rep.failAfter), "message": rep.message}
			send("response.failed", map[string]any{"response": failed})
			return
		}
		if rep.finish == "length" {
			msg.Status = "incomplete"
		}
		if !send("response.output_text.done", with(at, "text", rep.text())) ||
			!send("response.content_part.done", with(at, "part", msg.Content[0])) ||
			!send("response.output_item.done", map[string]any{"output_index": index, "item": msg}) {
			return
		}
		index++
	}
	for _, c := range calls {
		added := c
		added.Status, added.Arguments = "in_progress", ""
		at := map[string]any{"item_id": c.ID, "output_index": index}
		if !send("response.output_item.added", map[string]any{"output_index": index, "item": added}) {
			return
		}
		for _, frag := range fragments(c.Arguments, 3) {
			if !sendDelta("response.function_call_arguments.delta", deltaEvent{ItemID: c.ID, OutputIndex: index, Delta: frag}) {
				return
			}
		}
		if !send("response.function_call_arguments.done", with(at, "arguments", c.Arguments)) ||
			!send("response.output_item.done", map[string]any{"output_index": index, "item": c}) {
			return
		}
		index++
	}
	res := o.final(rep)
	typ := "response.completed"
	if res.Status == "incomplete" {
		typ = "response.incomplete"
	}
	send(typ, map[string]any{"response": res})
}

// deltaEvent is an output_text, reasoning_summary_text or function_call_arguments delta event.
type deltaEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	ItemID         string          `json:"item_id"`
	OutputIndex    int             `json:"output_index"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	SummaryIndex   *int            `json:"summary_index,omitempty"`
	Delta          string          `json:"delta"`
	Logprobs       json.RawMessage `json:"logprobs,omitempty"`
}

// with returns a copy of m with key set to v.
func with(m map[string]any, key string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for k, x := range m {
		out[k] = x
	}
	out[key] = v
	return out
}
