package benchmarks

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/tools"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

var secret = []byte("bench-secret-bench-secret-bench-secret")

// modelClock records when the offline endpoint finished writing each response (its last byte).
type modelClock struct {
	mu   sync.Mutex
	last time.Time
	h    http.Handler
}

func (m *modelClock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.h.ServeHTTP(w, r)
	m.mu.Lock()
	m.last = time.Now()
	m.mu.Unlock()
}

func (m *modelClock) lastByte() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

type stack struct {
	url   string
	token string
	model *modelClock
}

// setup serves the handlers over store with the offline model behind the real openai adapter.
func setup(b *testing.B, store agent.Store, maxSteps int) *stack {
	b.Helper()
	mc := &modelClock{h: offline.New()}
	ms := httptest.NewServer(mc)
	b.Cleanup(ms.Close)
	clock := agent.SystemClock{}
	log := slog.New(slog.DiscardHandler)
	eng := engine.New(engine.Deps{Store: store, Clock: clock, Tools: tools.Demo(store, clock), Logger: log,
		Model: openai.New(openai.Config{BaseURL: ms.URL + "/v1/", Model: "offline", Logger: log})},
		engine.Config{Model: "offline", MaxSteps: maxSteps})
	v, err := auth.NewHS256Verifier(secret, clock)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Deps{Engine: eng, Store: store, Auth: v, Clock: clock, Logger: log}))
	b.Cleanup(srv.Close)
	tok, err := auth.MintHS256(secret, "bench", time.Hour, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	return &stack{url: srv.URL, token: tok, model: mc}
}

// turn posts one user message and reads the stream to its end; it returns the time between the model
// endpoint's last byte and the client's last byte.
func (s *stack) turn(b *testing.B, thread, msgID, text string) time.Duration {
	body := fmt.Sprintf(`{"id":%q,"trigger":"submit-message","messages":[{"id":%q,"role":"user","parts":[{"type":"text","text":%q}]}]}`, thread, msgID, text)
	req, _ := http.NewRequest("POST", s.url+"/chat", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	data, err := io.ReadAll(resp.Body)
	end := time.Now()
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !bytes.HasSuffix(data, []byte("data: [DONE]\n\n")) {
		b.Fatalf("turn: %d %v %s", resp.StatusCode, err, data)
	}
	return end.Sub(s.model.lastByte())
}

func report(b *testing.B, overheads []time.Duration) {
	slices.Sort(overheads)
	pct := func(p float64) float64 {
		i := int(p * float64(len(overheads)-1))
		return float64(overheads[i].Microseconds())
	}
	b.ReportMetric(pct(0.50), "p50-overhead-µs")
	b.ReportMetric(pct(0.99), "p99-overhead-µs")
}

// BenchmarkTurnSQLite: a plain reply through the whole local stack. Reports the per-turn overhead over the
// model (model's last byte → client's last byte) and store operations (Store method calls) per turn.
func BenchmarkTurnSQLite(b *testing.B) {
	for _, tc := range []struct {
		name, text string
		steps      int
	}{
		{"plain", "hello benchmark, how are you today", 30},
		{"tool-3-steps", `/loop list_notes {}`, 3},
	} {
		b.Run(tc.name, func(b *testing.B) {
			st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			s := setup(b, st, tc.steps)
			overheads := make([]time.Duration, 0, b.N)
			ops0 := st.Ops()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				overheads = append(overheads, s.turn(b, fmt.Sprintf("t%d", i%50), fmt.Sprintf("m%d", i), tc.text))
			}
			b.StopTimer()
			report(b, overheads)
			b.ReportMetric(float64(st.Ops()-ops0)/float64(b.N), "store-ops/turn")
		})
	}
}

// BenchmarkTurnDynamo: the same turns against DynamoDB Local, counting DynamoDB requests with SDK middleware.
// The 3-step tool turn uses /loop with a step cap of 3 (two tool rounds and a third tool step).
func BenchmarkTurnDynamo(b *testing.B) {
	endpoint := dynamotest.Start(b)
	counter := &dynamo.Counter{}
	client := dynamotest.Client(endpoint, func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, counter.Register) })
	for _, tc := range []struct {
		name, text string
		steps      int
	}{
		{"plain", "hello benchmark, how are you today", 30},
		{"tool-3-steps", `/loop list_notes {}`, 3},
	} {
		b.Run(tc.name, func(b *testing.B) {
			table := fmt.Sprintf("bench_%d", time.Now().UnixNano())
			if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
				b.Fatal(err)
			}
			st := dynamo.New(client, table)
			s := setup(b, st, tc.steps)
			overheads := make([]time.Duration, 0, b.N)
			counter.Reset()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				overheads = append(overheads, s.turn(b, fmt.Sprintf("t%d", i%50), fmt.Sprintf("m%d", i), tc.text))
			}
			b.StopTimer()
			c := counter.Counts()
			report(b, overheads)
			b.ReportMetric(float64(c.Reads)/float64(b.N), "ddb-reads/turn")
			b.ReportMetric(float64(c.Writes)/float64(b.N), "ddb-writes/turn")
		})
	}
}
