package deploytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/aws/aws-lambda-go/events"

	"github.com/agentloop/agentloop/functions/deploytest"
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
)

const (
	appSecret   = "rie-test-application-secret-0123456789"
	secretParam = "/agentloop-test/agent-secret"
	openAIParam = "/agentloop-test/openai-api-key"
)

// functionNames are the functions under the emulator, by their folder under functions/.
var functionNames = []string{"chat", "api", "subagent", "wake", "reaper"}

// built holds the emulator and the bootstraps, built for this machine once per test binary (each build links
// a whole binary: building them again for every test would cost minutes on a small machine). The tests that
// use them run in parallel, with each other and with the template's arm64 build (TestTemplateBuild): each
// mostly waits (for its build, its Node servers, its functions' cold starts).
var built struct {
	once      sync.Once
	dir       string
	rie       string
	bootstrap map[string]string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func buildAll() error {
	built.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		if built.dir, built.err = os.MkdirTemp("", "agentloop-rie-"); built.err != nil {
			return
		}
		var wg sync.WaitGroup
		var rieErr error
		wg.Go(func() {
			dir := filepath.Join(built.dir, "rie")
			if rieErr = os.MkdirAll(dir, 0o755); rieErr == nil {
				built.rie, rieErr = deploytest.BuildRIE(ctx, dir)
			}
		})
		// Host architecture: the emulator runs the bootstrap here, not on arm64. One go build for all of them.
		built.bootstrap, built.err = deploytest.BuildAll(ctx, functionNames, built.dir, runtime.GOOS, runtime.GOARCH)
		wg.Wait()
		built.err = errors.Join(built.err, rieErr)
	})
	return built.err
}

// emulated is what the emulator tests and benchmarks share: the emulator and every bootstrap built for this
// machine, dynalite with a table from template.yaml, the offline model, a stand-in SSM endpoint, and the job
// state machine on sfnlocal (lib/sfn/sfntest) with its two Lambda tasks bound to the subagent and wake
// bootstraps under their own emulators (taskProxy).
type emulated struct {
	rie       string
	bootstrap map[string]string // "chat", "api", ... → path
	table     string
	dynamo    string
	model     string
	ssm       *fakeSSM
	ssmURL    string
	token     string
	home      string
	sfn       *sfntest.Server
	tasks     *taskProxy
	// extra is more environment for one function (e.g. "subagent" → "AGENT_MODEL_RETRIES=0").
	extra map[string][]string
}

func newEmulated(t testing.TB) *emulated {
	t.Helper()
	e := startStack(t, func() (string, map[string]string, error) {
		err := buildAll()
		return built.rie, built.bootstrap, err
	})
	// The repository's state machine as deployed (its own numbers), its task states calling the bootstraps.
	cb := httptest.NewServer(e.tasks)
	t.Cleanup(cb.Close)
	e.sfn = sfntest.Start(t, sfntest.Options{Lambdas: map[string]string{
		sfntest.FunctionARN(sfntest.SubagentFunction): cb.URL + "/" + sfntest.SubagentFunction,
		sfntest.FunctionARN(sfntest.WakeFunction):     cb.URL + "/" + sfntest.WakeFunction,
	}})
	return e
}

// startStack starts what every function under the emulator needs: dynalite with a table from template.yaml, the
// offline model (with opts), the stand-in SSM endpoint and a token; build, run while dynalite starts, gives the
// emulator and the bootstraps. No state machine: e.sfn is nil.
func startStack(t testing.TB, build func() (rie string, bootstrap map[string]string, err error), opts ...offline.Option) *emulated {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := &emulated{home: t.TempDir(), extra: map[string][]string{}, tasks: &taskProxy{rie: map[string]*deploytest.RIE{}}}

	// Build the emulator and the bootstraps while dynalite starts.
	var buildErr error
	var wg sync.WaitGroup
	wg.Go(func() { e.rie, e.bootstrap, buildErr = build() })
	e.dynamo = dynamotest.Start(t)
	wg.Wait()
	if buildErr != nil {
		t.Fatal(buildErr)
	}

	e.table = "rie-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if err := dynamotest.CreateTable(ctx, dynamotest.Client(e.dynamo), e.table); err != nil {
		t.Fatal(err)
	}
	base, stop, err := offline.Start("127.0.0.1:0", opts...)
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

// env is the whole environment of one function under the emulator. The functions read their secrets from the
// stand-in SSM endpoint (the SDK honours AWS_ENDPOINT_URL_SSM), as in AWS, each only the ones it needs (the
// reaper none); the API function uses the plain AGENT_SECRET fallback, the path of local runs where there is no
// SSM at all. The functions that start executions (chat, wake, reaper) name the state machine on sfnlocal
// (AWS_ENDPOINT_URL_SFN), as the template names the deployed one, or, without it (startStack), one that is
// nowhere.
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
		// Lambda always sets the function's size; 128 MB is the smallest a function must fit in (issue 18 item 6).
		fmt.Sprintf("AWS_LAMBDA_FUNCTION_MEMORY_SIZE=%d", footprintMemoryMB),
		"TABLE_NAME=" + e.table,
		"OPENAI_BASE_URL=" + e.model,
		"AGENT_MODEL=offline",
	}
	switch name {
	case "chat", "wake":
		env = append(env, "AWS_ENDPOINT_URL_SSM="+e.ssmURL, "AGENT_SECRET_PARAM="+secretParam, "OPENAI_API_KEY_PARAM="+openAIParam)
	case "subagent":
		env = append(env, "AWS_ENDPOINT_URL_SSM="+e.ssmURL, "OPENAI_API_KEY_PARAM="+openAIParam,
			"AWS_LAMBDA_FUNCTION_TIMEOUT=330") // the template's
	case "api":
		env = append(env, "AGENT_SECRET="+appSecret)
	}
	switch {
	case name != "chat" && name != "wake" && name != "reaper":
	case e.sfn != nil:
		env = append(env, "AWS_ENDPOINT_URL_SFN="+e.sfn.Endpoint, "JOBS_STATE_MACHINE_ARN="+e.sfn.StateMachineARN)
	default:
		// No state machine (startStack): a name to start executions of, at an endpoint nothing listens on.
		env = append(env, "AWS_ENDPOINT_URL_SFN=http://127.0.0.1:9", "JOBS_STATE_MACHINE_ARN=arn:aws:states:"+sfntest.Region+":"+sfntest.Account+":stateMachine:none")
	}
	return append(env, e.extra[name]...)
}

