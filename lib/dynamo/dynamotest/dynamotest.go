// Package dynamotest runs dynalite, a DynamoDB-compatible server (npm, Apache-2.0), for tests, and creates tables
// from template.yaml.
//
// dynalite is pinned in infra/dynalite (package.json and package-lock.json) and runs on the machine's Node.js
// (20 or newer), in memory:
//
//	node <dir>/node_modules/dynalite/cli.js --host 127.0.0.1 --port N
//
// Launch finds the repository root (the directory holding go.mod), runs `npm ci` in infra/dynalite when
// node_modules holds no dynalite (under a file lock, since go test runs packages in parallel), picks a free port,
// starts Node and waits until the endpoint answers. Tests that need DynamoDB fail when it cannot start, unless
// AGENTLOOP_SKIP_DYNAMO=1 is set, in which case they skip. AGENTLOOP_DYNAMO_ENDPOINT points the tests at an
// already running endpoint instead (a real DynamoDB, or a dynalite started by hand).
//
// CreateTable builds the table from the adapter's definition (dynamo.Table), which a test here checks against
// the Table resource of template.yaml, so the tests exercise the layout that is deployed. dynalite has no
// UpdateTimeToLive: CreateTable tolerates that one missing operation (and only that one), see
// dynamo.TableSpec.Create.
package dynamotest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/agentloop/agentloop/lib/sdkhttp"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

const (
	// SkipEnv set to 1 turns "dynalite cannot start" from a test failure into a skip.
	SkipEnv = "AGENTLOOP_SKIP_DYNAMO"
	// EndpointEnv names an already running DynamoDB endpoint to use instead of starting one.
	EndpointEnv = "AGENTLOOP_DYNAMO_ENDPOINT"

	// PackageDir is where the pinned dynalite lives, relative to the repository root.
	PackageDir = "infra/dynalite"
	// Region and static credentials every test client uses. dynalite ignores them (it checks only that a request
	// is signed); a real endpoint named by EndpointEnv takes its credentials from the usual AWS environment instead
	// (see Client).
	Region    = "us-east-1"
	AccessKey = "local"
	SecretKey = "local"

	startTimeout = 60 * time.Second
)

// SkipRequested reports whether SkipEnv is set to 1.
func SkipRequested() bool { return os.Getenv(SkipEnv) == "1" }

// Server is a running dynalite process (or, with EndpointEnv, the endpoint it names).
type Server struct {
	// Endpoint is the base URL, e.g. http://127.0.0.1:41234.
	Endpoint string
	// Startup is how long the process took from exec to its first answer (zero for EndpointEnv).
	Startup time.Duration

	cmd    *exec.Cmd
	exited chan struct{}
	out    *testenv.TailBuffer
	once   sync.Once
	closed atomic.Bool // Close began: an exit from then on is ours, not a crash
	// listening is closed once the process has said it listens (listenWatch).
	listening chan struct{}
}

// listenedLine is what dynalite's cli.js prints once its server is bound to the port.
var listenedLine = []byte("Dynalite listening at:")

// listenWatch passes the process's output to out and closes listening once the process has said it listens:
// only then is the port its own. A port picked free (testenv.FreePort) can be taken before Node binds it; when
// the taker is another test binary's dynalite, that one answers the health check in this one's place while this
// one dies with EADDRINUSE, and the tests then run on a server that goes away with the other test (seen in a
// loaded make test: "listen EADDRINUSE", then 503 store_unavailable).
type listenWatch struct {
	out       *testenv.TailBuffer
	listening chan struct{}
	head      []byte // the output so far, until the line is seen (exec calls Write from one goroutine: one writer)
	seen      bool
}

func (w *listenWatch) Write(p []byte) (int, error) {
	if !w.seen && len(w.head) < 64<<10 {
		w.head = append(w.head, p...)
		if bytes.Contains(w.head, listenedLine) {
			w.seen, w.head = true, nil
			close(w.listening)
		}
	}
	return w.out.Write(p)
}

