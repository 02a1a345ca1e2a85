package titles_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/titles"
)

func TestSanitize(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"plain", "Trip to Lisbon", "Trip to Lisbon"},
		{"quotes and period", `"Trip to Lisbon."`, "Trip to Lisbon"},
		{"curly quotes", "“Trip to Lisbon”", "Trip to Lisbon"},
		{"markdown", "**Trip to Lisbon**", "Trip to Lisbon"},
		{"label", "Title: Trip to Lisbon", "Trip to Lisbon"},
		{"label and quotes", `title: "Trip to Lisbon"`, "Trip to Lisbon"},
		{"first line with text", "\n\n  Trip to Lisbon  \nbecause you asked", "Trip to Lisbon"},
		{"whitespace collapsed", "Trip\tto   Lisbon", "Trip to Lisbon"},
		{"control and format characters", "Trip\x00 to\u200b Lisbon\x7f", "Trip to Lisbon"},
		{"question kept", "What is Go?", "What is Go?"},
		{"empty", "  \n\t ", ""},
		{"only quotes", `""`, ""},
		{"cut at a word", "one two three four five six seven eight nine ten eleven", "one two three"},
		{"cut inside one long word", strings.Repeat("é", 30), strings.Repeat("é", 15)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			max := 80
			if strings.HasPrefix(tc.name, "cut") {
				max = 15
			}
			if got := titles.Sanitize(tc.in, max); got != tc.want {
				t.Errorf("Sanitize(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// stack is a generator over SQLite and the offline model (through the production Chat Completions adapter).
type stack struct {
	store *sqlite.Store
	gen   *titles.Generator
	logs  *syncBuffer
}

func newStack(t *testing.T, wrap func(agent.Model) agent.Model) stack {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	url, stop, err := offline.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	var model agent.Model = openai.New(openai.Config{BaseURL: url, Model: offline.DefaultModel, MaxRetries: -1})
	if wrap != nil {
		model = wrap(model)
	}
	logs := &syncBuffer{}
	gen := titles.New(titles.Deps{Store: st, Model: model, Logger: slog.New(slog.NewJSONHandler(logs, nil))},
		titles.Config{Model: "title-model", Background: true})
	return stack{store: st, gen: gen, logs: logs}
}

func (s stack) thread(t *testing.T, id string) agent.Thread {
	t.Helper()
	th, _, err := s.store.CreateThread(t.Context(), agent.Thread{ID: id, Owner: "u", Title: reply.Title, CreatedAt: created, UpdatedAt: created})
	if err != nil {
		t.Fatal(err)
	}
	return th
}

func (s stack) title(t *testing.T, id string) string {
	t.Helper()
	th, err := s.store.GetThread(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return th.Title
}

// created is when the tests' threads were created.
var created = time.Date(2031, time.March, 4, 5, 6, 7, 891_000_000, time.UTC)

var reply = agent.FirstReply{ThreadID: "th", RunID: "run1", Title: "plan a trip to lisbon in may please, with trains", CreatedAt: created,
	User: "plan a trip to lisbon in may please, with trains", Reply: "Here is a plan."}

// The offline model's deterministic title (the first six words of the user message) is stored; the log line
// names the thread, the run and the model. It also holds titles.Instruction equal to the offline model's.
func TestTitleFromOfflineModel(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	s.thread(t, "th")
	s.gen.FirstReply(t.Context(), reply)
	s.gen.Wait()
	if got, want := s.title(t, "th"), "Plan a trip to lisbon in"; got != want {
		t.Fatalf("title %q, want %q", got, want)
	}
	for _, want := range []string{`"msg":"agent.title"`, `"thread_id":"th"`, `"run_id":"run1"`, `"model":"title-model"`, `"set":true`} {
		if !strings.Contains(s.logs.String(), want) {
			t.Errorf("log %s lacks %s", s.logs.String(), want)
		}
	}
	// A second title changes nothing.
	if got := s.gen.Title(t.Context(), agent.FirstReply{ThreadID: "th", RunID: "run2", Title: reply.Title, CreatedAt: created, User: "something else"}); got != "" {
		t.Errorf("second title stored %q", got)
	}
	if got := s.title(t, "th"); got != "Plan a trip to lisbon in" {
		t.Errorf("title after a second generation %q", got)
	}
}

// titleStore is a store the spend test runs over.
type titleStore interface {
	titles.Store
	CreateThread(ctx context.Context, t agent.Thread) (agent.Thread, bool, error)
	GetThread(ctx context.Context, id string) (agent.Thread, error)
}

// spendMetrics records the titles' spend handed to the metrics.
type spendMetrics struct {
	agent.NopMetrics
	mu    sync.Mutex
	spent []agent.Usage
}

func (m *spendMetrics) TitleSpent(model string, u agent.Usage, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if model == "title-model" {
		m.spent = append(m.spent, u)
	}
}

// A title's spend is the thread's: its tokens and cost are added to the thread's usage (once, a retry of the
// same run's title included), logged on the agent.title line and handed to the metrics, whether the title was
// stored or the owner's won; on both stores. Before, the thread's usage stayed zero.
func TestTitleSpendRecorded(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) titleStore{
		"sqlite": func(t *testing.T) titleStore {
			st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "t.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		},
		"dynamo": func(t *testing.T) titleStore {
			if testing.Short() {
				t.Skip("dynalite in -short")
			}
			client := dynamotest.Client(dynamotest.Start(t))
			table := fmt.Sprintf("titles_%d", time.Now().UnixNano())
			if err := dynamotest.CreateTable(t.Context(), client, table); err != nil {
				t.Fatal(err)
			}
			return dynamo.New(client, table)
		},
	}
	prices, err := agent.ParsePrices([]byte(`{"title-model": {"input": 1, "output": 4}}`))
	if err != nil {
		t.Fatal(err)
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := open(t)
			url, stop, err := offline.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
			logs, metrics := &syncBuffer{}, &spendMetrics{}
			gen := titles.New(titles.Deps{Store: st, Model: openai.New(openai.Config{BaseURL: url, Model: offline.DefaultModel, MaxRetries: -1}),
				Logger: slog.New(slog.NewJSONHandler(logs, nil)), Prices: prices, Metrics: metrics}, titles.Config{Model: "title-model"})
			for _, id := range []string{"th", "th-owned"} {
				if _, _, err := st.CreateThread(t.Context(), agent.Thread{ID: id, Owner: "u", Title: reply.Title, CreatedAt: created, UpdatedAt: created}); err != nil {
					t.Fatal(err)
				}
			}
			mine := "Mine"
			if _, err := st.(interface {
				UpdateThread(context.Context, string, agent.ThreadPatch, time.Time) (agent.Thread, error)
			}).UpdateThread(t.Context(), "th-owned", agent.ThreadPatch{Title: &mine}, created); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"th", "th-owned"} {
				r := reply
				r.ThreadID = id
				gen.Title(t.Context(), r)
				gen.Title(t.Context(), r) // the same run's title again (a retry): counted once
				th, err := st.GetThread(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				u := th.Usage
				// The offline model: the system prompt, the prompt and the six-word title, in words.
				if u.InputTokens <= 0 || u.OutputTokens != 6 || u.TotalTokens != u.InputTokens+u.OutputTokens ||
					u.CostMicroUSD != u.InputTokens+4*u.OutputTokens {
					t.Errorf("%s: thread usage %+v, want the title's tokens priced (1 and 4 USD per million)", id, u)
				}
			}
			metrics.mu.Lock()
			spent := len(metrics.spent)
			metrics.mu.Unlock()
			if spent != 4 {
				t.Errorf("%d title spends handed to the metrics, want 4 (one per model call)", spent)
			}
			for _, want := range []string{`"output_tokens":6`, `"cost_micro_usd":`, `"total_tokens":`} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("agent.title lines lack %s:\n%s", want, logs.String())
				}
			}
		})
	}
}

