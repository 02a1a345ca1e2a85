package dynamotest

import (
	"context"
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
