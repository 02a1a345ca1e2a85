package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// built is the real binary, built once per test binary (a link takes seconds on a small machine; every test
// that runs it shares it) and removed by TestMain.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	closeDynalite()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// setup returns the real binary and a data directory of the test's own.
func setup(t *testing.T) (bin, data string) {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "agentloop-bin-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "agentloop")
		if out, err := exec.Command("go", "build", "-o", built.bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin, filepath.Join(t.TempDir(), "data")
}

type devProc struct {
	cmd   *exec.Cmd
	url   string
	token string
	pprof string // the profiler's URL, when AGENT_PPROF_ADDR is set
}

// startDev starts `agentloop dev` on a free port and reads the URL and dev token it prints.
func startDev(t *testing.T, bin, data string, env ...string) *devProc {
	t.Helper()
	cmd := exec.Command(bin, "dev", "--addr", "127.0.0.1:0", "--data", data)
	cmd.Env = append(append(os.Environ(), "OPENAI_API_KEY=", "AGENT_SECRET="), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p := &devProc{cmd: cmd}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	var sawCurl bool
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "agentloop dev profiler on "):
			p.pprof = strings.TrimPrefix(line, "agentloop dev profiler on ")
		case strings.HasPrefix(line, "agentloop dev serving on "):
			p.url = strings.TrimPrefix(line, "agentloop dev serving on ")
		case strings.HasPrefix(line, "eyJ"):
			p.token = line
		case strings.HasPrefix(line, "curl -N "+p.url+"/chat"):
			sawCurl = true
		}
		if sawCurl {
			break
		}
	}
	if p.url == "" || p.token == "" || !sawCurl {
		t.Fatalf("dev banner incomplete: url=%q token=%t curl=%t", p.url, p.token != "", sawCurl)
	}
	go io.Copy(io.Discard, stdout)
	return p
}

func (p *devProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("dev did not stop on SIGTERM")
	}
}

func request(t *testing.T, method, url, tok, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A reply streamed by one dev process is served by a new process on the same data directory, and a token
// minted by `agentloop token` for that directory is accepted.
func TestPersistenceAcrossRestarts(t *testing.T) {
	bin, data := setup(t)
	first := startDev(t, bin, data)
	status, stream := request(t, "POST", first.url+"/chat", first.token,
		`{"id":"restart","trigger":"submit-message","messages":[{"id":"m1","role":"user","parts":[{"type":"text","text":"remember me"}]}]}`)
	if status != 200 || !bytes.HasSuffix(stream, []byte("data: [DONE]\n\n")) {
		t.Fatalf("first process: %d %s", status, stream)
	}
	first.stop(t)

	second := startDev(t, bin, data)
	out, err := exec.Command(bin, "token", "--user", "dev", "--data", data).Output()
	if err != nil {
		t.Fatal(err)
	}
	status, body := request(t, "GET", second.url+"/threads/restart", strings.TrimSpace(string(out)), "")
	if status != 200 {
		t.Fatalf("second process: %d %s", status, body)
	}
	var view struct {
		Messages []struct {
			Role  string
			Parts []struct{ Type, Text string }
		}
	}
	if err := json.Unmarshal(body, &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Messages) != 2 || view.Messages[1].Role != "assistant" || view.Messages[1].Parts[1].Text != "You said: remember me" {
		t.Fatalf("thread after restart = %s", body)
	}
	// A token for another user does not see it.
	other, _ := exec.Command(bin, "token", "--user", "eve", "--data", data).Output()
	if status, _ := request(t, "GET", second.url+"/threads/restart", strings.TrimSpace(string(other)), ""); status != 404 {
		t.Fatalf("other user: %d", status)
	}
}

func TestCommandLineErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "missing command"},
		{"unknown command", []string{"deploy"}, "unknown command"},
		{"serve bad flag", []string{"serve", "--data", "x"}, "flag provided but not defined"},
		{"token without user", []string{"token", "--data", t.TempDir()}, "--user is required"},
		{"token bad ttl", []string{"token", "--user", "a", "--ttl", "-1s", "--data", t.TempDir()}, "--ttl"},
		{"dev bad flag", []string{"dev", "--port", "1"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, &out, &errOut)
			if err == nil || !strings.Contains(err.Error()+errOut.String(), tt.want) {
				t.Fatalf("err = %v, stderr %q, want %q", err, errOut.String(), tt.want)
			}
		})
	}
}

