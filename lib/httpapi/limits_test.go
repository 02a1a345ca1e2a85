package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
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
	return limitStackWith(t, store, limits, nil)
}

// limitStackWith is limitStack with the stack's options adjusted (a clock, a model that holds its replies).
func limitStackWith(t *testing.T, store string, limits func(*config.Config), adjust func(*devserver.Options, *http.Handler)) *fixture {
	t.Helper()
	var model http.Handler = offline.New(offline.WithWordDelay(20 * time.Millisecond))
	cfg := config.Config{Secret: string(secret), Heartbeat: 50 * time.Millisecond, SegmentFlush: 20 * time.Millisecond,
		CancelPoll: 20 * time.Millisecond, ResumePollMax: 20 * time.Millisecond}
	limits(&cfg)
	o := devserver.Options{Data: t.TempDir(), Config: cfg, OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond }}
	if adjust != nil {
		adjust(&o, &model)
	}
	ms := httptest.NewServer(model)
	t.Cleanup(ms.Close)
	o.ModelURL = ms.URL + "/v1/"
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

// pausedClock is the wall clock, which a test can pause: while paused every Now is the instant it paused at, so
// requests made meanwhile happen "at the same time" whatever order a loaded machine runs them in. A paused
// clock resumes at the wall clock, which is past every instant it ever gave (SystemClock is monotonic enough:
// the stack's own writes compare times in milliseconds). jitter, when set, hands each reading back up to that
// much later (a goroutine preempted between reading the clock and using what it read).
type pausedClock struct {
	jitter time.Duration
	mu     sync.Mutex
	at     time.Time
}

func (c *pausedClock) Now() time.Time {
	c.mu.Lock()
	now := c.at
	c.mu.Unlock()
	if now.IsZero() {
		now = agent.SystemClock{}.Now()
	}
	if c.jitter > 0 {
		time.Sleep(rand.N(c.jitter))
	}
	return now
}

// pause stops the clock until the returned func is called.
func (c *pausedClock) pause() (resume func()) {
	c.mu.Lock()
	c.at = agent.SystemClock{}.Now()
	c.mu.Unlock()
	return func() { c.mu.Lock(); c.at = time.Time{}; c.mu.Unlock() }
}

// heldModel wraps the model so that every reply waits until release is closed (or its request ends): a run
// stays live for as long as a test needs it, however slowly the machine runs the test.
func heldModel(model http.Handler, release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		model.ServeHTTP(w, r)
	})
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

// Concurrent clients of one user each start a run on a thread of their own: exactly the limit get a stream, the
// others 429 too_many_runs with Retry-After and nothing stored; another user is not affected; once the runs
// end, the user starts runs again. The runs' model holds its replies until every client has been answered (a
// run that ended while the others were still posting would free its slot: that is timing, not the limit).
func TestActiveRunsLimitOverHTTP(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			const limit, clients = 3, 10
			release := make(chan struct{})
			end := sync.OnceFunc(func() { close(release) })
			defer end()
			f := limitStackWith(t, store, func(c *config.Config) { c.MaxActiveRunsPerUser = limit },
				func(o *devserver.Options, model *http.Handler) { *model = heldModel(*model, release) })
			alice, bob := token(t, "alice"), token(t, "bob")
			resps := make([]*http.Response, clients)
			errs := make([]error, clients)
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					resps[i], errs[i] = f.post(alice, "/chat", chatBody(fmt.Sprintf("run-%d", i), "u1", "/slow 5"))
				})
			}
			wg.Wait()
			var streams []*http.Response
			var refused []string
			for i, resp := range resps {
				if errs[i] != nil {
					t.Fatalf("POST /chat run-%d: %v", i, errs[i])
				}
				if resp.StatusCode == http.StatusOK {
					streams = append(streams, resp)
					continue
				}
				wantTooMany(t, resp, agent.CodeTooManyRuns, 5)
				refused = append(refused, fmt.Sprintf("run-%d", i))
			}
			if len(streams) != limit || len(refused) != clients-limit {
				t.Fatalf("%d concurrent runs with limit %d: %d streamed, %d refused", clients, limit, len(streams), len(refused))
			}
			for _, thread := range refused {
				if resp := f.do(t, "GET", "/threads/"+thread, alice, nil); resp.StatusCode != http.StatusNotFound {
					t.Fatalf("GET /threads/%s after its refusal: %d, want 404 (nothing stored)", thread, resp.StatusCode)
				}
			}
			end()
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

