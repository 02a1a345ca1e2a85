package devserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/sqlite"
)

// REVIEW S13: the dev server honours AGENT_JWT_ISSUER and AGENT_JWT_AUDIENCE as a deployment does (it ignored
// them), takes the dev tokens it mints itself, and keeps taking plain tokens when neither is set.
func TestDevServerChecksIssuerAndAudience(t *testing.T) {
	t.Parallel()
	status := func(s *devserver.Stack, tok string) int {
		t.Helper()
		req := httptest.NewRequest("GET", "/threads", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		s.Handler.ServeHTTP(rec, req)
		return rec.Code
	}
	start := func(cfg config.Config) *devserver.Stack {
		t.Helper()
		s, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}

	checked := start(config.Config{JWTIssuer: "https://issuer.example", JWTAudience: "my-app"})
	own, err := checked.Token("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := auth.MintHS256(checked.Secret, "alice", time.Hour, time.Now())
	right, _ := auth.MintHS256(checked.Secret, "alice", time.Hour, time.Now(), auth.WithIssuer("https://issuer.example"), auth.WithAudience("my-app"))
	for name, c := range map[string]struct {
		tok  string
		want int
	}{
		"its own token":            {own, http.StatusOK},
		"a token with iss and aud": {right, http.StatusOK},
		"a token without them":     {plain, http.StatusUnauthorized},
	} {
		if got := status(checked, c.tok); got != c.want {
			t.Errorf("AGENT_JWT_ISSUER/AUDIENCE set, %s: %d, want %d", name, got, c.want)
		}
	}

	open := start(config.Config{})
	own, _ = open.Token("alice", time.Hour)
	plain, _ = auth.MintHS256(open.Secret, "alice", time.Hour, time.Now())
	for name, tok := range map[string]string{"its own token": own, "a plain token": plain} {
		if got := status(open, tok); got != http.StatusOK {
			t.Errorf("nothing set, %s: %d, want 200", name, got)
		}
	}
}

// The peer benchmark reads the process's store work from the "store totals" line Close logs (issue 18): it must
// count what the stack's SQLite store did, a GET /threads included.
func TestCloseLogsStoreTotals(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(),
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := s.Token("alice", time.Hour)
	req := httptest.NewRequest("GET", "/threads", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	rec := httptest.NewRecorder()
	s.Handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /threads: %d", rec.Code)
	}
	s.Close()
	var totals struct {
		Msg        string `json:"msg"`
		Statements int64  `json:"statements"`
		StoreCalls int64  `json:"store_calls"`
	}
	for _, line := range bytes.Split(logs.Bytes(), []byte("\n")) {
		if bytes.Contains(line, []byte(`"store totals"`)) {
			if err := json.Unmarshal(line, &totals); err != nil {
				t.Fatal(err)
			}
		}
	}
	if totals.Msg != "store totals" || totals.Statements < 1 || totals.StoreCalls < 1 {
		t.Fatalf("Close logged %+v, want store totals with the GET's store call and statement:\n%s", totals, logs.Bytes())
	}
}

// The group-commit bounds reach the stack's own SQLite store from its Config (AGENT_SQLITE_BATCH_*), and unset mean
// the store's defaults.
func TestSQLiteBatchBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  config.Config
		want sqlite.Options
	}{
		{"unset", config.Config{}, sqlite.Options{BatchWrites: sqlite.DefaultBatchWrites, BatchBytes: sqlite.DefaultBatchBytes}},
		{"set", config.Config{SQLiteBatchWrites: 7, SQLiteBatchBytes: 4096}, sqlite.Options{BatchWrites: 7, BatchBytes: 4096}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := devserver.New(t.Context(), devserver.Options{Data: t.TempDir(), Config: tc.cfg})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.SQLite.Options(); got != tc.want {
				t.Fatalf("store options %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Issue 19: `agentloop dev` checks the tools file at start: a good one is logged (checked, not offered yet), a
// bad one stops the start with its line and field, and a file whose tool takes a Go tool's name too. The file's
// SSM form (AGENT_TOOLS_FILE=ssm:<name>, the functions') is refused at once, naming the variable and the command
// that saves a copy: the local stack has no AWS to read it from (it must not wait on one).
func TestToolsFileCheckedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files := map[string]string{
		"good.yaml":  "httpTools:\n  - name: ping\n    description: Ping the backend.\n    url: https://api.example.com/ping\n",
		"bad.yaml":   "httpTools:\n  - name: ping\n    description: Ping.\n    url: https://api.example.com/ping\n    timeout: soon\n",
		"taken.yaml": "httpTools:\n  - name: add_note\n    description: Another add_note.\n    url: https://api.example.com/notes\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ file, want string }{
		{"good.yaml", ""},
		{"bad.yaml", `bad.yaml:5: httpTools[0].timeout: "soon" is not a duration`},
		{"taken.yaml", `taken.yaml:2: httpTools[0].name: "add_note" is taken by a Go tool`},
		{"ssm:/agentloop/tools", "AGENT_TOOLS_FILE=ssm:/agentloop/tools: agentloop dev reads no SSM parameters (it has no AWS); " +
			"save the file and set AGENT_TOOLS_FILE to its path: aws ssm get-parameter --name /agentloop/tools --with-decryption"},
	} {
		var logs bytes.Buffer
		source := tc.file
		if !strings.HasPrefix(source, "ssm:") {
			source = filepath.Join(dir, tc.file)
		}
		s, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
			Config: config.Config{ToolsFile: source}})
		if tc.want == "" {
			if err != nil {
				t.Fatalf("%s: %v", tc.file, err)
			}
			s.Close()
			if !bytes.Contains(logs.Bytes(), []byte(`"msg":"tools.file"`)) || !bytes.Contains(logs.Bytes(), []byte(`"http_tools":["ping"]`)) {
				t.Errorf("%s: no tools.file line:\n%s", tc.file, logs.Bytes())
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %s", tc.file, err, tc.want)
		}
	}
}
