package anthropic

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/offline"
)

// bedrockEvents encodes the events of a hand-written Anthropic SSE file (testdata) as Bedrock's
// InvokeModelWithResponseStream answers them: one event-stream "chunk" message per event, whose payload's
// "bytes" is the event's JSON in base64 (the framing AWS documents; not a capture of the live service).
func bedrockEvents(t *testing.T, file string) []byte {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	enc := eventstream.NewEncoder()
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || strings.Contains(data, `"ping"`) {
			continue
		}
		payload, _ := json.Marshal(map[string]string{"bytes": base64.StdEncoding.EncodeToString([]byte(data))})
		msg := eventstream.Message{Payload: payload, Headers: eventstream.Headers{
			{Name: ":message-type", Value: eventstream.StringValue("event")},
			{Name: ":event-type", Value: eventstream.StringValue("chunk")},
			{Name: ":content-type", Value: eventstream.StringValue("application/json")},
		}}
		if err := enc.Encode(&out, msg); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

// TestBedrock: with Config.Bedrock the request goes to InvokeModelWithResponseStream for the model id, signed
// with SigV4, with Bedrock's anthropic_version in the body and no model or stream field; the event stream it
// answers is read as the direct API's SSE is. Only this recorded-response test covers Bedrock.
func TestBedrock(t *testing.T) {
	t.Parallel()
	const modelID = "anthropic.claude-sonnet-4-5-20250929-v1:0"
	stream := bedrockEvents(t, "thinking_tool_use.sse")
	var gotPath, gotAuth string
	var gotBody map[string]any
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotAuth = r.URL.EscapedPath(), r.Header.Get("Authorization")
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &gotBody)
		w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
		_, _ = w.Write(stream)
	}))
	t.Cleanup(ts.Close)
	awsCfg := aws.Config{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	m := New(Config{Bedrock: true, AWS: &awsCfg, BaseURL: ts.URL, Model: modelID, BackoffBase: time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	res, events, err := run(context.Background(), m, user("weather in Paris?"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "/model/" + strings.ReplaceAll(modelID, ":", "%3A") + "/invoke-with-response-stream"; gotPath != want && gotPath != "/model/"+modelID+"/invoke-with-response-stream" {
		t.Errorf("path = %s, want %s", gotPath, want)
	}
	if !strings.HasPrefix(gotAuth, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") || !strings.Contains(gotAuth, "/eu-west-1/bedrock/aws4_request") {
		t.Errorf("authorization = %q", gotAuth)
	}
	if gotBody["anthropic_version"] != BedrockVersion || gotBody["model"] != nil || gotBody["stream"] != nil || gotBody["messages"] == nil {
		t.Errorf("body = %v", gotBody)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Let me check the weather." {
		t.Errorf("text = %q", got)
	}
	calls := callsOf(events)
	if len(calls) != 1 || calls[0].Name != "get_weather" || res.FinishReason != agent.FinishToolCalls || res.Usage.CachedInputTokens != 2048 ||
		res.ReasoningData == nil {
		t.Errorf("calls %+v, result %+v", calls, res)
	}
}

// TestBedrockException: an exception message in Bedrock's event stream (throttling before any output) is an
// error event to the SDK; it is retried, and reported as a mid-stream failure once retries are spent.
func TestBedrockException(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	payload := []byte(`{"message":"Too many requests, please wait before trying again."}`)
	if err := eventstream.NewEncoder().Encode(&out, eventstream.Message{Payload: payload, Headers: eventstream.Headers{
		{Name: ":message-type", Value: eventstream.StringValue("exception")},
		{Name: ":exception-type", Value: eventstream.StringValue("throttlingException")},
		{Name: ":content-type", Value: eventstream.StringValue("application/json")},
	}}); err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
		_, _ = w.Write(out.Bytes())
	}))
	t.Cleanup(ts.Close)
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	m := New(Config{Bedrock: true, AWS: &awsCfg, BaseURL: ts.URL, Model: "anthropic.claude-x", BackoffBase: time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	_, _, err := run(context.Background(), m, user("hi"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "mid-stream")
	if n := requests.Load(); n != 3 {
		t.Errorf("requests = %d, want 3", n)
	}
}

// TestBedrockRefusals: Bedrock's HTTP errors ({"message": …}, the type in x-amzn-ErrorType) are classified by
// their message as Anthropic's are: a prompt over the context window is too long, a throttled request retried.
func TestBedrockRefusals(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status   int
		typ, msg string
		kind     agent.Kind
		code     string
		contains string
		requests int32
	}{
		{400, "ValidationException", "Input is too long for requested model.", agent.KindTooLarge, agent.CodeMessageTooLarge, "too long", 1},
		{400, "ValidationException", "messages: roles must alternate", agent.KindUnavailable, agent.CodeModelError, "HTTP 400", 1},
		{429, "ThrottlingException", "Too many requests, please wait before trying again.", agent.KindUnavailable, agent.CodeModelError, "HTTP 429", 3},
	}
	for _, tc := range cases {
		t.Run(tc.msg, func(t *testing.T) {
			t.Parallel()
			var requests atomic.Int32
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Amzn-Errortype", tc.typ+":http://internal.amazon.com/coral/com.amazon.bedrock/")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(`{"message":"` + tc.msg + `"}`))
			}))
			t.Cleanup(ts.Close)
			awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
			m := New(Config{Bedrock: true, AWS: &awsCfg, BaseURL: ts.URL, Model: "anthropic.claude-x", BackoffBase: time.Millisecond,
				Logger: slog.New(slog.DiscardHandler)})
			_, _, err := run(context.Background(), m, user("hi"))
			requireError(t, err, tc.kind, tc.code, tc.contains)
			if n := requests.Load(); n != tc.requests {
				t.Errorf("requests = %d, want %d", n, tc.requests)
			}
		})
	}
}

