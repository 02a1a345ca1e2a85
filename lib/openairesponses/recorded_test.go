package openairesponses

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// serveFile answers every request with testdata/name as an event stream (hand-written captures of the
// documented format: testdata/README.md).
func serveFile(t *testing.T, name string) *Model {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(b)
	}))
	t.Cleanup(ts.Close)
	return New(Config{BaseURL: ts.URL + "/v1", Model: "gpt-5", MaxRetries: -1})
}

func TestRecordedReasoningAndParallelCalls(t *testing.T) {
	t.Parallel()
	res, events, err := run(context.Background(), serveFile(t, "reasoning_tools.sse"), userReq("weather in Paris and Rome?"))
	if err != nil {
		t.Fatal(err)
	}
	wantReasoning := "**Checking the weather**\n\nThe user wants Paris and Rome.\n\n**Calling tools**\n\nTwo lookups, in parallel."
	if got := textOf(events, agent.EventReasoningDelta); got != wantReasoning {
		t.Fatalf("reasoning %q", got)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Let me check both." {
		t.Fatalf("text %q", got)
	}
	wantCalls := []agent.ToolCall{{ID: "call_Xq1", Name: "get_weather", Arguments: `{"city":"Paris"}`},
		{ID: "call_Xq2", Name: "get_weather", Arguments: `{"city":"Rome"}`}}
	if got := callsOf(events); !reflect.DeepEqual(got, wantCalls) {
		t.Fatalf("calls %+v", got)
	}
	// Every delta of a call carries its call id (not the item id the wire names).
	for _, ev := range events {
		if ev.Type == agent.EventToolCallDelta && ev.ToolCallID != "call_Xq1" && ev.ToolCallID != "call_Xq2" {
			t.Fatalf("delta %+v", ev)
		}
	}
	wantUsage := agent.Usage{InputTokens: 2048, CachedInputTokens: 1920, OutputTokens: 180, ReasoningTokens: 128, TotalTokens: 2228}
	if res.Usage != wantUsage || res.FinishReason != agent.FinishToolCalls || res.Model != "gpt-5-2025-08-07" {
		t.Fatalf("result %+v", res)
	}
	var items []map[string]any
	if err := json.Unmarshal(res.ReasoningData, &items); err != nil || len(items) != 1 ||
		items[0]["id"] != "rs_68a1b2c3d4e5f6aa" || items[0]["encrypted_content"] != "gAAAAABorecordedEncryptedReasoningBlob0123456789==" {
		t.Fatalf("reasoning data %s (%v)", res.ReasoningData, err)
	}

	// The next request replays the item as received, before the step's text and calls.
	r, _, err := New(Config{Model: "gpt-5"}).request(context.Background(), agent.ModelRequest{Messages: []agent.ModelMessage{
		{Role: "user", Text: "weather in Paris and Rome?"},
		{Role: "assistant", Text: "Let me check both.", ToolCalls: wantCalls, ReasoningData: res.ReasoningData},
		{Role: "tool", ToolCallID: "call_Xq1", Text: "sunny"}, {Role: "tool", ToolCallID: "call_Xq2", Text: "rain"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	body, err := encodeRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	var sent struct {
		Input []json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &sent); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, it := range sent.Input {
		var probe struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(it, &probe)
		types = append(types, probe.Type)
	}
	if want := []string{"message", "reasoning", "message", "function_call", "function_call", "function_call_output", "function_call_output"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("input item types %v", types)
	}
	if !strings.Contains(string(sent.Input[1]), `"summary":[{"type":"summary_text"`) {
		t.Fatalf("reasoning item not replayed as received: %s", sent.Input[1])
	}
}

func TestRecordedEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file   string
		finish agent.FinishReason
		kind   agent.Kind
		code   string
		cause  string
	}{
		{file: "incomplete_content_filter.sse", finish: agent.FinishContentFilter},
		{file: "error_event.sse", finish: agent.FinishError, kind: agent.KindUnavailable, code: agent.CodeModelError, cause: "The server had an error"},
		{file: "failed_image.sse", finish: agent.FinishError, kind: agent.KindInvalid, code: agent.CodeFileUnavailable, cause: "cat.png?…"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			res, _, err := run(context.Background(), serveFile(t, tt.file), userReq("hi"))
			if res.FinishReason != tt.finish {
				t.Fatalf("finish %q, want %q (err %v)", res.FinishReason, tt.finish, err)
			}
			if tt.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			requireError(t, err, tt.kind, tt.code, tt.cause)
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("cause quotes a URL's query: %v", err)
			}
		})
	}
}
