package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/transcript"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Crash points (REVIEW §2 "Crash points in a turn"): a process dies right after one of its store writes has been
// applied. A second process over the same store must converge to a clean thread: the claim released within
// staleAfter plus one reaper pass, the next message accepted and completed, a provider-valid transcript, no
// message twice, the tool's effect at most once and reported as it happened (DESIGN principles 5, 8, 9).

// Timing of the crash tests: no row waits for real time to make a claim stale. Every live process has a
// staleAfter far longer than any stall of a loaded machine (a live run stops itself once its heartbeats have failed
// for half of it, and every fenced store call carries a deadline there: with 2 s, a dynalite call slower than a
// second under load made innocent runs fence themselves). A dead process's claim is made stale by the clock
// instead: each process of a row runs crashLeap further ahead of real time than the one before it (crashClock), so
// the claims of every process that died before it are older than staleAfter by its clock, and its own claims stay
// fresh for as long as it lives.
const crashHeartbeat = 25 * time.Millisecond

var (
	crashStaleAfter = time.Minute
	// crashLeap is how much further ahead of real time each process's clock runs than the previous one's: more
	// than staleAfter, as a claim heartbeaten right up to the crash is stale only staleAfter after it.
	crashLeap = crashStaleAfter + time.Minute
	// crashRowsAtOnce bounds how many rows of one store run at a time, so that the live runs' heartbeats and the
	// machine's other work do not lag far behind.
	crashRowsAtOnce = pick(raceEnabled(), 4, 8)
)

// crashClock is a process's clock: real time moved ahead by a fixed amount.
type crashClock struct{ ahead time.Duration }

func (c crashClock) Now() time.Time { return time.Now().Add(c.ahead) }

func pick[T any](cond bool, yes, no T) T {
	if cond {
		return yes
	}
	return no
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// errProcessDied is what every store call of a dead process returns (it never learns the outcome of the call that
// was in flight). It is not transient, so the dead engine does not spend its retry budget on it.
var errProcessDied = agent.E(agent.KindInternal, agent.CodeInternal, "injected crash: the process died")

// storeCall describes one store call, for the crash point to match.
type storeCall struct {
	method string
	role   agent.Role // PutMessage
	final  bool       // PutMessage: finalizes; AppendSegment: the final segment
	hide   bool       // PutMessage: an edit's write, hiding the tail (HideBefore)
	ns     string     // PutValue
}

// crashPoint names the write after which the process dies: the nth applied call that matches.
type crashPoint struct {
	method string
	match  func(storeCall) bool // nil: every call of method
	n      int
	// dynamoRequest, when set, is a crash inside a store call, which only the DynamoDB adapter can have: the
	// process dies once a request of this operation (X-Amz-Target) whose body holds bodyHas has been answered 200.
	dynamoRequest, bodyHas string
	// holdReply: the model's reply stalls after its first word until the process has died, so a crash point
	// that counts heartbeats is reached by count, however fast the reply or slow the machine (with the reply
	// streaming freely, a reply that outran two heartbeats ended the run first: "the crash point Heartbeat #2
	// was never reached").
	holdReply bool
}

func (p crashPoint) String() string {
	if p.dynamoRequest != "" {
		return fmt.Sprintf("DynamoDB %s with %q", p.dynamoRequest, p.bodyHas)
	}
	return fmt.Sprintf("%s #%d", p.method, p.n)
}

// crashStore lets every call through until the crash point's write has been applied; from then on that call and
// every later one fail, as the process is dead (its goroutines are abandoned; nothing they do reaches the store).
type crashStore struct {
	agent.Store
	point crashPoint

	mu    sync.Mutex
	armed bool
	hits  int
	dead  bool
	died  chan struct{} // closed at the crash (nil: nobody waits for it)
}

// die marks the process dead at its crash point; the caller holds c.mu.
func (c *crashStore) die() {
	if c.dead {
		return
	}
	c.dead = true
	if c.died != nil {
		close(c.died)
	}
}

func (c *crashStore) wrap(s agent.Store) agent.Store { c.Store = s; return c }

// arm starts counting (calls before, e.g. a setup turn, never crash).
func (c *crashStore) arm() { c.mu.Lock(); c.armed = true; c.mu.Unlock() }

func (c *crashStore) isDead() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.dead }

func (c *crashStore) isArmed() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.armed }

// kill is the crash from below the store interface (dyingHTTP).
func (c *crashStore) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.die()
}

// dyingHTTP is the DynamoDB client's transport of a process that dies right after one chosen request was applied
// (between the two writes of one store call); every request after that fails.
type dyingHTTP struct {
	base *http.Client
	cs   *crashStore
}

func (d *dyingHTTP) Do(r *http.Request) (*http.Response, error) {
	if d.cs.isDead() {
		return nil, errProcessDied
	}
	p := d.cs.point
	match := false
	if d.cs.isArmed() && r.Header.Get("X-Amz-Target") == "DynamoDB_20120810."+p.dynamoRequest && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		match = bytes.Contains(body, []byte(p.bodyHas))
	}
	resp, err := d.base.Do(r)
	if err == nil && (d.cs.isDead() || match && resp.StatusCode == http.StatusOK) {
		_ = resp.Body.Close()
		d.cs.kill()
		return nil, errProcessDied
	}
	return resp, err
}

func (c *crashStore) matches(call storeCall) bool {
	return call.method == c.point.method && (c.point.match == nil || c.point.match(call))
}

// write applies one write unless the process is dead, and kills it when this is the crash point.
func (c *crashStore) write(call storeCall, apply func() error) error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return errProcessDied
	}
	candidate := c.armed && c.matches(call)
	c.mu.Unlock()
	err := apply()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errProcessDied // died while the call was in flight: its answer is lost
	}
	if err != nil || !candidate {
		return err
	}
	c.hits++
	if c.hits == c.point.n {
		c.die()
		return errProcessDied
	}
	return nil
}

