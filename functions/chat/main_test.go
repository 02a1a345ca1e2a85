package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/functions/deploytest"
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
)

const secret = "lambda-form-test-secret-0123456789abcdef"

type fixture struct {
	handler http.Handler
	// endpoint and table are the DynamoDB server and table the handler uses.
	endpoint, table string
	// cold builds another handler as a cold start of main does, over the same table.
	cold  func() http.Handler
	token string
	// release lets the gated model finish its reply.
	release func()
}

// setup builds the chat handler exactly as main does (newHandler), over a fresh table in DynamoDB Local and the
// offline model behind a gate: the model streams its first words, then holds the rest until release is called.
// The gate makes "the handler is still running" a fact rather than a race. Step Functions requests go to
// jobs when it is set (an sfntest server), else to an endpoint that refuses them.
// toolsFile is a valid tools file: one MCP server (down: nothing listens, so turns go on without it) and one HTTP
// tool.
const toolsFile = `mcpServers:
  - name: docs
    url: http://127.0.0.1:1/mcp
    headers: {Authorization: "Bearer ${env:DOCS_TOKEN}"}
httpTools:
  - name: create_ticket
    description: Open a ticket.
    inputSchema: {type: object, properties: {team: {type: string}}, required: [team]}
    method: POST
    url: https://api.example.com/teams/{team}/tickets
    headers: {X-Api-Key: "${env:BACKEND_API_KEY}"}
`

func setup(t *testing.T, endpoint string, jobs ...*sfntest.Jobs) *fixture {
	t.Helper()
	ctx := context.Background()
	table := "chat-" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-")
	if err := dynamotest.CreateTable(ctx, dynamotest.Client(endpoint), table); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	model := httptest.NewServer(gated(offline.New(offline.WithWordDelay(time.Millisecond)), gate))
	t.Cleanup(model.Close)
	// Never leave the model blocked, whatever the test did. Cleanups run last-in first-out: this one runs before
	// model.Close, which waits for the model's open replies.
	t.Cleanup(release)

	// The function starts with a tools file in its package, as a deployment bundles it (its HTTP tool offered).
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bundle"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bundle", "tools.yaml"), []byte(toolsFile), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"LAMBDA_TASK_ROOT":       root,
		"AGENT_TOOLS_FILE":       "bundle/tools.yaml",
		"BACKEND_API_KEY":        "k1",
		"DOCS_TOKEN":             "d1",
		"TABLE_NAME":             table,
		"AGENT_SECRET":           secret,
		"OPENAI_BASE_URL":        model.URL + "/v1/",
		"AGENT_MODEL":            "offline",
		"AGENT_SEGMENT_FLUSH":    "20ms",
		"JOBS_STATE_MACHINE_ARN": sfntest.FunctionARN("none"), // no state machine: a start is refused
	}
	stepFunctions := "http://127.0.0.1:1" // nothing listens: a start fails at once
	if len(jobs) > 0 {
		env["JOBS_STATE_MACHINE_ARN"], stepFunctions = jobs[0].Server.StateMachineARN, jobs[0].Server.Endpoint
	}
	awsCfg := aws.Config{
		Region:       dynamotest.Region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(dynamotest.AccessKey, dynamotest.SecretKey, ""),
		HTTPClient:   &http.Client{Transport: toStepFunctions(stepFunctions)},
	}
	cold := func() http.Handler {
		h, err := newHandler(ctx, func(k string) string { return env[k] }, awsCfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	tok, err := auth.MintHS256([]byte(secret), "alice", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{handler: cold(), cold: cold, token: tok, release: release, endpoint: endpoint, table: table}
}

// toStepFunctions sends the Step Functions requests (AWS JSON 1.0, X-Amz-Target AWSStepFunctions.*) of a
// client configured with one base endpoint for every service to endpoint instead, and every other request on.
func toStepFunctions(endpoint string) http.RoundTripper {
	u, err := url.Parse(endpoint)
	if err != nil {
		panic(err)
	}
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.HasPrefix(r.Header.Get("X-Amz-Target"), "AWSStepFunctions.") {
			r = r.Clone(r.Context())
			r.URL.Scheme, r.URL.Host, r.Host = u.Scheme, u.Host, u.Host
		}
		return http.DefaultTransport.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// gated serves next, but once a reply has streamed a non-empty piece of content, every further write waits
// until gate is closed.
func gated(next http.Handler, gate <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&gateWriter{ResponseWriter: w, gate: gate}, r)
	})
}

