package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// dynalite is the one DynamoDB-compatible server the serve tests share (one Node start for the package; each
// test makes its own table), started on first use and stopped by TestMain (closeDynalite).
var dynalite struct {
	once sync.Once
	srv  *dynamotest.Server
	err  error
}

func dynaliteEndpoint(t *testing.T) string {
	t.Helper()
	dynalite.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a first `npm ci` included
		defer cancel()
		dynalite.srv, dynalite.err = dynamotest.Launch(ctx)
	})
	if dynalite.err != nil {
		if dynamotest.SkipRequested() {
			t.Skipf("dynalite unavailable (%s=1): %v", dynamotest.SkipEnv, dynalite.err)
		}
		t.Fatalf("dynalite: %v (set %s=1 to skip these tests)", dynalite.err, dynamotest.SkipEnv)
	}
	return dynalite.srv.Endpoint
}

func closeDynalite() {
	if dynalite.srv != nil {
		if err := dynalite.srv.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// serveSecret is the AGENT_SECRET every replica of a test shares (and `agentloop token` mints with).
const serveSecret = "serve-test-secret-0123456789abcdef0123456789"

// serveEnv is the environment of a replica (and of `agentloop token` for it) on table at endpoint: the offline
// model, no SSM, no Step Functions, env overriding the rest.
func serveEnv(endpoint, table string, env ...string) []string {
	return append(append(os.Environ(), "OPENAI_API_KEY=", "AGENT_SECRET_PARAM=", "AGENT_MODELS_FILE=", "JOBS_STATE_MACHINE_ARN=",
		"AGENT_TOOLS_FILE=", "AGENT_JWT_AUDIENCE=", "AGENT_JWT_ISSUER=", "AGENT_JWKS_URL=",
		"AGENTLOOP_DYNAMO_ENDPOINT="+endpoint, "TABLE_NAME="+table, "AGENT_SECRET="+serveSecret), env...)
}

type serveProc struct {
	cmd    *exec.Cmd
	url    string
	lines  chan string // stdout after the banner
	stderr *bytes.Buffer
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// startServe starts `agentloop serve` on a free port with args and env (serveEnv's) and reads its banner.
func startServe(t *testing.T, bin string, env []string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, lines: make(chan string, 64), stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("agentloop serve %s stderr (tail):\n%s", p.url, tail(p.log(), 4000))
		}
	})
	deadline := time.After(time.Minute)
	for p.url == "" {
		select {
		case line, ok := <-p.lines:
			if !ok {
				<-p.exited
				t.Fatalf("agentloop serve exited before serving (%v): %s", p.err, p.log())
			}
			p.url, _ = strings.CutPrefix(line, "agentloop serve serving on ")
			if p.url == line {
				p.url = ""
			}
		case <-deadline:
			t.Fatal("agentloop serve printed no URL within a minute")
		}
	}
	return p
}

// log is what the process wrote to stderr so far.
func (p *serveProc) log() string {
	w := p.cmd.Stderr.(*lockedWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.String()
}

// wait waits for the process to exit by itself and returns Wait's error.
func (p *serveProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(time.Minute):
		t.Fatal("agentloop serve did not exit within a minute")
		return nil
	}
}