// Launch starts dynalite (or returns the endpoint named by EndpointEnv). Close stops it.
func Launch(ctx context.Context) (*Server, error) {
	if ep := os.Getenv(EndpointEnv); ep != "" {
		return &Server{Endpoint: ep}, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("dynamotest: dynalite needs Node.js 20 or newer on PATH: %w", err)
	}
	cli, err := ensureInstalled(ctx, filepath.Join(root, PackageDir))
	if err != nil {
		return nil, err
	}
	var lastErr error
	// A port picked free can be taken before Node binds it; a few attempts make that race harmless.
	for attempt := 0; attempt < 3; attempt++ {
		port, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		s, err := start(ctx, node, cli, port)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// Start launches dynalite for one test (or benchmark) and stops it when the test ends. It fails the test when
// dynalite cannot start, or skips it when SkipEnv=1, and when dynalite died during the test (see Died): the failure
// then carries what the process last wrote, so a crash says why instead of showing only as "connection refused".
func Start(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := Launch(ctx)
	if err != nil {
		if SkipRequested() {
			t.Skipf("dynalite unavailable (%s=1): %v", SkipEnv, err)
		}
		t.Fatalf("dynalite: %v (set %s=1 to skip these tests)", err, SkipEnv)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s.Endpoint
}

// Died reports, once the process has exited on its own (a crash: Node exits with status 1 on an uncaught
// exception), how it exited and the tail of its output (stdout and stderr: the crash's stack trace); nil while it
// runs, after Close, and for EndpointEnv. It does not wait: a request that failed because the process is dying may
// return before the process has exited; Close tells for sure.
func (s *Server) Died() error {
	if s.cmd == nil || s.closed.Load() {
		return nil
	}
	select {
	case <-s.exited:
		return s.crash()
	default:
		return nil
	}
}

func (s *Server) crash() error {
	return fmt.Errorf("dynamotest: dynalite on %s died (%v); its output:\n%s", s.Endpoint, s.cmd.ProcessState, s.out.String())
}

// Close stops the process and waits for it. The first Close returns an error, with the process's output, when the
// process had exited on its own before Close killed it (see Died). Safe to call more than once.
func (s *Server) Close() error {
	if s.cmd == nil {
		return nil
	}
	var err error
	s.once.Do(func() {
		s.closed.Store(true)
		_ = s.cmd.Process.Kill()
		<-s.exited
		// Killed by us: signaled. Exited (with any status) on its own: a crash, whenever it happened.
		if st := s.cmd.ProcessState; st != nil && st.Exited() {
			err = s.crash()
		}
	})
	return err
}

// Client returns a DynamoDB client for endpoint. Against the dynalite this package starts it uses the static
// local credentials and Region; against an endpoint named by EndpointEnv (possibly a real table's region
// endpoint) it uses the static credentials only when AWS_ACCESS_KEY_ID is unset, and AWS_REGION when set.
func Client(endpoint string, optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	opts := dynamodb.Options{
		Region:       Region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		HTTPClient:   sdkhttp.Wrap(awshttp.NewBuildableClient()), // as production's (dynamo.HTTPClient)
	}
	if endpoint == os.Getenv(EndpointEnv) {
		if r := os.Getenv("AWS_REGION"); r != "" {
			opts.Region = r
		}
		if id := os.Getenv("AWS_ACCESS_KEY_ID"); id != "" {
			opts.Credentials = credentials.NewStaticCredentialsProvider(id, os.Getenv("AWS_SECRET_ACCESS_KEY"), os.Getenv("AWS_SESSION_TOKEN"))
		}
	}
	return dynamodb.New(opts, optFns...)
}

// RepoRoot is the module root (testenv.Root).
func RepoRoot() (string, error) { return testenv.Root() }

// cliPath is dynalite's command-line entry point inside dir, "" when it is not installed.
func cliPath(dir string) string {
	p := filepath.Join(dir, "node_modules", "dynalite", "cli.js")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// ensureInstalled runs `npm ci` in dir unless dynalite is already there (its postinstall applies dir/patches),
// makes sure the installed dynalite carries the current patches (see ensurePatched), and returns its entry point.
func ensureInstalled(ctx context.Context, dir string) (string, error) {
	if err := testenv.NpmCI(ctx, dir, "dynalite", func() bool { return cliPath(dir) != "" }); err != nil {
		return "", fmt.Errorf("dynamotest: %w", err)
	}
	if err := ensurePatched(ctx, dir); err != nil {
		return "", fmt.Errorf("dynamotest: %w", err)
	}
	return cliPath(dir), nil
}

// patchMarker is the file apply-patches.js writes last: the sha256 of the patches it applied (patchesHash).
const patchMarker = ".agentloop-patches"

// ensurePatched runs dir/apply-patches.js (idempotent) when node_modules/.agentloop-patches does not name the
// patches in dir/patches: an install made before a patch was added or changed (make node-deps re-installs then,
// a plain go test does not) would otherwise run dynalite without it.
func ensurePatched(ctx context.Context, dir string) error {
	want, err := patchesHash(filepath.Join(dir, "patches"))
	if err != nil {
		return err
	}
	marker := filepath.Join(dir, "node_modules", patchMarker)
	current := func() bool {
		got, err := os.ReadFile(marker)
		return err == nil && strings.TrimSpace(string(got)) == want
	}
	if current() {
		return nil
	}
	unlock, err := testenv.LockFile(filepath.Join(dir, ".install.lock"))
	if err != nil {
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	defer unlock()
	if current() { // another test binary patched it while we waited
		return nil
	}
	cmd := exec.CommandContext(ctx, "node", "apply-patches.js")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("patching dynalite (%s/apply-patches.js): %w\n%s", dir, err, out)
	}
	if !current() {
		return fmt.Errorf("%s/apply-patches.js left %s not naming the current patches", dir, marker)
	}
	return nil
}

// patchesHash is apply-patches.js's marker: sha256 over each patch's name, a newline and its text, in name order.
func patchesHash(dir string) (string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.patch"))
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return "", err
		}
		h.Write([]byte(filepath.Base(n) + "\n"))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func start(ctx context.Context, node, cli string, port int) (*Server, error) {
	// In memory (no --path), bound to loopback only (dynalite listens on every interface by default), and tables
	// become ACTIVE at once instead of after dynalite's default 500 ms, since every test creates its own.
	cmd := exec.Command(node, cli, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
	cmd.Dir = os.TempDir()
	out := &testenv.TailBuffer{Max: 16 << 10}
	watch := &listenWatch{out: out, listening: make(chan struct{})}
	cmd.Stdout = watch
	cmd.Stderr = watch
	cmd.SysProcAttr = testenv.DieWithParent()
	began := time.Now()
	// Pdeathsig (Linux) is tied to the thread that forks: keep this goroutine on one thread while starting.
	runtime.LockOSThread()
	err := cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("dynamotest: start node: %w", err)
	}
	s := &Server{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, exited: make(chan struct{}), out: out,
		listening: watch.listening}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("%w\n--- dynalite output ---\n%s", err, out.String())
	}
	s.Startup = time.Since(began)
	return s, nil
}

// waitReady polls until the endpoint answers: dynalite answers a GET with 200 "healthy: ...".
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	select {
	case <-s.listening:
	case <-s.exited:
		return errors.New("dynamotest: dynalite exited during start-up")
	case <-ctx.Done():
		return fmt.Errorf("dynamotest: dynalite never said it listens on %s: %w", s.Endpoint, ctx.Err())
	}
	hc := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint, nil)
		if err != nil {
			return err
		}
		if res, err := hc.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return errors.New("dynamotest: dynalite exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("dynamotest: dynalite did not answer on %s: %w", s.Endpoint, ctx.Err())
		case <-tick.C:
		}
	}
}
