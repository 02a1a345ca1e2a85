package deploytest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/functions/deploytest"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/offline"
)

const (
	appSecret   = "rie-test-application-secret-0123456789"
	secretParam = "/agentloop-test/agent-secret"
	openAIParam = "/agentloop-test/openai-api-key"
)

// emulated is what the emulator tests and benchmarks share: the emulator and both bootstraps built for this
// machine, dynalite with a table from template.yaml, the offline model, and a stand-in SSM endpoint.
type emulated struct {
	rie       string
	bootstrap map[string]string // "chat", "api" → path
	table     string
	dynamo    string
	model     string
	ssm       *fakeSSM
	ssmURL    string
	token     string
	home      string
}

func newEmulated(t testing.TB) *emulated {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := &emulated{bootstrap: map[string]string{}, home: t.TempDir()}

	// Build the emulator and the bootstraps while dynalite starts.
	var wg sync.WaitGroup
	var errs [3]error
	var rie string
	paths := map[string]*string{}
	for _, name := range []string{"chat", "api"} {
		paths[name] = new(string)
	}
	dirs := map[string]string{"chat": t.TempDir(), "api": t.TempDir()}
	wg.Go(func() { rie, errs[0] = deploytest.BuildRIE(ctx, t.TempDir()) })
	wg.Go(func() {
		// Host architecture: the emulator runs the bootstrap here, not on arm64.
		*paths["chat"], errs[1] = deploytest.Build(ctx, "./functions/chat", dirs["chat"], runtime.GOOS, runtime.GOARCH)
		if errs[1] == nil {
			*paths["api"], errs[2] = deploytest.Build(ctx, "./functions/api", dirs["api"], runtime.GOOS, runtime.GOARCH)
		}
	})
	e.dynamo = dynamotest.Start(t)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	e.rie = rie
	for name, p := range paths {
		e.bootstrap[name] = *p
	}

	e.table = "rie-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if err := dynamotest.CreateTable(ctx, dynamotest.Client(e.dynamo), e.table); err != nil {
		t.Fatal(err)
	}
	base, stop, err := offline.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	e.model = base
	e.ssm = &fakeSSM{params: map[string]string{secretParam: appSecret, openAIParam: "sk-offline"}}
	srv := httptest.NewServer(e.ssm)
	t.Cleanup(srv.Close)
	e.ssmURL = srv.URL
	e.token, err = auth.MintHS256([]byte(appSecret), "alice", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// env is the whole environment of one function under the emulator. The chat function reads its secrets from
// the stand-in SSM endpoint (the SDK honours AWS_ENDPOINT_URL_SSM), as in AWS; the API function uses the plain
// AGENT_SECRET fallback, the path of local runs where there is no SSM at all.
func (e *emulated) env(name string) []string {
	env := []string{
		"HOME=" + e.home, // no ~/.aws of the machine running the tests
		"AWS_REGION=" + dynamotest.Region,
		"AWS_ACCESS_KEY_ID=" + dynamotest.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + dynamotest.SecretKey,
		"AWS_EC2_METADATA_DISABLED=true",
		"AWS_ENDPOINT_URL_DYNAMODB=" + e.dynamo,
		"AWS_LAMBDA_LOG_FORMAT=JSON",
		"AWS_LAMBDA_FUNCTION_NAME=agentloop-" + name,
		"TABLE_NAME=" + e.table,
		"OPENAI_BASE_URL=" + e.model,
		"AGENT_MODEL=offline",
	}
	if name == "chat" {
		return append(env, "AWS_ENDPOINT_URL_SSM="+e.ssmURL, "AGENT_SECRET_PARAM="+secretParam, "OPENAI_API_KEY_PARAM="+openAIParam)
	}
	return append(env, "AGENT_SECRET="+appSecret)
}

func (e *emulated) start(t testing.TB, name string) *deploytest.RIE {
	t.Helper()
	r, err := deploytest.StartRIE(e.rie, e.bootstrap[name], e.env(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func (e *emulated) event(t testing.TB, file, thread, text string) []byte {
	t.Helper()
	ev, err := deploytest.LoadEvent(file, map[string]string{"TOKEN": e.token, "THREAD_ID": thread, "MESSAGE_ID": "msg-" + thread, "TEXT": text})
	if err != nil {
		t.Fatal(err)
	}
	return ev.Raw
}

// invoke sends one event and splits the buffered streaming reply.
func invoke(t testing.TB, r *deploytest.RIE, payload []byte) (deploytest.Prelude, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	status, raw, err := r.Invoke(ctx, payload)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK {
		t.Fatalf("emulator answered %d: %s\nlogs:\n%s", status, raw, r.Logs())
	}
	p, body, err := deploytest.SplitStreamingResponse(raw)
	if err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, r.Logs())
	}
	return p, body
}

// Each built bootstrap, started under the Lambda Runtime Interface Emulator, answers the events of events/
// against dynalite with the function URL streaming framing and a complete stream; secrets come from SSM at
// cold start (once for the container's life) or, without SSM names, from the plain fallback; logs are JSON.
func TestBootstrapUnderRIE(t *testing.T) {
	e := newEmulated(t)
	chat := e.start(t, "chat")
	api := e.start(t, "api")

	// POST /chat: a whole reply, framed as a streaming function URL response.
	p, body := invoke(t, chat, e.event(t, "chat-post.json", "th-rie", "hello lambda"))
	if p.StatusCode != http.StatusOK || p.Headers["Content-Type"] != "text/event-stream" || p.Headers["X-Vercel-Ai-Ui-Message-Stream"] != "v1" {
		t.Fatalf("prelude %+v", p)
	}
	s, err := deploytest.ParseStream(body)
	if err != nil {
		t.Fatal(err)
	}
	if s.Text != "You said: hello lambda" || s.ErrorText != "" {
		t.Fatalf("reply text %q (error %q), want the offline model's echo", s.Text, s.ErrorText)
	}

	// GET /chat/{id}/stream after the run: 204 with an empty body.
	p, body = invoke(t, chat, e.event(t, "chat-stream.json", "th-rie", ""))
	if p.StatusCode != http.StatusNoContent || len(body) != 0 {
		t.Fatalf("resume after the run: prelude %+v body %q, want 204 and nothing", p, body)
	}

	// GET /threads on the API function sees the thread the chat function wrote: one table, two functions.
	p, body = invoke(t, api, e.event(t, "threads-list.json", "", ""))
	var list struct {
		Threads []struct{ ID, Owner string }
	}
	if p.StatusCode != http.StatusOK || p.Headers["Content-Type"] != "application/json" || json.Unmarshal(body, &list) != nil {
		t.Fatalf("threads: prelude %+v body %s", p, body)
	}
	if len(list.Threads) != 1 || list.Threads[0].ID != "th-rie" || list.Threads[0].Owner != "alice" {
		t.Fatalf("threads = %+v, want alice's th-rie", list.Threads)
	}

	// The secrets were read from SSM once, with decryption, for both chat invocations.
	calls := e.ssm.calls()
	if len(calls) != 1 || !calls[0].WithDecryption || len(calls[0].Names) != 2 {
		t.Fatalf("SSM GetParameters calls %+v, want one for both names with decryption", calls)
	}

	for name, r := range map[string]*deploytest.RIE{"chat": chat, "api": api} {
		var coldStart map[string]any
		for _, rec := range r.FunctionLogs() {
			if rec["message"] == "cold start" {
				coldStart = rec
			}
		}
		if coldStart == nil || coldStart["level"] != "INFO" || coldStart["timestamp"] == nil || coldStart["table"] != e.table {
			t.Errorf("%s: no JSON cold start record (lambdacontext.NewLogHandler) in:\n%s", name, r.Logs())
			continue
		}
		if want := name == "chat"; coldStart["secrets_from_ssm"] != want {
			t.Errorf("%s: secrets_from_ssm = %v, want %v", name, coldStart["secrets_from_ssm"], want)
		}
		if r.InitDuration() <= 0 {
			t.Errorf("%s: the emulator reported no init phase:\n%s", name, r.Logs())
		}
	}
}

// A framing error is caught: SplitStreamingResponse rejects replies that are not prelude + 8 NULs + body.
func TestSplitStreamingResponse(t *testing.T) {
	t.Parallel()
	nul8 := "\x00\x00\x00\x00\x00\x00\x00\x00"
	tests := []struct {
		name    string
		raw     string
		status  int
		body    string
		wantErr bool
	}{
		{name: "stream", raw: `{"statusCode":200,"headers":{"Content-Type":"text/event-stream"}}` + nul8 + "data: [DONE]\n\n", status: 200, body: "data: [DONE]\n\n"},
		{name: "empty body", raw: `{"statusCode":204}` + nul8, status: 204},
		{name: "body with NULs", raw: `{"statusCode":200}` + nul8 + "a" + nul8, status: 200, body: "a" + nul8},
		{name: "buffered JSON reply", raw: `{"statusCode":200,"body":"x"}`, wantErr: true},
		{name: "unknown prelude field", raw: `{"statusCode":200,"body":"x"}` + nul8, wantErr: true},
		{name: "no status", raw: `{"headers":{}}` + nul8, wantErr: true},
		{name: "garbage prelude", raw: `hello` + nul8, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, body, err := deploytest.SplitStreamingResponse([]byte(tt.raw))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && (p.StatusCode != tt.status || string(body) != tt.body) {
				t.Fatalf("got %d %q, want %d %q", p.StatusCode, body, tt.status, tt.body)
			}
		})
	}
}

// LoadEvent fills every placeholder and refuses a missing one or a value that would break the JSON.
func TestLoadEvent(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"TOKEN": "tok", "THREAD_ID": "th-1", "MESSAGE_ID": "m-1", "TEXT": "/slow 3"}
	ev, err := deploytest.LoadEvent("chat-post.json", vars)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		ID       string
		Trigger  string
		Messages []struct {
			ID    string
			Parts []struct{ Text string }
		}
	}
	if err := json.Unmarshal([]byte(ev.Request.Body), &body); err != nil {
		t.Fatalf("body %q: %v", ev.Request.Body, err)
	}
	if ev.Request.Headers["authorization"] != "Bearer tok" || ev.Request.RequestContext.HTTP.Method != "POST" ||
		body.ID != "th-1" || body.Trigger != "submit-message" || body.Messages[0].ID != "m-1" || body.Messages[0].Parts[0].Text != "/slow 3" {
		t.Fatalf("event %+v body %+v", ev.Request, body)
	}
	if _, err := deploytest.LoadEvent("chat-post.json", map[string]string{"TOKEN": "tok"}); err == nil {
		t.Error("missing placeholders accepted")
	}
	vars["TEXT"] = `say "hi"`
	if _, err := deploytest.LoadEvent("chat-post.json", vars); err == nil {
		t.Error("a value needing JSON escaping accepted")
	}
	root, _ := deploytest.RepoRoot()
	files, _ := filepath.Glob(filepath.Join(root, "events", "*.json"))
	if len(files) < 3 {
		t.Fatalf("events/ holds %d events, want POST /chat, GET /chat/{id}/stream and GET /threads", len(files))
	}
	for _, f := range files {
		if _, err := deploytest.LoadEvent(filepath.Base(f), vars2(f)); err != nil {
			t.Error(err)
		}
	}
}