// read fails once the process is dead.
func (c *crashStore) read() error {
	if c.isDead() {
		return errProcessDied
	}
	return nil
}

func (c *crashStore) CreateThread(ctx context.Context, t agent.Thread) (th agent.Thread, created bool, err error) {
	err = c.write(storeCall{method: "CreateThread"}, func() error {
		var err error
		th, created, err = c.Store.CreateThread(ctx, t)
		return err
	})
	return th, created, err
}

func (c *crashStore) GetThread(ctx context.Context, id string) (agent.Thread, error) {
	if err := c.read(); err != nil {
		return agent.Thread{}, err
	}
	return c.Store.GetThread(ctx, id)
}

func (c *crashStore) ListThreads(ctx context.Context, owner string, limit int) ([]agent.Thread, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListThreads(ctx, owner, limit)
}

func (c *crashStore) UpdateThread(ctx context.Context, id string, p agent.ThreadPatch, now time.Time) (th agent.Thread, err error) {
	err = c.write(storeCall{method: "UpdateThread"}, func() error {
		var err error
		th, err = c.Store.UpdateThread(ctx, id, p, now)
		return err
	})
	return th, err
}

func (c *crashStore) DeleteThread(ctx context.Context, id string) error {
	return c.write(storeCall{method: "DeleteThread"}, func() error { return c.Store.DeleteThread(ctx, id) })
}

func (c *crashStore) ClaimRun(ctx context.Context, req agent.ClaimRequest) (res agent.ClaimResult, err error) {
	err = c.write(storeCall{method: "ClaimRun"}, func() error {
		var err error
		res, err = c.Store.ClaimRun(ctx, req)
		return err
	})
	return res, err
}

func (c *crashStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	return keepEach(ctx, claims, now, c.Heartbeat)
}

func (c *crashStore) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	return c.write(storeCall{method: "Heartbeat"}, func() error { return c.Store.Heartbeat(ctx, threadID, f, now) })
}

func (c *crashStore) RequestCancel(ctx context.Context, threadID, runID string, now time.Time) (cl agent.Claim, err error) {
	err = c.write(storeCall{method: "RequestCancel"}, func() error {
		var err error
		cl, err = c.Store.RequestCancel(ctx, threadID, runID, now)
		return err
	})
	return cl, err
}

func (c *crashStore) FinishRun(ctx context.Context, run agent.Run) error {
	return c.write(storeCall{method: "FinishRun"}, func() error { return c.Store.FinishRun(ctx, run) })
}

func (c *crashStore) FenceMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	return c.write(storeCall{method: "FenceMessage"}, func() error { return c.Store.FenceMessage(ctx, threadID, id, f) })
}

func (c *crashStore) TakeOver(ctx context.Context, req agent.TakeRequest) (f agent.Fence, err error) {
	err = c.write(storeCall{method: "TakeOver"}, func() error { f, err = c.Store.TakeOver(ctx, req); return err })
	return f, err
}

func (c *crashStore) RecordOutcome(ctx context.Context, run agent.Run, holder agent.Fence) error {
	return c.write(storeCall{method: "RecordOutcome"}, func() error { return c.Store.RecordOutcome(ctx, run, holder) })
}

func (c *crashStore) ReleaseClaim(ctx context.Context, req agent.ReleaseRequest) error {
	return c.write(storeCall{method: "ReleaseClaim"}, func() error { return c.Store.ReleaseClaim(ctx, req) })
}

func (c *crashStore) ListStaleClaims(ctx context.Context, before time.Time, limit int) ([]agent.StaleClaim, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListStaleClaims(ctx, before, limit)
}

func (c *crashStore) GetRun(ctx context.Context, threadID, runID string) (agent.Run, error) {
	if err := c.read(); err != nil {
		return agent.Run{}, err
	}
	return c.Store.GetRun(ctx, threadID, runID)
}

func (c *crashStore) ListRuns(ctx context.Context, threadID string) ([]agent.Run, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListRuns(ctx, threadID)
}

func (c *crashStore) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	return c.write(storeCall{method: "PutMessage", role: w.Message.Role, final: w.Final, hide: w.HideBefore > 0},
		func() error { return c.Store.PutMessage(ctx, w) })
}

func (c *crashStore) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	if err := c.read(); err != nil {
		return agent.MessageRecord{}, err
	}
	return c.Store.GetMessage(ctx, threadID, id)
}

func (c *crashStore) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListMessages(ctx, threadID)
}

func (c *crashStore) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	return c.write(storeCall{method: "DeleteMessage"}, func() error { return c.Store.DeleteMessage(ctx, threadID, id, f) })
}

func (c *crashStore) AppendSegment(ctx context.Context, s agent.Segment) error {
	return c.write(storeCall{method: "AppendSegment", final: s.Final}, func() error { return c.Store.AppendSegment(ctx, s) })
}

func (c *crashStore) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListSegments(ctx, runID, from, now)
}

func (c *crashStore) PutValue(ctx context.Context, ns, key string, value []byte) error {
	return c.write(storeCall{method: "PutValue", ns: ns}, func() error { return c.Store.PutValue(ctx, ns, key, value) })
}

func (c *crashStore) GetValue(ctx context.Context, ns, key string) ([]byte, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.GetValue(ctx, ns, key)
}

func (c *crashStore) ListValues(ctx context.Context, ns string) ([]agent.KV, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListValues(ctx, ns)
}

func (c *crashStore) DeleteValue(ctx context.Context, ns, key string) error {
	return c.write(storeCall{method: "DeleteValue", ns: ns}, func() error { return c.Store.DeleteValue(ctx, ns, key) })
}

func (c *crashStore) CreateInterrupt(ctx context.Context, in agent.Interrupt) (got agent.Interrupt, created bool, err error) {
	err = c.write(storeCall{method: "CreateInterrupt"}, func() error {
		var err error
		got, created, err = c.Store.CreateInterrupt(ctx, in)
		return err
	})
	return got, created, err
}

