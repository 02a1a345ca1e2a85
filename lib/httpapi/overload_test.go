package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
)

// overloadStack serves every route over the local stack (SQLite) with admission control's bounds set, its model
// holding every reply until release is closed, on clock (nil: the wall clock), its store wrapped by wrap (nil:
// as it is). It returns the fixture and the engine (whose Load the tests wait on).
func overloadStack(t *testing.T, bounds func(*config.Config), release <-chan struct{}, clock agent.Clock,
	wrap func(agent.Store) agent.Store) (*fixture, *engine.Engine) {
	t.Helper()
	ms := httptest.NewServer(heldModel(offline.New(offline.WithWordDelay(20*time.Millisecond)), release))
	t.Cleanup(ms.Close)
	cfg := config.Config{Secret: string(secret), Heartbeat: 50 * time.Millisecond, SegmentFlush: 20 * time.Millisecond,
		CancelPoll: 20 * time.Millisecond, ResumePollMax: 20 * time.Millisecond, StaleAfter: time.Minute}
	bounds(&cfg)
	stack, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), Config: cfg, ModelURL: ms.URL + "/v1/",
		Clock: clock, Wrap: wrap, OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	srv := httptest.NewServer(stack.Handler)
	t.Cleanup(srv.Close)
	return &fixture{url: srv.URL, store: stack.Store}, stack.Engine
}

// wantOverloaded checks a 503 overloaded with a Retry-After of whole seconds (engine.OverloadRetryAfter), and that
// the refused request stored nothing: its thread does not exist.
func wantOverloaded(t *testing.T, f *fixture, tok, thread string, resp *http.Response) {
	t.Helper()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("POST /chat %s: status %d (%s), want 503", thread, resp.StatusCode, readAll(t, resp))
	}
	want := int(engine.OverloadRetryAfter / time.Second)
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra != want {
		t.Fatalf("Retry-After %q, want %d", resp.Header.Get("Retry-After"), want)
	}
	if code := errorCode(t, resp); code != agent.CodeOverloaded {
		t.Fatalf("code %q, want %q", code, agent.CodeOverloaded)
	}
	if resp := f.do(t, "GET", "/threads/"+thread, tok, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /threads/%s after its refusal: %d, want 404 (nothing stored)", thread, resp.StatusCode)
	}
}

// waitLoad waits until the engine's load satisfies ok (a run gives its place back just after its stream's last
// byte; a heartbeat is accepted a tick after the store lets it through).
func waitLoad(t *testing.T, e *engine.Engine, what string, ok func(engine.Load) bool) {
	t.Helper()
	for tries := 0; !ok(e.Load()); tries++ {
		if tries == 3000 { // 30 s: a bound for a load that never comes, not a measure of how soon it does
			t.Fatalf("engine load %+v: never %s", e.Load(), what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// At the per-process bound a new run is refused early: 503 overloaded with Retry-After, nothing stored, whoever
// asks; below the bound it passes; resuming a running
// reply's stream and stopping it are never refused; once the runs end, new ones are admitted again.
func TestOverloadedAtTheRunBound(t *testing.T) {
	t.Parallel()
	const bound = 2
	release := make(chan struct{})
	end := sync.OnceFunc(func() { close(release) })
	defer end()
	f, eng := overloadStack(t, func(c *config.Config) { c.MaxRunsPerProcess = bound; c.MaxActiveRunsPerUser = -1 }, release, nil, nil)
	alice, bob := token(t, "alice"), token(t, "bob")

	var streams []*http.Response
	for i := range bound {
		resp := f.do(t, "POST", "/chat", alice, chatBody("run-"+strconv.Itoa(i), "u1", "hello"))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("run %d below the bound: %d %s", i, resp.StatusCode, readAll(t, resp))
		}
		streams = append(streams, resp)
	}
	if l := eng.Load(); l.Running != bound {
		t.Fatalf("load %+v with %d runs held", l, bound)
	}
	for _, tc := range []struct{ name, tok, thread string }{
		{"a new thread", alice, "over-1"},
		{"another user", bob, "over-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantOverloaded(t, f, tc.tok, tc.thread, f.do(t, "POST", "/chat", tc.tok, chatBody(tc.thread, "u1", "hello")))
		})
	}
	t.Run("resume is not refused", func(t *testing.T) {
		resp := f.do(t, "GET", "/chat/run-0/stream", alice, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("resume at the bound: %d %s", resp.StatusCode, readAll(t, resp))
		}
		streams = append(streams, resp) // read once the runs end
	})
	t.Run("stop is not refused", func(t *testing.T) {
		if resp := f.do(t, "POST", "/threads/run-1/stop", alice, nil); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("stop at the bound: %d %s", resp.StatusCode, readAll(t, resp))
		}
	})
	end()
	for _, s := range streams {
		readAll(t, s)
	}
	waitLoad(t, eng, "idle", func(l engine.Load) bool { return l.Running == 0 })
	t.Run("admitted again", func(t *testing.T) {
		resp := f.do(t, "POST", "/chat", alice, chatBody("over-1", "u1", "hello"))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("after the runs ended: %d %s", resp.StatusCode, readAll(t, resp))
		}
		readAll(t, resp)
	})
}

