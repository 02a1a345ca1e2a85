package offline

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// invalidRequest is a 400 answer in OpenAI's shape. The messages, params and codes are OpenAI's own, as its
// Chat Completions endpoint sends them (note its spelling "preceeding", and the two param styles it mixes:
// "messages[1].role" from schema checks, "messages.[1].role" from the transcript rules). An empty param or code
// is sent as null, as OpenAI does.
type invalidRequest struct {
	message, param, code string
}

func (e *invalidRequest) body() errorBody {
	d := errorDetail{Message: e.message, Type: "invalid_request_error"}
	if e.param != "" {
		d.Param = &e.param
	}
	if e.code != "" {
		d.Code = &e.code
	}
	return errorBody{Error: d}
}

// OpenAI's messages. The role list is ours: the offline model does not take the deprecated "function" role.
const (
	msgUnparsable = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using " +
		"your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. " +
		"If you have trouble figuring out how to fix this, visit https://platform.openai.com/docs/guides/error-codes/api-errors.)"
	msgNoModel       = "you must provide a model parameter"
	msgOrphanTool    = "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
	msgUnanswered    = "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: %s"
	msgNoToolCallID  = "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'."
	msgNullContent   = "Invalid value for 'content': expected a string, got null."
	msgNamePattern   = "Invalid '%s': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
	msgNameTooLong   = "Invalid '%s': string too long. Expected a string with maximum length 64, but got a string with length %d instead."
	msgContextLength = "This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages."
	codeInvalidType  = "invalid_type"
	codeInvalidValue = "invalid_value"
	codeMissing      = "missing_required_parameter"
)

// Roles and the content part types each takes.
var partTypes = map[string][]string{
	"system":    {"text"},
	"developer": {"text"},
	"user":      {"text", "image_url", "file"},
	"assistant": {"text", "refusal"},
	"tool":      {"text"},
}

var roles = []string{"system", "assistant", "user", "tool", "developer"} // in the order OpenAI's message lists them

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

const maxToolName = 64

// contextExceeded is OpenAI's answer to a request over the model's context window.
func contextExceeded(limit, got int) *invalidRequest {
	return &invalidRequest{fmt.Sprintf(msgContextLength, limit, got), "messages", "context_length_exceeded"}
}

// withSystem is msgs after a system message of text (msgs when text is empty): how a protocol that sends the
// system prompt beside the messages (Messages, Converse) counts it, as Chat Completions counts its system
// message, in the context window and usage. The script reads msgs alone.
func withSystem(text string, msgs []wireMessage) []wireMessage {
	if text == "" {
		return msgs
	}
	sys, _ := json.Marshal(text)
	return append([]wireMessage{{Role: "system", Content: sys}}, msgs...)
}

// contextTokens counts a request's messages as chars/4 (the engine's own estimate): their text, tool call names
// and arguments, and tool call ids. Files are not counted (providers bill them by pages and tiles).
func contextTokens(msgs []wireMessage) int {
	n := 0
	for _, m := range msgs {
		n += len(m.text()) + len(m.ToolCallID)
		for _, c := range m.ToolCalls {
			n += len(c.ID) + len(c.Function.Name) + len(c.Function.Arguments)
		}
	}
	return (n + 3) / 4
}

func missing(param string) *invalidRequest {
	return &invalidRequest{fmt.Sprintf("Missing required parameter: '%s'.", param), param, codeMissing}
}

// checkCacheKey: prompt_cache_key (Chat Completions and Responses), when present, is a string.
func checkCacheKey(req map[string]json.RawMessage) *invalidRequest {
	if raw, ok := req["prompt_cache_key"]; ok && !isNull(raw) {
		if _, ok := str(raw); !ok {
			return wrongType("prompt_cache_key", "a string", raw)
		}
	}
	return nil
}

func wrongType(param, want string, got json.RawMessage) *invalidRequest {
	return &invalidRequest{
		fmt.Sprintf("Invalid type for '%s': expected %s, but got %s instead.", param, want, kindOf(got)), param, codeInvalidType,
	}
}

