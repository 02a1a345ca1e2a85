package agent

import (
	"context"
	"encoding/json"
)

// Model streams one completion. Stream calls emit for every delta as it arrives, in order, and returns the
// assembled result when the model finishes. Implementations retry transient failures only before the first
// emit; an error after that is returned as is. An error returned by emit aborts the stream and is returned.
type Model interface {
	Stream(ctx context.Context, req ModelRequest, emit func(ModelEvent) error) (ModelResult, error)
}

// ModelRequest is one model call.
type ModelRequest struct {
	Model           string
	System          string
	Messages        []ModelMessage
	Tools           []ToolSpec
	MaxOutputTokens int
	// CacheKey groups requests that share a prompt prefix (the engine sets the thread id): OpenAI's adapters
	// send it as prompt_cache_key, so a thread's requests reach the machine that cached its prefix. Adapters
	// whose provider has no such key ignore it.
	CacheKey string
}

// ModelMessage is the provider-neutral transcript entry.
type ModelMessage struct {
	Role      string // "user", "assistant" or "tool"
	Text      string
	Reasoning string // assistant only: the step's reasoning, for adapters whose provider takes it back
	// ReasoningData is assistant only: the provider's own state of the step's reasoning (Anthropic's thinking
	// blocks with their signatures, the Responses API's encrypted reasoning items), opaque to everything but the
	// adapter that produced it (ModelResult.ReasoningData), which replays it as given; another adapter ignores it.
	ReasoningData json.RawMessage
	Files         []ModelFile // user only: attachments the model reads (images, PDFs), after Text
	ToolCalls     []ToolCall  // assistant only
	ToolCallID    string      // tool only: the call this result answers
}

// ModelFile is one attachment of a user message as the model receives it: an image or a PDF, by a data URL
// ("data:<mediaType>;base64,…") or an https URL. Only the media types ModelFileTypes accepts reach a model; the
// boundary refuses the rest.
type ModelFile struct {
	MediaType string
	URL       string
	Filename  string
	// Bytes is the file's size when known without its data (a PDF by URL the adapter downloaded earlier in the
	// run: ModelResult.FileBytes); the transcript's budget counts it. Adapters ignore it.
	Bytes int64
}

// ModelFileType reports whether a model receives files of mediaType (images and PDFs).
func ModelFileType(mediaType string) bool {
	switch mediaType {
	case "image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf":
		return true
	}
	return false
}

// ToolCall is one call the model made. Arguments is the raw JSON the model produced.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolSpec describes a tool to the model.
type ToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	// InputExamples are sample inputs (Tool.InputExamples); an adapter whose provider has no field for them folds
	// them into the description.
	InputExamples []json.RawMessage `json:"inputExamples,omitempty"`
}

// ModelEventType says what a ModelEvent carries.
type ModelEventType int

const (
	EventTextDelta ModelEventType = iota + 1
	EventReasoningDelta
	EventToolCallStart // ToolCallID and ToolName are set
	EventToolCallDelta // ToolCallID is set; Delta is a fragment of the arguments JSON
	EventToolCall      // the call is complete: ToolCallID, ToolName and Arguments (the whole JSON text) are set
)

// ModelEvent is one streamed event. Data flows one way: the adapter emits events and the engine alone assembles
// message parts from them; every tool event carries its call id.
type ModelEvent struct {
	Type       ModelEventType
	Delta      string
	ToolCallID string
	ToolName   string
	Arguments  string
	// More says the adapter already holds the stream's next event and emits it (or returns) without waiting
	// for the provider, so a consumer may delay making this one visible (the engine leaves the client's flush
	// to the next event: one write for words that arrived together). An adapter that cannot tell leaves it
	// false; it is never set on the last event before a wait.
	More bool
}

// FinishReason uses the AI SDK's names.
type FinishReason string

const (
	FinishStop          FinishReason = "stop"
	FinishLength        FinishReason = "length"
	FinishToolCalls     FinishReason = "tool-calls"
	FinishContentFilter FinishReason = "content-filter"
	FinishError         FinishReason = "error"
	FinishOther         FinishReason = "other"
)

// ModelResult is how a finished completion ended. Its content arrived as events (one EventToolCall per call,
// in the order the model made them, all before Stream returns).
type ModelResult struct {
	FinishReason FinishReason
	Usage        Usage
	Model        string
	// FileBytes is the size of each file the adapter downloaded for the request, by URL (PDFs named by https
	// URL), so that later steps budget them by their size.
	FileBytes map[string]int64
	// ReasoningData is the provider's own state of this step's reasoning, for the next request of the same
	// provider (ModelMessage.ReasoningData); nil when the provider needs none back.
	ReasoningData json.RawMessage
}
