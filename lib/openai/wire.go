package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"reflect"
	"strconv"

	"github.com/agentloop/agentloop/lib/openaiwire"
	"github.com/agentloop/agentloop/lib/sse"
)

// The Chat Completions wire, with the standard library only: the request body, the streamed chunks and the
// error bodies, as OpenAI documents them (and as package offline checks them). The adapter once sent them
// through github.com/openai/openai-go/v3, whose package links every type of every OpenAI API into a binary
// that uses one of them: 17 of the chat bootstrap's 30 MB (issue 18 item 6). Only what the adapter sends and
// reads is declared; a field a provider adds is ignored.

// chatRequest is the body of POST chat/completions.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	MaxCompletionTokens int            `json:"max_completion_tokens,omitempty"`
	MaxTokens           int            `json:"max_tokens,omitempty"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
	Tools               []chatTool     `json:"tools,omitempty"`
	PromptCacheKey      string         `json:"prompt_cache_key,omitempty"` // agent.ModelRequest.CacheKey
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatMessage is one message of the request. Content is a string or []contentPart; nil leaves it out (an
// assistant message that only calls tools).
type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function chatFunctionCall `json:"function"`
}

type chatFunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// contentPart is a user message's part: text, image_url or file.
type contentPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
	File     *fileData `json:"file,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

type fileData struct {
	FileData string `json:"file_data"`
	Filename string `json:"filename"`
}

func textPart(s string) contentPart { return contentPart{Type: "text", Text: s} }

type chatTool struct {
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// encodeRequest is the request's JSON, HTML characters as they are (the prompt prefix is sent byte for byte
// alike on every step, so a provider's prompt cache holds).
func encodeRequest(r chatRequest) ([]byte, error) {
	return openaiwire.Encode(r)
}

// chunk is one streamed chat.completion.chunk.
type chunk struct {
	Model   string        `json:"model"`
	Usage   *chunkUsage   `json:"usage"`
	Choices []chunkChoice `json:"choices"`
}

type chunkUsage struct {
	PromptTokens        count `json:"prompt_tokens"`
	CompletionTokens    count `json:"completion_tokens"`
	TotalTokens         count `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens count `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens count `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

type chunkChoice struct {
	Index        count      `json:"index"`
	Delta        chunkDelta `json:"delta"`
	FinishReason string     `json:"finish_reason"`
}

type chunkDelta struct {
	Content string `json:"content"`
	Refusal string `json:"refusal"`
	// ReasoningContent and Reasoning are the fields in which compatible providers stream reasoning text
	// (DeepSeek, vLLM; Ollama, OpenRouter); kept raw, since some send an object there, which is not text.
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ToolCalls        []chunkToolCall `json:"tool_calls"`
}

type chunkToolCall struct {
	Index    count  `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// count is a number of tokens or an index: an integer, also when a compatible server writes it as 12.0; null is 0.
type count int64

func (c *count) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if n, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		*c = count(n)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return &json.UnmarshalTypeError{Value: "non-number " + string(b), Type: reflect.TypeFor[int64]()}
	}
	*c = count(f)
	return nil
}

// apiError is a provider's answer with an HTTP error status (lib/openaiwire).
type apiError = openaiwire.APIError

// streamError is an error event inside a 200 stream: data {"error": {...}}.
type streamError struct {
	Message string
	Data    []byte
}

func (e *streamError) Error() string { return e.Message }

// chunkStream reads the chunks of a text/event-stream body (lib/sse) one at a time, up to data: [DONE].
type chunkStream struct {
	events *sse.Reader
	cur    chunk
	err    error
	done   bool
}

// maxEventLine bounds one line of the stream (32 MB, as openai-go bounded it: a tool call's arguments can come
// whole in one chunk).
const maxEventLine = sse.MaxLine

// chunkReadBuffer is a stream's read buffer: most chunks are far shorter (a longer line is gathered), and a
// server holds one per streaming reply.
const chunkReadBuffer = sse.ReadBuffer

func newChunkStream(body io.ReadCloser) *chunkStream {
	return &chunkStream{events: sse.NewReader(body)}
}

// Next reads the next chunk; false at the end of the stream ([DONE], the end of the body) or on an error (Err).
func (s *chunkStream) Next() bool {
	if s.done {
		return false
	}
	data, ok := s.events.Next()
	if !ok || bytes.HasPrefix(data, []byte("[DONE]")) {
		s.done = true
		return false
	}
	if decodeChunk(data, &s.cur) {
		return true
	}
	if s.cur, s.err = decodeChunkSlow(data); s.err != nil {
		s.done = true
		return false
	}
	return true
}

// decodeChunkSlow decodes what decodeChunk refuses, with encoding/json: an error event ({"error": ...}) is a
// *streamError.
func decodeChunkSlow(data []byte) (chunk, error) {
	var probe struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &probe) == nil && len(probe.Error) > 0 {
		return chunk{}, &streamError{Message: "received error while streaming: " + string(probe.Error), Data: bytes.Clone(data)}
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return chunk{}, err
	}
	return c, nil
}

// Ready reports whether the next chunk is wholly in the read buffer (or the stream is over), so that Next will
// not wait for the provider.
func (s *chunkStream) Ready() bool { return s.done || s.events.Ready() }

func (s *chunkStream) Current() chunk { return s.cur }
func (s *chunkStream) Close() error   { return s.events.Close() }

func (s *chunkStream) Err() error {
	if s.err != nil {
		return s.err
	}
	return s.events.Err()
}

// endpoint is base's chat/completions URL: base is a path prefix whether or not it ends with a slash.
func endpoint(base string) (string, error) { return openaiwire.Endpoint(base, "chat/completions") }

// open sends the request and returns its stream, or the provider's error answer (*apiError), or the transport's
// error.
func (m *Model) open(ctx context.Context, body []byte) (*chunkStream, error) {
	if m.endpointErr != nil {
		return nil, m.endpointErr
	}
	rc, err := openaiwire.Client{HTTP: m.cfg.HTTPClient, APIKey: m.cfg.APIKey}.Stream(ctx, m.endpoint, body)
	if err != nil {
		return nil, err
	}
	return newChunkStream(rc), nil
}
