package devserver_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
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

// stillTimers is a clock (the wall clock) whose timers of realBelow or longer never fire: nothing the stack waits
// for that long on its clock (a heartbeat period, a poll, a flush interval) ever comes; shorter waits (a claim's
// retry backoff) pass on real time. armed counts the waits that never fire.
type stillTimers struct {
	realBelow time.Duration
	armed     atomic.Int64
}

func (c *stillTimers) Now() time.Time { return agent.SystemClock{}.Now() }

func (c *stillTimers) Sleep(ctx context.Context, d time.Duration) error {
	if d < c.realBelow {
		return agent.SystemClock{}.Sleep(ctx, d)
	}
	c.armed.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

func (c *stillTimers) After(d time.Duration) <-chan time.Time {
	if d < c.realBelow {
		return time.After(d)
	}
	c.armed.Add(1)
	return make(chan time.Time)
}

func (c *stillTimers) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	if d < c.realBelow {
		return context.WithTimeoutCause(ctx, d, cause)
	}
	c.armed.Add(1)
	ctx, cancel := context.WithCancelCause(ctx)
	return ctx, func() { cancel(context.Canceled) }
}

func chatBody(thread, msgID, text, multitask string) string {
	return fmt.Sprintf(`{"id":%q,"trigger":"submit-message","multitask":%q,"messages":[{"id":%q,"role":"user","parts":[{"type":"text","text":%q}]}]}`,
		thread, multitask, msgID, text)
}

// A stop that reaches the process running the reply reaches the run in memory (Engine.StopLocal), whether it is
// posted to the stop endpoint (the thread service's LocalStopper is the engine) or comes with a new message that
// interrupts the run (multitask interrupt): the reply ends as canceled, its stream with finish and [DONE],
// although no wait of a heartbeat's length on the engine's clock ever ends, so neither a heartbeat nor a poll
// could have carried the stop. Before the stop was delivered in-process the run learned of it only on such a
// tick: the stream went on to its last word (the stop endpoint), or the interrupting request waited for ever.
func TestStopReachesTheRunInProcess(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		realBelow time.Duration // the clock's waits this short pass (below a heartbeat: none carries a stop)
		stop      func(post func(path, body string) *http.Response) *http.Response
		want      int
	}{
		{"stop endpoint", 0, func(post func(string, string) *http.Response) *http.Response {
			return post("/threads/th/stop", "")
		}, http.StatusAccepted},
		// The interrupting request's claim retries every 25 ms until the run has let go.
		{"multitask interrupt", 100 * time.Millisecond, func(post func(string, string) *http.Response) *http.Response {
			return post("/chat", chatBody("th", "u2", "hello again", "interrupt"))
		}, http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			model := httptest.NewServer(offline.New(offline.WithWordDelay(20 * time.Millisecond)))
			t.Cleanup(model.Close)
			clock := &stillTimers{realBelow: c.realBelow}
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
			// A bound on a stream that never ends, so that the test fails instead of hanging; not a measure of how
			// soon it ends (make bench's BenchmarkStop is).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			post := func(path, body string) *http.Response {
				t.Helper()
				req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+path, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+tok)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("POST %s: %v", path, err)
				}
				return resp
			}
			resp := post("/chat", chatBody("th", "u1", "/slow 1000", ""))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST /chat: %d", resp.StatusCode)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && !bytes.Contains(sc.Bytes(), []byte(`"type":"text-delta"`)) {
			}
			armed := clock.armed.Load()
			stop := c.stop(post)
			if stop.StatusCode != c.want {
				t.Fatalf("stop: %d, want %d", stop.StatusCode, c.want)
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
			if _, err := io.Copy(io.Discard, stop.Body); err != nil { // the interrupting reply, to its end
				t.Fatal(err)
			}
			stop.Body.Close()
			runs, err := s.Store.ListRuns(context.Background(), "th")
			if err != nil || len(runs) == 0 || runs[0].Status != agent.RunCanceled {
				t.Fatalf("runs %+v %v, want the first canceled", runs, err)
			}
			t.Logf("waits armed on the clock that never ended: %d before the stop, %d after", armed, clock.armed.Load())
		})
	}
}
