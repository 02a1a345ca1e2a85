package openairesponses

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/agentloop/agentloop/lib/openaiwire"
	"github.com/agentloop/agentloop/lib/sse"
)

// The Responses wire, with the standard library only: the request body, the streamed events and the error
// bodies, as OpenAI documents them (platform.openai.com/docs/api-reference/responses-streaming, and the types
// of github.com/openai/openai-go/v3/responses) and as package offline checks them. Only what the adapter sends
// and reads is declared; a field or event a provider adds is ignored.

// responsesRequest is the body of POST responses.
type responsesRequest struct {
	Model           string     `json:"model"`
	Instructions    string     `json:"instructions,omitempty"`
	Input           []any      `json:"input"`
	Tools           []tool     `json:"tools,omitempty"`
	MaxOutputTokens int        `json:"max_output_tokens,omitempty"`
	Stream          bool       `json:"stream"`
	Store           bool       `json:"store"` // always false: the thread is ours, nothing is kept at the provider
	Include         []string   `json:"include,omitempty"`
	Reasoning       *reasoning `json:"reasoning,omitempty"`
	PromptCacheKey  string     `json:"prompt_cache_key,omitempty"`
}

type reasoning struct {
	Effort  string `json:"effort,omitempty"`
	Summary string `json:"summary,omitempty"`
}

// includeEncryptedReasoning asks for the reasoning items' encrypted_content, which a stateless (store: false)
// conversation must send back for the model to keep its reasoning across steps.
const includeEncryptedReasoning = "reasoning.encrypted_content"

// messageItem is a message input item: a user's (input_text, input_image, input_file parts) or the assistant's
// earlier text (output_text), as the AI SDK sends it.
type messageItem struct {
	Type    string `json:"type"` // "message"
	Role    string `json:"role"`
	Content []any  `json:"content"`
}

type textPart struct {
	Type string `json:"type"` // input_text | output_text
	Text string `json:"text"`
}

type imagePart struct {
	Type     string `json:"type"` // input_image
	ImageURL string `json:"image_url"`
	Detail   string `json:"detail"`
}

type filePart struct {
	Type     string `json:"type"` // input_file
	Filename string `json:"filename,omitempty"`
	FileData string `json:"file_data,omitempty"`
	FileURL  string `json:"file_url,omitempty"`
}

type functionCallItem struct {
	Type      string `json:"type"` // function_call
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type functionCallOutputItem struct {
	Type   string `json:"type"` // function_call_output
	CallID string `json:"call_id"`
	Output string `json:"output"`
}

// tool is a function tool. Strict is sent false: the Responses API defaults it to true, which refuses any
// schema that is not in its strict subset (every property required, additionalProperties false).
type tool struct {
	Type        string          `json:"type"` // function
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      bool            `json:"strict"`
}

// encodeRequest is the request's JSON, HTML characters as they are (the prompt prefix is sent byte for byte
// alike on every step, so a provider's prompt cache holds).
func encodeRequest(r responsesRequest) ([]byte, error) {
	return openaiwire.Encode(r)
}

// event is one streamed event, the union of the fields of the event types the adapter reads.
type event struct {
	Type         string          `json:"type"`
	Delta        string          `json:"delta"`
	ItemID       string          `json:"item_id"`
	SummaryIndex int             `json:"summary_index"`
	Item         json.RawMessage `json:"item"`
	Arguments    string          `json:"arguments"`
	Response     *response       `json:"response"`
	// The "error" event's fields.
	Code    json.RawMessage `json:"code"`
	Message string          `json:"message"`
}

// response is the response object of response.created, .completed, .incomplete and .failed.
type response struct {
	ID                string             `json:"id"`
	Status            string             `json:"status"`
	Model             string             `json:"model"`
	Error             *responseError     `json:"error"`
	IncompleteDetails *incompleteDetails `json:"incomplete_details"`
	Usage             *usage             `json:"usage"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incompleteDetails struct {
	Reason string `json:"reason"` // max_output_tokens | content_filter
}

type usage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// outputItem is what the adapter reads of an output item (output_item.added and .done).
type outputItem struct {
	Type             string `json:"type"` // message | reasoning | function_call | …
	ID               string `json:"id"`
	CallID           string `json:"call_id"`
	Name             string `json:"name"`
	Arguments        string `json:"arguments"`
	EncryptedContent string `json:"encrypted_content"`
}

// apiError is a provider's answer with an HTTP error status (lib/openaiwire).
type apiError = openaiwire.APIError

// streamFailure is the provider giving up inside a 200 stream: a response.failed event (its response.error),
// or an "error" event.
type streamFailure struct {
	Event   string // response.failed | error
	Code    string
	Message string
}

func (e *streamFailure) Error() string {
	return fmt.Sprintf("the model provider sent %s (code %q)", e.Event, e.Code)
}

// eventStream reads a text/event-stream body (lib/sse) one event's data at a time. The Responses stream has no
// [DONE] sentinel: it ends with the body (one is ignored if a proxy adds it).
type eventStream struct{ *sse.Reader }

func newEventStream(body io.ReadCloser) *eventStream { return &eventStream{sse.NewReader(body)} }

// Next returns the next event's data, valid until the next call; ok is false at the end of the body or on an
// error (Err).
func (s *eventStream) Next() (data []byte, ok bool) {
	for {
		data, ok := s.Reader.Next()
		if !ok || !bytes.HasPrefix(data, []byte("[DONE]")) {
			return data, ok
		}
	}
}

// endpoint is base's responses URL: base is a path prefix whether or not it ends with a slash.
func endpoint(base string) (string, error) { return openaiwire.Endpoint(base, "responses") }

// open sends the request and returns its stream, or the provider's error answer (*apiError), or the transport's
// error.
func (m *Model) open(ctx context.Context, body []byte) (*eventStream, error) {
	if m.endpointErr != nil {
		return nil, m.endpointErr
	}
	rc, err := openaiwire.Client{HTTP: m.cfg.HTTPClient, APIKey: m.cfg.APIKey}.Stream(ctx, m.endpoint, body)
	if err != nil {
		return nil, err
	}
	return newEventStream(rc), nil
}
