package benchmarks

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// probe timestamps one turn at a time: when the handler received the POST, when the model endpoint received its
// first request of the turn and finished its last response, and how many store calls had started by then.
type probe struct {
	mu           sync.Mutex
	received     time.Time
	modelAt      time.Time // first model request of the current turn
	lastByte     time.Time
	callsAtModel int64
	ddbAtModel   int64 // DynamoDB requests between the POST and the model request
	ddbAtStart   int64
	calls        atomic.Int64 // store calls started in the current turn
	total        atomic.Int64 // store calls started
	ddb          func() int64 // DynamoDB requests so far (nil on SQLite)
	model        http.Handler
}

func (p *probe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if p.modelAt.IsZero() {
		p.modelAt = time.Now()
		p.callsAtModel = p.calls.Load()
		if p.ddb != nil {
			p.ddbAtModel = p.ddb() - p.ddbAtStart
		}
	}
	p.mu.Unlock()
	p.model.ServeHTTP(w, r)
	p.mu.Lock()
	p.lastByte = time.Now()
	p.mu.Unlock()
}

// counting counts the store calls on a turn's way to the model (thread, claim, messages, interrupts), embedding the port;
// heartbeats, segments and the finish are not counted here.
func (p *probe) count() { p.calls.Add(1); p.total.Add(1) }

type counting struct {
	agent.Store
	p *probe
}

func (c counting) ClaimRun(ctx context.Context, r agent.ClaimRequest) (agent.ClaimResult, error) {
	c.p.count()
	return c.Store.ClaimRun(ctx, r)
}
func (c counting) ListMessages(ctx context.Context, id string) ([]agent.MessageRecord, error) {
	c.p.count()
	return c.Store.ListMessages(ctx, id)
}
func (c counting) ListMessagesPage(ctx context.Context, id string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	c.p.count()
	return c.Store.ListMessagesPage(ctx, id, p)
}
func (c counting) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	c.p.count()
	return c.Store.GetMessage(ctx, threadID, id)
}
func (c counting) GetThread(ctx context.Context, id string) (agent.Thread, error) {
	c.p.count()
	return c.Store.GetThread(ctx, id)
}
func (c counting) CreateThread(ctx context.Context, t agent.Thread) (agent.Thread, bool, error) {
	c.p.count()
	return c.Store.CreateThread(ctx, t)
}
func (c counting) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	c.p.count()
	return c.Store.PutMessage(ctx, w)
}

func (c counting) ListInterrupts(ctx context.Context, id string) ([]agent.Interrupt, error) {
	c.p.count()
	return c.Store.ListInterrupts(ctx, id)
}
func (c counting) ListMessageInterrupts(ctx context.Context, id, messageID string) ([]agent.Interrupt, error) {
	c.p.count()
	return c.Store.ListMessageInterrupts(ctx, id, messageID)
}
func (c counting) ResolveInterrupt(ctx context.Context, r agent.ResolveRequest) (agent.Interrupt, error) {
	c.p.count()
	return c.Store.ResolveInterrupt(ctx, r)
}
func (c counting) CreateInterrupt(ctx context.Context, in agent.Interrupt) (agent.Interrupt, bool, error) {
	c.p.count()
	return c.Store.CreateInterrupt(ctx, in)
}

type stack struct {
	url   string
	token string
	probe *probe
	store agent.Store
	dev   *devserver.Stack
	// measureIndexes turns on the DynamoDB counter's index write accounting (dynamoStack only).
	measureIndexes func()
}

