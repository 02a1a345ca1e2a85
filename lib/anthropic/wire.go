package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// The Messages wire, with the standard library only: the request body, the streamed events and the error bodies,
// as Anthropic documents them (docs.claude.com: Messages, streaming, prompt caching, extended thinking) and as
// package offline checks them. Only what the adapter sends and reads is declared; a field or event a provider
// adds is ignored.

// messagesRequest is the body of POST /v1/messages, and (AnthropicVersion set, no model, no stream) of Bedrock's
// InvokeModelWithResponseStream. Messages come first, system and tools last: the prompt prefix is what the
// provider renders (tools, system, messages), not the field order, but keeping the stable fields together keeps
// requests easy to compare.
type messagesRequest struct {
	AnthropicVersion string     `json:"anthropic_version,omitempty"` // Bedrock only
	Model            string     `json:"model,omitempty"`             // the direct API only (Bedrock: in the path)
	MaxTokens        int        `json:"max_tokens"`
	Messages         []message  `json:"messages"`
	Stream           bool       `json:"stream,omitempty"` // the direct API only (Bedrock: the operation streams)
	Thinking         *thinking  `json:"thinking,omitempty"`
	System           []block    `json:"system,omitempty"`
	Tools            []toolSpec `json:"tools,omitempty"`
}

type thinking struct {
	Type         string `json:"type"` // enabled
	BudgetTokens int    `json:"budget_tokens"`
}

type message struct {
	Role    string  `json:"role"` // user | assistant
	Content []block `json:"content"`
}

// block is a content block of any type the adapter sends: text, image, document, tool_use, tool_result,
// thinking, redacted_thinking. Fields a type does not have stay empty and are left out.
type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"` // text (never empty: Anthropic refuses empty text blocks)
	Source    *source         `json:"source,omitempty"`
	Title     string          `json:"title,omitempty"` // document
	ID        string          `json:"id,omitempty"`    // tool_use
	Name      string          `json:"name,omitempty"`  // tool_use
	Input     json.RawMessage `json:"input,omitempty"` // tool_use
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   []block         `json:"content,omitempty"`   // tool_result: its text
	Thinking  *string         `json:"thinking,omitempty"`  // thinking (present even when empty)
	Signature *string         `json:"signature,omitempty"` // thinking
	Data      string          `json:"data,omitempty"`      // redacted_thinking
	// CacheControl marks a prompt cache breakpoint (see "Prompt cache").
	CacheControl *cacheControl `json:"cache_control,omitempty"`
}

// source is an image's or a document's: base64 data or a URL Anthropic downloads itself.
type source struct {
	Type      string `json:"type"` // base64 | url
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type cacheControl struct {
	Type string `json:"type"` // ephemeral
}

var ephemeral = &cacheControl{Type: "ephemeral"}

// toolSpec is a client tool. The input schema goes out byte for byte as given (compacted), so the prompt prefix
// is stable.
type toolSpec struct {
	Name          string            `json:"name"`
	Description   string            `json:"description,omitempty"`
	InputSchema   json.RawMessage   `json:"input_schema"`
	InputExamples []json.RawMessage `json:"input_examples,omitempty"`
	CacheControl  *cacheControl     `json:"cache_control,omitempty"`
}

// cacheable reports whether a block may carry cache_control (thinking blocks may not: they are cached as part of
// the turn they belong to).
func (b *block) cacheable() bool { return b.Type != "thinking" && b.Type != "redacted_thinking" }

// encodeRequest is the request's JSON, HTML characters as they are (the prompt prefix is sent byte for byte
// alike on every step).
func encodeRequest(r *messagesRequest) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// event is one streamed event, the union of the fields of the event types the adapter reads: message_start,
// content_block_start, content_block_delta, content_block_stop, message_delta, message_stop, ping, error.
type event struct {
	Type         string        `json:"type"`
	Index        int           `json:"index"`
	Message      *startMessage `json:"message"`       // message_start
	ContentBlock *startBlock   `json:"content_block"` // content_block_start
	Delta        *delta        `json:"delta"`         // content_block_delta, message_delta
	Usage        *usage        `json:"usage"`         // message_delta (cumulative)
	Error        *errorDetail  `json:"error"`         // error
}

type startMessage struct {
	Model string `json:"model"`
	Usage usage  `json:"usage"`
}

type startBlock struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	Name      string `json:"name"`
	Text      string `json:"text"`
	Thinking  string `json:"thinking"`
	Signature string `json:"signature"`
	Data      string `json:"data"`
}

type delta struct {
	Type        string `json:"type"` // text_delta | thinking_delta | signature_delta | input_json_delta
	Text        string `json:"text"`
	Thinking    string `json:"thinking"`
	Signature   string `json:"signature"`
	PartialJSON string `json:"partial_json"`
	StopReason  string `json:"stop_reason"` // message_delta
}

// usage is Anthropic's usage object. The fields are pointers: message_delta's usage is cumulative and carries
// the input counts only when they changed.
type usage struct {
	InputTokens              *int64 `json:"input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	OutputTokensDetails      *struct {
		ThinkingTokens int64 `json:"thinking_tokens"`
	} `json:"output_tokens_details"`
}

type errorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// apiError is a provider's answer with an HTTP error status: Anthropic's {"type":"error","error":{type,message}},
// or Bedrock's {"message"} with the exception's name in the X-Amzn-ErrorType header.
type apiError struct {
	StatusCode int
	Type       string // overloaded_error, ThrottlingException, …
	Message    string // the provider's message, or the start of a body of neither shape
	Response   *http.Response
}

func (e *apiError) Error() string {
	return fmt.Sprintf("the model provider answered HTTP %d %s (%s)", e.StatusCode, http.StatusText(e.StatusCode), e.Type)
}

// maxErrorBody bounds the error body read from a provider.
const maxErrorBody = 64 << 10

func readAPIError(res *http.Response) *apiError {
	e := &apiError{StatusCode: res.StatusCode, Response: res}
	b, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
	var body struct {
		Error   *errorDetail `json:"error"`
		Message string       `json:"message"`
	}
	switch {
	case json.Unmarshal(b, &body) != nil:
		e.Message = strings.TrimSpace(string(b[:min(len(b), 300)]))
	case body.Error != nil:
		e.Type, e.Message = body.Error.Type, body.Error.Message
	default:
		e.Message = body.Message
	}
	if t := res.Header.Get("X-Amzn-Errortype"); t != "" && e.Type == "" {
		e.Type, _, _ = strings.Cut(t, ":")
	}
	return e
}

// streamError is the provider giving up inside a 200 stream: Anthropic's "error" event, or an exception message
// of Bedrock's event stream (its :exception-type, e.g. throttlingException).
type streamError struct {
	Type    string
	Message string
}

func (e *streamError) Error() string {
	return fmt.Sprintf("the model provider sent an error event (%s)", e.Type)
}

// eventReader yields the JSON of a stream's events one at a time: the SSE of the direct API (lib/sse) or the
// event stream of Bedrock (bedrockStream).
type eventReader interface {
	// Next returns the next event's JSON, valid until the next call; ok is false at the end of the stream or on
	// an error (Err).
	Next() (data []byte, ok bool)
	// Ready reports whether the next event is at hand: Next will not wait for the provider.
	Ready() bool
	Err() error
	Close() error
}