// TestBedrockOffline: the Bedrock variant end to end over HTTP against the offline model's InvokeModel route
// (Bedrock's event-stream framing, its errors): text, a thinking tool round replayed, a throttled request
// retried, an exception mid-stream before any output retried.
func TestBedrockOffline(t *testing.T) {
	t.Parallel()
	srv := offline.New(offline.WithWordDelay(time.Millisecond))
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	m := New(Config{Bedrock: true, AWS: &awsCfg, BaseURL: ts.URL, Model: "anthropic.claude-x:0", ThinkingBudget: 1024,
		BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()

	res, events, err := run(ctx, m, user(`/tool echo {"v":1}`))
	if err != nil {
		t.Fatal(err)
	}
	calls := callsOf(events)
	if len(calls) != 1 || res.Model != "anthropic.claude-x:0" || res.ReasoningData == nil || res.Usage.InputTokens == 0 {
		t.Fatalf("calls %+v result %+v", calls, res)
	}
	res, events, err = run(ctx, m, user(`/tool echo {"v":1}`),
		agent.ModelMessage{Role: "assistant", ReasoningData: res.ReasoningData, ToolCalls: calls},
		agent.ModelMessage{Role: "tool", ToolCallID: calls[0].ID, Text: "1"})
	if err != nil || textOf(events, agent.EventTextDelta) != "Tool echo returned: 1" || res.FinishReason != agent.FinishStop {
		t.Fatalf("err %v text %q result %+v", err, textOf(events, agent.EventTextDelta), res)
	}
	// Without thinking (which would be output before the failure), so that failures come before any output.
	m = New(Config{Bedrock: true, AWS: &awsCfg, BaseURL: ts.URL, Model: "anthropic.claude-x:0", BackoffBase: time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	before := srv.Requests()
	if _, _, err := run(ctx, m, user("/error 429")); err == nil || srv.Requests()-before != 3 {
		t.Errorf("throttled: %v after %d requests", err, srv.Requests()-before)
	}
	requireErrorNoOutput := func(text, contains string) {
		t.Helper()
		before := srv.Requests()
		_, events, err := run(ctx, m, user(text))
		requireError(t, err, agent.KindUnavailable, agent.CodeModelError, contains)
		if srv.Requests()-before != 3 || textOf(events, agent.EventTextDelta) != "" {
			t.Errorf("%s: %d requests, events %v", text, srv.Requests()-before, events)
		}
	}
	requireErrorNoOutput("/error 529 after 0", "mid-stream")
	// Unsigned, the offline model refuses as Bedrock does.
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/model/x/invoke-with-response-stream", strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("unsigned: %d", resp.StatusCode)
	}
}

// TestBedrockModelIDs: the model id is one path label, escaped as the AWS SDK escapes it (an inference profile's
// ARN keeps no ":" or "/"), under the endpoint's own path; the offline model reads it back and answers with it.
func TestBedrockModelIDs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ endpoint, model, want string }{
		{"https://bedrock-runtime.us-east-1.amazonaws.com", "anthropic.claude-x-v1:0",
			"https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-x-v1%3A0/invoke-with-response-stream"},
		{"http://127.0.0.1:9/proxy/", "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-x-v1:0",
			"http://127.0.0.1:9/proxy/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-x-v1%3A0/invoke-with-response-stream"},
	} {
		u, err := bedrockURL(tc.endpoint, tc.model)
		if err != nil || u.String() != tc.want {
			t.Errorf("%s %s: %v %v, want %s", tc.endpoint, tc.model, u, err, tc.want)
		}
	}
	srv := httptest.NewServer(offline.New(offline.WithWordDelay(0)))
	t.Cleanup(srv.Close)
	const arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-x-v1:0"
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	m := New(Config{Bedrock: true, AWS: &awsCfg, BaseURL: srv.URL, Model: arn, Logger: slog.New(slog.DiscardHandler)})
	res, _, err := run(context.Background(), m, user("hi"))
	if err != nil || res.Model != arn {
		t.Errorf("result %+v, err %v", res, err)
	}
	// No region anywhere: every request fails at once, saying so.
	m = New(Config{Bedrock: true, AWS: &aws.Config{Credentials: awsCfg.Credentials}, Model: "m", Logger: slog.New(slog.DiscardHandler)})
	_, _, err = run(context.Background(), m, user("hi"))
	requireError(t, err, agent.KindInternal, agent.CodeModelError, "no AWS region")
	// No credentials: the request is not sent, nor retried.
	m = New(Config{Bedrock: true, AWS: &aws.Config{Region: "us-east-1"}, BaseURL: srv.URL, Model: "m", Logger: slog.New(slog.DiscardHandler)})
	_, _, err = run(context.Background(), m, user("hi"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "no AWS credentials")
}