// setup serves the whole local stack (lib/devserver) over store, the offline model behind the real adapter.
func setup(b *testing.B, store agent.Store, ddb func() int64, cfg config.Config, opts ...func(*devserver.Options, *probe)) *stack {
	b.Helper()
	p := &probe{model: offline.New(), ddb: ddb}
	ms := httptest.NewServer(p)
	b.Cleanup(ms.Close)
	cfg.Secret = "bench-secret-bench-secret-bench-secret"
	// Benchmarks open threads far faster than a person does: the new-threads-per-minute limit would stop them. The
	// run limit stays on (turns run one after another), so a turn's measured cost includes its slot's lease.
	if cfg.ThreadsPerMinute == 0 {
		cfg.ThreadsPerMinute = -1
	}
	o := devserver.Options{Data: b.TempDir(), Store: store, ModelURL: ms.URL + "/v1/", Config: cfg,
		Wrap: func(s agent.Store) agent.Store { return counting{Store: s, p: p} }}
	for _, opt := range opts {
		opt(&o, p)
	}
	st, err := devserver.New(context.Background(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/chat" {
			p.mu.Lock()
			p.received, p.modelAt = time.Now(), time.Time{}
			p.calls.Store(0)
			if ddb != nil {
				p.ddbAtModel, p.ddbAtStart = 0, ddb()
			}
			p.mu.Unlock()
		}
		st.Handler.ServeHTTP(w, r)
	}))
	b.Cleanup(srv.Close)
	tok, err := st.Token("bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	return &stack{url: srv.URL, token: tok, probe: p, store: st.Store, dev: st}
}

// sample is what one turn measured.
type sample struct {
	overhead     time.Duration // model's last byte → client's last byte
	toModel      time.Duration // request received → first model request received
	callsToModel int64         // store calls started before the model request
	ddbToModel   int64         // DynamoDB requests sent before the model request
	frames       int
}

func (s *stack) post(b *testing.B, path, body string) *http.Response {
	req, _ := http.NewRequest("POST", s.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	return resp
}

func chat(thread, msgID, text string) string {
	return fmt.Sprintf(`{"id":%q,"trigger":"submit-message","messages":[{"id":%q,"role":"user","parts":[{"type":"text","text":%q}]}]}`, thread, msgID, text)
}

// turn posts one user message and reads the stream to its end.
func (s *stack) turn(b *testing.B, thread, msgID, text string) sample {
	resp := s.post(b, "/chat", chat(thread, msgID, text))
	data, err := io.ReadAll(resp.Body)
	end := time.Now()
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !bytes.HasSuffix(data, []byte("data: [DONE]\n\n")) {
		b.Fatalf("turn: %d %v %s", resp.StatusCode, err, data)
	}
	p := s.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	return sample{overhead: end.Sub(p.lastByte), toModel: p.modelAt.Sub(p.received), callsToModel: p.callsAtModel,
		ddbToModel: p.ddbAtModel, frames: bytes.Count(data, []byte("data: "))}
}

func pct(ds []time.Duration, p float64) float64 {
	slices.Sort(ds)
	return float64(ds[int(p*float64(len(ds)-1))].Microseconds())
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// run runs b.N turns of text (on 10 threads, so that most turns land on a thread with history) and reports:
// overhead p50/p99 (model's last byte → client's last byte), request → model request p50/p99, the store calls
// (and DynamoDB requests) made before the model request, store calls per turn, and CPU time per streamed chunk
// (the whole process: client, handler, engine, store and offline model).
func (s *stack) run(b *testing.B, text string, ops func() int64) {
	var over, toModel []time.Duration
	var calls, ddb, frames int64
	ops0 := ops()
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sm := s.turn(b, fmt.Sprintf("t%d", i%10), fmt.Sprintf("m%d", i), text)
		over, toModel = append(over, sm.overhead), append(toModel, sm.toModel)
		if i >= 10 { // existing threads only: a thread's first message also creates it
			calls, ddb = max(calls, sm.callsToModel), max(ddb, sm.ddbToModel)
		}
		frames += int64(sm.frames)
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(pct(over, 0.50), "p50-overhead-µs")
	b.ReportMetric(pct(over, 0.99), "p99-overhead-µs")
	b.ReportMetric(pct(toModel, 0.50), "p50-to-model-µs")
	b.ReportMetric(pct(toModel, 0.99), "p99-to-model-µs")
	b.ReportMetric(float64(calls), "store-calls-before-model")
	if s.probe.ddb != nil {
		b.ReportMetric(float64(ddb), "ddb-requests-before-model")
	}
	b.ReportMetric(float64(ops()-ops0)/float64(b.N), "counted-store-calls/turn")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(frames), "cpu-ns/chunk")
	s.reportRunStore(b)
}

// reportRunStore reports what the runs' own outcomes recorded of their store cost (agent.Run.Store: from the
// claim to just before the FinishRun write), averaged over the runs of the 10 threads.
func (s *stack) reportRunStore(b *testing.B) {
	var n int
	var sum agent.StoreUsage
	for i := range 10 {
		runs, err := s.store.ListRuns(context.Background(), fmt.Sprintf("t%d", i))
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range runs {
			if r.Store == nil {
				b.Fatalf("run %s recorded no store usage", r.ID)
			}
			n++
			sum.Requests += r.Store.Requests
			sum.ReadUnits += r.Store.ReadUnits
			sum.WriteUnits += r.Store.WriteUnits
		}
	}
	if n == 0 {
		return
	}
	b.ReportMetric(float64(sum.Requests)/float64(n), "run-store-requests/turn")
	b.ReportMetric(sum.ReadUnits/float64(n), "run-store-read-units/turn")
	b.ReportMetric(sum.WriteUnits/float64(n), "run-store-write-units/turn")
}

var turns = []struct {
	name, text string
	steps      int
}{
	{"plain", "hello benchmark, how are you today", 30},
	{"tool-3-steps", `/loop list_notes {}`, 3},
}

// BenchmarkTurnSQLite: whole turns through the local stack on SQLite.
func BenchmarkTurnSQLite(b *testing.B) {
	for _, tc := range turns {
		b.Run(tc.name, func(b *testing.B) {
			s := setup(b, nil, nil, config.Config{MaxSteps: tc.steps})
			s.run(b, tc.text, s.probe.total.Load)
		})
	}
}

func dynamoStack(b *testing.B, cfg config.Config, opts ...func(*devserver.Options, *probe)) (*stack, *dynamo.Counter) {
	endpoint := dynamotest.Start(b)
	counter := &dynamo.Counter{}
	client := dynamotest.Client(endpoint, func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, counter.Register) })
	table := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
		b.Fatal(err)
	}
	s := setup(b, dynamo.New(client, table), func() int64 { c := counter.Counts(); return c.Reads + c.Writes }, cfg, opts...)
	s.measureIndexes = func() {
		// dynalite reports no index capacity: the counter computes it from each write's before and after (it reads
		// every item it writes, so only cost benchmarks turn it on, never latency ones).
		path, err := dynamotest.TemplatePath()
		if err != nil {
			b.Fatal(err)
		}
		spec, err := dynamotest.LoadTable(path)
		if err != nil {
			b.Fatal(err)
		}
		counter.MeasureIndexWrites(dynamotest.Client(endpoint), table, []string{dynamo.AttrPK, dynamo.AttrSK}, spec.Indexes())
	}
	return s, counter
}