// start starts name's bootstrap under its own emulator; the task functions also become what the state
// machine's task states call.
func (e *emulated) start(t testing.TB, name string) *deploytest.RIE {
	t.Helper()
	r, err := deploytest.StartRIE(e.rie, e.bootstrap[name], e.env(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	e.tasks.set(name, r)
	return r
}

// taskProxy answers sfnlocal's task calls (POST /subagent, POST /wake) as the Lambda Invoke API would, by
// invoking the function's bootstrap under its emulator: the function's output, or its error document with
// X-Amz-Function-Error (what makes the task fail with Error = errorType). An emulator that cannot be reached
// answers 502: Lambda.ServiceException, which the state machine retries.
type taskProxy struct {
	mu  sync.Mutex
	rie map[string]*deploytest.RIE
}

func (p *taskProxy) set(name string, r *deploytest.RIE) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rie[name] = r
}

func (p *taskProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	rie := p.rie[strings.TrimPrefix(r.URL.Path, "/")]
	p.mu.Unlock()
	payload, err := io.ReadAll(r.Body)
	if rie == nil || err != nil {
		http.Error(w, "no function "+r.URL.Path, http.StatusNotFound)
		return
	}
	status, out, err := rie.Invoke(r.Context(), payload)
	if err != nil || status != http.StatusOK {
		http.Error(w, fmt.Sprintf("emulator: %d %v", status, err), http.StatusBadGateway)
		return
	}
	if fe, _ := deploytest.ParseFunctionError(out); fe != nil {
		w.Header().Set(sfntest.FunctionErrorHeader, "Unhandled")
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
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
	t.Parallel()
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
		Threads []struct{ ID, Owner, Title string }
	}
	if p.StatusCode != http.StatusOK || p.Headers["Content-Type"] != "application/json" || json.Unmarshal(body, &list) != nil {
		t.Fatalf("threads: prelude %+v body %s", p, body)
	}
	if len(list.Threads) != 1 || list.Threads[0].ID != "th-rie" || list.Threads[0].Owner != "alice" {
		t.Fatalf("threads = %+v, want alice's th-rie", list.Threads)
	}
	// The chat function titled the thread before its invocation ended (issue 20 item 5: the offline model's title).
	if got := list.Threads[0].Title; got != "Hello lambda" {
		t.Fatalf("thread title %q, want the generated %q", got, "Hello lambda")
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
		if !memoryLimitLogged(r) {
			t.Errorf("%s: no memory limit set from AWS_LAMBDA_FUNCTION_MEMORY_SIZE=%d at cold start:\n%s", name, footprintMemoryMB, r.Logs())
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
	if len(files) < 6 {
		t.Fatalf("events/ holds %d events, want POST /chat, GET /chat/{id}/stream, GET /threads and the three task inputs", len(files))
	}
	// Every event fills in; the function URL requests decode as such, the task inputs as their functions'
	// input types, with every field known.
	tasks := map[string]any{"subagent-task.json": &agent.JobTask{}, "wake-task.json": &agent.JobTask{},
		"reaper-schedule.json": &events.EventBridgeEvent{}}
	for _, f := range files {
		name := filepath.Base(f)
		raw, err := deploytest.LoadPayload(name, vars2(f))
		if err != nil {
			t.Error(err)
			continue
		}
		into, isTask := tasks[name]
		if !isTask {
			if ev, err := deploytest.LoadEvent(name, vars2(f)); err != nil || ev.Request.RequestContext.HTTP.Method == "" {
				t.Errorf("%s: not a function URL request (%v) and no task input", name, err)
			}
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(into); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		delete(tasks, name)
	}
	for name := range tasks {
		t.Errorf("events/%s is missing", name)
	}
}

// vars2 gives every placeholder a harmless value.
func vars2(string) map[string]string {
	return map[string]string{"TOKEN": "t", "THREAD_ID": "th", "MESSAGE_ID": "m", "TEXT": "x", "JOB_ID": "job_1"}
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
	task := func(file string) []byte {
		p, err := deploytest.LoadPayload(file, map[string]string{"THREAD_ID": "th-none", "JOB_ID": "job_none"})
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	// The task functions' first request is as cheap: a job that does not exist (one GetItem), a sweep of an
	// empty table.
	requests := map[string][]byte{
		"chat":     e.event(b, "chat-stream.json", "th-none", ""),
		"api":      e.event(b, "threads-list.json", "", ""),
		"subagent": task("subagent-task.json"),
		"wake":     task("wake-task.json"),
		"reaper":   task("reaper-schedule.json"),
	}
	for _, name := range functionNames {
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
				if name == "chat" || name == "api" {
					p, _ := invoke(b, r, requests[name])
					b.StopTimer()
					if p.StatusCode >= 500 {
						b.Fatalf("status %d:\n%s", p.StatusCode, r.Logs())
					}
				} else {
					out, fe := invokeTask(b, r, requests[name])
					b.StopTimer()
					if fe != nil {
						b.Fatalf("%s: %s\n%s", name, out, r.Logs())
					}
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
