// Package deploytest runs the Lambda form of agentloop in tests: it loads the function URL events of events/,
// builds a function's `bootstrap` the way `make build` does (for any GOOS/GOARCH), builds the Lambda Runtime
// Interface Emulator (RIE) from the Go module proxy, starts a bootstrap under it and invokes it, and splits a
// streamed function URL reply into its prelude and body.
//
// The RIE buffers a streamed reply: an invoke answers, once the handler is done, with the raw bytes the function
// streamed to the Runtime API, which for a RESPONSE_STREAM function URL is
//
//	{"statusCode":200,"headers":{...},"cookies":[...]} + 8 NUL bytes + body
//
// (the "application/vnd.awslambda.http-integration-response" framing that aws-lambda-go's lambdaurl writes).
// SplitStreamingResponse checks and parses that framing.
package deploytest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/agentloop/agentloop/lib/uistream"
)

// MaxBootstrapBytes bounds a function's bootstrap as `make build` ships it (linux/arm64, stripped): 25 MB
// (issue 18 item 6; the chat function's was 30.0 MB while it linked openai-go, 13.0 MB since).
const MaxBootstrapBytes = 25_000_000

// RIEPackage is the emulator's main package and the pinned version, as `go install` takes it.
const RIEPackage = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d"

// LambdaBuildFlags returns the `go build` flags of a Lambda bootstrap (the Makefile's LAMBDA_GOFLAGS).
func LambdaBuildFlags() []string {
	return []string{"-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w"}
}

// RepoRoot is the module root (repo.Root).
func RepoRoot() (string, error) { return testenv.Root() }

// placeholder matches the ${NAME} placeholders of the event files.
var placeholder = regexp.MustCompile(`\$\{([A-Z_]+)\}`)

// Event is one function URL request from events/, with its placeholders filled in.
type Event struct {
	// Raw is the JSON document, ready to post to the RIE.
	Raw []byte
	// Request is Raw decoded, ready for lambdaurl.Wrap's handler.
	Request *events.LambdaFunctionURLRequest
}

// LoadEvent reads the function URL request events/<name> with its placeholders filled in (LoadPayload).
func LoadEvent(name string, vars map[string]string) (Event, error) {
	out, err := LoadPayload(name, vars)
	if err != nil {
		return Event{}, err
	}
	var req events.LambdaFunctionURLRequest
	if err := json.Unmarshal(out, &req); err != nil {
		return Event{}, fmt.Errorf("lambdatest: %s: %w", name, err)
	}
	return Event{Raw: out, Request: &req}, nil
}

// LoadPayload reads events/<name> (any event: a function URL request, a task input, a scheduled event) and
// replaces every ${NAME} placeholder with vars[NAME]. A placeholder without a value is an error, and so is a
// value that would need JSON escaping (the placeholders sit inside JSON strings, some of them inside the
// JSON-encoded body string), and a result that is not JSON.
func LoadPayload(name string, vars map[string]string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "events", name))
	if err != nil {
		return nil, err
	}
	var missing []string
	out := placeholder.ReplaceAllFunc(data, func(m []byte) []byte {
		key := string(placeholder.FindSubmatch(m)[1])
		v, ok := vars[key]
		if !ok {
			missing = append(missing, key)
			return m
		}
		return []byte(v)
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("lambdatest: %s: no value for %s", name, strings.Join(missing, ", "))
	}
	for k, v := range vars {
		if strings.ContainsAny(v, "\"\\\n\r\t") {
			return nil, fmt.Errorf("lambdatest: value of %s needs JSON escaping: %q", k, v)
		}
	}
	if !json.Valid(out) {
		return nil, fmt.Errorf("lambdatest: %s is not JSON once filled in", name)
	}
	return out, nil
}

