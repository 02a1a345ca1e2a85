package devserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/titles"
)

// modelsStack is agentloop dev with the models file body and the environment env (read by config.Load, as the
// command reads it).
func modelsStack(t *testing.T, body string, env map[string]string) (*devserver.Stack, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env["AGENT_MODELS_FILE"] = file
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		return nil, err
	}
	s, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), Config: cfg,
		Offline: []offline.Option{offline.WithReplyDelay(0), offline.WithWordDelay(0)}})
	if err != nil {
		return nil, err
	}
	t.Cleanup(s.Close)
	return s, nil
}

// Issue 20 item 1: agentloop dev with a models file. An entry with neither baseURL nor apiKey talks to the
// offline endpoint, another to its own baseURL; a turn asks AGENT_MODEL's entry, the provider receives the entry's
// model id, and the reply's metadata.model shows it (as the provider reported it).
func TestModelsFileTurns(t *testing.T) {
	t.Parallel()
	var other, responses atomic.Int64
	second := offline.New(offline.WithWordDelay(0))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case titleRequest(r): // the thread's title, asked of the same entry after the reply (checked below)
		case strings.HasSuffix(r.URL.Path, "/chat/completions"):
			other.Add(1)
		case strings.HasSuffix(r.URL.Path, "/responses"):
			responses.Add(1)
		}
		second.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	body := "models:\n" +
		"  - name: main\n    provider: openai-chat\n    model: house-model-1\n    maxOutputTokens: 2048\n" +
		"  - name: second\n    provider: openai-chat\n    model: other-model-2\n    baseURL: " + srv.URL + "/v1/\n" +
		"  - name: resp\n    provider: openai-responses\n    model: resp-model-3\n    baseURL: " + srv.URL + "/v1/\n" +
		"  - name: resp-offline\n    provider: openai-responses\n    model: resp-model-4\n" +
		"  - name: nova-offline\n    provider: bedrock-converse\n    model: amazon.nova-lite-v1:0\n    region: us-east-1\n" +
		"  - name: claude-offline\n    provider: anthropic\n    model: claude-haiku-4-5\n" +
		"  - name: claude-bedrock-offline\n    provider: anthropic-bedrock\n    model: anthropic.claude-sonnet-4-5-20250929-v1:0\n    region: eu-west-1\n"
	for _, tc := range []struct {
		name, model, want string
		otherCalls        int64
		responsesCalls    int64
	}{
		{name: "the default entry, offline", model: "", want: "house-model-1"},
		{name: "an entry at its base URL", model: "second", want: "other-model-2", otherCalls: 1},
		{name: "a Responses API entry at its base URL", model: "resp", want: "resp-model-3", responsesCalls: 1},
		{name: "a Responses API entry, offline", model: "resp-offline", want: "resp-model-4"},
		{name: "a Bedrock Converse entry, offline", model: "nova-offline", want: "amazon.nova-lite-v1:0"},
		{name: "an Anthropic entry, offline", model: "claude-offline", want: "claude-haiku-4-5"},
		{name: "an Anthropic on Bedrock entry, offline", model: "claude-bedrock-offline", want: "anthropic.claude-sonnet-4-5-20250929-v1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, beforeResponses := other.Load(), responses.Load()
			s, err := modelsStack(t, body, map[string]string{"AGENT_MODEL": tc.model})
			if err != nil {
				t.Fatal(err)
			}
			tok, _ := s.Token("alice", time.Hour)
			stream := postChat(t, s, tok, "th-models", "hello")
			if !strings.Contains(stream, `"model":"`+tc.want+`"`) || !strings.Contains(stream, `"delta":" hello"`) {
				t.Errorf("the reply's metadata does not name %s:\n%s", tc.want, stream)
			}
			// The title model is the default entry (AGENT_TITLE_MODEL unset): the offline model's title in every
			// protocol (issue 20 item 5).
			s.Titles.Wait()
			if th, err := s.Store.GetThread(context.Background(), "th-models"); err != nil || th.Title != "Hello" {
				t.Errorf("thread title %q (%v), want the offline model's %q", th.Title, err, "Hello")
			}
			if got := other.Load() - before; got != tc.otherCalls {
				t.Errorf("the second endpoint got %d requests, want %d", got, tc.otherCalls)
			}
			if got := responses.Load() - beforeResponses; got != tc.responsesCalls {
				t.Errorf("the second endpoint got %d Responses API requests, want %d", got, tc.responsesCalls)
			}
		})
	}
}

// Issue 20 item 1: an anthropic entry with a baseURL and an ${env:…} key talks to that endpoint's /v1/messages with
// the key as x-api-key. Not parallel: the key is in the process environment, where agentloop dev reads it.
func TestModelsFileAnthropicKey(t *testing.T) {
	t.Setenv("AGENTLOOP_TEST_ANTHROPIC_KEY", "sk-ant-test")
	var keys []string
	var mu sync.Mutex
	second := offline.New(offline.WithWordDelay(0))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.URL.Path+" "+r.Header.Get("X-Api-Key"))
		mu.Unlock()
		second.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s, err := modelsStack(t, "models:\n  - name: claude\n    provider: anthropic\n    model: claude-sonnet-4-5\n    baseURL: "+srv.URL+
		"\n    apiKey: ${env:AGENTLOOP_TEST_ANTHROPIC_KEY}\n", map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := s.Token("alice", time.Hour)
	stream := postChat(t, s, tok, "th-claude", "hello")
	if !strings.Contains(stream, `"model":"claude-sonnet-4-5"`) || !strings.Contains(stream, `"delta":" hello"`) {
		t.Errorf("the reply:\n%s", stream)
	}
	s.Titles.Wait() // the thread's title is asked of the same entry, after the reply
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[0] != "/v1/messages sk-ant-test" || keys[1] != keys[0] {
		t.Errorf("requests %q, want two /v1/messages (the reply, the title) with the entry's key", keys)
	}
}