// line waits for a stdout line starting with prefix.
func (p *serveProc) line(t *testing.T, prefix string) string {
	t.Helper()
	for l := range p.lines {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("agentloop serve printed no line starting %q", prefix)
	return ""
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func tail(s string, n int) string { return s[max(len(s)-n, 0):] }

// mintServeToken runs `agentloop token` in env (serveEnv's: TABLE_NAME and AGENT_SECRET set).
func mintServeToken(t *testing.T, bin string, env []string, user string) string {
	t.Helper()
	cmd := exec.Command(bin, "token", "--user", user)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agentloop token: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

func tableName(t *testing.T) string {
	return fmt.Sprintf("serve-%s-%d", strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-"), time.Now().UnixNano())
}

// postStream posts a user message to /chat and returns the open streaming response.
func postStream(t *testing.T, url, tok, thread, msgID, text string) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"id":%q,"trigger":"submit-message","messages":[{"id":%q,"role":"user","parts":[{"type":"text","text":%q}]}]}`, thread, msgID, text)
	req, _ := http.NewRequest("POST", url+"/chat", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("POST /chat: %d %s", resp.StatusCode, b)
	}
	return resp
}

// readUntil reads r until what it read contains want, and returns what it read.
func readUntil(t *testing.T, r io.Reader, want string) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte(want)) {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("stream ended before %q (%v): %s", want, err, got)
		}
	}
	return got
}

// threadView is what the serve tests read of GET /threads/{id}.
type threadView struct {
	Thread struct {
		ActiveRun *struct{ RunID string } `json:"activeRun"`
	}
	Messages []struct {
		ID       string
		Role     string
		Parts    []struct{ Type, Text string }
		Metadata struct{ Status string }
	}
}

func (v threadView) reply() (status, text string) {
	for i := len(v.Messages) - 1; i >= 0; i-- {
		m := v.Messages[i]
		if m.Role == "assistant" {
			var b strings.Builder
			for _, p := range m.Parts {
				if p.Type == "text" {
					b.WriteString(p.Text)
				}
			}
			return m.Metadata.Status, b.String()
		}
	}
	return "", ""
}

func getThread(t *testing.T, url, tok, id string) threadView {
	t.Helper()
	status, body := request(t, "GET", url+"/threads/"+id, tok, "")
	var v threadView
	if err := json.Unmarshal(body, &v); err != nil || status != 200 {
		t.Fatalf("GET /threads/%s: %d %s", id, status, body)
	}
	return v
}

// eventually polls check every 50 ms until it reports true, failing t after a minute with what it said last.
func eventually(t *testing.T, what string, check func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, last := check()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after a minute; last: %s", what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Two `agentloop serve` replicas on one dynalite table: the first creates the table (--create-table), the second
// finds it. Both are ready (GET /readyz); a token `agentloop token` mints with TABLE_NAME and the same
// AGENT_SECRET is taken by both, a dev token (aud agentloop-dev, same secret) by neither. The AI SDK's own chat
// client (AbstractChat, ai@6.0.0, ai@6 and ai@7) runs the human-in-the-loop scenarios against each replica, and a
// reply streamed by one is resumed on the other: both streams parse with the SDK's parsers into the same message.
func TestServeReplicas(t *testing.T) {
	t.Parallel()
	bin, data := setup(t)
	endpoint := dynaliteEndpoint(t)
	env := serveEnv(endpoint, tableName(t))
	a := startServe(t, bin, env, "--create-table")
	b := startServe(t, bin, env)
	tok := mintServeToken(t, bin, env, "alice")

	devCmd := exec.Command(bin, "token", "--user", "alice", "--data", data)
	devCmd.Env = append(os.Environ(), "TABLE_NAME=", "AGENT_SECRET_PARAM=", "AGENT_SECRET="+serveSecret)
	devTok, err := devCmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*serveProc{a, b} {
		if status, body := request(t, "GET", p.url+"/readyz", "", ""); status != 200 || !bytes.Contains(body, []byte(`"store":"ok"`)) ||
			!bytes.Contains(body, []byte(`"model":"ok"`)) {
			t.Fatalf("%s/readyz: %d %s", p.url, status, body)
		}
		if status, body := request(t, "GET", p.url+"/threads", tok, ""); status != 200 {
			t.Fatalf("serve token refused by %s: %d %s", p.url, status, body)
		}
		if status, body := request(t, "GET", p.url+"/threads", strings.TrimSpace(string(devTok)), ""); status != 401 {
			t.Fatalf("dev token taken by %s: %d %s", p.url, status, body)
		}
	}

	// The web app is served as the API function serves it: no dev token route, a page that asks for a token.
	if status, body := request(t, "GET", a.url+"/config.json", "", ""); status != 200 || bytes.Contains(body, []byte("devTokenUrl")) {
		t.Fatalf("/config.json: %d %s, want the web app's configuration without devTokenUrl", status, body)
	}
	if status, body := request(t, "POST", a.url+"/dev/token", "", ""); status != 404 {
		t.Fatalf("POST /dev/token: %d %s, want 404 (serve mints no token over HTTP)", status, body)
	}

	// A reply streamed by A, resumed on B while it streams.
	resp := postStream(t, a.url, tok, "across", "m1", "/slow 40") // long enough for B to attach while it streams, even under load
	first := readUntil(t, resp.Body, "word2")
	status, resumed := request(t, "GET", b.url+"/chat/across/stream", tok, "")
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || status != 200 {
		t.Fatalf("resume on B: %d (%v)", status, err)
	}
	direct := append(first, rest...)
	parsed := aisdktest.CheckStreams(t, direct, resumed)
	for i, sdk := range aisdktest.SDKs {
		d, r := aisdktest.OfFile(parsed, 0)[i], aisdktest.OfFile(parsed, 1)[i]
		if d.Message.ID == "" || d.Message.ID != r.Message.ID || d.FinishReason != "stop" || r.FinishReason != "stop" {
			t.Fatalf("ai@%s: direct %s (%s), resumed %s (%s): want one message, finished", sdk, d.Message.ID, d.FinishReason, r.Message.ID, r.FinishReason)
		}
		dt, _ := json.Marshal(d.Message.Parts)
		rt, _ := json.Marshal(r.Message.Parts)
		if !bytes.Equal(dt, rt) || !bytes.Contains(dt, []byte("word40")) {
			t.Fatalf("ai@%s: the resumed stream's message differs:\ndirect  %s\nresumed %s", sdk, dt, rt)
		}
	}
	if st, text := getThread(t, b.url, tok, "across").reply(); st != "completed" || !strings.HasSuffix(text, "word40") {
		t.Fatalf("the reply as B reads it: %s %q", st, text)
	}

	// The SDK's chat client against each replica, at once.
	var wg sync.WaitGroup
	for _, run := range []struct {
		p         *serveProc
		scenarios []string
	}{
		{a, []string{aisdktest.ScenarioApprove}},
		{b, []string{aisdktest.ScenarioDeny, aisdktest.ScenarioClientTool}},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chatScenarios(t, &devProc{url: run.p.url, token: tok}, run.scenarios...)
		}()
	}
	wg.Wait()
}

// The claim timing of the serve tests that kill or drain a replica: a claim goes stale after 6 s. The
// replicas share one dynalite, which under a loaded make test took longer than half of a 1 s AGENT_STALE_AFTER
// to answer a heartbeat: the run then put itself in doubt and stopped before the test's kill (TestServeKilled…:
// "stream ended before word3", the run failed run_fenced), or before its tool was called (TestServeDrainHandsOver
// waited on it for ever). The reaps these tests wait for come that much later.
const (
	serveHeartbeat  = "AGENT_HEARTBEAT=250ms"
	serveStaleAfter = "AGENT_STALE_AFTER=6s"
)

// One replica killed with SIGKILL in the middle of a reply: the other replica's reaper ticker reaps its run
// (failed, code stale), keeping what was stored of the reply, and the thread takes the next message there. A
// replica started while the run streams leaves it alone.
func TestServeKilledReplicaIsReaped(t *testing.T) {
	t.Parallel()
	bin, _ := setup(t)
	endpoint := dynaliteEndpoint(t)
	env := serveEnv(endpoint, tableName(t), serveHeartbeat, serveStaleAfter, "AGENT_REAPER_INTERVAL=200ms")
	a := startServe(t, bin, env, "--create-table")
	b := startServe(t, bin, env)
	tok := mintServeToken(t, bin, env, "alice")

	resp := postStream(t, a.url, tok, "killed", "m1", "/slow 200")
	readUntil(t, resp.Body, "word3")
	// A replica that starts while A's run streams reaps nothing at start (dev's start-up reap, which its data
	// directory's lock makes safe, would take a live run here): A's reply streams on.
	startServe(t, bin, env)
	if got := readUntil(t, resp.Body, "word25"); bytes.Contains(got, []byte(`"type":"error"`)) {
		t.Fatalf("A's run was cut when a replica started: %s", got)
	}
	// B sees A's run on the thread: the claim is in the table.
	if v := getThread(t, b.url, tok, "killed"); v.Thread.ActiveRun == nil {
		t.Fatalf("B does not see A's run: %+v", v)
	}
	_ = a.cmd.Process.Kill()
	<-a.exited
	resp.Body.Close()

	eventually(t, "B reaps A's run", func() (bool, string) {
		status, body := request(t, "GET", b.url+"/threads/killed/runs", tok, "")
		return status == 200 && bytes.Contains(body, []byte(`"status":"failed"`)) && bytes.Contains(body, []byte(`"code":"stale"`)), string(body)
	})
	v := getThread(t, b.url, tok, "killed")
	if st, text := v.reply(); v.Thread.ActiveRun != nil || st != "failed" {
		t.Fatalf("after the reap: active run %v, reply %s %q", v.Thread.ActiveRun, st, text)
	}
	status, stream := request(t, "POST", b.url+"/chat", tok,
		`{"id":"killed","trigger":"submit-message","messages":[{"id":"m2","role":"user","parts":[{"type":"text","text":"still there?"}]}]}`)
	if status != 200 || !bytes.Contains(stream, []byte(`"finishReason":"stop"`)) {
		t.Fatalf("next message on B: %d %s", status, stream)
	}
}

// SIGTERM with a run in flight: the replica refuses new chat requests at once (503 draining, with a Retry-After),
// and so does GET /readyz, while the run goes on; within AGENT_DRAIN_GRACE it finishes, its stream ends normally
// and the stored reply is complete; the process exits 0. With a grace shorter than the reply, the run is stopped
// at its end as the stop endpoint stops one: the stream ends, the reply keeps what was streamed, marked canceled,
// the claim is released, and the process exits 0 all the same.
func TestServeDrain(t *testing.T) {
	t.Parallel()
	bin, _ := setup(t)
	endpoint := dynaliteEndpoint(t)
	table := tableName(t)
	other := startServe(t, bin, serveEnv(endpoint, table), "--create-table")
	tok := mintServeToken(t, bin, serveEnv(endpoint, table), "alice")
	tests := []struct {
		name, grace, prompt string
		wantStatus, wantRun string // the stored reply's status, the run's
		wantLine            string // serve's drained line
		wantText            func(string) bool
	}{
		{"finishes within the grace", "1m", "/slow 50", "completed", `"status":"completed"`, "agentloop serve drained: 1 runs finished, 0 stopped, 0 left to the reaper, 0 handed over",
			func(s string) bool { return strings.HasSuffix(s, "word50") }},
		{"stopped after the grace", "5s", "/slow 300", "canceled", `"status":"canceled"`, "agentloop serve drained: 0 runs finished, 1 stopped, 0 left to the reaper, 0 handed over",
			func(s string) bool { return strings.Contains(s, "word2") && !strings.Contains(s, "word300") }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startServe(t, bin, serveEnv(endpoint, table, "AGENT_DRAIN_GRACE="+tt.grace))
			thread := fmt.Sprintf("drain%d", i)
			resp := postStream(t, p.url, tok, thread, "m1", tt.prompt)
			defer resp.Body.Close()
			first := readUntil(t, resp.Body, "word2")
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			// Once the drain has begun (its log line: the gate is closed before it), new work is refused.
			eventually(t, "the drain begins", func() (bool, string) {
				return strings.Contains(p.log(), `"msg":"drain.begin"`), tail(p.log(), 300)
			})
			req, _ := http.NewRequest("POST", p.url+"/chat", strings.NewReader(
				`{"id":"`+thread+`-new","trigger":"submit-message","messages":[{"id":"n1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`))
			req.Header.Set("Authorization", "Bearer "+tok)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 503 || !bytes.Contains(body, []byte(`"code":"draining"`)) || res.Header.Get("Retry-After") == "" {
				t.Fatalf("a new message while draining: %d %s Retry-After %q, want 503 draining with a Retry-After", res.StatusCode, body, res.Header.Get("Retry-After"))
			}
			if status, body := request(t, "GET", p.url+"/readyz", "", ""); status != 503 || !bytes.Contains(body, []byte(`"code":"draining"`)) {
				t.Fatalf("readyz while draining: %d %s", status, body)
			}
			if status, _ := request(t, "GET", p.url+"/healthz", "", ""); status != 200 {
				t.Fatalf("healthz while draining: %d", status)
			}
			rest, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("the in-flight stream: %v", err)
			}
			stream := append(first, rest...)
			if !bytes.Contains(stream, []byte(`"type":"finish"`)) || !bytes.HasSuffix(stream, []byte("data: [DONE]\n\n")) {
				t.Fatalf("the in-flight stream did not end normally: %s", tail(string(stream), 600))
			}
			if line := p.line(t, "agentloop serve drained:"); line != tt.wantLine {
				t.Errorf("serve printed %q, want %q", line, tt.wantLine)
			}
			if err := p.wait(t); err != nil {
				t.Fatalf("serve exited with %v after SIGTERM, want 0", err)
			}
			v := getThread(t, other.url, tok, thread)
			if st, text := v.reply(); v.Thread.ActiveRun != nil || st != tt.wantStatus || !tt.wantText(text) {
				t.Fatalf("the stored reply: active run %v, %s %q", v.Thread.ActiveRun, st, text)
			}
			if status, body := request(t, "GET", other.url+"/threads/"+thread+"/runs", tok, ""); status != 200 || !bytes.Contains(body, []byte(tt.wantRun)) {
				t.Fatalf("runs: %d %s", status, body)
			}
		})
	}
}

// agentloop serve refuses to start without what it needs, saying what: --create-table without
// AGENTLOOP_DYNAMO_ENDPOINT (a table in AWS is the deployment's), no TABLE_NAME, no AGENT_SECRET, and a secret
// only in SSM.
func TestServeRefusesToStart(t *testing.T) {
	t.Parallel()
	bin, _ := setup(t)
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"create-table without endpoint", []string{"AGENTLOOP_DYNAMO_ENDPOINT="}, []string{"--create-table"}, "--create-table needs AGENTLOOP_DYNAMO_ENDPOINT"},
		{"no table", []string{"TABLE_NAME="}, nil, "TABLE_NAME is not set"},
		{"no secret", []string{"AGENT_SECRET="}, nil, "AGENT_SECRET is not set"},
		{"secret in SSM", []string{"AGENT_SECRET=", "AGENT_SECRET_PARAM=/agentloop/secret"}, nil, "reads no SSM parameter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0"}, tt.args...)...)
			cmd.Env = serveEnv("http://127.0.0.1:1", "t", tt.env...)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tt.want) {
				t.Fatalf("err %v, output %q: want a refusal saying %q", err, out, tt.want)
			}
		})
	}
}

