package benchmarks

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// Stop latency (issue 18 item 5): how long after a stop request a streaming reply ends for its client (the stop
// POST sent → the stream's finish and [DONE] read), p50 and p99 over b.N stops of a /slow 1000 reply (a word
// every 100 ms), and how many words still arrived after the stop. Each stop is sent at a random moment (seeded)
// within the heartbeat period after the reply's first word: a stop the run learns from the store waits for the
// next heartbeat batch, so stops sent at one phase of it would all measure the same wait. Two ways:
//
//   - same-process-sqlite: `agentloop dev`'s composition (lib/devserver over SQLite, the offline model over HTTP):
//     the stop reaches the process that runs the reply.
//   - across-processes-dynamo: two stacks over one dynalite table, each with its own DynamoDB client, store,
//     engine, reaper and thread service, sharing nothing in memory (one test process, two "processes"): the reply
//     runs on one, the stop is posted to the other, so the run can learn it only from the store.
//
// Each also runs stopCostRuns replies side by side for stopCostWindow without stopping them and reports the store
// requests a running run costs per second to notice a stop: the reads that look for one (GetThread) and the
// heartbeats (which answer run_canceled: Heartbeat, or one KeepClaims per process per period, which counts one
// request per claim on DynamoDB and one statement per batch on SQLite). Numbers only; nothing here asserts a time.
const (
	stopCostRuns   = 10
	stopCostWindow = 3 * time.Second
)

// stopDetect counts the store calls by which a running run can learn it was stopped.
type stopDetect struct {
	agent.Store
	reads      atomic.Int64 // GetThread
	heartbeats atomic.Int64 // Heartbeat calls, and KeepClaims batches
	claims     atomic.Int64 // claims heartbeated (one each per Heartbeat, the batch's size per KeepClaims)
}

func (s *stopDetect) GetThread(ctx context.Context, id string) (agent.Thread, error) {
	s.reads.Add(1)
	return s.Store.GetThread(ctx, id)
}

func (s *stopDetect) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	s.heartbeats.Add(1)
	s.claims.Add(1)
	return s.Store.Heartbeat(ctx, threadID, f, now)
}

func (s *stopDetect) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	s.heartbeats.Add(1)
	s.claims.Add(int64(len(claims)))
	return s.Store.KeepClaims(ctx, claims, now)
}

func (s *stopDetect) counts() (reads, heartbeats, claims int64) {
	return s.reads.Load(), s.heartbeats.Load(), s.claims.Load()
}

// detecting wraps the stack's store (inside the turn probe's counting) with d.
func detecting(d *stopDetect) func(*devserver.Options, *probe) {
	return func(o *devserver.Options, _ *probe) {
		inner := o.Wrap
		o.Wrap = func(s agent.Store) agent.Store {
			d.Store = s
			return inner(d)
		}
	}
}

// stopConfig: the per-user run limit off (stopCostRuns replies of one user run side by side); the rest defaults.
func stopConfig() config.Config { return config.Config{MaxActiveRunsPerUser: -1} }

// streaming is a reply being read: started is closed at its first text delta, ended once its body ended (at).
type streaming struct {
	started chan struct{}
	ended   chan struct{}
	at      time.Time
	after   int  // text deltas read after stopAt
	done    bool // it ended with finish and [DONE]
	stopAt  atomic.Int64
}

// startReply posts text on thread to s and reads the stream on a goroutine of its own.
func startReply(b *testing.B, s *stack, thread, text string) *streaming {
	b.Helper()
	resp := s.post(b, "/chat", chat(thread, "m", text))
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("POST /chat %s: %d", thread, resp.StatusCode)
	}
	r := &streaming{started: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(r.ended)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		started, finished := false, false
		for sc.Scan() {
			line := sc.Bytes()
			switch {
			case bytes.Contains(line, []byte(`"type":"text-delta"`)):
				if !started {
					started = true
					close(r.started)
				}
				if r.stopAt.Load() != 0 {
					r.after++
				}
			case bytes.Contains(line, []byte(`"type":"finish"`)):
				finished = true
			case bytes.Equal(line, []byte("data: [DONE]")):
				r.at, r.done = time.Now(), finished
			}
		}
		if !started {
			close(r.started)
		}
	}()
	return r
}