// Issue 20 item 1: a models file the local stack cannot serve fails the start and says why: an ${ssm:…} key
// (agentloop dev reads no SSM), an unset ${env:…} key. Every provider is built (TestModelsFileTurns answers
// through each); lib/modelset's tests refuse a provider with no constructor.
func TestModelsFileRefusedAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, body, want string }{
		{"an ssm key", "models:\n  - {name: main, provider: openai-chat, model: m, apiKey: '${ssm:/agentloop/openai-api-key}'}\n",
			"ssm references cannot be resolved here"},
		{"an unset env key", "models:\n  - {name: main, provider: openai-chat, model: m, apiKey: '${env:AGENTLOOP_TEST_UNSET_KEY}'}\n",
			"environment variables that are not set: AGENTLOOP_TEST_UNSET_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := modelsStack(t, tc.body, map[string]string{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one with %q", err, tc.want)
			}
		})
	}
}

// Issue 20 item 1: the research sub-agent asks AGENT_SUBAGENT_MODEL's entry: its job's model requests reach that
// entry's endpoint with its model id, while the turn's go to the default entry's.
func TestModelsFileSubagent(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var asked []string
	second := offline.New(offline.WithWordDelay(0))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &req)
		mu.Lock()
		asked = append(asked, req.Model)
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		second.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	body := "models:\n" +
		"  - {name: main, provider: openai-chat, model: house-model-1}\n" +
		"  - {name: researcher, provider: openai-chat, model: cheap-model-3, baseURL: '" + srv.URL + "/v1/'}\n"
	s, err := modelsStack(t, body, map[string]string{"AGENT_SUBAGENT_MODEL": "researcher"})
	if err != nil {
		t.Fatal(err)
	}
	if s.ModelName != "main" || s.SubagentModelName != "researcher" {
		t.Fatalf("models %q, %q", s.ModelName, s.SubagentModelName)
	}
	tok, _ := s.Token("alice", time.Hour)
	stream := postChat(t, s, tok, "th-research", `/tool research {"question":"why is the sky blue"}`)
	if !strings.Contains(stream, `"model":"house-model-1"`) {
		t.Errorf("the turn's metadata does not name the default entry's model:\n%s", stream)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Runner.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 {
		t.Fatal("the sub-agent's endpoint got no request")
	}
	for _, m := range asked {
		if m != "cheap-model-3" {
			t.Errorf("the sub-agent's endpoint was asked for %q, want cheap-model-3", m)
		}
	}
}

// Issue 20 item 4: agentloop dev with a models file whose default entry has fallbacks. The primary, at its base
// URL, fails in each way; a retryable failure before the first token goes on to the fallback (a Responses API
// entry, then the offline Chat Completions one), whose model the reply's metadata names; a refused request and a
// reply cut after its first words are not failed over (the latter ends with model_interrupted, its words kept).
func TestModelsFileFailover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text    string
		status        int // the primary answers every request with it (0: the offline model answers)
		want          string
		fallbackCalls int64
	}{
		{name: "primary down: the fallback answers", text: "hello", status: 503, want: `"model":"resp-fallback-2"`, fallbackCalls: 1},
		{name: "primary refuses: no failover", text: "hello", status: 400, want: `"errorText":"the model provider returned HTTP 400"`},
		{name: "cut after text: no failover, model_interrupted", text: "/drop 2", want: `"code":"model_interrupted"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary := offline.New(offline.WithWordDelay(0))
			down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.status != 0 {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(tc.status)
					_, _ = io.WriteString(w, `{"error":{"message":"switched off","type":"test"}}`)
					return
				}
				primary.ServeHTTP(w, r)
			}))
			t.Cleanup(down.Close)
			var calls atomic.Int64
			fallback := offline.New(offline.WithWordDelay(0))
			fb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !titleRequest(r) { // the thread's title fails over as the turn does; counted apart
					calls.Add(1)
				}
				fallback.ServeHTTP(w, r)
			}))
			t.Cleanup(fb.Close)
			body := "models:\n" +
				"  - name: main\n    provider: openai-chat\n    model: primary-model-1\n    baseURL: " + down.URL + "/v1/\n    fallback: [resp, house]\n" +
				"  - name: resp\n    provider: openai-responses\n    model: resp-fallback-2\n    baseURL: " + fb.URL + "/v1/\n" +
				"  - name: house\n    provider: openai-chat\n    model: house-model-3\n"
			s, err := modelsStack(t, body, map[string]string{"AGENT_MODEL": "main", "AGENT_MODEL_RETRIES": "0"})
			if err != nil {
				t.Fatal(err)
			}
			tok, _ := s.Token("alice", time.Hour)
			stream := postChat(t, s, tok, "th-failover", tc.text)
			s.Titles.Wait()
			if !strings.Contains(stream, tc.want) {
				t.Errorf("the stream does not hold %s:\n%s", tc.want, stream)
			}
			if got := calls.Load(); got != tc.fallbackCalls {
				t.Errorf("the fallback got %d requests, want %d", got, tc.fallbackCalls)
			}
		})
	}
}

// titleRequest reports whether r asks for a thread's title (lib/titles), leaving its body to be read again.
func titleRequest(r *http.Request) bool {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	return bytes.Contains(body, []byte(titles.Instruction))
}