func (c *crashStore) ResolveInterrupt(ctx context.Context, req agent.ResolveRequest) (got agent.Interrupt, err error) {
	err = c.write(storeCall{method: "ResolveInterrupt", ns: string(req.Status)}, func() error {
		var err error
		got, err = c.Store.ResolveInterrupt(ctx, req)
		return err
	})
	return got, err
}

func (c *crashStore) GetInterrupt(ctx context.Context, threadID, messageID, id string) (agent.Interrupt, error) {
	if err := c.read(); err != nil {
		return agent.Interrupt{}, err
	}
	return c.Store.GetInterrupt(ctx, threadID, messageID, id)
}

func (c *crashStore) ListMessageInterrupts(ctx context.Context, threadID, messageID string) ([]agent.Interrupt, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListMessageInterrupts(ctx, threadID, messageID)
}

func (c *crashStore) ListInterrupts(ctx context.Context, threadID string) ([]agent.Interrupt, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListInterrupts(ctx, threadID)
}

func (c *crashStore) ListExpiredInterrupts(ctx context.Context, before time.Time, limit int) ([]agent.Interrupt, error) {
	if err := c.read(); err != nil {
		return nil, err
	}
	return c.Store.ListExpiredInterrupts(ctx, before, limit)
}

// crashBackend is one kind of durable store. start makes a fresh one for a row and returns how to start a
// "process" over it: each call is a new stack (its own engine, reaper, tools and store handle) over the same data,
// crashing as cs says (nil: a process that does not crash). The model's replies stall after their first word
// while hold is open (nil: never).
type crashBackend struct {
	name  string
	start func(t *testing.T, hold *crashStore) func(t *testing.T, cs *crashStore) *devserver.Stack
}

// crashModel serves the offline model over HTTP, replies arriving piece by piece so that heartbeats and segment
// flushes happen while a reply streams. With hold (nil: never), a reply stalls after its first word while hold's
// crash is armed and its process alive (a setup turn, before the crash is armed, streams freely).
func crashModel(t *testing.T, hold *crashStore) string {
	srv := offline.New(offline.WithWordDelay(5*time.Millisecond), offline.WithReplyDelay(8*time.Millisecond))
	var h http.Handler = srv
	if hold != nil {
		end := t.Context().Done() // a row that fails with the reply held lets it go
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			srv.ServeHTTP(&heldWriter{ResponseWriter: w, hold: hold, end: end, done: r.Context().Done()}, r)
		})
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return hs.URL + "/v1/"
}

// heldWriter lets a streamed reply's first two writes through (the assistant role and the first word) and, while
// hold is armed, holds every later one until its process has died.
type heldWriter struct {
	http.ResponseWriter
	hold      *crashStore
	end, done <-chan struct{}
	writes    int
}

func (w *heldWriter) Write(p []byte) (int, error) {
	if w.writes++; w.writes > 2 && w.hold.isArmed() {
		select {
		case <-w.hold.died:
		case <-w.end:
		case <-w.done:
			return 0, http.ErrHandlerTimeout
		}
	}
	return w.ResponseWriter.Write(p)
}

func (w *heldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// crashOptions are the options of a row's next process; processes counts the row's processes so far. Each process
// comes after the previous ones have died (or, the first, before anything ran), and its clock runs crashLeap
// further ahead than theirs.
func crashOptions(modelURL, data string, processes *int) devserver.Options {
	ahead := time.Duration(*processes) * crashLeap
	*processes++
	return devserver.Options{Data: data, ModelURL: modelURL, Clock: crashClock{ahead: ahead},
		// Every process has the same application secret, as every Lambda of a deployment does (approval
		// signatures made by one process verify in the next).
		Config: config.Config{Heartbeat: crashHeartbeat, StaleAfter: crashStaleAfter, SegmentFlush: 20 * time.Millisecond,
			CancelPoll: 20 * time.Millisecond, Secret: "crash-test-application-secret-0123456789",
			TitlesOff: true}, // the invariants check the runs' usage: a title's spend is the thread's too (lib/titles)
		OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond; c.MaxRetries = 2 }}
}

// testLog sends a process's warnings to the row's log (shown when it fails), until the row ends.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	name string
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Logf("%s: %s", l.name, bytes.TrimSpace(p))
	}
	return len(p), nil
}