// gate holds the title model's answer until released, and signals when it was asked.
type gate struct {
	agent.Model
	asked   chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *gate) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	g.once.Do(func() { close(g.asked) })
	<-g.release
	return g.Model.Stream(ctx, req, emit)
}

// The owner's title wins the race in both orders: set while the model is answering (before the generated
// write), and set after the generated title was stored.
func TestOwnerTitleWins(t *testing.T) {
	t.Parallel()
	t.Run("owner first", func(t *testing.T) {
		t.Parallel()
		g := &gate{asked: make(chan struct{}), release: make(chan struct{})}
		s := newStack(t, func(m agent.Model) agent.Model { g.Model = m; return g })
		s.thread(t, "th")
		s.gen.FirstReply(t.Context(), reply)
		<-g.asked
		mine := "My trip"
		if _, err := s.store.UpdateThread(t.Context(), "th", agent.ThreadPatch{Title: &mine}, time.Now()); err != nil {
			t.Fatal(err)
		}
		close(g.release)
		s.gen.Wait()
		if got := s.title(t, "th"); got != mine {
			t.Fatalf("title %q, want the owner's %q", got, mine)
		}
		if !strings.Contains(s.logs.String(), `"set":false`) {
			t.Errorf("log %s does not say the generated title was not set", s.logs.String())
		}
	})
	t.Run("generated first", func(t *testing.T) {
		t.Parallel()
		s := newStack(t, nil)
		s.thread(t, "th")
		s.gen.FirstReply(t.Context(), reply)
		s.gen.Wait()
		mine := "My trip"
		th, err := s.store.UpdateThread(t.Context(), "th", agent.ThreadPatch{Title: &mine}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if th.Title != mine {
			t.Fatalf("title %q, want the owner's %q", th.Title, mine)
		}
	})
}

// failing is a title model that fails every request.
type failing struct{}

func (failing) Stream(context.Context, agent.ModelRequest, func(agent.ModelEvent) error) (agent.ModelResult, error) {
	return agent.ModelResult{}, errors.New("provider down")
}

// A failing model leaves the thread as it was and logs the failure.
func TestFailingModelChangesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(agent.Model) agent.Model { return failing{} })
	before := s.thread(t, "th")
	s.gen.FirstReply(t.Context(), reply)
	s.gen.Wait()
	after, err := s.store.GetThread(t.Context(), "th")
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("thread changed: %+v, was %+v", after, before)
	}
	if log := s.logs.String(); !strings.Contains(log, `"stage":"model"`) || !strings.Contains(log, "provider down") {
		t.Errorf("log %s does not report the model's failure", log)
	}
}