// kill -9 in the middle of a reply: after a restart, the reaper ticker reaps the dead run (failed, code stale),
// keeps what was streamed, releases the claim, and the next message gets a normal reply.
func TestKillMidRunAndRecover(t *testing.T) {
	bin, data := setup(t)
	env := []string{"AGENT_HEARTBEAT=100ms", "AGENT_STALE_AFTER=1s", "AGENT_REAPER_INTERVAL=200ms"}
	first := startDev(t, bin, data, env...)
	req, _ := http.NewRequest("POST", first.url+"/chat", strings.NewReader(
		`{"id":"crash","trigger":"submit-message","messages":[{"id":"m1","role":"user","parts":[{"type":"text","text":"/slow 100"}]}]}`))
	req.Header.Set("Authorization", "Bearer "+first.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("post: %v", err)
	}
	buf := make([]byte, 4096)
	got := 0
	for !bytes.Contains(buf[:got], []byte("word3")) {
		n, err := resp.Body.Read(buf[got:])
		if err != nil {
			t.Fatalf("stream ended early: %v", err)
		}
		got += n
	}
	time.Sleep(700 * time.Millisecond) // let a step-independent segment flush and heartbeats happen
	_ = first.cmd.Process.Kill()
	_ = first.cmd.Wait()
	resp.Body.Close()

	second := startDev(t, bin, data, env...)
	// The reaper ticker (every 200 ms here) finds the dead run once its heartbeat is older than AGENT_STALE_AFTER;
	// the thread list does not reap, so a released claim there is the ticker's work.
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, list := request(t, "GET", second.url+"/threads", second.token, "")
		if status == 200 && !bytes.Contains(list, []byte(`"activeRun"`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reaper did not release the dead run's claim: %s", list)
		}
		time.Sleep(100 * time.Millisecond)
	}
	status, body := request(t, "GET", second.url+"/threads/crash", second.token, "")
	var view struct {
		Thread struct {
			ActiveRun *struct{ RunID string } `json:"activeRun"`
		}
		Messages []struct {
			Role     string
			Metadata struct{ Status string }
		}
	}
	if err := json.Unmarshal(body, &view); err != nil || status != 200 {
		t.Fatalf("get thread: %d %s", status, body)
	}
	if view.Thread.ActiveRun != nil {
		t.Fatalf("claim of the dead run still held: %s", body)
	}
	status, body = request(t, "GET", second.url+"/threads/crash/runs", second.token, "")
	if status != 200 || !bytes.Contains(body, []byte(`"status":"failed"`)) || !bytes.Contains(body, []byte(`"code":"stale"`)) {
		t.Fatalf("runs after crash: %d %s", status, body)
	}
	status, stream := request(t, "POST", second.url+"/chat", second.token,
		`{"id":"crash","trigger":"submit-message","messages":[{"id":"m2","role":"user","parts":[{"type":"text","text":"still there?"}]}]}`)
	if status != 200 || !bytes.Contains(stream, []byte(`"finishReason":"stop"`)) {
		t.Fatalf("post after recovery: %d %s", status, stream)
	}
}

// agentloop dev holds its Go runtime to the smallest chat function's limit (issue 18: 1,000 streams under 150 MB)
// unless GOMEMLIMIT says otherwise, and logs which.
func TestDevMemoryLimit(t *testing.T) {
	t.Parallel()
	bin, _ := setup(t)
	tests := []struct {
		name string
		env  []string
		want string // in the log, "" for no memory limit line
	}{
		{"default", nil, `msg="memory limit" bytes=107374182 from="80% of 128 MB (GOMEMLIMIT overrides)"`},
		{"GOMEMLIMIT wins", []string{"GOMEMLIMIT=1GiB"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, "dev", "--addr", "127.0.0.1:0", "--data", filepath.Join(t.TempDir(), "data"))
			cmd.Env = append(append(os.Environ(), "OPENAI_API_KEY=", "AGENT_SECRET=", "GOMEMLIMIT="), tt.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(stdout)
			for sc.Scan() && !strings.HasPrefix(sc.Text(), "agentloop dev serving on ") {
			}
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			log := stderr.String()
			switch {
			case tt.want != "" && !strings.Contains(log, tt.want):
				t.Errorf("log lacks %s:\n%s", tt.want, log)
			case tt.want == "" && strings.Contains(log, `msg="memory limit"`):
				t.Errorf("a memory limit set with %v:\n%s", tt.env, log)
			}
		})
	}
}