func newCrashStack(t *testing.T, o devserver.Options, name string) *devserver.Stack {
	t.Helper()
	l := &testLog{t: t, name: name}
	t.Cleanup(func() { l.mu.Lock(); l.done = true; l.mu.Unlock() })
	o.Logger = slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := devserver.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// sqliteBackend: a second process opens the same SQLite file (devserver.New with the same Data directory).
var sqliteBackend = crashBackend{name: "sqlite", start: func(t *testing.T, hold *crashStore) func(*testing.T, *crashStore) *devserver.Stack {
	data, model, processes := t.TempDir(), crashModel(t, hold), 0
	return func(t *testing.T, cs *crashStore) *devserver.Stack {
		o := crashOptions(model, data, &processes)
		name := "recovering process"
		if cs != nil {
			o.Wrap, name = cs.wrap, "crashing process"
		}
		return newCrashStack(t, o, name)
	}
}}

// dynamoBackend: one table on dynalite per row; each process gets its own adapter value (its own client) over it.
func dynamoBackend(endpoint string) crashBackend {
	var mu sync.Mutex
	tables := 0
	return crashBackend{name: "dynamo", start: func(t *testing.T, hold *crashStore) func(*testing.T, *crashStore) *devserver.Stack {
		mu.Lock()
		tables++
		table := fmt.Sprintf("crash%d_%d", time.Now().UnixNano(), tables)
		mu.Unlock()
		if err := dynamotest.CreateTable(context.Background(), dynamotest.Client(endpoint), table); err != nil {
			t.Fatal(err)
		}
		model, processes := crashModel(t, hold), 0
		return func(t *testing.T, cs *crashStore) *devserver.Stack {
			o := crashOptions(model, t.TempDir(), &processes)
			client, name := dynamotest.Client(endpoint), "recovering process"
			if cs != nil {
				o.Wrap, name = cs.wrap, "crashing process"
				client = dynamotest.Client(endpoint, func(do *dynamodb.Options) {
					do.HTTPClient = &dyingHTTP{base: &http.Client{}, cs: cs}
					do.RetryMaxAttempts = 1 // a dead process does not retry
				})
			}
			o.Store = dynamo.New(client, table, dynamo.WithLogger(slog.New(slog.DiscardHandler)))
			return newCrashStack(t, o, name)
		}
	}}
}

const (
	crashThread = "th-crash"
	toolText    = `/tool add_note {"text":"x"}`
	plainText   = "hello there, how are you today my friend, and what shall we do next"
	editText    = "hello again, edited"
)

// Expectations a row adds to the invariants every row checks.
type want int

const (
	wantAny want = iota // either way
	wantNo
	wantYes
)

type crashRow struct {
	name  string
	text  string // the crashed turn's user message (u1); empty for a regenerate
	regen bool   // the crashed turn regenerates the reply to u0 (answered first, before the crash is armed)
	// edit: the crashed turn edits u0 (answered first, before the crash is armed) to editText; edited says
	// whether the converged thread shows the edit (u0's new text, its old reply hidden) or nothing changed.
	edit   bool
	edited want
	point  crashPoint
	// What the converged thread holds of the crashed turn.
	user  want            // u1 stored
	note  want            // the note written (tool rows)
	reply agent.RunStatus // the crashed run's outcome (its reply's status follows); "" means no run
	check func(t *testing.T, c *checks, v view)
	// reaperCrash, when set: a reaper process reaps the dead run and dies after this write of its own; the
	// next process's reaper pass must finish the job.
	reaperCrash *crashPoint
	// takeover: no reaper pass; the next message's claim reaps the stale run in its way (REVIEW W2′).
	takeover bool
}

// checks reports a row's failed checks, naming the check.
type checks struct {
	row crashRow
	// reposted: the re-posted u1 ran, so u1 is stored now (and, for the tool message, the note exists) whatever
	// the crash left.
	reposted bool
}

func (c *checks) fail(t *testing.T, check, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s: %s", check, fmt.Sprintf(format, args...))
}

// The checks, named in failures.
const (
	checkRecorded  = "recorded-outcome"
	checkRegenHide = "regenerate-hides-old-reply"
	checkTerminal  = "runs-and-replies-terminal"
	checkUsage     = "usage-added-once"
)

func written(role agent.Role, final bool) func(storeCall) bool {
	return func(c storeCall) bool { return c.role == role && c.final == final }
}

func finalSegment(c storeCall) bool { return c.final }

var (
	atCreateThread = crashPoint{method: "CreateThread", n: 1}
	atClaim        = crashPoint{method: "ClaimRun", n: 1}
	atUser         = crashPoint{method: "PutMessage", match: written(agent.RoleUser, true), n: 1}
	// The reply is held at the first segment too: streaming freely, a one-step reply could put its final message
	// while the segmenter's first flush was in flight, so the final write landed as the process died and the
	// reaper adopted it (the run completed, not failed: seen under load on dynalite).
	atFirstSegment = crashPoint{method: "AppendSegment", n: 1, holdReply: true}
	atHeartbeat2   = crashPoint{method: "Heartbeat", n: 2, holdReply: true}
	atDraft        = crashPoint{method: "PutMessage", match: written(agent.RoleAssistant, false), n: 1}
	atFinal        = crashPoint{method: "PutMessage", match: written(agent.RoleAssistant, true), n: 1}
	atFinishRun    = crashPoint{method: "FinishRun", n: 1}
	atFinalSegment = crashPoint{method: "AppendSegment", match: finalSegment, n: 1}
)

func crashTable() []crashRow {
	notes := func(c storeCall) bool { return strings.HasPrefix(c.ns, "notes/") }
	effects := func(c storeCall) bool { return strings.HasPrefix(c.ns, "effects/") }
	return []crashRow{
		// A 2-step tool turn: the model calls add_note, then answers.
		{name: "tool/W0 CreateThread", text: toolText, point: atCreateThread, user: wantNo, note: wantNo},
		// The reaper stubs the missing run item, failed, so that a late run write cannot land (REVIEW D15).
		{name: "tool/W1 claim UpdateItem without the run item", text: toolText, user: wantNo, note: wantNo, reply: agent.RunFailed,
			point: crashPoint{dynamoRequest: "UpdateItem", bodyHas: "nextSeq"}},
		{name: "tool/W1+W2 ClaimRun", text: toolText, point: atClaim, user: wantNo, note: wantNo, reply: agent.RunFailed},
		// The user message is written beside the first model request, so the tool may run (and its note land)
		// before the user message's write is applied: the note may exist after a crash at W3.
		{name: "tool/W3 user PutMessage", text: toolText, point: atUser, user: wantYes, reply: agent.RunFailed},
		{name: "tool/mid-step first AppendSegment", text: toolText, point: atFirstSegment, reply: agent.RunFailed},
		{name: "tool/mid-step Heartbeat #1", text: toolText, point: crashPoint{method: "Heartbeat", n: 1, holdReply: true}, reply: agent.RunFailed},
		{name: "tool/W4 note PutValue", text: toolText, user: wantYes, note: wantYes, reply: agent.RunFailed,
			point: crashPoint{method: "PutValue", match: notes, n: 1}},
		{name: "tool/W4 effect record PutValue", text: toolText, user: wantYes, note: wantYes, reply: agent.RunFailed,
			point: crashPoint{method: "PutValue", match: effects, n: 1}},
		{name: "tool/W5 draft PutMessage", text: toolText, point: atDraft, user: wantYes, note: wantYes, reply: agent.RunFailed},
		{name: "tool/W6 final PutMessage", text: toolText, point: atFinal, user: wantYes, note: wantYes, reply: agent.RunCompleted},
		{name: "tool/W7 FinishRun", text: toolText, point: atFinishRun, user: wantYes, note: wantYes, reply: agent.RunCompleted},
		{name: "tool/W9 final AppendSegment", text: toolText, point: atFinalSegment, user: wantYes, note: wantYes, reply: agent.RunCompleted},

		// A plain one-step reply.
		{name: "plain/W0 CreateThread", text: plainText, point: atCreateThread, user: wantNo},
		{name: "plain/W1+W2 ClaimRun", text: plainText, point: atClaim, user: wantNo, reply: agent.RunFailed},
		{name: "plain/W3 user PutMessage", text: plainText, point: atUser, user: wantYes, reply: agent.RunFailed},
		{name: "plain/mid-step first AppendSegment", text: plainText, point: atFirstSegment, reply: agent.RunFailed},
		{name: "plain/mid-step Heartbeat #2", text: plainText, point: atHeartbeat2, reply: agent.RunFailed},
		{name: "plain/W6 final PutMessage", text: plainText, point: atFinal, user: wantYes, reply: agent.RunCompleted},
		{name: "plain/W7 FinishRun", text: plainText, point: atFinishRun, user: wantYes, reply: agent.RunCompleted},
		{name: "plain/W9 final AppendSegment", text: plainText, point: atFinalSegment, user: wantYes, reply: agent.RunCompleted},

		// A crash of the reaper itself, half way through reaping the draft of a tool turn that died at W5.
		// (The reaper's claim it leaves goes stale and the next sweep reaps it the same way.)
		{name: "reap/crash after TakeOver", text: toolText, point: atDraft, user: wantYes, note: wantYes, reply: agent.RunFailed,
			reaperCrash: &crashPoint{method: "TakeOver", n: 1}},
		{name: "reap/crash after the run's RecordOutcome", text: toolText, point: atDraft, user: wantYes, note: wantYes, reply: agent.RunFailed,
			reaperCrash: &crashPoint{method: "RecordOutcome", n: 1}},
		{name: "reap/crash after its own ReleaseClaim", text: toolText, point: atDraft, user: wantYes, note: wantYes, reply: agent.RunFailed,
			reaperCrash: &crashPoint{method: "ReleaseClaim", n: 1}},
		{name: "reap/crash after the message's PutMessage", text: toolText, point: atDraft, user: wantYes, note: wantYes, reply: agent.RunFailed,
			reaperCrash: &crashPoint{method: "PutMessage", n: 1}},

		// No reaper pass: the next message takes the stale claim over.
		{name: "takeover/W3 user PutMessage", text: toolText, point: atUser, user: wantYes, reply: agent.RunFailed, takeover: true},
		{name: "takeover/W5 draft PutMessage", text: toolText, point: atDraft, user: wantYes, note: wantYes, reply: agent.RunFailed, takeover: true},
		{name: "takeover/W6 final PutMessage", text: plainText, point: atFinal, user: wantYes, reply: agent.RunCompleted, takeover: true},

		// A regenerate of u0's reply: the old reply is kept until the new one is stored and the run completed, and
		// then hidden (see oneReplyToU0).
		{name: "regen/mid-step first AppendSegment", regen: true, point: atFirstSegment, reply: agent.RunFailed, check: oneReplyToU0},
		{name: "regen/W6 final PutMessage", regen: true, point: atFinal, reply: agent.RunCompleted, check: oneReplyToU0},
		{name: "regen/W7 FinishRun", regen: true, point: atFinishRun, reply: agent.RunCompleted, check: oneReplyToU0},
		{name: "regen/DeleteMessage", regen: true, point: crashPoint{method: "DeleteMessage", n: 1}, reply: agent.RunCompleted, check: oneReplyToU0},

		// An edit of u0 (fence D): it commits in its one write on u0, which hides u0's old reply; the deletes
		// after it are cleanup. Between the edit record and that write (DynamoDB) nothing changed yet.
		{name: "edit/edit record PutItem", edit: true, edited: wantNo, reply: agent.RunFailed, check: editOrNothing,
			point: crashPoint{dynamoRequest: "PutItem", bodyHas: "EDIT#u0"}},
		{name: "edit/edit PutMessage", edit: true, edited: wantYes, reply: agent.RunFailed, check: editOrNothing,
			point: crashPoint{method: "PutMessage", match: func(c storeCall) bool { return c.hide }, n: 1}},
		{name: "edit/first cleanup DeleteMessage", edit: true, edited: wantYes, reply: agent.RunFailed, check: editOrNothing,
			point: crashPoint{method: "DeleteMessage", n: 1}},
	}
}

func TestCrashPoints(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		runCrashRows(t, sqliteBackend)
	})
	t.Run("dynamo", func(t *testing.T) {
		t.Parallel()
		if testing.Short() {
			t.Skip("dynalite in -short")
		}
		runCrashRows(t, dynamoBackend(dynamotest.Start(t)))
	})
}