type gateWriter struct {
	http.ResponseWriter
	gate <-chan struct{}
	hold bool
}

func (g *gateWriter) Write(p []byte) (int, error) {
	if g.hold {
		<-g.gate
	}
	n, err := g.ResponseWriter.Write(p)
	if bytes.Contains(p, []byte(`"content":"`)) && !bytes.Contains(p, []byte(`"content":""`)) {
		g.hold = true
	}
	return n, err
}

func (g *gateWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// guard bounds every wait of these tests, so that a regression (a buffered reply, a stream that never ends)
// fails the test instead of hanging it. It is no performance bound: the waits normally take milliseconds.
const guard = 30 * time.Second

// within runs fn and fails the test when it has not returned after guard.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		fn()
	}()
	select {
	case <-finished:
	case <-time.After(guard):
		t.Fatalf("%s: still waiting after %s", what, guard)
	}
}

// invoke runs one function URL request through lambdaurl.Wrap, as the Lambda runtime does. done is closed when
// the http.Handler's ServeHTTP returns.
func (f *fixture) invoke(t *testing.T, req *events.LambdaFunctionURLRequest) (resp *events.LambdaFunctionURLStreamingResponse, done <-chan struct{}) {
	t.Helper()
	finished := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(finished)
		f.handler.ServeHTTP(w, r)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	var err error
	within(t, "the response head", func() { resp, err = lambdaurl.Wrap(h)(ctx, req) })
	if err != nil {
		t.Fatal(err)
	}
	return resp, finished
}

// readAll reads r to its end and waits for done.
func readAll(t *testing.T, r io.Reader, done <-chan struct{}) []byte {
	t.Helper()
	var b []byte
	var err error
	within(t, "the end of the body", func() {
		b, err = io.ReadAll(r)
		<-done // the body's EOF comes from the handler's return
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fixture) event(t *testing.T, name, thread, text string) *events.LambdaFunctionURLRequest {
	t.Helper()
	ev, err := deploytest.LoadEvent(name, map[string]string{"TOKEN": f.token, "THREAD_ID": thread, "MESSAGE_ID": "msg-" + thread, "TEXT": text})
	if err != nil {
		t.Fatal(err)
	}
	return ev.Request
}

// nextChunk reads one SSE frame and returns its chunk type ("[DONE]" for the end marker) and the raw frame.
func nextChunk(r *bufio.Reader) (typ string, frame string, err error) {
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", b.String(), fmt.Errorf("stream ended inside a frame (read %q): %w", b.String(), err)
		}
		b.WriteString(line)
		if line == "\n" {
			break
		}
	}
	payload := strings.TrimSuffix(strings.TrimPrefix(b.String(), "data: "), "\n\n")
	if payload == "[DONE]" {
		return payload, b.String(), nil
	}
	var c struct{ Type string }
	if err := json.Unmarshal([]byte(payload), &c); err != nil {
		return "", b.String(), fmt.Errorf("frame %q: %w", b.String(), err)
	}
	return c.Type, b.String(), nil
}

// untilText reads frames up to and including the first text-delta and returns them.
func untilText(r *bufio.Reader) (string, error) {
	var head strings.Builder
	for {
		typ, frame, err := nextChunk(r)
		head.WriteString(frame)
		switch {
		case err != nil:
			return head.String(), err
		case typ == "text-delta":
			return head.String(), nil
		case typ == "finish" || typ == "[DONE]":
			return head.String(), fmt.Errorf("reply ended before any text: %q", head.String())
		}
	}
}

