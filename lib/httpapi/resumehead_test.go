package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdaurl"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/openai"
)

// A resume of a run that has written nothing yet (killed before its first segment save, or still waiting for its
// first model token) answers 200 and the stream headers at once, not with the first byte of the stream: before,
// a client with a response-header timeout (browsers, proxies, Lambda function URL clients) gave up while the
// run waited to be reaped (up to a stale window and a reaper tick). The signal is the follower's second poll of
// the run's segments: by then it has found nothing and waited once, so the headers must be out (flushed, on
// net/http; written, on a function URL, whose writer sends the prelude on WriteHeader and cannot flush). The
// clock is paused, so the claim never goes stale and nothing but the test ends the request.
func TestResumeSendsItsHeadersBeforeTheRunWritesAnything(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"sqlite", "dynamo"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			polls := &pollSignals{waiting: map[string]*pollWait{}}
			clock := &pausedClock{}
			o := devserver.Options{Data: t.TempDir(), ModelURL: "http://127.0.0.1:1/v1/", Clock: clock,
				Config: config.Config{Secret: string(secret), ResumePollMax: 20 * time.Millisecond},
				OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond },
				Wrap:   func(s agent.Store) agent.Store { polls.Store = s; return polls }}
			if store == "dynamo" {
				if testing.Short() {
					t.Skip("dynalite in -short")
				}
				client := dynamotest.Client(dynamotest.Start(t))
				table := fmt.Sprintf("resumehead_%d", time.Now().UnixNano())
				if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
					t.Fatal(err)
				}
				o.Store = dynamo.New(client, table)
			}
			stack, err := devserver.New(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stack.Close)
			defer clock.pause()()
			tok := token(t, "alice")

			t.Run("net/http", func(t *testing.T) {
				second := claimSilentRun(t, stack.Store, clock, polls, "t_http")
				ctx, cancel := context.WithCancel(context.Background())
				rec := &headRecorder{header: http.Header{}}
				req, _ := http.NewRequestWithContext(ctx, "GET", "/chat/t_http/stream", nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				done := make(chan struct{})
				go func() { defer close(done); stack.Handler.ServeHTTP(rec, req) }()
				defer func() { cancel(); <-done }()
				<-second
				rec.mu.Lock()
				defer rec.mu.Unlock()
				if rec.flushedStatus != http.StatusOK || rec.body != 0 {
					t.Fatalf("when the follower polled again: status %d flushed with it %d, %d body bytes; want 200 flushed and 0 bytes",
						rec.status, rec.flushedStatus, rec.body)
				}
				checkStreamHeaders(t, rec.sent)
			})

			t.Run("function URL", func(t *testing.T) {
				second := claimSilentRun(t, stack.Store, clock, polls, "t_lambda")
				ctx, cancel := context.WithCancel(context.Background())
				spy := &headRecorder{}
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					stack.Handler.ServeHTTP(&lambdaSpy{ResponseWriter: w, rec: spy}, r)
				})
				req := &events.LambdaFunctionURLRequest{RawPath: "/chat/t_lambda/stream",
					Headers: map[string]string{"authorization": "Bearer " + tok},
					RequestContext: events.LambdaFunctionURLRequestContext{DomainName: "example.lambda-url.aws",
						HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "GET", Path: "/chat/t_lambda/stream"}}}
				type result struct {
					resp *events.LambdaFunctionURLStreamingResponse
					err  error
				}
				got := make(chan result, 1)
				go func() { r, err := lambdaurl.Wrap(h)(ctx, req); got <- result{r, err} }()
				defer cancel()
				<-second
				spy.mu.Lock()
				status, body := spy.status, spy.body
				spy.mu.Unlock()
				if status != http.StatusOK || body != 0 {
					t.Fatalf("when the follower polled again: status %d, %d body bytes; want 200 written and 0 bytes", status, body)
				}
				// The status is written, so lambdaurl has its prelude: Wrap returns, and the prelude reads whole
				// while the body has nothing.
				r := <-got
				if r.err != nil || r.resp.StatusCode != http.StatusOK {
					t.Fatalf("Wrap: %v %+v", r.err, r.resp)
				}
				checkStreamHeaders(t, http.Header{"Content-Type": {r.resp.Headers["Content-Type"]},
					"X-Vercel-Ai-Ui-Message-Stream": {r.resp.Headers["X-Vercel-Ai-Ui-Message-Stream"]}})
				p := make([]byte, 4096)
				n, err := r.resp.Read(p)
				if err != nil || n < 8 || string(p[n-8:n]) != "\x00\x00\x00\x00\x00\x00\x00\x00" {
					t.Fatalf("prelude: %q %v", p[:n], err)
				}
				var prelude struct {
					StatusCode int `json:"statusCode"`
				}
				if err := json.Unmarshal(p[:n-8], &prelude); err != nil || prelude.StatusCode != 200 {
					t.Fatalf("prelude %q: %v", p[:n-8], err)
				}
				cancel()
				r.resp.Close()
			})
		})
	}
}