func wrongValue(param, got string, supported []string) *invalidRequest {
	return &invalidRequest{fmt.Sprintf("Invalid value: '%s'. Supported values are: %s.", got, quoteList(supported)), param, codeInvalidValue}
}

// quoteList renders 'a', 'b', and 'c' (or 'a' and 'b', or 'a'), as OpenAI's messages do.
func quoteList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = "'" + v + "'"
	}
	switch len(q) {
	case 1:
		return q[0]
	case 2:
		return q[0] + " and " + q[1]
	}
	return strings.Join(q[:len(q)-1], ", ") + ", and " + q[len(q)-1]
}

// kindOf names a JSON value's type the way OpenAI's messages do.
func kindOf(raw json.RawMessage) string {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	if bytes.ContainsAny(b, ".eE") {
		return "a decimal"
	}
	return "an integer"
}

// requiredString reads obj's field key (at names obj), refusing it as OpenAI does when it is missing, null or not
// a string.
func requiredString(obj map[string]json.RawMessage, at, key string) (string, *invalidRequest) {
	raw, ok := obj[key]
	if !ok || isNull(raw) {
		return "", missing(at + "." + key)
	}
	v, ok := str(raw)
	if !ok {
		return "", wrongType(at+"."+key, "a string", raw)
	}
	return v, nil
}

func isNull(raw json.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) == 0 || string(b) == "null"
}

// asObject decodes raw into a map of its fields; ok is false when raw is not a JSON object.
func asObject(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	if b := bytes.TrimSpace(raw); len(b) == 0 || b[0] != '{' {
		return nil, false
	}
	var m map[string]json.RawMessage
	return m, json.Unmarshal(raw, &m) == nil
}

func array(raw json.RawMessage) ([]json.RawMessage, bool) {
	if b := bytes.TrimSpace(raw); len(b) == 0 || b[0] != '[' {
		return nil, false
	}
	var a []json.RawMessage
	return a, json.Unmarshal(raw, &a) == nil
}