// vars2 gives every placeholder a harmless value.
func vars2(string) map[string]string {
	return map[string]string{"TOKEN": "t", "THREAD_ID": "th", "MESSAGE_ID": "m", "TEXT": "x"}
}

// fakeSSM stands in for SSM Parameter Store (GetParameters over the JSON protocol), since there is no SSM
// locally. It serves every parameter as a SecureString and records the requests.
type fakeSSM struct {
	params map[string]string

	mu       sync.Mutex
	requests []ssmRequest
}

type ssmRequest struct {
	Names          []string `json:"Names"`
	WithDecryption bool     `json:"WithDecryption"`
}

func (f *fakeSSM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req ssmRequest
	b, _ := io.ReadAll(r.Body)
	if r.Header.Get("X-Amz-Target") != "AmazonSSM.GetParameters" || json.Unmarshal(b, &req) != nil {
		http.Error(w, `{"__type":"ValidationException","message":"unexpected request"}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()
	type param struct{ Name, Type, Value string }
	out := struct {
		Parameters        []param
		InvalidParameters []string
	}{Parameters: []param{}, InvalidParameters: []string{}}
	for _, n := range req.Names {
		v, ok := f.params[n]
		if !ok {
			out.InvalidParameters = append(out.InvalidParameters, n)
			continue
		}
		out.Parameters = append(out.Parameters, param{Name: n, Type: "SecureString", Value: v})
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeSSM) calls() []ssmRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ssmRequest(nil), f.requests...)
}

// BenchmarkColdStart measures, per function, the cold start under the emulator: from starting the emulator
// process to the complete first response (ns/op; each op is a fresh process), with the function's own init
// phase as the emulator reports it (init-ms), and the size of the linux/arm64 bootstrap that `make build`
// ships (arm64-bytes). The first request is a cheap authenticated read (one DynamoDB request or two).
func BenchmarkColdStart(b *testing.B) {
	e := newEmulated(b)
	requests := map[string][]byte{
		"chat": e.event(b, "chat-stream.json", "th-none", ""),
		"api":  e.event(b, "threads-list.json", "", ""),
	}
	for _, name := range []string{"chat", "api"} {
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			arm, err := deploytest.Build(context.Background(), "./functions/"+name, dir, "linux", "arm64")
			if err != nil {
				b.Fatal(err)
			}
			st, err := os.Stat(arm)
			if err != nil {
				b.Fatal(err)
			}
			var init time.Duration
			for b.Loop() {
				r, err := deploytest.StartRIE(e.rie, e.bootstrap[name], e.env(name))
				if err != nil {
					b.Fatal(err)
				}
				p, _ := invoke(b, r, requests[name])
				b.StopTimer()
				if p.StatusCode >= 500 {
					b.Fatalf("status %d:\n%s", p.StatusCode, r.Logs())
				}
				init += r.InitDuration()
				_ = r.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(init.Microseconds())/1000/float64(b.N), "init-ms")
			b.ReportMetric(float64(st.Size()), "arm64-bytes")
		})
	}
}