// post is do for a goroutine other than the test's: it reports the error instead of failing the test.
func (f *fixture) post(tok, path string, body any) (*http.Response, error) {
	js, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest("POST", f.url+path, bytes.NewReader(js))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// postWhenFree posts a message, retrying while the previous runs are finishing (their slot is given back after
// the stream's last byte reached the client).
func postWhenFree(t *testing.T, f *fixture, tok, thread string) *http.Response {
	t.Helper()
	for tries := 0; ; tries++ {
		resp := f.do(t, "POST", "/chat", tok, chatBody(thread, "u1", "hello"))
		if resp.StatusCode == http.StatusOK {
			return resp
		}
		// 1,500 tries: over 30 s, a bound for a slot never given back, not a measure of how soon it is.
		if resp.StatusCode != http.StatusTooManyRequests || tries == 1500 {
			t.Fatalf("POST /chat %s after the runs ended: %d %s", thread, resp.StatusCode, readAll(t, resp))
		}
		readAll(t, resp)
		time.Sleep(20 * time.Millisecond)
	}
}

// More readers than allowed attach to one live run: exactly the per-run limit get its stream, the others 429
// too_many_streams with Retry-After; the per-user limit counts the user's readers of all runs; another user's
// readers are their own; a reader that ends gives its lease back.
//
// Nothing here depends on timing: the runs stay live until the test ends (their model holds its replies), and
// the clock is paused while readers attach, so a refused reader's Retry-After is measured from the same instant
// as the leases that refused it (with the wall clock, a reader that read the clock just before a winner and
// reached the store just after it was told 3.001 s, "4", and failed under load).
func TestStreamReaderLimitsOverHTTP(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			const perRun, perUser, readers = 2, 3, 6
			const ttl = 3 * time.Second
			clock, release := &pausedClock{jitter: 3 * time.Millisecond}, make(chan struct{})
			end := sync.OnceFunc(func() { close(release) })
			defer end()
			f := limitStackWith(t, store, func(c *config.Config) {
				c.MaxStreamsPerRun, c.MaxStreamsPerUser, c.StreamLeaseTTL = perRun, perUser, ttl
			}, func(o *devserver.Options, model *http.Handler) {
				o.Clock, *model = clock, heldModel(*model, release)
			})
			alice, bob := token(t, "alice"), token(t, "bob")
			start := func(tok, thread string) *http.Response {
				resp := f.do(t, "POST", "/chat", tok, chatBody(thread, "u1", "/slow 5"))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("POST /chat %s: %d", thread, resp.StatusCode)
				}
				return resp
			}
			// attach opens n readers at once (at one instant of the paused clock) and checks every refusal.
			attach := func(tok, thread string, n int) (ok []*http.Response, refused int) {
				defer clock.pause()()
				resps := make([]*http.Response, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						req, _ := http.NewRequest("GET", f.url+"/chat/"+thread+"/stream", nil)
						req.Header.Set("Authorization", "Bearer "+tok)
						resps[i], errs[i] = http.DefaultClient.Do(req)
					})
				}
				wg.Wait()
				for i, resp := range resps {
					if errs[i] != nil {
						t.Fatalf("GET /chat/%s/stream: %v", thread, errs[i])
					}
					if resp.StatusCode == http.StatusOK {
						ok = append(ok, resp)
						continue
					}
					wantTooMany(t, resp, agent.CodeTooManyStreams, int(ttl/time.Second))
					refused++
				}
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
			// Readers that end (the client went away) give their leases back: the server learns it when it sees
			// the connection close, so poll (the clock is paused only while a reader attaches: the leases held
			// cannot expire in the meantime, 3 s is far longer than the poll).
			onR1[0].Body.Close()
			var again []*http.Response
			for tries := 0; len(again) == 0; tries++ {
				if again, _ = attach(alice, "r1", 1); len(again) == 0 {
					if tries == 1500 {
						t.Fatal("no reader attached in 1,500 tries (over 30 s) after one went away")
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			end()
			for _, r := range append(append(append(append(onR1[1:], onR2...), onB...), again...), w1, w2, b) {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
		})
	}
}

// New threads per minute over HTTP: the second new thread of the minute is 429 thread_rate_limited with a
// Retry-After of at most the minute, and is not created; a message to the existing thread and another user's new
// thread go through. The clock is paused: with the wall clock, the two posts could fall on either side of a
// minute's boundary (fixed windows), and the second would be allowed.
func TestThreadsPerMinuteOverHTTP(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clock := &pausedClock{}
			defer clock.pause()()
			f := limitStackWith(t, store, func(c *config.Config) { c.ThreadsPerMinute = 1 },
				func(o *devserver.Options, _ *http.Handler) { o.Clock = clock })
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