// The request asks for a short answer and cuts long inputs.
func TestRequestBounds(t *testing.T) {
	t.Parallel()
	var got agent.ModelRequest
	model := modelFunc(func(req agent.ModelRequest) { got = req })
	gen := titles.New(titles.Deps{Store: nopStore{}, Model: model}, titles.Config{Model: "m", MaxInputBytes: 10})
	gen.Title(t.Context(), agent.FirstReply{ThreadID: "th", User: strings.Repeat("u", 100), Reply: strings.Repeat("é", 100)})
	if got.Model != "m" || got.MaxOutputTokens != titles.DefaultMaxOutputTokens || got.System != titles.System {
		t.Errorf("request %+v", got)
	}
	want := titles.Instruction + "\n\n<user>\n" + strings.Repeat("u", 10) + "\n</user>\n\n<assistant>\n" + strings.Repeat("é", 5) + "\n</assistant>"
	if len(got.Messages) != 1 || got.Messages[0].Text != want {
		t.Errorf("prompt %+v, want %q", got.Messages, want)
	}
}

type modelFunc func(agent.ModelRequest)

func (f modelFunc) Stream(_ context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	f(req)
	return agent.ModelResult{}, emit(agent.ModelEvent{Type: agent.EventTextDelta, Delta: "A title"})
}

type nopStore struct{}

func (nopStore) SetGeneratedTitle(context.Context, agent.GeneratedTitle) (agent.Thread, bool, error) {
	return agent.Thread{}, true, nil
}

func (nopStore) AddUsage(context.Context, agent.ThreadUsage) error { return nil }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// BenchmarkTitle is one title end to end in the local stack: the title request to the offline model over HTTP
// (the production Chat Completions adapter) and the conditional write to SQLite. It is what the chat Lambda's
// connection stays open for after [DONE], less the provider's own latency (make bench).
func BenchmarkTitle(b *testing.B) {
	st, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "t.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	url, stop, err := offline.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	gen := titles.New(titles.Deps{Store: st, Model: openai.New(openai.Config{BaseURL: url, Model: offline.DefaultModel, MaxRetries: -1})},
		titles.Config{Model: offline.DefaultModel})
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("th%d", i)
		if _, _, err := st.CreateThread(b.Context(), agent.Thread{ID: id, Owner: "u", Title: reply.Title, CreatedAt: created, UpdatedAt: created}); err != nil {
			b.Fatal(err)
		}
		r := reply
		r.ThreadID = id
		if gen.Title(b.Context(), r) == "" {
			b.Fatal("no title stored")
		}
	}
}
