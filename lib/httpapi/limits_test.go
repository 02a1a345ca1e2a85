package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
)

// limitStack serves every route over the local stack with the given limits, on SQLite or on dynalite.
func limitStack(t *testing.T, store string, limits func(*config.Config)) *fixture {
	t.Helper()
	model := httptest.NewServer(offline.New(offline.WithWordDelay(20 * time.Millisecond)))
	t.Cleanup(model.Close)
	cfg := config.Config{Secret: string(secret), Heartbeat: 50 * time.Millisecond, SegmentFlush: 20 * time.Millisecond,
		CancelPoll: 20 * time.Millisecond, ResumePollMax: 20 * time.Millisecond}
	limits(&cfg)
	o := devserver.Options{Data: t.TempDir(), ModelURL: model.URL + "/v1/", Config: cfg,
		OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond }}
	if store == "dynamo" {
		client := dynamotest.Client(dynamotest.Start(t))
		table := fmt.Sprintf("limits_%d", time.Now().UnixNano())
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
	srv := httptest.NewServer(stack.Handler)
	t.Cleanup(srv.Close)
	return &fixture{url: srv.URL, store: stack.Store}
}

func limitBackends() []string {
	if testing.Short() {
		return []string{"sqlite"}
	}
	return []string{"sqlite", "dynamo"}
}

// wantTooMany checks a 429: the code, and a Retry-After of whole seconds, at least 1 and at most max.
func wantTooMany(t *testing.T, resp *http.Response, code string, max int) {
	t.Helper()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d (%s), want 429", resp.StatusCode, readAll(t, resp))
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > max {
		t.Fatalf("Retry-After %q, want whole seconds in [1, %d]", resp.Header.Get("Retry-After"), max)
	}
	if got := errorCode(t, resp); got != code {
		t.Fatalf("code %q, want %q", got, code)
	}
}

// Concurrent clients of one user each start a slow run on a thread of their own: exactly the limit get a
// stream, the others 429 too_many_runs with Retry-After and nothing stored; another user is not affected; once
// the runs end, the user starts runs again.
func TestActiveRunsLimitOverHTTP(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			const limit, clients = 3, 10
			f := limitStack(t, store, func(c *config.Config) { c.MaxActiveRunsPerUser = limit })
			alice, bob := token(t, "alice"), token(t, "bob")
			var mu sync.Mutex
			var streams []*http.Response
			var refused []string
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					thread := fmt.Sprintf("run-%d", i)
					resp := f.do(t, "POST", "/chat", alice, chatBody(thread, "u1", "/slow 100"))
					mu.Lock()
					defer mu.Unlock()
					if resp.StatusCode == http.StatusOK {
						streams = append(streams, resp)
						return
					}
					wantTooMany(t, resp, agent.CodeTooManyRuns, 5)
					refused = append(refused, thread)
				})
			}
			wg.Wait()
			if len(streams) != limit || len(refused) != clients-limit {
				t.Fatalf("%d concurrent runs with limit %d: %d streamed, %d refused", clients, limit, len(streams), len(refused))
			}
			for _, thread := range refused {
				if resp := f.do(t, "GET", "/threads/"+thread, alice, nil); resp.StatusCode != http.StatusNotFound {
					t.Fatalf("GET /threads/%s after its refusal: %d, want 404 (nothing stored)", thread, resp.StatusCode)
				}
			}
			resp := f.do(t, "POST", "/chat", bob, chatBody("bob-1", "u1", "hello"))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("bob while alice is at her limit: %d", resp.StatusCode)
			}
			readAll(t, resp)
			for _, s := range streams {
				if _, err := io.Copy(io.Discard, s.Body); err != nil {
					t.Fatal(err)
				}
				s.Body.Close()
			}
			// A run gives its slot back just after its stream's last byte: wait for the claims to go.
			for _, thread := range []string{"again-1", "again-2", "again-3"} {
				resp := postWhenFree(t, f, alice, thread)
				readAll(t, resp)
			}
		})
	}
}

// postWhenFree posts a message, retrying briefly while the previous runs are finishing (their slot is given
// back after the stream's last byte reached the client).
func postWhenFree(t *testing.T, f *fixture, tok, thread string) *http.Response {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := f.do(t, "POST", "/chat", tok, chatBody(thread, "u1", "hello"))
		if resp.StatusCode == http.StatusOK {
			return resp
		}
		if resp.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("POST /chat %s after the runs ended: %d %s", thread, resp.StatusCode, readAll(t, resp))
		}
		readAll(t, resp)
		time.Sleep(20 * time.Millisecond)
	}
}