func runCrashRows(t *testing.T, b crashBackend) {
	sem := make(chan struct{}, crashRowsAtOnce)
	var wg sync.WaitGroup
	for _, row := range crashTable() {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			t.Run(row.name, func(t *testing.T) { crashAndRecover(t, b, row) })
		}()
	}
	wg.Wait()
}

// view is the converged thread as the second process reads it.
type view struct {
	thread  agent.Thread
	msgs    []agent.Message
	runs    []agent.Run
	notes   []agent.KV
	crashed agent.Run // the crashed turn's run (zero when it died before its claim)
	prior   agent.Run // regenerate rows: the run that answered u0 first
}

func crashAndRecover(t *testing.T, b crashBackend, row crashRow) {
	ctx := context.Background()
	if row.point.dynamoRequest != "" && b.name != "dynamo" {
		t.Skip("impossible on this store: the store call is one transaction")
	}
	cs := &crashStore{point: row.point, died: make(chan struct{})}
	var hold *crashStore
	if row.point.holdReply {
		hold = cs
	}
	process := b.start(t, hold)
	first := process(t, cs)

	var prior agent.Run
	req := engine.Request{Owner: "alice", ThreadID: crashThread, Kind: engine.TurnSubmit, Message: userMsg("u1", row.text)}
	if row.regen || row.edit {
		tr, err := first.Engine.Begin(ctx, submit(crashThread, "u0", plainText))
		if err != nil {
			t.Fatal(err)
		}
		if prior = tr.Stream(ctx, io.Discard); prior.Status != agent.RunCompleted {
			t.Fatalf("setup turn: %+v", prior)
		}
		req = engine.Request{Owner: "alice", ThreadID: crashThread, Kind: engine.TurnRegenerate}
		if row.edit {
			req = editU0()
		}
	}
	cs.arm()

	// The first process runs the turn and dies at the crash point; whatever its goroutines do afterwards fails
	// (the run, if it is still going, is abandoned).
	if tr, err := first.Engine.Begin(ctx, req); err == nil {
		done := make(chan agent.Run, 1)
		go func() { done <- tr.Stream(ctx, io.Discard) }()
		select {
		case run := <-done:
			if !cs.isDead() {
				t.Fatalf("the crash point %s was never reached: the run ended %+v", row.point, run)
			}
		case <-cs.died:
		}
	} else if !cs.isDead() {
		t.Fatalf("begin failed without a crash: %v", err)
	}
	if !cs.isDead() {
		t.Fatalf("the crash point %s was never reached", row.point)
	}

	// Every later process's clock is ahead by more than staleAfter (crashClock): the dead run's claim is stale
	// for it.
	if row.point.bodyHas == "nextSeq" {
		// The claim is stored, the run item is not.
		p := process(t, nil)
		th, err := p.Store.GetThread(ctx, crashThread)
		if err != nil || th.ActiveRun == nil {
			t.Fatalf("no claim after a crash between the claim's two writes: %+v %v", th.ActiveRun, err)
		}
		if runs, err := p.Store.ListRuns(ctx, crashThread); err != nil || len(runs) != 0 {
			t.Fatalf("a run item after a crash between the claim's two writes: %+v %v", runs, err)
		}
	}
	if row.reaperCrash != nil {
		// A reaper process dies half way through reaping the dead run.
		rs := &crashStore{point: *row.reaperCrash}
		rs.arm()
		_, _ = process(t, rs).Reaper.Tick(ctx)
		if !rs.isDead() {
			t.Fatalf("the reaper's crash point %s was never reached", rs.point)
		}
		// The next process's clock is ahead of this one's by more than staleAfter: its claim is stale there.
	}

	// A second process over the same store (its clock past staleAfter): after one reaper pass, the thread is free.
	// (A takeover row skips the pass: the next message's claim finds the stale claim and reaps it on the way.)
	second := process(t, nil)
	c := &checks{row: row}
	if !row.takeover {
		if _, err := second.Reaper.Tick(ctx); err != nil {
			t.Fatalf("reaper tick: %v", err)
		}
		th, err := second.Store.GetThread(ctx, crashThread)
		if err != nil {
			t.Fatalf("get thread: %v", err)
		}
		if th.ActiveRun != nil {
			t.Fatalf("claim still held after staleAfter and a reaper pass: %+v", th.ActiveRun)
		}
		v := readView(t, second, prior)
		checkConverged(t, v, c, false)
		if row.edit {
			row.check(t, c, v)
		}
	}

	// The client, which saw its request fail, posts u1 again (same id, same content): a message the store never
	// got runs now; one that is stored and answered (the recovered reply) is refused as a duplicate and not
	// stored twice.
	var retried agent.Run
	if row.edit {
		// The client, which saw its edit fail, sends it again: it runs (a stored edit is edited once more).
		tr, err := second.Engine.Begin(ctx, editU0())
		if err != nil {
			t.Fatalf("the re-sent edit was refused: %v", err)
		}
		if retried = tr.Stream(ctx, io.Discard); retried.Status != agent.RunCompleted {
			t.Fatalf("the re-sent edit did not complete: %+v (error %+v)", retried, retried.Error)
		}
		c.reposted = true
	}
	if !row.regen && !row.edit {
		stored := slices.ContainsFunc(readView(t, second, prior).msgs, func(m agent.Message) bool { return m.ID == "u1" })
		tr, err := second.Engine.Begin(ctx, submit(crashThread, "u1", row.text))
		switch {
		case err == nil:
			t.Logf("re-post of u1 (stored before: %v) accepted", stored)
			if retried = tr.Stream(ctx, io.Discard); retried.Status != agent.RunCompleted {
				t.Fatalf("the re-posted u1 did not complete: %+v (error %+v)", retried, retried.Error)
			}
			c.reposted = true
		case !stored:
			t.Fatalf("the re-post of u1, which the store never got, was refused: %v", err)
		case agent.CodeOf(err) != agent.CodeDuplicateMessage:
			t.Fatalf("the re-post of an answered u1 was refused with %v, want %s", err, agent.CodeDuplicateMessage)
		default:
			t.Logf("re-post of u1 refused: %v", err)
		}
	}

	// The next message (a new id) is accepted and completed, on the transcript the crash left.
	tr, err := second.Engine.Begin(ctx, submit(crashThread, "u2", "next please"))
	if err != nil {
		t.Fatalf("the next message was refused: %v", err)
	}
	next := tr.Stream(ctx, io.Discard)
	if next.Status != agent.RunCompleted {
		t.Fatalf("the next turn did not complete: %+v (error %+v)", next, next.Error)
	}
	v := readView(t, second, prior, next.ID, retried.ID)
	checkConverged(t, v, c, true)
	if v.thread.ActiveRun != nil {
		t.Fatalf("claim held after the next turn: %+v", v.thread.ActiveRun)
	}
	last := v.msgs[len(v.msgs)-1]
	if last.ID != next.AssistantMessageID || last.Meta().Status != agent.MessageCompleted || last.Text() != "You said: next please" {
		t.Fatalf("the next reply is not the newest message: %s %q %q", last.ID, last.Meta().Status, last.Text())
	}
	if row.check != nil {
		row.check(t, c, v)
	}
	for _, m := range v.msgs {
		t.Logf("converged: %s %s %q %s", m.ID, m.Role, m.Meta().Status, m.Parts)
	}
}

