package bedrockconverse

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"

	"github.com/agentloop/agentloop/lib/agent"
)

// recorded frames a testdata/*.events file as ConverseStream's answer: one event-stream message per line, an
// event (:event-type, :content-type application/json, :message-type event) or an exception (:exception-type,
// :message-type exception). The files are hand-written from the event shapes AWS documents for ConverseStream
// (the "p" padding, metrics, cacheDetails, redactedContent and guardrail stop included), not captures of the live
// service.
func recorded(t *testing.T, file string) []byte {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	enc := eventstream.NewEncoder()
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var line struct {
			Event, Exception string
			Payload          json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		msg := eventstream.Message{Payload: line.Payload, Headers: eventstream.Headers{
			{Name: ":event-type", Value: eventstream.StringValue(line.Event)},
			{Name: ":content-type", Value: eventstream.StringValue("application/json")},
			{Name: ":message-type", Value: eventstream.StringValue("event")},
		}}
		if line.Exception != "" {
			msg.Headers = eventstream.Headers{
				{Name: ":exception-type", Value: eventstream.StringValue(line.Exception)},
				{Name: ":content-type", Value: eventstream.StringValue("application/json")},
				{Name: ":message-type", Value: eventstream.StringValue("exception")},
			}
		}
		if err := enc.Encode(&out, msg); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

func recordedModel(t *testing.T, file string) (*Model, *atomic.Int64) {
	t.Helper()
	stream := recorded(t, file)
	var n atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
		_, _ = w.Write(stream)
	}))
	t.Cleanup(ts.Close)
	return New(Config{BaseURL: ts.URL, AWS: staticAWS(), Model: testModel, BackoffBase: time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}), &n
}

// TestRecorded: Bedrock's documented event shapes read as the offline model's are, and the details it does not
// produce: a redacted reasoning block kept for replay, an empty first input fragment, a tool call with no input,
// cache details, a guardrail stop, and an exception mid-stream after text (not retried).
func TestRecorded(t *testing.T) {
	t.Parallel()
	m, _ := recordedModel(t, "reasoning_tool_use.events")
	res, events, err := run(context.Background(), m, user("weather in Paris?"))
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventReasoningDelta); got != "The user wants the weather in Paris." {
		t.Errorf("reasoning = %q", got)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Let me check the weather." {
		t.Errorf("text = %q", got)
	}
	calls := callsOf(events)
	if len(calls) != 2 || calls[0].Arguments != `{"city": "Paris"}` || calls[1].Name != "get_time" || calls[1].Arguments != "{}" {
		t.Errorf("calls = %+v", calls)
	}
	want := agent.Usage{InputTokens: 15 + 2048 + 1024, CachedInputTokens: 2048, CacheWriteTokens: 1024, OutputTokens: 87, TotalTokens: 3174}
	if res.FinishReason != agent.FinishToolCalls || res.Usage != want || res.Model != testModel {
		t.Errorf("result = %+v", res)
	}
	if got := string(res.ReasoningData); got != `{"converse":[{"text":"The user wants the weather in Paris.","signature":"EqoBCkgIARABGAIiQL3nJ8k0sZp"},{"redacted":"c2VjcmV0IHJlYXNvbmluZw=="}]}` {
		t.Errorf("reasoning data = %s", got)
	}
	// Replayed first in the assistant message, as sent.
	msgs, err := messages([]agent.ModelMessage{user("q"), {Role: "assistant", ReasoningData: res.ReasoningData, ToolCalls: calls}}, true)
	if err != nil || len(msgs) != 2 || len(msgs[1].Content) != 4 {
		t.Fatalf("replayed = %+v, %v", msgs, err)
	}

	m, _ = recordedModel(t, "guardrail.events")
	res, _, err = run(context.Background(), m, user("something"))
	if err != nil || res.FinishReason != agent.FinishContentFilter {
		t.Errorf("guardrail: %+v, %v", res, err)
	}

	m, n := recordedModel(t, "stream_error.events")
	_, events, err = run(context.Background(), m, user("a story"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "failed (ModelStreamErrorException)")
	if n.Load() != 1 || textOf(events, agent.EventTextDelta) != "Once upon" {
		t.Errorf("requests %d, events %+v", n.Load(), events)
	}
}