// Build compiles the main package pkg (e.g. "./functions/chat") into dir/bootstrap with the Lambda build flags
// for goos/goarch, CGO off, and returns the binary's path.
func Build(ctx context.Context, pkg, dir, goos, goarch string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "bootstrap")
	args := append([]string{"build"}, LambdaBuildFlags()...)
	args = append(args, "-o", out, pkg)
	cmd := exec.CommandContext(ctx, GoCommand(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("lambdatest: go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// BuildAll compiles the main packages ./functions/<name> of names in one `go build` (the shared packages are
// compiled once and the links run side by side) into dir/<name>/bootstrap, with the Lambda build flags for
// goos/goarch, CGO off, and returns the binaries' paths by name.
func BuildAll(ctx context.Context, names []string, dir, goos, goarch string) (map[string]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "all")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	args := append([]string{"build"}, LambdaBuildFlags()...)
	args = append(args, "-o", out+string(filepath.Separator))
	for _, name := range names {
		args = append(args, "./functions/"+name)
	}
	cmd := exec.CommandContext(ctx, GoCommand(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lambdatest: go build %v: %w\n%s", names, err, b)
	}
	paths := make(map[string]string, len(names))
	for _, name := range names {
		p := filepath.Join(dir, name, "bootstrap")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.Rename(filepath.Join(out, name), p); err != nil {
			return nil, fmt.Errorf("lambdatest: go build wrote no %s: %w", name, err)
		}
		paths[name] = p
	}
	return paths, nil
}

// BuildRIE installs the emulator at RIEPackage into dir with `go install` (module mode, outside this module, so
// go.mod is untouched) and returns its path.
func BuildRIE(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, GoCommand(), "install", RIEPackage)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("lambdatest: go install %s: %w\n%s", RIEPackage, err, b)
	}
	return filepath.Join(dir, "aws-lambda-rie"), nil
}

// GoCommand is the go command: the one on PATH, else the one of the toolchain that built the tests.
func GoCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// RIE is one running emulator with one function.
type RIE struct {
	// URL is the invoke endpoint.
	URL string
	// Started is when the emulator process was started.
	Started time.Time

	cmd  *exec.Cmd
	logs *lockedBuffer
	done chan struct{}
	once sync.Once
}

// StartRIE starts the emulator at rie with bootstrap as the function. env is the whole environment the function
// sees (the emulator passes its own environment on); AWS_LAMBDA_FUNCTION_TIMEOUT defaults to 900 s. The
// function starts (its cold start) on the first invoke, as in Lambda.
func StartRIE(rie, bootstrap string, env []string) (*RIE, error) {
	invokePort, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	apiPort, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(rie,
		"--runtime-interface-emulator-address", "127.0.0.1:"+strconv.Itoa(invokePort),
		"--runtime-api-address", "127.0.0.1:"+strconv.Itoa(apiPort),
		bootstrap)
	cmd.Dir = filepath.Dir(bootstrap)
	if !hasKey(env, "AWS_LAMBDA_FUNCTION_TIMEOUT") {
		env = append(env, "AWS_LAMBDA_FUNCTION_TIMEOUT=900")
	}
	cmd.Env = env
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	// Own process group, so Close ends the emulator and the bootstrap it started, and nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r := &RIE{URL: fmt.Sprintf("http://127.0.0.1:%d/2015-03-31/functions/function/invocations", invokePort),
		cmd: cmd, logs: logs, done: make(chan struct{})}
	r.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lambdatest: start %s: %w", rie, err)
	}
	go func() {
		_ = cmd.Wait()
		close(r.done)
	}()
	return r, nil
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// Invoke posts payload and returns the function's raw reply. Until the emulator listens, connection errors are
// retried (the first call after StartRIE waits for it), up to ctx's deadline.
func (r *RIE) Invoke(ctx context.Context, payload []byte) (status int, body []byte, err error) {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(payload))
		if err != nil {
			return 0, nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return resp.StatusCode, b, err
		}
		select {
		case <-r.done:
			return 0, nil, fmt.Errorf("lambdatest: emulator exited: %s", r.Logs())
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("lambdatest: invoke: %w (last error %v)", ctx.Err(), err)
		case <-time.After(time.Millisecond):
		}
	}
}

// Logs returns everything the emulator and the function wrote so far.
func (r *RIE) Logs() string { return r.logs.String() }

// initReport matches the emulator's report of the function's init phase.
var initReport = regexp.MustCompile(`INIT REPORT\(durationMs: ([0-9.]+)\)`)

// InitDuration is the function's init phase (process start to its first call for an invoke) as the emulator
// reported it, or 0 before the first invoke.
func (r *RIE) InitDuration() time.Duration {
	m := initReport.FindStringSubmatch(r.Logs())
	if m == nil {
		return 0
	}
	ms, _ := strconv.ParseFloat(m[1], 64)
	return time.Duration(ms * float64(time.Millisecond))
}

// FunctionPID is the process id of the function the emulator started (its bootstrap, a child of the emulator),
// or an error before the first invoke started it.
func (r *RIE) FunctionPID() (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	parent := r.cmd.Process.Pid
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(parent) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("lambdatest: the emulator (pid %d) has no child process", parent)
}

// PeakRSS is the peak resident set size of process pid so far (VmHWM of /proc/<pid>/status), in bytes.
func PeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("lambdatest: no VmHWM in /proc/%d/status", pid)
}

// FunctionLogs returns the function's JSON log records (the lines of the output that are JSON objects).
func (r *RIE) FunctionLogs() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.Logs()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil {
			out = append(out, rec)
		}
	}
	return out
}

// Close kills the emulator's process group (the emulator and the bootstrap) and waits for the emulator.
func (r *RIE) Close() error {
	r.once.Do(func() {
		if r.cmd.Process != nil {
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		}
		<-r.done
	})
	return nil
}