// More readers than allowed attach to one live run: exactly the per-run limit get its stream, the others 429
// too_many_streams with Retry-After; the per-user limit counts the user's readers of all runs; another user's
// readers are their own; a reader that ends gives its lease back.
func TestStreamReaderLimitsOverHTTP(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			const perRun, perUser, readers = 2, 3, 6
			f := limitStack(t, store, func(c *config.Config) {
				c.MaxStreamsPerRun, c.MaxStreamsPerUser, c.StreamLeaseTTL = perRun, perUser, 3*time.Second
			})
			alice, bob := token(t, "alice"), token(t, "bob")
			start := func(tok, thread string) *http.Response {
				resp := f.do(t, "POST", "/chat", tok, chatBody(thread, "u1", "/slow 150"))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("POST /chat %s: %d", thread, resp.StatusCode)
				}
				return resp
			}
			attach := func(tok, thread string, n int) (ok []*http.Response, refused int) {
				var mu sync.Mutex
				var wg sync.WaitGroup
				for range n {
					wg.Go(func() {
						resp := f.do(t, "GET", "/chat/"+thread+"/stream", tok, nil)
						mu.Lock()
						defer mu.Unlock()
						if resp.StatusCode == http.StatusOK {
							ok = append(ok, resp)
							return
						}
						wantTooMany(t, resp, agent.CodeTooManyStreams, 3)
						refused++
					})
				}
				wg.Wait()
				return ok, refused
			}
			w1, w2 := start(alice, "r1"), start(alice, "r2")
			onR1, refused := attach(alice, "r1", readers)
			if len(onR1) != perRun || refused != readers-perRun {
				t.Fatalf("%d readers of one run, limit %d: %d attached, %d refused", readers, perRun, len(onR1), refused)
			}
			onR2, refused := attach(alice, "r2", readers)
			if len(onR2) != perUser-perRun || refused != readers-(perUser-perRun) {
				t.Fatalf("readers of a second run with %d of %d of the user's taken: %d attached, %d refused", perRun, perUser, len(onR2), refused)
			}
			b := start(bob, "b1")
			onB, refused := attach(bob, "b1", 1)
			if len(onB) != 1 || refused != 0 {
				t.Fatalf("bob's reader while alice is at her limit: %d attached", len(onB))
			}
			// Readers that end (the client went away) give their leases back.
			onR1[0].Body.Close()
			var again []*http.Response
			deadline := time.Now().Add(5 * time.Second)
			for len(again) == 0 {
				again, _ = attach(alice, "r1", 1)
				if len(again) == 0 && time.Now().After(deadline) {
					t.Fatal("no reader attached after one went away")
				}
				time.Sleep(20 * time.Millisecond)
			}
			for _, r := range append(append(append(append(onR1[1:], onR2...), onB...), again...), w1, w2, b) {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
		})
	}
}

// New threads per minute over HTTP: the second new thread of the minute is 429 thread_rate_limited with a
// Retry-After of at most the minute, and is not created; a message to the existing thread and another user's new
// thread go through.
func TestThreadsPerMinuteOverHTTP(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			f := limitStack(t, store, func(c *config.Config) { c.ThreadsPerMinute = 1 })
			alice, bob := token(t, "alice"), token(t, "bob")
			readAll(t, f.do(t, "POST", "/chat", alice, chatBody("first", "u1", "hello")))
			wantTooMany(t, f.do(t, "POST", "/chat", alice, chatBody("second", "u1", "hello")), agent.CodeThreadRateLimited, 60)
			if resp := f.do(t, "GET", "/threads/second", alice, nil); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("GET /threads/second after its refusal: %d, want 404", resp.StatusCode)
			}
			for _, c := range []struct{ tok, thread, msg string }{{alice, "first", "u2"}, {bob, "second", "u1"}} {
				resp := f.do(t, "POST", "/chat", c.tok, chatBody(c.thread, c.msg, "hello"))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("POST /chat %s: %d %s", c.thread, resp.StatusCode, readAll(t, resp))
				}
				readAll(t, resp)
			}
		})
	}
}

// A browser reads a 429's Retry-After only when CORS exposes it (it is not a safelisted response header).
func TestCORSExposesRetryAfter(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.NewAPI(httpapi.Deps{AllowOrigins: []string{"*"}}))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest("GET", srv.URL+"/healthz", nil)
	req.Header.Set("Origin", "https://app.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	exposed := strings.Split(resp.Header.Get("Access-Control-Expose-Headers"), ",")
	for i := range exposed {
		exposed[i] = strings.ToLower(strings.TrimSpace(exposed[i]))
	}
	if !slices.Contains(exposed, "retry-after") {
		t.Fatalf("Access-Control-Expose-Headers = %q, want retry-after in it", resp.Header.Get("Access-Control-Expose-Headers"))
	}
}