// A background run (POST /chat with "background": true: it goes on with no client, on the replica's launcher)
// is one of the replica's runs for the drain too: SIGTERM waits for it through the grace, then stops it as the
// stop endpoint does; its reply is stored canceled with what it streamed, its claim released, and the process
// exits 0.
func TestServeDrainBackgroundRun(t *testing.T) {
	t.Parallel()
	bin, _ := setup(t)
	endpoint := dynaliteEndpoint(t)
	table := tableName(t)
	other := startServe(t, bin, serveEnv(endpoint, table), "--create-table")
	tok := mintServeToken(t, bin, serveEnv(endpoint, table), "alice")
	p := startServe(t, bin, serveEnv(endpoint, table, "AGENT_DRAIN_GRACE=1s"))
	status, body := request(t, "POST", p.url+"/chat", tok,
		`{"id":"bg","background":true,"trigger":"submit-message","messages":[{"id":"m1","role":"user","parts":[{"type":"text","text":"/slow 300"}]}]}`)
	if status != 202 {
		t.Fatalf("background POST: %d %s", status, body)
	}
	// The run streams on the replica (its resumed stream, read on the other replica, shows its words).
	res, err := http.NewRequest("GET", other.url+"/chat/bg/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(res)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("attach: %v %v", resp, err)
	}
	defer resp.Body.Close()
	readUntil(t, resp.Body, "word2")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if line, want := p.line(t, "agentloop serve drained:"), "agentloop serve drained: 0 runs finished, 1 stopped, 0 left to the reaper, 0 handed over"; line != want {
		t.Errorf("serve printed %q, want %q", line, want)
	}
	if err := p.wait(t); err != nil {
		t.Fatalf("serve exited with %v after SIGTERM, want 0", err)
	}
	v := getThread(t, other.url, tok, "bg")
	if st, text := v.reply(); v.Thread.ActiveRun != nil || st != "canceled" || !strings.Contains(text, "word2") || strings.Contains(text, "word300") {
		t.Fatalf("the stored reply: active run %v, %s %q", v.Thread.ActiveRun, st, text)
	}
}

