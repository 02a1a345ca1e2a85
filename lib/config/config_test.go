package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/bedrockconverse"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/toolrouter"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		wantErr bool
		check   func(t *testing.T, c Config)
	}{
		// Unset means zero, and zero means the owning component's default: config has no numbers of its own.
		{name: "unset is zero", env: nil, check: func(t *testing.T, c Config) {
			if c.MaxSteps != 0 || c.RunTimeout != 0 || c.StaleAfter != 0 || c.MaxBodyBytes != 0 || c.Model != "" || c.ModelRetries != nil {
				t.Fatalf("unset values not zero: %+v", c)
			}
			if e := c.Engine("m"); e.MaxSteps != 0 || e.Transcript.BudgetBytes != 0 {
				t.Fatalf("engine config not zero: %+v", e)
			}
			if o := c.OpenAI("u", "k", "m", nil); o.MaxRetries != 0 {
				t.Fatalf("adapter retries %d, want 0 (the adapter's default)", o.MaxRetries)
			}
		}},
		{name: "zero retries means none", env: map[string]string{"AGENT_MODEL_RETRIES": "0"}, check: func(t *testing.T, c Config) {
			if o := c.OpenAI("u", "k", "m", nil); o.MaxRetries >= 0 {
				t.Fatalf("adapter retries %d, want negative (none)", o.MaxRetries)
			}
		}},
		{name: "component configs", env: map[string]string{"AGENT_STALE_AFTER": "10s", "AGENT_REAPER_BATCH": "7", "AGENT_CONTEXT_BYTES": "1000"},
			check: func(t *testing.T, c Config) {
				if c.Reaper().StaleAfter != 10*time.Second || c.Reaper().Batch != 7 || c.Threads().StaleAfter != 10*time.Second ||
					c.Engine("m").StaleAfter != 10*time.Second || c.Engine("m").Transcript.BudgetBytes != 1000 {
					t.Fatalf("component configs: %+v %+v", c.Reaper(), c.Engine("m"))
				}
			}},
		{name: "page bytes", env: map[string]string{"AGENT_PAGE_BYTES": "65536"},
			check: func(t *testing.T, c Config) {
				if got := c.Threads().PageBytes; got != 65536 {
					t.Fatalf("threads page bytes %d, want 65536", got)
				}
			}},
		{name: "jwt max age", env: map[string]string{"AGENT_JWT_MAX_AGE": "168h", "AGENT_JWT_AUDIENCE": "my-app"},
			check: func(t *testing.T, c Config) {
				if a := c.Auth([]byte("k"), nil, false); a.MaxAge != 168*time.Hour || a.Audience != "my-app" || a.DevTokens {
					t.Fatalf("auth config %+v", a)
				}
			}},
		{name: "page bytes too small", env: map[string]string{"AGENT_PAGE_BYTES": "10"}, wantErr: true},
		// A POST's deadline for dev and serve: the hand-over margin must fit below it, the default's (2 min) too.
		{name: "request deadline", env: map[string]string{"AGENT_REQUEST_DEADLINE": "10m", "AGENT_HANDOVER_MARGIN": "30s"},
			check: func(t *testing.T, c Config) {
				if c.RequestDeadline != 10*time.Minute || c.Engine("m").HandOverMargin != 30*time.Second {
					t.Fatalf("request deadline %s, margin %s", c.RequestDeadline, c.Engine("m").HandOverMargin)
				}
			}},
		{name: "request deadline above the default margin", env: map[string]string{"AGENT_REQUEST_DEADLINE": "5m"}, check: func(t *testing.T, c Config) {
			if c.RequestDeadline != 5*time.Minute {
				t.Fatalf("request deadline %s", c.RequestDeadline)
			}
		}},
		{name: "request deadline within the default margin", env: map[string]string{"AGENT_REQUEST_DEADLINE": "60s"}, wantErr: true},
		{name: "request deadline equal to the margin", env: map[string]string{"AGENT_REQUEST_DEADLINE": "30s", "AGENT_HANDOVER_MARGIN": "30s"}, wantErr: true},
		{name: "request deadline not a duration", env: map[string]string{"AGENT_REQUEST_DEADLINE": "soon"}, wantErr: true},
		{name: "titles", env: map[string]string{"AGENT_TITLES": "off", "AGENT_TITLE_TIMEOUT": "3s", "AGENT_TITLE_MODEL": "small"},
			check: func(t *testing.T, c Config) {
				if tc := c.Titles("small"); !c.TitlesOff || tc.Timeout != 3*time.Second || tc.Model != "small" {
					t.Fatalf("titles off %v, config %+v", c.TitlesOff, tc)
				}
			}},
		{name: "titles on by default", env: map[string]string{"AGENT_TITLES": "on"}, check: func(t *testing.T, c Config) {
			if c.TitlesOff || c.Titles("m").Timeout != 0 {
				t.Fatalf("titles off %v, timeout %s", c.TitlesOff, c.Titles("m").Timeout)
			}
		}},
		{name: "titles neither on nor off", env: map[string]string{"AGENT_TITLES": "maybe"}, wantErr: true},
		{name: "context block tokens", env: map[string]string{"AGENT_CONTEXT_BLOCK_TOKENS": "1"},
			check: func(t *testing.T, c Config) {
				if got := c.Engine("m").Transcript.BlockTokens; got != 1 {
					t.Fatalf("transcript block %d tokens, want 1", got)
				}
			}},
		{name: "context tokens", env: map[string]string{"AGENT_CONTEXT_TOKENS": "32000"},
			check: func(t *testing.T, c Config) {
				if got := c.Engine("m").Transcript.BudgetTokens; got != 32000 {
					t.Fatalf("transcript budget %d tokens, want 32000", got)
				}
			}},
		{name: "overrides", env: map[string]string{"AGENT_MAX_STEPS": "3", "AGENT_RUN_TIMEOUT": "5s", "AGENT_MODEL": "m1", "AGENT_MAX_BODY_BYTES": "100"},
			check: func(t *testing.T, c Config) {
				if c.MaxSteps != 3 || c.RunTimeout != 5*time.Second || c.Model != "m1" || c.MaxBodyBytes != 100 {
					t.Fatalf("overrides not applied: %+v", c)
				}
			}},
		{name: "lambda wiring", env: map[string]string{"TABLE_NAME": " t1 ", "AGENT_SECRET_PARAM": "/app/secret", "OPENAI_API_KEY_PARAM": "/app/openai",
			"JOBS_STATE_MACHINE_ARN": " arn:aws:states:us-east-1:123456789012:stateMachine:agentloop-jobs "},
			check: func(t *testing.T, c Config) {
				if c.TableName != "t1" || c.SecretParam != "/app/secret" || c.OpenAIAPIKeyParam != "/app/openai" ||
					c.JobsStateMachineARN != "arn:aws:states:us-east-1:123456789012:stateMachine:agentloop-jobs" {
					t.Fatalf("lambda wiring not read: %+v", c)
				}
			}},
		{name: "model overrides", env: map[string]string{
			"AGENT_MODEL_TIMEOUT": "7s", "AGENT_MODEL_IDLE_TIMEOUT": "9s", "AGENT_MODEL_RETRIES": "0",
			"OPENAI_MAX_TOKENS_FIELD": "max_tokens", "OPENAI_STREAM_USAGE": "false",
		}, check: func(t *testing.T, c Config) {
			// AGENT_MODEL_TIMEOUT keeps working, as the time to the first token.
			got := c.OpenAI("http://base/v1/", "sk", "m", nil)
			want := openai.Config{
				BaseURL: "http://base/v1/", APIKey: "sk", Model: "m",
				FirstTokenTimeout: 7 * time.Second, IdleTimeout: 9 * time.Second,
				MaxRetries:     -1, // AGENT_MODEL_RETRIES=0 means none; the adapter's zero would mean its default
				MaxTokensParam: openai.MaxTokens, OmitStreamOptions: true,
			}
			if got != want {
				t.Fatalf("openai config %+v, want %+v", got, want)
			}
			// The same settings reach a bedrock-converse entry's adapter (boot and the dev server map it here).
			bc := c.BedrockConverse(modelsfile.Model{Region: "eu-west-1", BaseURL: "http://b/", Model: "amazon.nova-pro-v1:0"}, nil, nil)
			if bc != (bedrockconverse.Config{Region: "eu-west-1", BaseURL: "http://b/", Model: "amazon.nova-pro-v1:0",
				FirstTokenTimeout: 7 * time.Second, IdleTimeout: 9 * time.Second, MaxRetries: -1}) {
				t.Fatalf("bedrock-converse config %+v", bc)
			}
		}},
		{name: "retries carried to the adapter", env: map[string]string{"AGENT_MODEL_RETRIES": "4"}, check: func(t *testing.T, c Config) {
			if got := c.OpenAI("", "", "m", nil); got.MaxRetries != 4 || got.FirstTokenTimeout != 0 {
				t.Fatalf("openai config %+v", got)
			}
		}},
		// The limits: a number is the limit, 0 is none (the components' negative), unset is the default (zero).
		{name: "limits", env: map[string]string{"AGENT_MAX_ACTIVE_RUNS_PER_USER": "2", "AGENT_THREADS_PER_MINUTE": "0",
			"AGENT_MAX_STREAMS_PER_USER": "5", "AGENT_STREAM_LEASE_TTL": "9s", "AGENT_RUN_LEASE_TTL": "20s",
			"AGENT_MAX_TOOL_CALLS_PER_STEP": "0", "AGENT_MAX_JOBS_PER_RUN": "2", "AGENT_MAX_JOB_CHAIN": "3", "AGENT_MAX_ACTIVE_JOBS_PER_USER": "0"},
			check: func(t *testing.T, c Config) {
				e, th := c.Engine("m"), c.Threads()
				if e.MaxToolCallsPerStep >= 0 || e.MaxJobsPerRun != 2 || e.MaxJobChain != 3 || c.MaxActiveJobsPerUser >= 0 {
					t.Fatalf("turn bounds: calls per step %d, jobs per run %d", e.MaxToolCallsPerStep, e.MaxJobsPerRun)
				}
				if e.MaxActiveRunsPerUser != 2 || e.ThreadsPerMinute >= 0 || e.RunLeaseTTL != 20*time.Second {
					t.Fatalf("engine limits: runs %d, threads %d, lease %s", e.MaxActiveRunsPerUser, e.ThreadsPerMinute, e.RunLeaseTTL)
				}
				if th.MaxStreamsPerUser != 5 || th.MaxStreamsPerRun != 0 || th.StreamLeaseTTL != 9*time.Second {
					t.Fatalf("stream limits: %+v", th)
				}
			}},
		// Admission control: a number is the bound, 0 is none (the engine's negative), unset is the default (zero).
		{name: "admission", env: map[string]string{"AGENT_MAX_RUNS_PER_PROCESS": "1500", "AGENT_MAX_HEARTBEAT_LAG": "5s"},
			check: func(t *testing.T, c Config) {
				if e := c.Engine("m"); e.MaxRunsPerProcess != 1500 || e.MaxHeartbeatLag != 5*time.Second {
					t.Fatalf("admission: runs %d, lag %s", e.MaxRunsPerProcess, e.MaxHeartbeatLag)
				}
			}},
		{name: "admission off", env: map[string]string{"AGENT_MAX_RUNS_PER_PROCESS": "0", "AGENT_MAX_HEARTBEAT_LAG": "0"},
			check: func(t *testing.T, c Config) {
				if e := c.Engine("m"); e.MaxRunsPerProcess >= 0 || e.MaxHeartbeatLag >= 0 {
					t.Fatalf("admission: runs %d, lag %s", e.MaxRunsPerProcess, e.MaxHeartbeatLag)
				}
			}},
		// Resumed streams (principle 6): the hurried flush, the attached reader's poll and its presence window.
		{name: "resumed streams", env: map[string]string{"AGENT_SEGMENT_HURRY": "80ms", "AGENT_RESUME_POLL_ATTACHED": "70ms", "AGENT_READER_PRESENCE": "8s"},
			check: func(t *testing.T, c Config) {
				f := c.Threads().Follow
				if e := c.Engine("m"); e.SegmentHurry != 80*time.Millisecond || f.PollAttached != 70*time.Millisecond || f.Presence != 8*time.Second {
					t.Fatalf("resumed streams: hurry %s, poll %s, presence %s", e.SegmentHurry, f.PollAttached, f.Presence)
				}
			}},
		// SQLite group commit (principle 6): lib/devserver passes these to sqlite.OpenWith.
		{name: "sqlite batch bounds", env: map[string]string{"AGENT_SQLITE_BATCH_WRITES": "16", "AGENT_SQLITE_BATCH_BYTES": "65536"},
			check: func(t *testing.T, c Config) {
				if c.SQLiteBatchWrites != 16 || c.SQLiteBatchBytes != 65536 {
					t.Fatalf("sqlite batch: writes %d, bytes %d", c.SQLiteBatchWrites, c.SQLiteBatchBytes)
				}
			}},
		{name: "sqlite batch of no writes", env: map[string]string{"AGENT_SQLITE_BATCH_WRITES": "0"}, wantErr: true},
		// The keeper's reader probe: a period, or 0 for none (the engine's negative).
		{name: "reader probe", env: map[string]string{"AGENT_READER_PROBE": "50ms"},
			check: func(t *testing.T, c Config) {
				if p := c.Engine("m").ReaderProbe; p != 50*time.Millisecond {
					t.Fatalf("reader probe %s, want 50ms", p)
				}
			}},
		{name: "reader probe off", env: map[string]string{"AGENT_READER_PROBE": "0"},
			check: func(t *testing.T, c Config) {
				if p := c.Engine("m").ReaderProbe; p >= 0 {
					t.Fatalf("reader probe %s, want negative (none)", p)
				}
			}},
		{name: "reader probe unset", env: map[string]string{},
			check: func(t *testing.T, c Config) {
				if p := c.Engine("m").ReaderProbe; p != 0 {
					t.Fatalf("reader probe %s, want 0 (the engine's default)", p)
				}
			}},
		{name: "reader probe negative", env: map[string]string{"AGENT_READER_PROBE": "-1s"}, wantErr: true},
		{name: "heartbeat lag past the horizon", env: map[string]string{"AGENT_MAX_HEARTBEAT_LAG": "15s"}, wantErr: true},
		{name: "heartbeat and its lag at the horizon", env: map[string]string{"AGENT_MAX_HEARTBEAT_LAG": "14s"}, wantErr: true},
		{name: "lease TTL too short to renew", env: map[string]string{"AGENT_STREAM_LEASE_TTL": "10ms"}, wantErr: true},
		{name: "lease TTL past what stores keep", env: map[string]string{"AGENT_RUN_LEASE_TTL": "25h"}, wantErr: true},
		{name: "negative limit", env: map[string]string{"AGENT_MAX_STREAMS_PER_RUN": "-1"}, wantErr: true},
		{name: "unknown max tokens field", env: map[string]string{"OPENAI_MAX_TOKENS_FIELD": "max_output_tokens"}, wantErr: true},
		{name: "bad stream usage", env: map[string]string{"OPENAI_STREAM_USAGE": "sometimes"}, wantErr: true},
		{name: "JWKS over plain http", env: map[string]string{"AGENT_JWKS_URL": "http://idp.example/jwks.json"}, wantErr: true},
		{name: "JWKS and subject claim", env: map[string]string{"AGENT_JWKS_URL": "https://idp.example/jwks.json", "AGENT_JWT_SUBJECT_CLAIM": "email"},
			check: func(t *testing.T, c Config) {
				if a := c.Auth([]byte("s"), nil, false); c.JWKSURL != "https://idp.example/jwks.json" || a.SubjectClaim != "email" {
					t.Fatalf("JWKS %q, auth %+v", c.JWKSURL, a)
				}
			}},
		{name: "bad idle timeout", env: map[string]string{"AGENT_MODEL_IDLE_TIMEOUT": "0s"}, wantErr: true},
		{name: "bad int", env: map[string]string{"AGENT_MAX_STEPS": "many"}, wantErr: true},
		{name: "zero steps", env: map[string]string{"AGENT_MAX_STEPS": "0"}, wantErr: true},
		{name: "bad duration", env: map[string]string{"AGENT_RUN_TIMEOUT": "-1s"}, wantErr: true},
		{name: "heartbeat not below stale", env: map[string]string{"AGENT_HEARTBEAT": "40s"}, wantErr: true},
		{name: "heartbeat not below half of stale", env: map[string]string{"AGENT_HEARTBEAT": "2s", "AGENT_STALE_AFTER": "3s"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := Load(func(k string) string { return tt.env[k] })
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// The price table comes from the env or a file (not both); the metrics switch takes emf, off or nothing.
func TestLoadPricesAndMetrics(t *testing.T) {
	t.Parallel()
	table := `{"m": {"input": 1, "output": 2}}`
	file := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(file, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	u := agent.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000}
	for _, tc := range []struct {
		name     string
		env      map[string]string
		wantErr  bool
		wantCost int64
	}{
		{"none", nil, false, 0},
		{"inline", map[string]string{"AGENT_PRICES": table}, false, 3_000_000},
		{"file", map[string]string{"AGENT_PRICES_FILE": file}, false, 3_000_000},
		{"both", map[string]string{"AGENT_PRICES": table, "AGENT_PRICES_FILE": file}, true, 0},
		{"missing file", map[string]string{"AGENT_PRICES_FILE": file + ".gone"}, true, 0},
		{"bad json", map[string]string{"AGENT_PRICES": `{"m": 1}`}, true, 0},
		{"metrics emf", map[string]string{"AGENT_METRICS": "emf", "AGENT_METRICS_NAMESPACE": "ns"}, false, 0},
		{"metrics unknown", map[string]string{"AGENT_METRICS": "statsd"}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Load(func(k string) string { return tc.env[k] })
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got, _ := c.Prices.Cost("m", u); !tc.wantErr && got != tc.wantCost {
				t.Fatalf("cost = %d, want %d", got, tc.wantCost)
			}
			if !tc.wantErr && (c.Metrics != tc.env["AGENT_METRICS"] || c.MetricsNamespace != tc.env["AGENT_METRICS_NAMESPACE"]) {
				t.Fatalf("metrics %q %q", c.Metrics, c.MetricsNamespace)
			}
		})
	}
}

// REVIEW H6: a system prompt or a price table of any size deploys as a file in the deployment package (the
// environment holds 4 KB in all): AGENT_SYSTEM_PROMPT_FILE and AGENT_PRICES_FILE, a relative path read from
// the package's root (LAMBDA_TASK_ROOT in Lambda).
func TestLargeSettingsFromFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	prompt := strings.Repeat("You are a careful assistant. ", 1000) // ~29 KB: far past the environment's 4 KB
	if err := os.MkdirAll(filepath.Join(root, "bundle"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bundle", "system-prompt.txt"), []byte(prompt), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bundle", "prices.json"), []byte(`{"m": {"input": 1, "output": 2}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr bool
	}{
		{"absolute", map[string]string{"AGENT_SYSTEM_PROMPT_FILE": filepath.Join(root, "bundle", "system-prompt.txt")}, false},
		{"relative to the task root", map[string]string{"LAMBDA_TASK_ROOT": root, "AGENT_SYSTEM_PROMPT_FILE": "bundle/system-prompt.txt",
			"AGENT_PRICES_FILE": "bundle/prices.json"}, false},
		{"both", map[string]string{"AGENT_SYSTEM_PROMPT": "hi", "AGENT_SYSTEM_PROMPT_FILE": filepath.Join(root, "bundle", "system-prompt.txt")}, true},
		{"missing", map[string]string{"AGENT_SYSTEM_PROMPT_FILE": filepath.Join(root, "gone.txt")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Load(func(k string) string { return tc.env[k] })
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && c.SystemPrompt != prompt {
				t.Fatalf("system prompt of %d bytes, want the file's %d", len(c.SystemPrompt), len(prompt))
			}
			if cost, _ := c.Prices.Cost("m", agent.Usage{InputTokens: 1_000_000}); tc.env["AGENT_PRICES_FILE"] != "" && cost != 1_000_000 {
				t.Fatal("no price table from the relative AGENT_PRICES_FILE")
			}
		})
	}
}

// Issue 19: AGENT_TOOLS_FILE is mapped to a path, a relative one inside the deployment package (LAMBDA_TASK_ROOT)
// as the other files are, or is ssm:<parameter name>, kept as given (never a path in the package) when the name
// is one the template can grant (a hierarchy: "/" and segments); the wiring reads and checks it (lib/toolsfile).
func TestToolsFilePath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    string
		wantErr bool // an error naming AGENT_TOOLS_FILE
	}{
		{"unset", map[string]string{}, "", false},
		{"as given", map[string]string{"AGENT_TOOLS_FILE": "tools.yaml"}, "tools.yaml", false},
		{"relative to the task root", map[string]string{"LAMBDA_TASK_ROOT": "/var/task", "AGENT_TOOLS_FILE": "bundle/tools.yaml"}, "/var/task/bundle/tools.yaml", false},
		{"absolute in Lambda", map[string]string{"LAMBDA_TASK_ROOT": "/var/task", "AGENT_TOOLS_FILE": "/opt/tools.json"}, "/opt/tools.json", false},
		{"an SSM parameter", map[string]string{"AGENT_TOOLS_FILE": "ssm:/agentloop/tools"}, "ssm:/agentloop/tools", false},
		{"an SSM parameter in Lambda", map[string]string{"LAMBDA_TASK_ROOT": "/var/task", "AGENT_TOOLS_FILE": " ssm:/agentloop/tools.v2 "}, "ssm:/agentloop/tools.v2", false},
		{"an SSM name without /", map[string]string{"AGENT_TOOLS_FILE": "ssm:agentloop-tools"}, "", true},
		{"an SSM path, not a name", map[string]string{"AGENT_TOOLS_FILE": "ssm:/agentloop/"}, "", true},
		{"an SSM wildcard", map[string]string{"AGENT_TOOLS_FILE": "ssm:/agentloop/*"}, "", true},
		{"no SSM name", map[string]string{"AGENT_TOOLS_FILE": "ssm:"}, "", true},
	} {
		c, err := Load(func(k string) string { return tc.env[k] })
		switch {
		case tc.wantErr && (err == nil || !strings.Contains(err.Error(), "AGENT_TOOLS_FILE")):
			t.Errorf("%s: %v, want an error naming AGENT_TOOLS_FILE", tc.name, err)
		case !tc.wantErr && (err != nil || c.ToolsFile != tc.want):
			t.Errorf("%s: %q %v, want %q", tc.name, c.ToolsFile, err, tc.want)
		}
	}
}

// Issue 19: AGENT_TOOLS_SECRETS_PATH is an SSM path prefix that starts and ends with "/" (the template grants
// <path>*, so "/" alone, which would be every parameter, and a prefix that ends mid-name are refused).
func TestToolsSecretsPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string
		ok    bool
	}{
		{"", true},
		{"/agentloop/tools/", true},
		{"/a/", true},
		{"/", false},
		{"/agentloop/tools", false},
		{"agentloop/tools/", false},
		{"/agentloop//tools/", false},
		{"/agentloop/*/", false},
	} {
		c, err := Load(func(k string) string { return map[string]string{"AGENT_TOOLS_SECRETS_PATH": tc.value}[k] })
		switch {
		case tc.ok && (err != nil || c.ToolsSecretsPath != tc.value):
			t.Errorf("%q: %q %v, want it taken", tc.value, c.ToolsSecretsPath, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "AGENT_TOOLS_SECRETS_PATH")):
			t.Errorf("%q: %v, want an error naming AGENT_TOOLS_SECRETS_PATH", tc.value, err)
		}
	}
}

// Issue 19 item 5: AGENT_TOOL_ROUTER_* map onto toolrouter.Config; 0 means "every catalog" for the minimum and
// "none" for the threshold (the router's negative values), unset means the router's default (zero).
func TestToolRouter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    toolrouter.Config
		wantErr bool
	}{
		{name: "unset", env: map[string]string{}, want: toolrouter.Config{}},
		{name: "set", env: map[string]string{"AGENT_TOOL_ROUTER_MIN": "50", "AGENT_TOOL_ROUTER_TOP_K": "5", "AGENT_TOOL_ROUTER_THRESHOLD": "2.5",
			"AGENT_TOOL_ROUTER_SIMILARITY": "0.4", "AGENT_TOOL_ROUTER_MIN_MATCHES": "5", "AGENT_TOOL_ROUTER_COOL_DOWN": "5s",
			"AGENT_TOOL_ROUTER_MAX_COOL_DOWN": "2m", "AGENT_TOOL_ROUTER_VECTOR_TTL": "168h"},
			want: toolrouter.Config{Min: 50, TopK: 5, Threshold: 2.5, Similarity: 0.4, MinMatches: 5, CoolDown: 5 * time.Second,
				MaxCoolDown: 2 * time.Minute, VectorTTL: 7 * 24 * time.Hour}},
		{name: "zeros", env: map[string]string{"AGENT_TOOL_ROUTER_MIN": "0", "AGENT_TOOL_ROUTER_THRESHOLD": "0", "AGENT_TOOL_ROUTER_SIMILARITY": "0"},
			want: toolrouter.Config{Min: -1, Threshold: -1, Similarity: -1}},
		{name: "similarity above 1", env: map[string]string{"AGENT_TOOL_ROUTER_SIMILARITY": "1.5"}, wantErr: true},
		{name: "top-K 0", env: map[string]string{"AGENT_TOOL_ROUTER_TOP_K": "0"}, wantErr: true},
		{name: "min matches 0", env: map[string]string{"AGENT_TOOL_ROUTER_MIN_MATCHES": "0"}, wantErr: true},
		{name: "negative threshold", env: map[string]string{"AGENT_TOOL_ROUTER_THRESHOLD": "-1"}, wantErr: true},
		{name: "cool-down 0", env: map[string]string{"AGENT_TOOL_ROUTER_COOL_DOWN": "0s"}, wantErr: true},
		{name: "vector TTL not a duration", env: map[string]string{"AGENT_TOOL_ROUTER_VECTOR_TTL": "30d"}, wantErr: true},
		{name: "threshold not a number", env: map[string]string{"AGENT_TOOL_ROUTER_THRESHOLD": "high"}, wantErr: true},
	} {
		c, err := Load(func(k string) string { return tc.env[k] })
		if (err != nil) != tc.wantErr || (!tc.wantErr && c.ToolRouter() != tc.want) {
			t.Errorf("%s: %+v %v, want %+v (error %v)", tc.name, c.ToolRouter(), err, tc.want, tc.wantErr)
		}
	}
	c, err := Load(func(k string) string { return map[string]string{"AGENT_EMBEDDING_MODEL": "nomic-embed-text"}[k] })
	if err != nil || c.OpenAI("", "", "m", nil).EmbeddingModel != "nomic-embed-text" {
		t.Errorf("AGENT_EMBEDDING_MODEL: %q %v, want nomic-embed-text in the adapter's config", c.EmbeddingModel, err)
	}
}

// Issue 20 item 1: AGENT_MODELS_FILE is read and checked by Load (a relative path inside LAMBDA_TASK_ROOT, as
// the tools file's); with it AGENT_MODEL, AGENT_SUBAGENT_MODEL and AGENT_TITLE_MODEL name entries (the default is
// the first entry, the others the default), its prices join the table and an entry's contextTokens bounds the
// engine's budget. Without it AGENT_MODEL keeps its meaning, the provider's model id.
func TestModelsFile(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bundle"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "bundle", "models.yaml")
	models := "models:\n" +
		"  - {name: main, provider: openai-chat, model: gpt-4o, contextTokens: 64000, prices: {input: 2.5, output: 10}}\n" +
		"  - {name: small, provider: openai-chat, model: gpt-4o-mini}\n"
	if err := os.WriteFile(file, []byte(models), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(root, "bad.yaml")
	if err := os.WriteFile(bad, []byte("models:\n  - {name: a, provider: gemini, model: m}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                   string
		env                    map[string]string
		model, subagent, title string
		budget                 int
		err                    string
	}{
		{name: "no models file", env: map[string]string{"AGENT_MODEL": "gpt-4o", "AGENT_SUBAGENT_MODEL": "gpt-4o-mini"},
			model: "gpt-4o", subagent: "gpt-4o-mini"},
		{name: "defaults", env: map[string]string{"AGENT_MODELS_FILE": file},
			model: "main", subagent: "main", title: "main", budget: 64000},
		{name: "relative to the task root", env: map[string]string{"LAMBDA_TASK_ROOT": root, "AGENT_MODELS_FILE": "bundle/models.yaml",
			"AGENT_MODEL": "small", "AGENT_SUBAGENT_MODEL": "small", "AGENT_TITLE_MODEL": "main"},
			model: "small", subagent: "small", title: "main"},
		{name: "the smaller budget wins", env: map[string]string{"AGENT_MODELS_FILE": file, "AGENT_CONTEXT_TOKENS": "32000"},
			model: "main", subagent: "main", title: "main", budget: 32000},
		{name: "the entry's budget below the deployment's", env: map[string]string{"AGENT_MODELS_FILE": file, "AGENT_CONTEXT_TOKENS": "100000"},
			model: "main", subagent: "main", title: "main", budget: 64000},
		{name: "a model id, not an entry", env: map[string]string{"AGENT_MODELS_FILE": file, "AGENT_MODEL": "gpt-4o-mini"},
			err: `AGENT_MODEL="gpt-4o-mini" names no entry of the models file models.yaml (its entries: main, small)`},
		{name: "an unknown sub-agent", env: map[string]string{"AGENT_MODELS_FILE": file, "AGENT_SUBAGENT_MODEL": "tiny"},
			err: `AGENT_SUBAGENT_MODEL="tiny" names no entry`},
		{name: "an unknown title model", env: map[string]string{"AGENT_MODELS_FILE": file, "AGENT_TITLE_MODEL": "tiny"},
			err: `AGENT_TITLE_MODEL="tiny" names no entry`},
		{name: "a bad file", env: map[string]string{"AGENT_MODELS_FILE": bad},
			err: `bad.yaml:2: models[0].provider: "gemini" is not a provider`},
		{name: "a missing file", env: map[string]string{"AGENT_MODELS_FILE": file + ".gone"}, err: "AGENT_MODELS_FILE="},
		{name: "with OPENAI_BASE_URL", env: map[string]string{"AGENT_MODELS_FILE": file, "OPENAI_BASE_URL": "http://x/v1"},
			err: "OPENAI_BASE_URL and AGENT_MODELS_FILE are both set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Load(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Model != tc.model || c.SubagentModel != tc.subagent || c.TitleModel != tc.title {
				t.Errorf("models = %q %q %q, want %q %q %q", c.Model, c.SubagentModel, c.TitleModel, tc.model, tc.subagent, tc.title)
			}
			if got := c.Engine(c.Model).Transcript.BudgetTokens; got != tc.budget {
				t.Errorf("budget = %d, want %d", got, tc.budget)
			}
			if tc.env["AGENT_MODELS_FILE"] == "" {
				if c.Models != nil {
					t.Error("a models file without AGENT_MODELS_FILE")
				}
				return
			}
			for model, want := range map[string]int64{"main": 2_500_000, "gpt-4o-2024-08-06": 2_500_000, "small": 0} {
				if cost, _ := c.Prices.Cost(model, agent.Usage{InputTokens: 1_000_000}); cost != want {
					t.Errorf("cost of %s = %d, want %d", model, cost, want)
				}
			}
		})
	}
}