// BenchmarkTurnDynamo: the same turns against dynalite, counting DynamoDB requests with SDK middleware.
func BenchmarkTurnDynamo(b *testing.B) {
	for _, tc := range turns {
		b.Run(tc.name, func(b *testing.B) {
			s, counter := dynamoStack(b, config.Config{MaxSteps: tc.steps})
			counter.Reset()
			s.run(b, tc.text, s.probe.total.Load)
			c := counter.Counts()
			b.ReportMetric(float64(c.Reads)/float64(b.N), "ddb-reads/turn")
			b.ReportMetric(float64(c.Writes)/float64(b.N), "ddb-writes/turn")
		})
	}
}

// BenchmarkStreamingCostDynamo: one 20 s reply (/slow 200: a word every 100 ms), and the DynamoDB write units it
// cost per streaming second: heartbeats, segments, the run's index writes, messages and claim, all included.
// Run with -benchtime 1x (make bench does).
func BenchmarkStreamingCostDynamo(b *testing.B) {
	s, counter := dynamoStack(b, config.Config{})
	s.measureIndexes()
	counter.Reset()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		s.turn(b, fmt.Sprintf("slow%d", i), fmt.Sprintf("m%d", i), "/slow 200")
	}
	secs := time.Since(start).Seconds()
	c := counter.Counts()
	b.ReportMetric(c.WriteUnits()/secs, "wcu/s")
	b.ReportMetric(c.IndexWriteUnits/secs, "index-wcu/s")
	b.ReportMetric(float64(c.ByOperation["UpdateItem"])/secs, "updates/s")
	b.ReportMetric(float64(c.ByOperation["PutItem"])/secs, "puts/s")
	b.ReportMetric(c.ReadUnits/secs, "rcu/s")
}
