package dynamotest

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Without Node, Launch reports why instead of hanging or silently passing, and Start turns that into a skip only
// when SkipEnv asks for it. (Not parallel: it changes PATH for the process.)
func TestWithoutNode(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(EndpointEnv, "")
	_, err := Launch(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Node.js") {
		t.Fatalf("Launch without node: %v, want an error naming Node.js", err)
	}

	t.Setenv(SkipEnv, "1")
	reached := false
	ok := t.Run("Start", func(t *testing.T) {
		Start(t)
		reached = true
	})
	if !ok || reached {
		t.Fatalf("Start without node and %s=1: passed=%v reached=%v, want a skip", SkipEnv, ok, reached)
	}
}

// EndpointEnv short-circuits the launch.
func TestEndpointOverride(t *testing.T) {
	t.Setenv(EndpointEnv, "http://127.0.0.1:9")
	s, err := Launch(context.Background())
	if err != nil || s.Endpoint != "http://127.0.0.1:9" {
		t.Fatalf("Launch with %s: %+v, %v", EndpointEnv, s, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// Launch starts a dynalite that serves the DynamoDB API on loopback, a table from template.yaml can be created on
// it, and Close stops the process (the port stops answering).
func TestLaunchServesTheTemplateTable(t *testing.T) {
	t.Setenv(EndpointEnv, "")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := Launch(ctx)
	if err != nil {
		if SkipRequested() {
			t.Skipf("dynalite unavailable (%s=1): %v", SkipEnv, err)
		}
		t.Fatal(err)
	}
	t.Logf("dynalite started on %s in %v", s.Endpoint, s.Startup.Round(time.Millisecond))
	client := Client(s.Endpoint)
	if err := CreateTable(ctx, client, "launch-test"); err != nil {
		t.Fatal(err)
	}
	out, err := client.ListTables(ctx, &dynamodb.ListTablesInput{})
	if err != nil || len(out.TableNames) != 1 || out.TableNames[0] != "launch-test" {
		t.Fatalf("ListTables = %+v, %v; want the one table", out, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Client(s.Endpoint, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }).ListTables(ctx, &dynamodb.ListTablesInput{}); err == nil {
		t.Fatal("the endpoint still answers after Close")
	}
}

// The dynalite the tests start carries infra/dynalite/patches: its marker names the current patches (the hash
// apply-patches.js writes is the one Go computes) and the patched code is in place.
func TestPatchesApplied(t *testing.T) {
	if os.Getenv(EndpointEnv) != "" {
		t.Skip("an endpoint is named: no dynalite is installed here")
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, PackageDir)
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("no Node.js")
	}
	if _, err := ensureInstalled(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	want, err := patchesHash(filepath.Join(dir, "patches"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "node_modules", patchMarker))
	if err != nil || strings.TrimSpace(string(got)) != want {
		t.Fatalf("marker = %q, %v; want %s", got, err, want)
	}
	src, err := os.ReadFile(filepath.Join(dir, "node_modules", "dynalite", "db", "index.js"))
	if err != nil || !strings.Contains(string(src), "agentloop patch (infra/dynalite/patches/query-index-entry-before-item.patch)") {
		t.Fatalf("dynalite/db/index.js is not patched (%v)", err)
	}
}

// A client that goes away part way through a request (a Go context canceled while the SDK sends the body, as a
// claim's horizon deadline does) must cost that request only. dynalite 4.0.0 threw the request stream's error
// ("aborted", ECONNRESET) and so died, failing every test sharing it with "connection refused"
// (TestResumeSendsItsHeadersBeforeTheRunWritesAnything/dynamo/function_URL failed so in a full run);
// infra/dynalite/patches/client-aborted-request.patch drops the request instead.
func TestClientAbortLeavesTheServerUp(t *testing.T) {
	t.Setenv(EndpointEnv, "")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := Launch(ctx)
	if err != nil {
		if SkipRequested() {
			t.Skipf("dynalite unavailable (%s=1): %v", SkipEnv, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	client := Client(s.Endpoint, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	// Every request below finds the server up only if each abort before it was survived: the server handles its
	// connections' events on one loop, and a request's round trip comes after the earlier connections' resets.
	for i := range 5 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.Endpoint, "http://"))
		if err != nil {
			t.Fatalf("abort %d: %v", i, err)
		}
		head := "POST / HTTP/1.1\r\nHost: dynalite\r\nContent-Type: application/x-amz-json-1.0\r\n" +
			"X-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 1000\r\n\r\n{\"Limit\":"
		if _, err := conn.Write([]byte(head)); err != nil {
			t.Fatalf("abort %d: %v", i, err)
		}
		// The server answers nothing before the whole body: a read blocks until it read the head (it then
		// waits for more). Close with a reset, as a canceled request's transport does.
		_ = conn.(*net.TCPConn).SetLinger(0)
		_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, _ = conn.Read(make([]byte, 1))
		_ = conn.Close()
		for range 2 {
			if _, err := client.ListTables(ctx, &dynamodb.ListTablesInput{}); err != nil {
				t.Fatalf("after abort %d: %v\n%v", i, err, s.Died())
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// A port picked free and taken before Node binds it, by a server that answers the health check as dynalite does
// (another test binary's dynalite): start fails (the process dies with EADDRINUSE) instead of handing out the
// other server's endpoint, so Launch tries another port. Before the start waited for the process's own
// "listening" line, start returned the impostor's endpoint, and the tests ran on a server that went away with the
// other test ("listen EADDRINUSE" in the crash report, then 503 store_unavailable).
func TestPortTakenByAnotherServer(t *testing.T) {
	t.Setenv(EndpointEnv, "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	impostor := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("healthy: dynamodb.us-east-1.amazonaws.com "))
	})}
	go func() { _ = impostor.Serve(l) }()
	t.Cleanup(func() { _ = impostor.Close() })
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cli, err := ensureInstalled(ctx, filepath.Join(root, PackageDir))
	if err != nil {
		t.Fatal(err)
	}
	s, err := start(ctx, node, cli, l.Addr().(*net.TCPAddr).Port)
	if err == nil {
		_ = s.Close()
		t.Fatalf("start on a port another server holds returned %s, want an error", s.Endpoint)
	}
	if !strings.Contains(err.Error(), "EADDRINUSE") {
		t.Errorf("err = %v, want dynalite's EADDRINUSE in it", err)
	}
}