// readView reads the thread; the crashed run is the first one that is neither prior (the setup turn) nor one of
// later (the recovering process's own runs).
func readView(t *testing.T, s *devserver.Stack, prior agent.Run, later ...string) view {
	t.Helper()
	ctx := context.Background()
	v := view{prior: prior}
	// The thread as a client reads it (GET /threads/{id}): a replaced reply left out, an orphaned one finished.
	tv, err := s.Threads.Get(ctx, "alice", crashThread)
	if err != nil {
		t.Fatalf("get thread: %v", err)
	}
	v.thread, v.msgs = tv.Thread, tv.Messages
	if v.runs, err = s.Store.ListRuns(ctx, crashThread); err != nil {
		t.Fatal(err)
	}
	for _, r := range v.runs {
		if r.ID != prior.ID && !slices.Contains(later, r.ID) && v.crashed.ID == "" {
			v.crashed = r
		}
	}
	if v.notes, err = s.Store.ListValues(ctx, "notes/alice"); err != nil {
		t.Fatal(err)
	}
	return v
}

// checkConverged checks the invariants of a converged thread, and what the row expects of the crashed turn.
func checkConverged(t *testing.T, v view, c *checks, afterNext bool) {
	t.Helper()
	row := c.row
	dump := func() string {
		var b strings.Builder
		for _, m := range v.msgs {
			fmt.Fprintf(&b, "\n  %s %s %q: %s", m.ID, m.Role, m.Meta().Status, m.Parts)
		}
		for _, r := range v.runs {
			fmt.Fprintf(&b, "\n  run %s %s %+v", r.ID, r.Status, r.Error)
		}
		return b.String()
	}

	// No message id twice; exactly one user message per accepted id; no reply left streaming; every tool part
	// has its result.
	seen := map[string]bool{}
	byID := map[string]agent.Message{}
	for _, m := range v.msgs {
		if seen[m.ID] {
			t.Fatalf("message %s stored twice:%s", m.ID, dump())
		}
		seen[m.ID], byID[m.ID] = true, m
		if m.Role != agent.RoleAssistant {
			continue
		}
		switch st := m.Meta().Status; st {
		case agent.MessageCompleted, agent.MessageFailed, agent.MessageCanceled, agent.MessageInterrupted:
		default:
			c.fail(t, checkTerminal, "assistant message %s has status %q:%s", m.ID, st, dump())
		}
		for _, p := range transcript.Decode(m.Parts) {
			if agent.IsToolPart(p.Type) && p.State != agent.StateOutputAvailable && p.State != agent.StateOutputError && p.State != agent.StateOutputDenied {
				t.Fatalf("tool part %s of %s has no result (state %q):%s", p.ToolCallID, m.ID, p.State, dump())
			}
		}
	}
	switch u1 := seen["u1"]; {
	case row.user == wantYes && !u1:
		t.Fatalf("the user message u1 was lost:%s", dump())
	case row.user == wantNo && u1 && !c.reposted:
		t.Fatalf("u1 stored although the crash came before its write:%s", dump())
	}
	if afterNext && !seen["u2"] {
		t.Fatalf("the next message u2 is not stored:%s", dump())
	}
	if (row.regen || row.edit) && !seen["u0"] {
		t.Fatalf("u0 lost:%s", dump())
	}
	checkTranscript(t, v.msgs, dump)

	// Every run ended; the crashed one as the row says, its reply terminal (never streaming).
	var usage agent.Usage
	for _, r := range v.runs {
		if !r.Status.Terminal() {
			c.fail(t, checkTerminal, "run %s is %s:%s", r.ID, r.Status, dump())
		}
		usage = usage.Add(r.Usage)
	}
	switch {
	case row.reply == "" && v.crashed.ID != "":
		t.Fatalf("a run %s exists although the crash came before the claim:%s", v.crashed.ID, dump())
	case row.reply != "" && v.crashed.ID == "":
		t.Fatalf("the crashed run is missing:%s", dump())
	case row.reply != "" && !v.crashed.Status.Terminal():
		c.fail(t, checkTerminal, "crashed run %s is %s, want %s:%s", v.crashed.ID, v.crashed.Status, row.reply, dump())
	case row.reply != "" && v.crashed.Status != row.reply:
		t.Fatalf("crashed run %s is %s (%+v), want %s:%s", v.crashed.ID, v.crashed.Status, v.crashed.Error, row.reply, dump())
	}
	if v.crashed.ID != "" {
		if m, ok := byID[v.crashed.AssistantMessageID]; ok {
			switch want := agent.MessageStatus(v.crashed.Status); {
			case m.Meta().Status == agent.MessageStreaming:
				c.fail(t, checkTerminal, "crashed run %s is %s but its reply is %q:%s", v.crashed.ID, v.crashed.Status, m.Meta().Status, dump())
			case m.Meta().Status != want:
				t.Fatalf("crashed run %s is %s but its reply is %q:%s", v.crashed.ID, v.crashed.Status, m.Meta().Status, dump())
			}
		} else if v.crashed.Status == agent.RunCompleted {
			t.Fatalf("run %s completed without its reply:%s", v.crashed.ID, dump())
		}
	}
	// Usage is added to the thread exactly once per run, by whichever write released its claim.
	if v.thread.Usage != usage {
		c.fail(t, checkUsage, "thread usage %+v, the runs' sum %+v:%s", v.thread.Usage, usage, dump())
	}

	// The note exists at most once, and a note that exists is what the transcript reports (principle 9).
	switch {
	case len(v.notes) > 1:
		t.Fatalf("%d notes for one call: %v", len(v.notes), v.notes)
	case (row.note == wantYes || c.reposted && row.text == toolText) && len(v.notes) == 0:
		t.Fatalf("the note is missing:%s", dump())
	case row.note == wantNo && !c.reposted && len(v.notes) == 1:
		t.Fatalf("a note exists although the crash came before the tool ran: %s", v.notes[0].Value)
	}
	for _, n := range v.notes {
		var note struct{ ID string }
		_ = json.Unmarshal(n.Value, &note)
		reported := false
		for _, m := range v.msgs {
			for _, p := range transcript.Decode(m.Parts) {
				if p.Type == "tool-add_note" && p.State == agent.StateOutputAvailable && strings.Contains(string(p.Output), note.ID) {
					reported = true
				}
			}
		}
		if !reported {
			c.fail(t, checkRecorded, "note %s was added but no message reports it (the recorded outcome should be):%s", note.ID, dump())
		}
	}
}

