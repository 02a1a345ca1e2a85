package modelset_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelset"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openairesponses"
)

// TestRetryable: the errors the adapters return, as they word them, and whether another model may answer.
func TestRetryable(t *testing.T) {
	t.Parallel()
	http := func(status int) error {
		return agent.Wrap(errors.New("cause"), agent.KindUnavailable, agent.CodeModelError, fmt.Sprintf("the model provider returned HTTP %d", status))
	}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"not an agent error", errors.New("boom"), false},
		{"HTTP 503", http(503), true},
		{"HTTP 500", http(500), true},
		{"HTTP 529 (Anthropic overloaded)", http(529), true},
		{"HTTP 429", http(429), true},
		{"HTTP 408", http(408), true},
		{"HTTP 400", http(400), false},
		{"HTTP 401", http(401), false},
		{"HTTP 403", http(403), false},
		{"HTTP 404", http(404), false},
		{"HTTP 422", http(422), false},
		{"wrapped HTTP 503", fmt.Errorf("step: %w", http(503)), true},
		{"first-token timeout", agent.E(agent.KindUnavailable, agent.CodeModelTimeout, "the model sent nothing within 2m0s"), true},
		{"connection failed", agent.E(agent.KindUnavailable, agent.CodeModelError, "the connection to the model provider failed"), true},
		{"stream ended early", agent.E(agent.KindUnavailable, agent.CodeModelError, "the model stream ended before the model finished"), true},
		{"failed in-stream", agent.E(agent.KindUnavailable, agent.CodeModelError, "the model provider failed mid-stream"), true},
		{"Bedrock throttled", agent.E(agent.KindUnavailable, agent.CodeModelError, "the model provider failed (ThrottlingException)"), true},
		{"Bedrock refused", agent.E(agent.KindUnavailable, agent.CodeModelError, "the model provider refused the request (ValidationException)"), false},
		{"Bedrock access denied", agent.E(agent.KindUnavailable, agent.CodeModelError, "the deployment may not call this model on Bedrock (AccessDeniedException): check the model's access and the function's role"), false},
		{"no AWS credentials", agent.E(agent.KindUnavailable, agent.CodeModelError, "the deployment has no AWS credentials to call the model on Bedrock"), false},
		{"malformed chunk", agent.E(agent.KindUnavailable, agent.CodeModelError, "the model provider sent a malformed chunk"), false},
		{"a message no adapter writes", agent.E(agent.KindUnavailable, agent.CodeModelError, "something new"), false},
		{"rate limited", &agent.Error{Kind: agent.KindLimited, Code: agent.CodeModelError}, true},
		{"canceled", &agent.Error{Kind: agent.KindCanceled, Code: agent.CodeRunCanceled, Message: "model call canceled"}, false},
		{"run timeout", &agent.Error{Kind: agent.KindCanceled, Code: agent.CodeRunTimeout, Message: "model call canceled"}, false},
		{"context too long", agent.E(agent.KindTooLarge, agent.CodeMessageTooLarge, "the conversation is too long for the model"), false},
		{"file refused", agent.E(agent.KindInvalid, agent.CodeFileUnavailable, "the model provider could not read an image of the message (HTTP 400)"), false},
		{"request not built", agent.E(agent.KindInternal, agent.CodeInternal, "encode the model request"), false},
		{"unknown entry", agent.E(agent.KindInternal, agent.CodeUnknownModel, "model %q is no entry", "x"), false},
	}
	for _, c := range cases {
		if got := modelset.Retryable(c.err); got != c.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// switchable is an offline model over HTTP that can be made to answer every request with one HTTP status, or
// to hold every request until the client goes away; it counts the model requests it got.
type switchable struct {
	url     string
	mu      sync.Mutex
	status  int  // answer this status (0: the offline model answers)
	hang    bool // hold the request until the client goes away
	n       int
	arrived chan struct{}
}

func newSwitchable(t *testing.T) *switchable {
	e := &switchable{arrived: make(chan struct{}, 16)}
	model := offline.New()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.n++
		status, hang := e.status, e.hang
		e.mu.Unlock()
		e.arrived <- struct{}{}
		switch {
		case hang:
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case status != 0:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error":{"message":"switched to %d","type":"test","code":null}}`, status)
		default:
			model.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before Close: a held request ends
	e.url = srv.URL + "/v1/"
	return e
}

func (e *switchable) set(status int, hang bool) {
	e.mu.Lock()
	e.status, e.hang = status, hang
	e.mu.Unlock()
}

func (e *switchable) requests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func openaiResponses(e modelsfile.Model, key string) (agent.Model, error) {
	return openairesponses.New(openairesponses.Config{BaseURL: e.BaseURL, APIKey: key, Model: e.Model, MaxRetries: -1}), nil
}

// counted records the Failovers metric.
type counted struct {
	mu  sync.Mutex
	got []string
}

func (c *counted) FailedOver(from, code string) {
	c.mu.Lock()
	c.got = append(c.got, from+" "+code)
	c.mu.Unlock()
}

// TestFailover: entries on three offline endpoints over HTTP (Chat Completions and Responses), the primary
// switched to fail in each way; which endpoints are asked, which model answers, what is logged and counted.
func TestFailover(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		text      string
		status    [3]int // per endpoint a, b, c (0: it answers)
		hang      bool   // a holds the request until the test cancels
		entry     string
		wantModel string
		wantText  string
		wantCode  string // the error's code ("" for none)
		wantCalls [3]int
		wantLog   []string // failover lines: "from to code attempt"
	}{
		{name: "primary down: the fallback answers", text: "hello there", status: [3]int{503}, entry: "main",
			wantModel: "model-b", wantText: "You said: hello there", wantCalls: [3]int{1, 1, 0},
			wantLog: []string{"main small model_error 1"}},
		{name: "primary rate-limited", text: "hello there", status: [3]int{429}, entry: "main",
			wantModel: "model-b", wantText: "You said: hello there", wantCalls: [3]int{1, 1, 0},
			wantLog: []string{"main small model_error 1"}},
		{name: "primary refuses the request: no failover", text: "hello there", status: [3]int{400}, entry: "main",
			wantCode: agent.CodeModelError, wantCalls: [3]int{1, 0, 0}},
		{name: "primary's key refused: no failover", text: "hello there", status: [3]int{401}, entry: "main",
			wantCode: agent.CodeModelError, wantCalls: [3]int{1, 0, 0}},
		{name: "primary drops after text: no failover", text: "/drop 3", entry: "main",
			wantText: "word1 word2 word3", wantCode: agent.CodeModelError, wantCalls: [3]int{1, 0, 0}},
		{name: "primary fails in-stream after text: no failover", text: "/error 500 after 2", entry: "main",
			wantText: "word1 word2", wantCode: agent.CodeModelError, wantCalls: [3]int{1, 0, 0}},
		{name: "a chain of two fallbacks", text: "hello there", status: [3]int{503, 502}, entry: "main",
			wantModel: "model-c", wantText: "You said: hello there", wantCalls: [3]int{1, 1, 1},
			wantLog: []string{"main small model_error 1", "small tiny model_error 2"}},
		{name: "all down: the last error", text: "hello there", status: [3]int{503, 503, 500}, entry: "main",
			wantCode: agent.CodeModelError, wantCalls: [3]int{1, 1, 1},
			wantLog: []string{"main small model_error 1", "small tiny model_error 2"}},
		{name: "a fallback refuses: the chain stops", text: "hello there", status: [3]int{503, 400}, entry: "main",
			wantCode: agent.CodeModelError, wantCalls: [3]int{1, 1, 0},
			wantLog: []string{"main small model_error 1"}},
		{name: "a fallback's own fallbacks are not followed", text: "hello there", status: [3]int{0, 503, 503}, entry: "small",
			wantCode: agent.CodeModelError, wantCalls: [3]int{0, 1, 1},
			wantLog: []string{"small tiny model_error 1"}},
		{name: "Responses primary down: a Chat Completions fallback", text: "hello there", status: [3]int{0, 0, 503}, entry: "tiny",
			wantModel: "model-a", wantText: "You said: hello there", wantCalls: [3]int{1, 0, 1},
			wantLog: []string{"tiny main model_error 1"}},
		{name: "canceled: no failover", text: "hello there", hang: true, entry: "main",
			wantCode: agent.CodeRunCanceled, wantCalls: [3]int{1, 0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			eps := [3]*switchable{newSwitchable(t), newSwitchable(t), newSwitchable(t)}
			for i, e := range eps {
				e.set(c.status[i], i == 0 && c.hang)
			}
			// main (chat) → small (chat), tiny (responses); small → tiny; tiny → main.
			file := "models:\n" +
				"  - {name: main, provider: openai-chat, model: model-a, baseURL: '" + eps[0].url + "', fallback: [small, tiny]}\n" +
				"  - {name: small, provider: openai-chat, model: model-b, baseURL: '" + eps[1].url + "', maxOutputTokens: 50, fallback: [tiny]}\n" +
				"  - {name: tiny, provider: openai-responses, model: model-c, baseURL: '" + eps[2].url + "', fallback: [main]}\n"
			if c.entry == "main" {
				// tiny → main would be a cycle through main's list: the file refuses it.
				file = strings.Replace(file, ", fallback: [main]}", "}", 1)
			} else {
				file = strings.Replace(file, ", fallback: [small, tiny]}", "}", 1)
				if c.entry == "tiny" {
					file = strings.Replace(file, ", fallback: [tiny]}", "}", 1)
				}
			}
			f, err := modelsfile.Parse("models.yaml", []byte(file))
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			metric := &counted{}
			set, err := modelset.New(f, nil, modelset.Constructors{modelsfile.OpenAIChat: openaiChat, modelsfile.OpenAIResponses: openaiResponses},
				modelset.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), modelset.WithFailovers(metric))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.hang {
				go func() {
					<-eps[0].arrived
					cancel()
				}()
			}
			var text strings.Builder
			res, err := set.Stream(ctx, agent.ModelRequest{Model: c.entry, Messages: []agent.ModelMessage{{Role: "user", Text: c.text}}},
				func(ev agent.ModelEvent) error {
					text.WriteString(ev.Delta)
					return nil
				})
			if c.wantCode == "" && err != nil {
				t.Fatalf("err = %v", err)
			}
			if c.wantCode != "" && agent.CodeOf(err) != c.wantCode {
				t.Fatalf("err = %v (code %s), want code %s", err, agent.CodeOf(err), c.wantCode)
			}
			if c.wantModel != "" && res.Model != c.wantModel {
				t.Errorf("model = %q, want %q (the model that answered)", res.Model, c.wantModel)
			}
			if text.String() != c.wantText {
				t.Errorf("text = %q, want %q", text.String(), c.wantText)
			}
			for i, e := range eps {
				if got := e.requests(); got != c.wantCalls[i] {
					t.Errorf("endpoint %c got %d requests, want %d", 'a'+i, got, c.wantCalls[i])
				}
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				if !strings.Contains(l, "msg=model.failover") {
					continue
				}
				var from, to, code, attempt string
				for _, kv := range strings.Fields(l) {
					k, v, _ := strings.Cut(kv, "=")
					switch k {
					case "from":
						from = cmp.Or(from, v) // the first: the err value may hold the word too
					case "to":
						to = cmp.Or(to, v) // the first: the err value may hold the word too
					case "code":
						code = cmp.Or(code, v) // the first: the err value may hold the word too
					case "attempt":
						attempt = cmp.Or(attempt, v) // the first: the err value may hold the word too
					}
				}
				lines = append(lines, strings.Join([]string{from, to, code, attempt}, " "))
			}
			if strings.Join(lines, "|") != strings.Join(c.wantLog, "|") {
				t.Errorf("failover log lines = %q, want %q", lines, c.wantLog)
			}
			if got := set.Failovers(); got != int64(len(c.wantLog)) {
				t.Errorf("Failovers() = %d, want %d", got, len(c.wantLog))
			}
			if len(metric.got) != len(c.wantLog) {
				t.Errorf("metric counted %q, want %d", metric.got, len(c.wantLog))
			}
		})
	}
}