func checkStreamHeaders(t *testing.T, h http.Header) {
	t.Helper()
	if h.Get("Content-Type") != "text/event-stream" || h.Get("X-Vercel-Ai-Ui-Message-Stream") != "v1" {
		t.Fatalf("headers %v, want the UI message stream's", h)
	}
}

// claimSilentRun gives alice's thread id a running run that never writes a segment (its writer died before its
// first save), and returns a channel closed at the follower's second poll of it.
func claimSilentRun(t *testing.T, st agent.Store, clock agent.Clock, polls *pollSignals, id string) <-chan struct{} {
	t.Helper()
	ctx, now := context.Background(), clock.Now()
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: id, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	runID := "run_" + id
	second := polls.second(runID)
	if _, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "alice", RunID: runID, AssistantMessageID: "msg_" + id,
		Now: now, Reserve: 2}); err != nil {
		t.Fatal(err)
	}
	return second
}

// pollSignals is the store as every component sees it, telling a test when a run's segments are read twice.
type pollSignals struct {
	agent.Store
	mu      sync.Mutex
	waiting map[string]*pollWait
}

type pollWait struct {
	n    int
	done chan struct{}
}

func (p *pollSignals) second(runID string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := &pollWait{done: make(chan struct{})}
	p.waiting[runID] = w
	return w.done
}

func (p *pollSignals) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	segs, err := p.Store.ListSegments(ctx, runID, from, now)
	p.mu.Lock()
	if w := p.waiting[runID]; w != nil {
		if w.n++; w.n == 2 {
			close(w.done)
		}
	}
	p.mu.Unlock()
	return segs, err
}

// headRecorder is a response writer that remembers what reached the client: the status, the headers sent with
// it, the status a Flush sent, and how many body bytes.
type headRecorder struct {
	mu            sync.Mutex
	header        http.Header
	sent          http.Header
	status        int
	flushedStatus int
	body          int
}

func (r *headRecorder) Header() http.Header { return r.header }

func (r *headRecorder) WriteHeader(status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.status == 0 {
		r.status, r.sent = status, r.header.Clone()
	}
}

func (r *headRecorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.body += len(p)
	return len(p), nil
}

func (r *headRecorder) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.flushedStatus == 0 {
		r.flushedStatus = r.status
	}
}

// lambdaSpy records what the handler writes to lambdaurl's writer. Like that writer, it cannot flush.
type lambdaSpy struct {
	http.ResponseWriter
	rec *headRecorder
}

func (s *lambdaSpy) WriteHeader(status int) {
	s.rec.mu.Lock()
	if s.rec.status == 0 {
		s.rec.status = status
	}
	s.rec.mu.Unlock()
	s.ResponseWriter.WriteHeader(status)
}

func (s *lambdaSpy) Write(p []byte) (int, error) {
	s.rec.mu.Lock()
	if s.rec.status == 0 {
		s.rec.status = http.StatusOK
	}
	s.rec.body += len(p)
	s.rec.mu.Unlock()
	return s.ResponseWriter.Write(p)
}

// The same for POST /chat: its status and headers are flushed before the turn runs, not with the stream's first
// byte. An answer to an approval while a steer waits is an answer-only turn whose own stream the client never
// gets (the delivery pass's follows it): before, the client had no status line for as long as the approved tool
// ran. The signal is the approved tool's start.
func TestChatSendsItsHeadersBeforeTheTurnWritesAnything(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			started, release := make(chan struct{}), make(chan struct{})
			h := startHITL(t, store, func(h *hitlStack) {
				h.tools = func(agent.ValueStore, agent.Clock) []agent.Tool {
					return []agent.Tool{{Name: "launch", Kind: agent.ToolServer, Approval: agent.ApprovalAlways,
						InputSchema: json.RawMessage(`{"type":"object"}`),
						Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
							close(started)
							select {
							case <-release:
							case <-ctx.Done():
							}
							return json.RawMessage(`{"launched":true}`), nil
						}}}
				}
			})
			h.send("th", "u1", `/tool launch {}`)
			if out := h.deliver(h.finishedJob("th", "call_1", "a brief")); out.Status != agent.DeliveredQueued {
				t.Fatalf("delivery while a question is pending: %+v", out)
			}
			body, _ := json.Marshal(answerBody(h.view("th"), respond(true, "")))
			req, _ := http.NewRequest("POST", "/chat", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token(t, "alice"))
			req.Header.Set("Content-Type", "application/json")
			rec := &headRecorder{header: http.Header{}}
			done := make(chan struct{})
			go func() { defer close(done); h.stack.Handler.ServeHTTP(rec, req) }()
			defer func() { close(release); <-done }()
			<-started
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.flushedStatus != http.StatusOK || rec.body != 0 {
				t.Fatalf("when the approved tool started: status %d flushed with it %d, %d body bytes; want 200 flushed and 0 bytes",
					rec.status, rec.flushedStatus, rec.body)
			}
			checkStreamHeaders(t, rec.sent)
		})
	}
}