// checkTranscript builds the model transcript from the stored messages and checks it as a provider would: it
// starts with a user message, every tool call is answered exactly once right after the assistant message that
// made it, no result is orphaned, and none is the placeholder for a call without a result.
func checkTranscript(t *testing.T, msgs []agent.Message, dump func() string) {
	t.Helper()
	mm := transcript.NewHistory(msgs, transcript.Config{}).Build(nil)
	if len(mm) > 0 && mm[0].Role != "user" {
		t.Fatalf("the transcript does not start with a user message: %+v%s", mm, dump())
	}
	open, called := map[string]bool{}, map[string]bool{}
	for i, m := range mm {
		switch m.Role {
		case "user", "assistant":
			if len(open) > 0 {
				t.Fatalf("transcript message %d (%s) comes before the results of %v%s", i, m.Role, open, dump())
			}
			for _, c := range m.ToolCalls {
				if called[c.ID] {
					t.Fatalf("tool call %s made twice in the transcript%s", c.ID, dump())
				}
				called[c.ID], open[c.ID] = true, true
			}
		case "tool":
			if !open[m.ToolCallID] {
				t.Fatalf("tool result %s without its call right before it%s", m.ToolCallID, dump())
			}
			delete(open, m.ToolCallID)
			if strings.HasPrefix(m.Text, "No result:") {
				t.Fatalf("tool call %s reaches the model without a result%s", m.ToolCallID, dump())
			}
		default:
			t.Fatalf("transcript message %d has role %q", i, m.Role)
		}
	}
	if len(open) > 0 {
		t.Fatalf("tool calls without results at the end of the transcript: %v%s", open, dump())
	}
}