// heldHeartbeats holds every heartbeat until the test opens it (a store or a CPU too busy to keep the runs alive
// on time).
type heldHeartbeats struct {
	agent.Store
	open chan struct{}
}

func (h *heldHeartbeats) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	select {
	case <-h.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return h.Store.Heartbeat(ctx, threadID, f, now)
}

// KeepClaims is held as Heartbeat is: it is the heartbeat of a process's runs in one call (lib/engine's keeper).
func (h *heldHeartbeats) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	select {
	case <-h.open:
	case <-ctx.Done():
		out := make([]agent.KeepResult, len(claims))
		for i := range out {
			out[i].Err = ctx.Err()
		}
		return out
	}
	return h.Store.KeepClaims(ctx, claims, now)
}

// stoppedClock is a clock that moves only when the test moves it (the engine's waits are on real time: it has
// no timers of its own).
type stoppedClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stoppedClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *stoppedClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A process whose runs' heartbeats fall behind refuses new runs early (503 overloaded, nothing stored) while the
// run it holds goes on; once its heartbeats catch up, it admits again. The lag is measured on the injected clock:
// the test holds the heartbeats and moves the clock past the bound, no wall-clock time is asserted.
func TestOverloadedWhenHeartbeatsLag(t *testing.T) {
	t.Parallel()
	const lag = 2 * time.Second
	release := make(chan struct{})
	end := sync.OnceFunc(func() { close(release) })
	defer end()
	alice := token(t, "alice")
	clock := &stoppedClock{now: agent.SystemClock{}.Now()}
	held := &heldHeartbeats{open: make(chan struct{})}
	f, eng := overloadStack(t, func(c *config.Config) { c.MaxHeartbeatLag = lag }, release, clock,
		func(s agent.Store) agent.Store { held.Store = s; return held })

	running := f.do(t, "POST", "/chat", alice, chatBody("live", "u1", "hello"))
	if running.StatusCode != http.StatusOK {
		t.Fatalf("first run: %d %s", running.StatusCode, readAll(t, running))
	}
	steps := []struct {
		name    string
		move    time.Duration // the clock moves on by this first
		catchUp bool          // the heartbeats are let through first, until every run's is accepted
		want    int
	}{
		{"on time", 0, false, http.StatusOK},
		{"within the bound", lag, false, http.StatusOK},
		{"past the bound", 2 * time.Second, false, http.StatusServiceUnavailable},
		{"caught up", 0, true, http.StatusOK},
	}
	streams := []*http.Response{running}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clock.add(st.move)
			if st.catchUp {
				close(held.open)
				waitLoad(t, eng, "caught up", func(l engine.Load) bool { return l.HeartbeatLag == 0 })
			}
			thread := "t" + strconv.Itoa(i)
			resp := f.do(t, "POST", "/chat", alice, chatBody(thread, "u1", "hello"))
			if st.want == http.StatusServiceUnavailable {
				wantOverloaded(t, f, alice, thread, resp)
				return
			}
			if resp.StatusCode != st.want {
				t.Fatalf("load %+v: status %d (%s), want %d", eng.Load(), resp.StatusCode, readAll(t, resp), st.want)
			}
			streams = append(streams, resp) // read once the runs end
		})
	}
	end()
	for _, s := range streams {
		readAll(t, s)
	}
}