// TestLambdaForm drives main's chat handler the way Lambda does (lambdaurl.Wrap with the events of events/),
// against DynamoDB Local. One DynamoDB Local serves every subtest; each has its own table.
func TestLambdaForm(t *testing.T) {
	endpoint := dynamotest.Start(t)

	// Chunks leave while the handler runs: the first text-delta is read from the streaming body while the model
	// (gated) cannot have finished, so ServeHTTP has not returned. A resumed stream (GET /chat/{id}/stream)
	// attached mid-run replays the same reply from its start; both end complete once the model goes on.
	t.Run("streams before the handler returns", func(t *testing.T) {
		t.Parallel()
		f := setup(t, endpoint)
		resp, done := f.invoke(t, f.event(t, "chat-post.json", "th-stream", "/slow 5"))
		if resp.StatusCode != http.StatusOK || resp.Headers["Content-Type"] != "text/event-stream" ||
			resp.Headers["X-Vercel-Ai-Ui-Message-Stream"] != "v1" {
			t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Headers)
		}
		body := bufio.NewReader(resp.Body)
		var head string
		var err error
		within(t, "the first text-delta", func() { head, err = untilText(body) })
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
			t.Fatal("ServeHTTP returned before the model finished: the reply was buffered, not streamed")
		default:
		}

		resumed, resumeDone := f.invoke(t, f.event(t, "chat-stream.json", "th-stream", ""))
		if resumed.StatusCode != http.StatusOK {
			t.Fatalf("resume status %d, want 200 while the run is active", resumed.StatusCode)
		}
		f.release()

		orig, err := deploytest.ParseStream(append([]byte(head), readAll(t, body, done)...))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(orig.Text); strings.Join(got, " ") != "word1 word2 word3 word4 word5" {
			t.Fatalf("text = %q, want the five /slow words", orig.Text)
		}
		again, err := deploytest.ParseStream(readAll(t, resumed.Body, resumeDone))
		if err != nil {
			t.Fatal(err)
		}
		if again.MessageID != orig.MessageID || again.Text != orig.Text {
			t.Fatalf("resumed reply = (%s, %q), want (%s, %q)", again.MessageID, again.Text, orig.MessageID, orig.Text)
		}

		// The run is over: nothing to resume.
		idle, idleDone := f.invoke(t, f.event(t, "chat-stream.json", "th-stream", ""))
		b := readAll(t, idle.Body, idleDone)
		if idle.StatusCode != http.StatusNoContent || len(b) != 0 {
			t.Fatalf("resume after the run: %d %q, want 204 and no body", idle.StatusCode, b)
		}
	})

	// A pending approval survives a cold start: the answer, posted to a new handler (a new Lambda sandbox: nothing
	// in memory), verifies against the stored request and continues the same message.
	t.Run("approval across a cold start", func(t *testing.T) {
		t.Parallel()
		f := setup(t, endpoint)
		f.release()
		post := func(body any) []byte {
			ev := f.event(t, "chat-post.json", "th-cold", "x")
			b, _ := json.Marshal(body)
			ev.Body = string(b)
			resp, done := f.invoke(t, ev)
			out := readAll(t, resp.Body, done)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			return out
		}
		user := func(id, text string) map[string]any {
			return map[string]any{"id": "th-cold", "trigger": "submit-message", "messages": []any{
				map[string]any{"id": id, "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}}}}
		}
		added := post(user("u1", `/tool add_note {"text":"cold"}`))
		noteID := regexp.MustCompile(`note_[0-9a-f]+`).Find(added)
		asked, err := deploytest.ParseStream(post(user("u2", fmt.Sprintf(`/tool delete_note {"id":%q}`, noteID))))
		if err != nil {
			t.Fatal(err)
		}
		var req map[string]any
		for _, c := range asked.Chunks {
			if c["type"] == "tool-approval-request" {
				req = c
			}
		}
		if req == nil {
			t.Fatalf("no approval request: %+v", asked.Chunks)
		}
		f.handler = f.cold()
		answer := map[string]any{"id": "th-cold", "trigger": "submit-message", "messageId": asked.MessageID, "messages": []any{
			map[string]any{"id": asked.MessageID, "role": "assistant", "parts": []any{
				map[string]any{"type": "step-start"},
				map[string]any{"type": "tool-delete_note", "toolCallId": req["toolCallId"], "state": "approval-responded",
					"input": map[string]any{"id": string(noteID)}, "approval": map[string]any{"id": req["approvalId"], "approved": true}}}}}}
		done, err := deploytest.ParseStream(post(answer))
		if err != nil {
			t.Fatal(err)
		}
		if done.MessageID != asked.MessageID || !strings.Contains(done.Text, "deleted") {
			t.Fatalf("continuation %s %q, want %s to go on and report the delete", done.MessageID, done.Text, asked.MessageID)
		}
	})

	// A job tool's call starts the job's execution of the state machine (named by the job id, with the job as
	// its input) and acknowledges at once; the state machine then runs the sub-agent task and delivery.
	t.Run("a job tool starts its execution", func(t *testing.T) {
		t.Parallel()
		jobs := sfntest.StartJobs(t, agent.DefaultJobContract())
		f := setup(t, endpoint, jobs)
		f.release()
		var mu sync.Mutex
		var calls []string
		record := func(what string, in agent.JobTask) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, fmt.Sprintf("%s %s %s", what, in.ThreadID, in.JobID))
		}
		jobs.Route(t, "th-job",
			sfntest.Function(func(_ context.Context, in agent.JobTask) (agent.JobTask, error) {
				record("subagent", in)
				return in, nil
			}),
			sfntest.Function(func(_ context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
				record("deliver", in)
				return agent.DeliveryResult{ThreadID: in.ThreadID, JobID: in.JobID, Status: agent.DeliveredSteer}, nil
			}))
		ev := f.event(t, "chat-post.json", "th-job", "x")
		body, _ := json.Marshal(map[string]any{"id": "th-job", "trigger": "submit-message", "messages": []any{map[string]any{
			"id": "u1", "role": "user", "parts": []any{map[string]any{"type": "text", "text": `/tool research {"question":"why is the sky blue"}`}}}}})
		ev.Body = string(body)
		resp, done := f.invoke(t, ev)
		s, err := deploytest.ParseStream(readAll(t, resp.Body, done))
		if err != nil {
			t.Fatal(err)
		}
		var jobID string
		for _, c := range s.Chunks {
			if out, ok := c["output"].(map[string]any); ok && c["type"] == "tool-output-available" {
				jobID, _ = out["jobId"].(string)
			}
		}
		if jobID == "" || s.ErrorText != "" {
			t.Fatalf("no job acknowledgement in %+v", s.Chunks)
		}
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		if err := jobs.Wait(ctx, jobID); err != nil {
			t.Fatal(err)
		}
		out, err := jobs.Describe(ctx, jobID)
		if err != nil {
			t.Fatalf("no execution named %s: %v", jobID, err)
		}
		var in agent.JobTask
		if out.Status != "SUCCEEDED" || json.Unmarshal([]byte(aws.ToString(out.Input)), &in) != nil || in != (agent.JobTask{ThreadID: "th-job", JobID: jobID}) {
			t.Fatalf("execution %s: %s, input %s", jobID, out.Status, aws.ToString(out.Input))
		}
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"subagent th-job " + jobID, "deliver th-job " + jobID}; !slices.Equal(calls, want) {
			t.Fatalf("task calls %q, want %q", calls, want)
		}
	})

	// Lambda freezes the environment once the response ends, so the thread's title (issue 20 item 5) is made
	// after the stream's last byte and before the handler returns: when ServeHTTP has returned, the offline
	// model's title is stored.
	t.Run("titles the thread before the handler returns", func(t *testing.T) {
		t.Parallel()
		f := setup(t, endpoint)
		f.release()
		resp, done := f.invoke(t, f.event(t, "chat-post.json", "th-title", "plan a trip to lisbon in may"))
		b := readAll(t, resp.Body, done)
		if !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
			t.Fatalf("stream %s", b)
		}
		th, err := dynamo.New(dynamotest.Client(f.endpoint), f.table).GetThread(context.Background(), "th-title")
		if err != nil {
			t.Fatal(err)
		}
		if want := "Plan a trip to lisbon in"; th.Title != want {
			t.Fatalf("title %q when the handler returned, want %q", th.Title, want)
		}
	})

	// Errors before the first byte are plain JSON replies with their status in the prelude.
	t.Run("rejects a bad token", func(t *testing.T) {
		t.Parallel()
		f := setup(t, endpoint)
		f.token = "not-a-jwt"
		resp, done := f.invoke(t, f.event(t, "chat-post.json", "th-unauth", "hello"))
		b := readAll(t, resp.Body, done)
		var e struct{ Error struct{ Code string } }
		if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(b, &e) != nil || e.Error.Code != auth.CodeInvalidToken {
			t.Fatalf("got %d %s, want 401 %s", resp.StatusCode, b, auth.CodeInvalidToken)
		}
	})
}