// Prelude is the head of a streamed function URL reply.
type Prelude struct {
	StatusCode int               `json:"statusCode"`
	Headers    map[string]string `json:"headers"`
	Cookies    []string          `json:"cookies"`
}

// preludeEnd separates the prelude from the body.
const preludeEnd = "\x00\x00\x00\x00\x00\x00\x00\x00"

// SplitStreamingResponse parses raw as prelude JSON + 8 NUL bytes + body and checks the prelude: a JSON object
// with a 1xx-5xx statusCode and nothing else before the separator.
func SplitStreamingResponse(raw []byte) (Prelude, []byte, error) {
	i := bytes.Index(raw, []byte(preludeEnd))
	if i < 0 {
		return Prelude{}, nil, fmt.Errorf("lambdatest: no 8-NUL prelude separator in %q", clip(raw))
	}
	var p Prelude
	dec := json.NewDecoder(bytes.NewReader(raw[:i]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Prelude{}, nil, fmt.Errorf("lambdatest: prelude %q: %w", clip(raw[:i]), err)
	}
	if dec.More() {
		return Prelude{}, nil, fmt.Errorf("lambdatest: prelude %q has trailing data", clip(raw[:i]))
	}
	if p.StatusCode < 100 || p.StatusCode > 599 {
		return Prelude{}, nil, fmt.Errorf("lambdatest: prelude status %d", p.StatusCode)
	}
	return p, raw[i+len(preludeEnd):], nil
}

func clip(b []byte) []byte {
	if len(b) > 300 {
		return b[:300]
	}
	return b
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Stream is a complete UI message stream, parsed.
type Stream struct {
	// Types lists the chunk types in order.
	Types []string
	// MessageID is the start chunk's messageId.
	MessageID string
	// Text concatenates the text-delta chunks.
	Text string
	// ErrorText is the errorText of an error chunk, if any.
	ErrorText string
	// Chunks holds every chunk, decoded, in order.
	Chunks []map[string]any
}

// ParseStream parses a whole UI message stream body and checks that it is complete: it begins with a start
// chunk, holds a finish chunk, and ends with [DONE].
func ParseStream(body []byte) (Stream, error) {
	frames, done, err := uistream.ParseFrames(body)
	if err != nil {
		return Stream{}, fmt.Errorf("lambdatest: stream %q: %w", clip(body), err)
	}
	var s Stream
	var text strings.Builder
	for _, f := range frames {
		var c struct {
			Type      string `json:"type"`
			MessageID string `json:"messageId"`
			Delta     string `json:"delta"`
			ErrorText string `json:"errorText"`
		}
		var m map[string]any
		if err := errors.Join(json.Unmarshal(f, &c), json.Unmarshal(f, &m)); err != nil {
			return Stream{}, fmt.Errorf("lambdatest: chunk %s: %w", f, err)
		}
		s.Types, s.Chunks = append(s.Types, c.Type), append(s.Chunks, m)
		switch c.Type {
		case "start":
			s.MessageID = c.MessageID
		case "text-delta":
			text.WriteString(c.Delta)
		case "error":
			s.ErrorText = c.ErrorText
		}
	}
	s.Text = text.String()
	switch {
	case !done:
		return s, fmt.Errorf("lambdatest: stream does not end with [DONE]: %q", clip(body))
	case len(s.Types) == 0 || s.Types[0] != "start":
		return s, fmt.Errorf("lambdatest: stream does not begin with start: %v", s.Types)
	case !slices.Contains(s.Types, "finish"):
		return s, fmt.Errorf("lambdatest: stream has no finish chunk: %v", s.Types)
	}
	return s, nil
}

// FunctionError is the error document a function's reply is when its handler returned an error (or panicked):
// what the Lambda Go runtime reports, with the error's Go type name as Type ("TransientError" for a returned
// *agent.TransientError), which Step Functions matches in ErrorEquals.
type FunctionError struct {
	Message string `json:"errorMessage"`
	Type    string `json:"errorType"`
}

// ParseFunctionError returns the error document raw holds, or nil when raw is the function's output (no JSON
// object with both errorType and errorMessage). It fails only on an error document it cannot read.
func ParseFunctionError(raw []byte) (*FunctionError, error) {
	var keys map[string]json.RawMessage
	if json.Unmarshal(raw, &keys) != nil || keys["errorType"] == nil || keys["errorMessage"] == nil {
		return nil, nil
	}
	var fe FunctionError
	if err := json.Unmarshal(raw, &fe); err != nil {
		return nil, fmt.Errorf("lambdatest: error document %q: %w", clip(raw), err)
	}
	return &fe, nil
}
