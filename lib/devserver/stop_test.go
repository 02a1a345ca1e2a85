package devserver_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/offline"
)

// stillTimers is a clock (the wall clock) whose timers never fire unless they are for no time at all: nothing the
// stack waits for on its clock (a heartbeat period, a poll, a flush interval) ever comes. armed counts the waits
// of some length that were asked for.
type stillTimers struct{ armed atomic.Int64 }

func (c *stillTimers) Now() time.Time { return agent.SystemClock{}.Now() }

func (c *stillTimers) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	c.armed.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

func (c *stillTimers) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.Now()
	} else {
		c.armed.Add(1)
	}
	return ch
}

func (c *stillTimers) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	if d <= 0 {
		cancel(cause)
	} else {
		c.armed.Add(1)
	}
	return ctx, func() { cancel(context.Canceled) }
}

// A stop posted to the process that runs the reply reaches the run in memory (the thread service's LocalStopper
// is the engine): the reply ends as canceled, its stream with finish and [DONE], although no timer of the
// engine's clock ever fires, so neither a heartbeat nor a poll could have carried it. Before the stop was
// delivered in-process the run learned of it only on such a tick, and this stream never ended.
func TestStopReachesTheRunInProcess(t *testing.T) {
	t.Parallel()
	model := httptest.NewServer(offline.New(offline.WithWordDelay(20 * time.Millisecond)))
	t.Cleanup(model.Close)
	clock := &stillTimers{}
	s, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), Clock: clock, ModelURL: model.URL + "/v1/",
		Config: config.Config{StaleAfter: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler)
	t.Cleanup(srv.Close)
	tok, err := s.Token("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	post := func(ctx context.Context, path, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// A bound on a stream that never ends, so that the test fails instead of hanging; not a measure of how soon
	// it ends (make bench's BenchmarkStop is).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := post(ctx, "/chat", fmt.Sprintf(`{"id":"th","trigger":"submit-message","messages":[{"id":"u1","role":"user","parts":[{"type":"text","text":%q}]}]}`,
		"/slow 1000"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /chat: %d", resp.StatusCode)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !bytes.Contains(sc.Bytes(), []byte(`"type":"text-delta"`)) {
	}
	armed := clock.armed.Load()
	if stop := post(ctx, "/threads/th/stop", ""); stop.StatusCode != http.StatusAccepted {
		t.Fatalf("stop: %d", stop.StatusCode)
	}
	var rest []string
	for sc.Scan() {
		rest = append(rest, sc.Text())
	}
	if ctx.Err() != nil {
		t.Fatalf("the stream did not end after the stop (it read %d more lines)", len(rest))
	}
	tail := strings.Join(rest, "\n")
	if !strings.Contains(tail, `"type":"finish"`) || !strings.HasSuffix(strings.TrimSpace(tail), "data: [DONE]") {
		t.Fatalf("the stream did not end with finish and [DONE]: %q", tail)
	}
	runs, err := s.Store.ListRuns(context.Background(), "th")
	if err != nil || len(runs) != 1 || runs[0].Status != agent.RunCanceled {
		t.Fatalf("runs %+v %v, want one canceled", runs, err)
	}
	t.Logf("timers armed on the clock: %d before the stop, %d after; none fired", armed, clock.armed.Load())
}