// stopLatency runs b.N stops: a reply on run, its stop posted to stop (the same stack or another).
func stopLatency(b *testing.B, run, stop *stack) {
	var lat []time.Duration
	after := 0
	rng := rand.New(rand.NewPCG(18, 5))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		thread := fmt.Sprintf("stop%d", i)
		r := startReply(b, run, thread, "/slow 1000")
		<-r.started
		time.Sleep(time.Duration(rng.Int64N(int64(agent.DefaultHeartbeat)))) // the stop's phase in the heartbeat period
		at := time.Now()
		r.stopAt.Store(at.UnixNano())
		if resp := stop.post(b, "/threads/"+thread+"/stop", ""); resp.StatusCode != http.StatusAccepted {
			b.Fatalf("stop = %d", resp.StatusCode)
		} else {
			resp.Body.Close()
		}
		<-r.ended
		if !r.done {
			b.Fatalf("stream of %s did not end with finish and [DONE]", thread)
		}
		lat = append(lat, r.at.Sub(at))
		after += r.after
	}
	b.StopTimer()
	b.ReportMetric(pct(lat, 0.50)/1000, "p50-stop-ms")
	b.ReportMetric(pct(lat, 0.99)/1000, "p99-stop-ms")
	b.ReportMetric(float64(after)/float64(b.N), "words-after-stop")
}

// stopCost streams stopCostRuns replies side by side on s for stopCostWindow and reports what noticing a stop
// cost each running run per second; perClaim says whether a KeepClaims batch costs a request per claim (DynamoDB)
// or one for the batch (SQLite). The replies are stopped afterwards.
func stopCost(b *testing.B, s *stack, d *stopDetect, perClaim bool) {
	var rs []*streaming
	for i := range stopCostRuns {
		rs = append(rs, startReply(b, s, fmt.Sprintf("cost%d", i), "/slow 1000"))
	}
	for _, r := range rs {
		<-r.started
	}
	r0, h0, c0 := d.counts()
	start := time.Now()
	time.Sleep(stopCostWindow)
	r1, h1, c1 := d.counts()
	runSecs := time.Since(start).Seconds() * stopCostRuns
	for i, r := range rs {
		r.stopAt.Store(time.Now().UnixNano())
		if resp := s.post(b, fmt.Sprintf("/threads/cost%d/stop", i), ""); resp.StatusCode != http.StatusAccepted {
			b.Fatalf("stop = %d", resp.StatusCode)
		} else {
			resp.Body.Close()
		}
	}
	for _, r := range rs {
		<-r.ended
	}
	hb := float64(h1 - h0)
	if perClaim {
		hb = float64(c1 - c0)
	}
	b.ReportMetric(float64(r1-r0)/runSecs, "stop-reads/run-s")
	b.ReportMetric(hb/runSecs, "heartbeat-requests/run-s")
	b.ReportMetric((float64(r1-r0)+hb)/runSecs, "stop-detect-requests/run-s")
}

// BenchmarkStop: stop → stream end, in the reply's own process on SQLite and across processes on DynamoDB, and
// the store requests per running run per second that noticing a stop costs (the doc above). make bench runs 50.
func BenchmarkStop(b *testing.B) {
	b.Run("same-process-sqlite", func(b *testing.B) {
		d := &stopDetect{}
		s := setup(b, nil, nil, stopConfig(), detecting(d))
		stopLatency(b, s, s)
		stopCost(b, s, d, false)
	})
	b.Run("across-processes-dynamo", func(b *testing.B) {
		endpoint := dynamotest.Start(b)
		table := fmt.Sprintf("stop_%d", time.Now().UnixNano())
		if err := dynamotest.CreateTable(context.Background(), dynamotest.Client(endpoint), table); err != nil {
			b.Fatal(err)
		}
		d := &stopDetect{}
		// Each "process" has its own client and store over the one table, and shares nothing else.
		runner := setup(b, dynamo.New(dynamotest.Client(endpoint), table), nil, stopConfig(), detecting(d))
		stopper := setup(b, dynamo.New(dynamotest.Client(endpoint), table), nil, stopConfig())
		stopper.token = runner.token // the same user (both stacks mint with the bench secret)
		stopLatency(b, runner, stopper)
		stopCost(b, runner, d, true)
	})
}
