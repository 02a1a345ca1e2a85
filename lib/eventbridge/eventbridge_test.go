package eventbridge_test

// There is no EventBridge emulator among the project's test servers (dynalite is DynamoDB's only): the sink runs the real SDK client against an httptest server that decodes the SDK's real
// PutEvents request (JSON 1.1 protocol, X-Amz-Target AWSEvents.PutEvents) and answers as EventBridge does. What
// the bus does with the event afterwards (rules, targets) is EventBridge's, configured in template.yaml.

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/eventbridge"
	"github.com/agentloop/agentloop/lib/toolschema"
)

// putEvents is the request as the SDK sends it.
type putEvents struct {
	Entries []struct {
		Source       string
		DetailType   string
		Detail       string
		EventBusName string
		Time         float64
	}
}

// fakeBus is the httptest stand-in for EventBridge's PutEvents.
type fakeBus struct {
	mu      sync.Mutex
	got     []putEvents
	targets []string
	failing bool // answer every entry as not taken
}

func (f *fakeBus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = append(f.targets, r.Header.Get("X-Amz-Target"))
	var in putEvents
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.got = append(f.got, in)
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	if f.failing {
		_, _ = io.WriteString(w, `{"FailedEntryCount":1,"Entries":[{"ErrorCode":"InternalFailure","ErrorMessage":"try again"}]}`)
		return
	}
	_, _ = io.WriteString(w, `{"FailedEntryCount":0,"Entries":[{"EventId":"11710aed-b79e-4468-a20b-bb3c0c3b4860"}]}`)
}

func client(t *testing.T, h http.Handler) *awseb.Client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return awseb.New(awseb.Options{Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")})
}

var finished = time.Date(2031, 3, 4, 5, 6, 7, 891_000_000, time.UTC)

func signals() []agent.RunFinished {
	base := agent.Run{ID: "run_1", ThreadID: "th_1", Trigger: agent.TriggerUser, Model: "gpt-test", Steps: 3,
		Usage: agent.Usage{InputTokens: 100, OutputTokens: 20, TotalTokens: 120, CachedInputTokens: 64, CacheWriteTokens: 8,
			ReasoningTokens: 5, CostMicroUSD: 1234},
		CreatedAt: finished.Add(-time.Minute), FinishedAt: finished}
	var out []agent.RunFinished
	for _, st := range []agent.RunStatus{agent.RunCompleted, agent.RunInterrupted, agent.RunCanceled, agent.RunFailed} {
		r := base
		r.Status = st
		if st == agent.RunFailed {
			r.Error = &agent.RunError{Code: agent.CodeStale, Message: "The run stopped unexpectedly."}
			r.Trigger, r.Model, r.Steps, r.Usage = agent.TriggerUnknown, "", 0, agent.Usage{}
		}
		f := agent.Finished(r, "alice")
		f.Attempt = 1
		out = append(out, f)
	}
	return out
}

func schema(t *testing.T) json.RawMessage {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "infra", "events", "run-finished.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := toolschema.Compile(b); err != nil {
		t.Fatalf("the schema does not compile: %v", err)
	}
	return b
}

// Each status's event, as the SDK put it on the wire, is on the default bus with the source and detail-type a
// rule matches, and its detail matches infra/events/run-finished.schema.json and carries no message text.
func TestPutEventsMatchesSchema(t *testing.T) {
	t.Parallel()
	sch := schema(t)
	fake := &fakeBus{}
	bus := eventbridge.New(client(t, fake), eventbridge.Options{})
	for _, f := range signals() {
		if err := bus.Send(t.Context(), f); err != nil {
			t.Fatalf("Send(%s): %v", f.Status, err)
		}
	}
	if len(fake.got) != 4 {
		t.Fatalf("%d requests, want 4", len(fake.got))
	}
	for i, in := range fake.got {
		if fake.targets[i] != "AWSEvents.PutEvents" {
			t.Fatalf("X-Amz-Target = %q", fake.targets[i])
		}
		if len(in.Entries) != 1 {
			t.Fatalf("%d entries", len(in.Entries))
		}
		e := in.Entries[0]
		if e.Source != "agentloop" || e.DetailType != "agentloop.run.finished" || e.EventBusName != "default" ||
			int64(e.Time) != finished.Unix() {
			t.Fatalf("entry %+v", e)
		}
		if err := toolschema.ValidateJSON(sch, json.RawMessage(e.Detail)); err != nil {
			t.Fatalf("detail %s does not match the schema: %v", e.Detail, err)
		}
		if strings.Contains(e.Detail, "stopped unexpectedly") {
			t.Fatalf("the detail carries the error's message text: %s", e.Detail)
		}
	}
	// The schema is no rubber stamp: a detail with message text, or without usage, is refused.
	for _, bad := range []string{
		`{"signalId":"msg_run_1","threadId":"th_1","runId":"run_1","owner":"a","trigger":"user","status":"completed","errorCode":"","model":"","steps":0,"usage":{"inputTokens":0,"outputTokens":0,"totalTokens":0,"cachedInputTokens":0,"cacheWriteTokens":0,"reasoningTokens":0,"costMicroUsd":0},"createdAt":"2031-03-04T05:06:07Z","finishedAt":"2031-03-04T05:06:07Z","attempt":1,"text":"hello"}`,
		`{"signalId":"msg_run_1","threadId":"th_1","runId":"run_1","owner":"a","trigger":"user","status":"running","errorCode":"","model":"","steps":0,"createdAt":"2031-03-04T05:06:07Z","finishedAt":"2031-03-04T05:06:07Z","attempt":1}`,
	} {
		if toolschema.ValidateJSON(sch, json.RawMessage(bad)) == nil {
			t.Fatalf("the schema accepts %s", bad)
		}
	}
}

// An entry EventBridge did not take is a failed attempt (lib/signals retries it).
func TestFailedEntryIsAnError(t *testing.T) {
	t.Parallel()
	bus := eventbridge.New(client(t, &fakeBus{failing: true}), eventbridge.Options{})
	if err := bus.Send(t.Context(), signals()[0]); err == nil || !strings.Contains(err.Error(), "InternalFailure") {
		t.Fatalf("Send = %v, want the entry's error", err)
	}
}

// The local stack's sink: one log line per signal, whose detail matches the schema too.
func TestLogSink(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	if err := (eventbridge.Log{Logger: log}).Send(t.Context(), signals()[3]); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1", len(lines))
	}
	var line struct {
		M      string `json:"msg"`
		S      string `json:"source"`
		D      string `json:"detail_type"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatal(err)
	}
	if line.M != "agentloop.run.finished" || line.S != "agentloop" || line.D != "agentloop.run.finished" {
		t.Fatalf("line %s", lines[0])
	}
	if err := toolschema.ValidateJSON(schema(t), json.RawMessage(line.Detail)); err != nil {
		t.Fatalf("logged detail: %v", err)
	}
}