// oneReplyToU0: a regenerate replaces u0's reply. A completed regenerate shows only the new reply; one that did
// not complete keeps the old reply (a failed regenerate must not lose it), followed by its own failed attempt, as
// a regenerate that fails without a crash does.
func oneReplyToU0(t *testing.T, c *checks, v view) {
	t.Helper()
	var replies []string
	for i, m := range v.msgs {
		if m.ID == "u0" {
			for _, r := range v.msgs[i+1:] {
				if r.Role != agent.RoleAssistant {
					break
				}
				replies = append(replies, r.ID+"/"+string(r.Meta().Status))
			}
		}
	}
	old := v.prior.AssistantMessageID + "/" + string(agent.MessageCompleted)
	want := []string{old, v.crashed.AssistantMessageID + "/" + string(agent.MessageStatus(v.crashed.Status))}
	if v.crashed.Status == agent.RunCompleted {
		want = want[1:]
	}
	if !slices.Equal(replies, want) {
		c.fail(t, checkRegenHide, "replies to u0 after a crashed regenerate: %v, want %v", replies, want)
	}
}

// editU0 is the edit of u0 to editText.
func editU0() engine.Request {
	return engine.Request{Owner: "alice", ThreadID: crashThread, Kind: engine.TurnSubmit, Message: userMsg("u0", editText), MessageID: "u0"}
}

// editOrNothing: a crashed edit of u0 shows either the edit (u0's new text, its old reply hidden) or nothing
// changed (u0's old text and its old reply); never the new text with the old reply, nor the old text without it.
// The re-sent edit shows the edit.
func editOrNothing(t *testing.T, c *checks, v view) {
	t.Helper()
	var shown []string
	for _, m := range v.msgs {
		shown = append(shown, m.ID+"/"+string(m.Role)+"/"+m.Text())
	}
	i := slices.IndexFunc(v.msgs, func(m agent.Message) bool { return m.ID == "u0" })
	if i < 0 {
		t.Fatalf("u0 lost: %q", shown)
	}
	edited := v.msgs[i].Text() == editText
	oldReply := slices.ContainsFunc(v.msgs, func(m agent.Message) bool { return m.ID == v.prior.AssistantMessageID })
	switch {
	case edited == oldReply:
		t.Fatalf("u0 edited=%v with its old reply shown=%v: %q", edited, oldReply, shown)
	case c.reposted && !edited:
		t.Fatalf("the re-sent edit is not shown: %q", shown)
	case !c.reposted && c.row.edited == wantYes && !edited:
		t.Fatalf("the edit, committed before the crash, is not shown: %q", shown)
	case !c.reposted && c.row.edited == wantNo && edited:
		t.Fatalf("the edit shown although the crash came before its write: %q", shown)
	}
}