func str(raw json.RawMessage) (string, bool) {
	if b := bytes.TrimSpace(raw); len(b) == 0 || b[0] != '"' {
		return "", false
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

// validate checks a Chat Completions request body as OpenAI does, in the order it does: the body parses, the
// model is named, every message and tool is well-formed, and the transcript keeps the tool-call rule.
func validate(body []byte) *invalidRequest {
	req, ok := asObject(body)
	if !ok {
		return &invalidRequest{message: msgUnparsable}
	}
	if raw, ok := req["model"]; !ok || isNull(raw) {
		return &invalidRequest{message: msgNoModel}
	} else if s, ok := str(raw); !ok {
		return wrongType("model", "a string", raw)
	} else if s == "" {
		return &invalidRequest{message: msgNoModel}
	}
	if bad := checkCacheKey(req); bad != nil {
		return bad
	}
	raw, ok := req["messages"]
	if !ok || isNull(raw) {
		return missing("messages")
	}
	msgs, ok := array(raw)
	if !ok {
		return wrongType("messages", "an array of objects", raw)
	}
	if len(msgs) == 0 {
		return &invalidRequest{
			"Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
			"messages", "empty_array",
		}
	}
	parsed := make([]checkedMessage, len(msgs))
	for i, m := range msgs {
		cm, err := checkMessage(i, m)
		if err != nil {
			return err
		}
		parsed[i] = cm
	}
	if raw, ok := req["tools"]; ok && !isNull(raw) {
		if err := checkTools(raw); err != nil {
			return err
		}
	}
	return checkSequence(parsed)
}

// checkedMessage is what the transcript rule reads of a message.
type checkedMessage struct {
	role       string
	callIDs    []string // assistant: the ids of its tool_calls
	toolCallID string   // tool: the call it answers
}

func checkMessage(i int, raw json.RawMessage) (checkedMessage, *invalidRequest) {
	at := fmt.Sprintf("messages[%d]", i)
	m, ok := asObject(raw)
	if !ok {
		return checkedMessage{}, wrongType(at, "an object", raw)
	}
	role, bad := requiredString(m, at, "role")
	if bad != nil {
		return checkedMessage{}, bad
	}
	if !slices.Contains(roles, role) {
		return checkedMessage{}, wrongValue(at+".role", role, roles)
	}
	cm := checkedMessage{role: role}

	content, hasContent := m["content"]
	hasContent = hasContent && !isNull(content)
	if role == "assistant" {
		calls, err := checkToolCalls(at, m["tool_calls"])
		if err != nil {
			return cm, err
		}
		if !hasContent && len(calls) == 0 {
			return cm, &invalidRequest{message: msgNullContent, param: fmt.Sprintf("messages.[%d].content", i)}
		}
		cm.callIDs = calls
	} else if !hasContent {
		if _, present := m["content"]; present {
			return cm, wrongType(at+".content", "one of a string or array of objects", content)
		}
		return cm, missing(at + ".content")
	}
	if hasContent {
		if err := checkContent(at+".content", role, content); err != nil {
			return cm, err
		}
	}
	if role == "tool" {
		id, _ := str(m["tool_call_id"])
		if id == "" {
			return cm, &invalidRequest{message: msgNoToolCallID, param: fmt.Sprintf("messages.[%d].tool_call_id", i)}
		}
		cm.toolCallID = id
	}
	return cm, nil
}

// checkContent accepts a string, or an array of parts whose types the role takes.
func checkContent(at, role string, raw json.RawMessage) *invalidRequest {
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
		if !slices.Contains(partTypes[role], typ) {
			return wrongValue(pat+".type", typ, partTypes[role])
		}
		// Each part type carries its payload in the field of its name.
		field := typ
		payload, ok := part[field]
		if !ok || isNull(payload) {
			return missing(pat + "." + field)
		}
		switch typ {
		case "text", "refusal":
			if _, ok := str(payload); !ok {
				return wrongType(pat+"."+field, "a string", payload)
			}
		default: // image_url, file
			obj, ok := asObject(payload)
			if !ok {
				return wrongType(pat+"."+field, "an object", payload)
			}
			if err := checkMedia(pat+"."+field, typ, obj); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkToolCalls checks an assistant message's tool_calls and returns their ids.
func checkToolCalls(at string, raw json.RawMessage) ([]string, *invalidRequest) {
	if isNull(raw) {
		return nil, nil
	}
	calls, ok := array(raw)
	if !ok {
		return nil, wrongType(at+".tool_calls", "an array of objects", raw)
	}
	ids := make([]string, 0, len(calls))
	for k, c := range calls {
		cat := fmt.Sprintf("%s.tool_calls[%d]", at, k)
		call, ok := asObject(c)
		if !ok {
			return nil, wrongType(cat, "an object", c)
		}
		id, ok := str(call["id"])
		if !ok {
			return nil, missing(cat + ".id")
		}
		typ, ok := str(call["type"])
		if !ok {
			return nil, missing(cat + ".type")
		}
		if typ != "function" {
			return nil, wrongValue(cat+".type", typ, []string{"function"})
		}
		fn, ok := asObject(call["function"])
		if !ok {
			return nil, missing(cat + ".function")
		}
		if _, ok := str(fn["name"]); !ok {
			return nil, missing(cat + ".function.name")
		}
		args, present := fn["arguments"]
		if !present || isNull(args) {
			return nil, missing(cat + ".function.arguments")
		}
		if _, ok := str(args); !ok {
			return nil, wrongType(cat+".function.arguments", "a string", args)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func checkTools(raw json.RawMessage) *invalidRequest {
	tools, ok := array(raw)
	if !ok {
		return wrongType("tools", "an array of objects", raw)
	}
	if len(tools) == 0 {
		return &invalidRequest{
			"Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array instead.",
			"tools", "empty_array",
		}
	}
	for i, t := range tools {
		at := fmt.Sprintf("tools[%d]", i)
		tool, ok := asObject(t)
		if !ok {
			return wrongType(at, "an object", t)
		}
		typ, ok := str(tool["type"])
		if !ok {
			return missing(at + ".type")
		}
		if typ != "function" {
			return wrongValue(at+".type", typ, []string{"function"})
		}
		fn, ok := asObject(tool["function"])
		if !ok {
			return missing(at + ".function")
		}
		name, ok := str(fn["name"])
		if !ok {
			return missing(at + ".function.name")
		}
		if len(name) > maxToolName {
			return &invalidRequest{fmt.Sprintf(msgNameTooLong, at+".function.name", len(name)), at + ".function.name", "string_above_max_length"}
		}
		if !toolName.MatchString(name) {
			return &invalidRequest{fmt.Sprintf(msgNamePattern, at+".function.name"), at + ".function.name", codeInvalidValue}
		}
		if params, ok := fn["parameters"]; ok && !isNull(params) {
			if _, ok := asObject(params); !ok {
				return wrongType(at+".function.parameters", "an object", params)
			}
		}
	}
	return nil
}

// checkSequence applies OpenAI's tool-call rule: an assistant message with tool_calls must be followed, before
// any other role, by tool messages answering each of its ids; a tool message must answer a call of the assistant
// message right before the run of tool messages it belongs to.
func checkSequence(msgs []checkedMessage) *invalidRequest {
	owner := -1          // the assistant message whose calls the current run of tool messages answers
	var pending []string // its ids not answered yet
	unanswered := func() *invalidRequest {
		return &invalidRequest{message: fmt.Sprintf(msgUnanswered, strings.Join(pending, ", ")),
			param: fmt.Sprintf("messages.[%d].role", owner)}
	}
	for i, m := range msgs {
		if m.role == "tool" {
			if owner < 0 || !slices.Contains(msgs[owner].callIDs, m.toolCallID) {
				return &invalidRequest{message: msgOrphanTool, param: fmt.Sprintf("messages.[%d].role", i)}
			}
			pending = slices.DeleteFunc(pending, func(id string) bool { return id == m.toolCallID })
			continue
		}
		if len(pending) > 0 {
			return unanswered()
		}
		owner, pending = -1, nil
		if m.role == "assistant" && len(m.callIDs) > 0 {
			owner, pending = i, slices.Clone(m.callIDs)
		}
	}
	if len(pending) > 0 {
		return unanswered()
	}
	return nil
}

// The image types OpenAI reads from a data URL.
var imageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// checkMedia checks an image_url part's url (an http(s) URL, or a base64 data URL of an image) or a file part's
// file_data (a base64 data URL of a PDF; or a file_id), with OpenAI's messages for each case.
func checkMedia(at, typ string, obj map[string]json.RawMessage) *invalidRequest {
	if typ == "image_url" {
		u, bad := requiredString(obj, at, "url")
		if bad != nil {
			return bad
		}
		if strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
			return nil
		}
		return checkDataURL("Invalid image URL", at+".url", "an image MIME type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU=')", u, imageTypes)
	}
	if id, ok := str(obj["file_id"]); ok && id != "" {
		return nil
	}
	data, bad := requiredString(obj, at, "file_data")
	if bad != nil {
		return bad
	}
	return checkDataURL("Invalid file data", at+".file_data", "an application/pdf MIME type (e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ==')", data, []string{"application/pdf"})
}

// checkDataURL checks "data:<type>;base64,<bytes>" as OpenAI does: the prefix, a supported MIME type, valid and
// non-empty base64.
func checkDataURL(what, param, expected, u string, types []string) *invalidRequest {
	fail := func(got string) *invalidRequest {
		return &invalidRequest{fmt.Sprintf("%s: '%s'. Expected a base64-encoded data URL with %s, but got %s.", what, param, expected, got),
			param, codeInvalidValue}
	}
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		return fail("a value without the 'data:' prefix")
	}
	head, payload, ok := strings.Cut(rest, ",")
	mediaType, _, _ := strings.Cut(head, ";")
	if !slices.Contains(types, mediaType) {
		return fail(fmt.Sprintf("unsupported MIME type '%s'", mediaType))
	}
	if !ok || !strings.HasSuffix(head, ";base64") {
		return fail("an invalid base64-encoded value")
	}
	b, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		return fail("an invalid base64-encoded value")
	}
	if len(b) == 0 {
		return fail("empty base64-encoded bytes")
	}
	return nil
}