// Issue 21 item 1: SIGTERM with a run in flight past a short grace: the run hands over at its next step boundary
// (here: once its tool, held by the test, returns after the grace), its continuation is left to another replica
// (the draining one starts none), and the process exits 0. Replica B continues the run once its claim is stale
// (its reaper, or the lazy reap of its reader: both relaunch, never reap, a handed-over run) to completed: the
// stored reply is the whole reply, once; a reader attached on B before the SIGTERM sees one continuous stream,
// parsed by the AI SDK's parsers into one finished message.
func TestServeDrainHandsOver(t *testing.T) {
	t.Parallel()
	bin, _ := setup(t)
	endpoint := dynaliteEndpoint(t)
	called, release := make(chan struct{}, 1), make(chan struct{})
	var words []string
	for i := 1; i <= 60; i++ {
		words = append(words, fmt.Sprintf("out%d", i))
	}
	output := strings.Join(words, " ")
	hold := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case called <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, output)
	}))
	t.Cleanup(hold.Close)
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte("httpTools:\n  - name: hold\n    description: Waits until the test lets it go.\n"+
		"    inputSchema: {type: object}\n    url: "+hold.URL+"/hold\n    timeout: 5m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := serveEnv(endpoint, tableName(t), "AGENT_TOOLS_FILE="+tools, serveHeartbeat, serveStaleAfter,
		"AGENT_REAPER_INTERVAL=200ms", "AGENT_DRAIN_GRACE=1s")
	a := startServe(t, bin, env, "--create-table")
	b := startServe(t, bin, env)
	tok := mintServeToken(t, bin, env, "alice")

	resp := postStream(t, a.url, tok, "handover", "m1", "/tool hold {}")
	defer resp.Body.Close()
	readUntil(t, resp.Body, `"type":"tool-input-available"`)
	select {
	case <-called:
	case <-time.After(time.Minute):
		t.Fatalf("A's run never called its tool: %s", tail(a.log(), 600))
	}
	// A reader on B, attached while A's run waits on its tool.
	type read struct {
		status int
		body   []byte
		err    error
	}
	reader := make(chan read, 1)
	go func() {
		req, _ := http.NewRequest("GET", b.url+"/chat/handover/stream", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			reader <- read{err: err}
			return
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		reader <- read{res.StatusCode, body, err}
	}()

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The grace is over (A's run is asked to hand over at its next step boundary): the tool returns now.
	eventually(t, "A's grace ends", func() (bool, string) {
		return strings.Contains(a.log(), `"msg":"drain.handover"`), tail(a.log(), 300)
	})
	close(release)
	post, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("A's POST stream: %v", err)
	}
	if bytes.Contains(post, []byte(`"type":"finish"`)) || !bytes.Contains(post, []byte(`"handover":true`)) {
		t.Fatalf("A's POST stream did not end as a hand-over: %s", tail(string(post), 600))
	}
	if line := a.line(t, "agentloop serve drained:"); line != "agentloop serve drained: 0 runs finished, 0 stopped, 0 left to the reaper, 1 handed over" {
		t.Errorf("A printed %q", line)
	}
	if err := a.wait(t); err != nil {
		t.Fatalf("A exited with %v after SIGTERM, want 0", err)
	}
	if strings.Contains(a.log(), `"msg":"run continued"`) {
		t.Fatal("the draining replica continued the run itself")
	}

	eventually(t, "B continues the run to its end", func() (bool, string) {
		status, body := request(t, "GET", b.url+"/threads/handover/runs", tok, "")
		return status == 200 && bytes.Contains(body, []byte(`"status":"completed"`)), string(body)
	})
	v := getThread(t, b.url, tok, "handover")
	st, text := v.reply()
	if v.Thread.ActiveRun != nil || st != "completed" || strings.Count(text, "out60") != 1 || strings.Count(text, "out1 ") != 1 {
		t.Fatalf("the stored reply: active run %v, %s %q; want completed, the tool's whole output once", v.Thread.ActiveRun, st, text)
	}
	var replies int
	for _, m := range v.Messages {
		if m.Role == "assistant" {
			replies++
		}
	}
	if replies != 1 {
		t.Fatalf("%d assistant messages, want one reply", replies)
	}

	var got read
	select {
	case got = <-reader:
	case <-time.After(time.Minute):
		t.Fatal("B's reader did not end within a minute of the run's end")
	}
	if got.err != nil || got.status != 200 {
		t.Fatalf("B's reader: %d %v", got.status, got.err)
	}
	if n := bytes.Count(got.body, []byte(`"type":"start"`)); n != 1 {
		t.Fatalf("B's reader saw %d start chunks, want one continuous stream: %s", n, got.body)
	}
	for i, sdk := range aisdktest.SDKs {
		p := aisdktest.OfFile(aisdktest.CheckStreams(t, got.body), 0)[i]
		parts, _ := json.Marshal(p.Message.Parts)
		if p.FinishReason != "stop" || bytes.Count(parts, []byte("out60")) != 2 || !bytes.Contains(parts, []byte(`"tool-hold"`)) {
			// out60 twice: the tool's output, and the reply's text quoting it.
			t.Fatalf("ai@%s: B's reader parsed into %s (%s), want the tool call and the whole reply, finished", sdk, parts, p.FinishReason)
		}
	}
}