// newHandler refuses to start half-configured: a cold start that fails is visible at once in Lambda's init error,
// while a function that starts without its table or secret would fail every request.
func TestSetupRejectsBadConfig(t *testing.T) {
	t.Parallel()
	base := map[string]string{"TABLE_NAME": "t", "AGENT_SECRET": secret, "JOBS_STATE_MACHINE_ARN": sfntest.FunctionARN("jobs")}
	root := t.TempDir()
	bad := "httpTools:\n  - name: t\n    description: d\n    method: FETCH\n    url: https://api.example.com/x\n"
	if err := os.WriteFile(filepath.Join(root, "tools.yaml"), []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "env.yaml"), []byte(toolsFile), 0o600); err != nil {
		t.Fatal(err)
	}
	// Issue 19: the role may read only the parameters under AGENT_TOOLS_SECRETS_PATH (the template's grant), so a
	// reference outside it fails the start at its line, before anything asks SSM (it used to be an AccessDenied).
	ssmFile := "httpTools:\n  - name: t\n    description: d\n    url: https://api.example.com/x\n    headers:\n      Authorization: \"Bearer ${ssm:/agentloop/agent-secret}\"\n"
	if err := os.WriteFile(filepath.Join(root, "ssm.yaml"), []byte(ssmFile), 0o600); err != nil {
		t.Fatal(err)
	}
	// Issue 19: the tools file kept in SSM (AGENT_TOOLS_FILE=ssm:<name>) is read at cold start through the SDK; a
	// parameter that does not exist fails the start saying what to create. SSM is a fake endpoint that knows no
	// parameter (real SSM cannot run here); every case talks to it, never to AWS.
	noParams := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if r.Header.Get("X-Amz-Target") != "AmazonSSM.GetParameter" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"__type":"AccessDeniedException","message":"not this test's"}`)
			return
		}
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"__type":"ParameterNotFound","message":""}`)
	}))
	t.Cleanup(noParams.Close)
	awsCfg := aws.Config{Region: "us-east-1", BaseEndpoint: aws.String(noParams.URL),
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", ""), RetryMaxAttempts: 1}
	tests := []struct {
		name string
		drop string
		set  map[string]string
		want string // in the error, when set
	}{
		{name: "tools file parameter missing", set: map[string]string{"AGENT_TOOLS_FILE": "ssm:/agentloop/tools"},
			want: "aws ssm put-parameter --region us-east-1 --type String --name /agentloop/tools --value file://tools.yaml"},
		{name: "tools file parameter not a name", set: map[string]string{"AGENT_TOOLS_FILE": "ssm:agentloop-tools"}, want: "AGENT_TOOLS_FILE"},
		{name: "bad tools file", set: map[string]string{"LAMBDA_TASK_ROOT": root, "AGENT_TOOLS_FILE": "tools.yaml"},
			want: `tools.yaml:4: httpTools[0].method: "FETCH" is not an HTTP method`},
		{name: "missing tools file", set: map[string]string{"LAMBDA_TASK_ROOT": root, "AGENT_TOOLS_FILE": "gone.yaml"}, want: "gone.yaml"},
		{name: "tools file reference unset", set: map[string]string{"LAMBDA_TASK_ROOT": root, "AGENT_TOOLS_FILE": "env.yaml"}, want: "BACKEND_API_KEY"},
		{name: "tools file reference outside the SSM path", set: map[string]string{"LAMBDA_TASK_ROOT": root, "AGENT_TOOLS_FILE": "ssm.yaml",
			"AGENT_TOOLS_SECRETS_PATH": "/agentloop/tools/"},
			want: "ssm.yaml:6: httpTools[0].headers.Authorization: ${ssm:/agentloop/agent-secret} is outside the SSM path the functions may read, /agentloop/tools/"},
		{name: "tools file reference without an SSM path", set: map[string]string{"LAMBDA_TASK_ROOT": root, "AGENT_TOOLS_FILE": "ssm.yaml"},
			want: "ssm.yaml:6: httpTools[0].headers.Authorization: ${ssm:/agentloop/agent-secret}: no SSM path is granted"},
		{name: "bad tools secrets path", set: map[string]string{"AGENT_TOOLS_SECRETS_PATH": "/"}, want: "AGENT_TOOLS_SECRETS_PATH"},
		{name: "no table", drop: "TABLE_NAME"},
		{name: "no secret", drop: "AGENT_SECRET"},
		{name: "no state machine", drop: "JOBS_STATE_MACHINE_ARN"},
		{name: "weak secret", set: map[string]string{"AGENT_SECRET": "short"}},
		{name: "bad bound", set: map[string]string{"AGENT_RUN_TIMEOUT": "forever"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				if k != tt.drop {
					env[k] = v
				}
			}
			for k, v := range tt.set {
				env[k] = v
			}
			_, err := newHandler(context.Background(), func(k string) string { return env[k] }, awsCfg, slog.New(slog.DiscardHandler))
			if err == nil {
				t.Fatal("newHandler succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to say %s", err, tt.want)
			}
		})
	}
}
