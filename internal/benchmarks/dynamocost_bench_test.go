package benchmarks

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// BenchmarkDynamoCost: what one turn costs on DynamoDB, request by request (issue 18 item 7). Three kinds of
// turn, each on a thread that already holds one short exchange, through the whole local stack (HTTP handler,
// engine, openai adapter) on one dynamo.Store over dynalite, against a fake model that streams a reply of
// costWords words over costStream:
//
//	plain    one user message → the reply
//	tool     one user message → a call of the server tool "lookup" (no store work of its own) → the reply
//	resumed            plain, with a second client attached through GET /chat/{id}/stream from the reply's
//	                   first word to its end, on the process that runs the turn (its requests are counted too,
//	                   as "reader: …")
//	resumed-elsewhere  the same, the GET served by a second stack on the same table: another process, as every
//	                   resume is on Lambda (an execution environment serves one request at a time, and the turn's
//	                   is busy streaming it)
//
// Every request the store's client sends is counted once per attempt on the wire, with the capacity it consumed,
// under its purpose (purposeOf): the store method that sent it, found on the goroutine's stack (ClaimRun,
// Heartbeat, AppendSegment, …), and the function outside lib/dynamo that called the method ("Heartbeat ←
// engine.(*guard).heartbeat"), prefixed "reader: " when the HTTP request it serves is GET /chat/{id}/stream.
// Each purpose has its own dynamo.Counter:
// read units and table write units as dynalite reports them (ReturnConsumedCapacity=INDEXES; a read that finds
// nothing raised to DynamoDB's least charge, which dynalite reports as 0: floorReadUnits), index write units
// computed from each written item before and after (MeasureIndexWrites: dynalite reports none). A turn is counted
// from its POST until no request has been in flight for costQuiet after the client read [DONE] (the run's finish
// and final segment come after the stream's end).
//
// Run with -benchtime 1x (make bench does): costTurns turns of each kind, the tables give the mean per turn.
func BenchmarkDynamoCost(b *testing.B) {
	cs := newCostStack(b)
	kinds := []string{"plain", "tool", "resumed", "resumed-elsewhere"}
	results := map[string]costResult{}
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			var r costResult
			for i := range costTurns {
				thread := fmt.Sprintf("%s%d_%d", kind, b.N, i)
				cs.turn(b, thread, "w", "/quick hello", "")
				cs.settle(b)
				before := cs.purposes.snapshot()
				start := time.Now()
				switch kind {
				case "tool":
					cs.turn(b, thread, "u", "/tool lookup", "")
				case "resumed":
					cs.turn(b, thread, "u", "tell me a story", cs.url)
				case "resumed-elsewhere":
					cs.turn(b, thread, "u", "tell me a story", cs.other)
				default:
					cs.turn(b, thread, "u", "tell me a story", "")
				}
				r.secs += time.Since(start).Seconds()
				cs.settle(b)
				r.counts = addPurposes(r.counts, diffPurposes(cs.purposes.snapshot(), before))
			}
			cs.report(b, kind, r)
			results[kind] = r
		})
	}
	if len(results) == len(kinds) {
		fmt.Print(cs.summary(kinds, results))
	}
}

// costResult is what costTurns turns of one kind cost, by purpose, and their seconds from POST to [DONE].
type costResult struct {
	counts map[string]dynamo.Counts
	secs   float64
}

const (
	costWords  = 200
	costStream = 10 * time.Second // costWords words, one every costStream/costWords
	costTurns  = 3
	costQuiet  = 1500 * time.Millisecond // no request in flight for this long: the turn's writes are over
)

// costStack is the local stack on one dynamo.Store whose client counts requests by purpose, and a second one on
// the same table (other: its URL), counted the same way, for readers in another process.
type costStack struct {
	url, other, token string
	purposes          *purposes
}

func newCostStack(b *testing.B) *costStack {
	ctx := context.Background()
	endpoint := dynamotest.Start(b)
	table := fmt.Sprintf("cost_%d", time.Now().UnixNano())
	if err := dynamotest.CreateTable(ctx, dynamotest.Client(endpoint), table); err != nil {
		b.Fatal(err)
	}
	ps, err := newPurposes(endpoint, table)
	if err != nil {
		b.Fatal(err)
	}
	model := httptest.NewServer(&costModel{})
	b.Cleanup(model.Close)
	schema := json.RawMessage(`{"type":"object"}`)
	cs := &costStack{purposes: ps}
	serve := func() (string, *devserver.Stack) {
		client := dynamotest.Client(endpoint, func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, ps.register) })
		dev, err := devserver.New(ctx, devserver.Options{Data: b.TempDir(), Store: dynamo.New(client, table), ModelURL: model.URL + "/v1/",
			Config: config.Config{Secret: "bench-secret-bench-secret-bench-secret"},
			Tools: func(agent.ValueStore, agent.Clock) []agent.Tool {
				return []agent.Tool{{Name: "lookup", Kind: agent.ToolServer, InputSchema: schema,
					Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
						return json.RawMessage(`{"answer":"forty-two"}`), nil
					}}}
			}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(dev.Close)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/stream") {
				r = r.WithContext(context.WithValue(r.Context(), routeKey{}, "reader"))
			}
			dev.Handler.ServeHTTP(w, r)
		}))
		b.Cleanup(srv.Close)
		return srv.URL, dev
	}
	var dev *devserver.Stack
	cs.url, dev = serve()
	cs.other, _ = serve()
	tok, err := dev.Token("bench", time.Hour) // both stacks share the secret
	if err != nil {
		b.Fatal(err)
	}
	cs.token = tok
	return cs
}

func (cs *costStack) do(b *testing.B, method, path, body string) *http.Response {
	req, _ := http.NewRequest(method, cs.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cs.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	return resp
}

// turn posts one user message and reads the reply to [DONE]; with a resume URL, a second client reads the same
// reply through GET /chat/{id}/stream there from its first text delta on.
func (cs *costStack) turn(b *testing.B, thread, msgID, text, resume string) {
	resp := cs.do(b, "POST", "/chat", chat(thread, msgID, text))
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		b.Fatalf("POST /chat: %d %s", resp.StatusCode, data)
	}
	var reader sync.WaitGroup
	var readerData []byte
	var readerStatus int
	var all bytes.Buffer
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadBytes('\n')
		all.Write(line)
		if resume != "" && bytes.Contains(line, []byte(`"type":"text-delta"`)) {
			req, _ := http.NewRequest("GET", resume+"/chat/"+thread+"/stream", nil)
			resume = ""
			req.Header.Set("Authorization", "Bearer "+cs.token)
			reader.Go(func() {
				r, err := http.DefaultClient.Do(req)
				if err != nil {
					readerStatus, readerData = -1, []byte(err.Error())
					return
				}
				defer r.Body.Close()
				readerStatus = r.StatusCode
				readerData, _ = io.ReadAll(r.Body)
			})
		}
		if err != nil {
			break
		}
	}
	reader.Wait()
	if !bytes.HasSuffix(all.Bytes(), []byte("data: [DONE]\n\n")) {
		b.Fatalf("turn %s/%s: the stream did not end with [DONE]: %s", thread, msgID, all.Bytes())
	}
	if readerStatus != 0 && (readerStatus != 200 || !bytes.HasSuffix(readerData, []byte("data: [DONE]\n\n"))) {
		b.Fatalf("resume %s: %d %s", thread, readerStatus, readerData)
	}
	if resume != "" {
		b.Fatalf("turn %s/%s: no text delta to attach a reader at", thread, msgID)
	}
}

// settle waits until no request has been in flight for costQuiet.
func (cs *costStack) settle(b *testing.B) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if cs.purposes.inflight.Load() == 0 && time.Since(time.Unix(0, cs.purposes.last.Load())) >= costQuiet {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("DynamoDB requests did not stop within 30 s of the turn's end")
}

// report prints a kind's table (mean per turn) and reports its totals.
func (cs *costStack) report(b *testing.B, kind string, r costResult) {
	total, secs := r.counts, r.secs
	n := float64(costTurns)
	order := cs.purposes.order()
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%s turn (mean of %d; %.1f s from POST to [DONE]):\n\n", kind, costTurns, secs/n)
	sb.WriteString("| purpose | requests | RCU | WCU (index) |\n| --- | --- | --- | --- |\n")
	var all dynamo.Counts
	for _, p := range slices.SortedFunc(maps.Keys(total), func(x, y string) int { return cmp.Compare(order[x], order[y]) }) {
		c := total[p]
		if c.Total() == 0 {
			continue
		}
		all = sum(map[string]dynamo.Counts{"all": all, p: c})
		var ops []string
		for _, op := range slices.Sorted(maps.Keys(c.ByOperation)) {
			ops = append(ops, fmt.Sprintf("%s %s", num(float64(c.ByOperation[op])/n), op))
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s (%s) |\n", p, strings.Join(ops, ", "), num(c.ReadUnits/n), num(c.WriteUnits()/n),
			num(c.IndexWriteUnits/n))
	}
	reqs := float64(all.Total()) / n
	fmt.Fprintf(&sb, "| **total** | **%s** (%s reads, %s writes) | **%s** | **%s** (%s) |\n", num(reqs), num(float64(all.Reads)/n),
		num(float64(all.Writes)/n), num(all.ReadUnits/n), num(all.WriteUnits()/n), num(all.IndexWriteUnits/n))
	fmt.Fprintf(&sb, "\nper second of the turn: %s requests, %s RCU, %s WCU\n", num(reqs/(secs/n)), num(all.ReadUnits/secs),
		num(all.WriteUnits()/secs))
	// Printed rather than logged: a benchmark's log is cut to its first lines.
	fmt.Print(sb.String())
	b.ReportMetric(reqs, "ddb-requests/turn")
	b.ReportMetric(all.ReadUnits/n, "rcu/turn")
	b.ReportMetric(all.WriteUnits()/n, "wcu/turn")
	b.ReportMetric(all.WriteUnits()/secs, "wcu/s")
}

// summary is one table of every kind: a row per purpose (requests · RCU · WCU per turn), then the totals.
func (cs *costStack) summary(kinds []string, results map[string]costResult) string {
	n := float64(costTurns)
	order := cs.purposes.order()
	names := map[string]bool{}
	for _, r := range results {
		for p, c := range r.counts {
			if c.Total() > 0 {
				names[p] = true
			}
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nper turn (mean of %d), requests · RCU · WCU:\n\n| purpose | operations | %s |\n| --- | --- |%s\n", costTurns,
		strings.Join(kinds, " | "), strings.Repeat(" --- |", len(kinds)))
	for _, p := range slices.SortedFunc(maps.Keys(names), func(x, y string) int { return cmp.Compare(order[x], order[y]) }) {
		ops := map[string]bool{}
		var cells []string
		for _, k := range kinds {
			c := results[k].counts[p]
			for op, m := range c.ByOperation {
				ops[op] = ops[op] || m > 0
			}
			cell := "—"
			if c.Total() > 0 {
				cell = fmt.Sprintf("%s · %s · %s", num(float64(c.Total())/n), num(c.ReadUnits/n), num(c.WriteUnits()/n))
			}
			cells = append(cells, cell)
		}
		fmt.Fprintf(&sb, "| %s | %s | %s |\n", p, strings.Join(slices.Sorted(maps.Keys(ops)), ", "), strings.Join(cells, " | "))
	}
	row := func(label string, f func(all dynamo.Counts, secs float64) string) {
		var cells []string
		for _, k := range kinds {
			cells = append(cells, f(sum(results[k].counts), results[k].secs/n))
		}
		fmt.Fprintf(&sb, "| %s | | %s |\n", label, strings.Join(cells, " | "))
	}
	row("**requests** (reads + writes)", func(a dynamo.Counts, _ float64) string {
		return fmt.Sprintf("**%s** (%s + %s)", num(float64(a.Total())/n), num(float64(a.Reads)/n), num(float64(a.Writes)/n))
	})
	row("**RCU**", func(a dynamo.Counts, _ float64) string { return "**" + num(a.ReadUnits/n) + "**" })
	row("**WCU** (of which index)", func(a dynamo.Counts, _ float64) string {
		return fmt.Sprintf("**%s** (%s)", num(a.WriteUnits()/n), num(a.IndexWriteUnits/n))
	})
	row("seconds, POST to [DONE]", func(_ dynamo.Counts, s float64) string { return num(s) })
	row("WCU per streaming second", func(a dynamo.Counts, s float64) string { return num(a.WriteUnits() / n / s) })
	row("requests per streaming second", func(a dynamo.Counts, s float64) string { return num(float64(a.Total()) / n / s) })
	return sb.String()
}

// num prints a per-turn mean: whole numbers as such, others to one decimal.
func num(f float64) string {
	if f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}

func diffPurposes(now, before map[string]dynamo.Counts) map[string]dynamo.Counts {
	out := map[string]dynamo.Counts{}
	for p, c := range now {
		out[p] = c.Sub(before[p])
	}
	return out
}

func addPurposes(into, more map[string]dynamo.Counts) map[string]dynamo.Counts {
	if into == nil {
		into = map[string]dynamo.Counts{}
	}
	for p, c := range more {
		into[p] = sum(map[string]dynamo.Counts{"a": into[p], "b": c})
	}
	return into
}

// routeKey marks the context of an HTTP request whose store requests are counted under a prefix ("reader").
type routeKey struct{}

// purposes counts a client's requests by purpose, each purpose with its own dynamo.Counter: register puts one
// middleware in the Initialize step and one in the Finalize step, which hand each request to its purpose's
// counter's own two middlewares.
type purposes struct {
	measure  func(*dynamo.Counter)
	mu       sync.Mutex
	by       map[string]*purpose
	inflight atomic.Int64
	last     atomic.Int64 // unix ns when the last request ended
}

type purpose struct {
	counter  *dynamo.Counter
	first    int // the order purposes were first seen in
	units    middleware.InitializeMiddleware
	requests middleware.FinalizeMiddleware
}

type purposeCtx struct{}

func newPurposes(endpoint, table string) (*purposes, error) {
	measure, err := indexWrites(endpoint, table)
	if err != nil {
		return nil, err
	}
	return &purposes{by: map[string]*purpose{}, measure: measure}, nil
}

// of returns the purpose's counter, made on first use: the counter's middlewares are taken from a stack of
// their own.
func (ps *purposes) of(name string) (*purpose, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p, ok := ps.by[name]; ok {
		return p, nil
	}
	c := &dynamo.Counter{}
	ps.measure(c)
	st := middleware.NewStack("purpose", nil)
	if err := c.Register(st); err != nil {
		return nil, err
	}
	ini, fin := st.Initialize.List(), st.Finalize.List()
	if len(ini) != 1 || len(fin) != 1 {
		return nil, fmt.Errorf("dynamo.Counter registers %v and %v, want one Initialize and one Finalize middleware", ini, fin)
	}
	p := &purpose{counter: c, first: len(ps.by)}
	p.units, _ = st.Initialize.Get(ini[0])
	p.requests, _ = st.Finalize.Get(fin[0])
	ps.by[name] = p
	return p, nil
}

func (ps *purposes) register(stack *middleware.Stack) error {
	err := stack.Initialize.Add(middleware.InitializeMiddlewareFunc("bench.PurposeUnits",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			p, err := ps.of(purposeOf(ctx))
			if err != nil {
				return middleware.InitializeOutput{}, middleware.Metadata{}, err
			}
			ps.inflight.Add(1)
			defer func() {
				ps.last.Store(time.Now().UnixNano())
				ps.inflight.Add(-1)
			}()
			floored := middleware.InitializeHandlerFunc(func(ctx context.Context, in middleware.InitializeInput) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				if err == nil {
					floorReadUnits(in.Parameters, out.Result)
				}
				return out, md, err
			})
			return p.units.HandleInitialize(context.WithValue(ctx, purposeCtx{}, p), in, floored)
		}), middleware.After)
	if err != nil {
		return err
	}
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("bench.PurposeRequests",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if p, ok := ctx.Value(purposeCtx{}).(*purpose); ok {
				return p.requests.HandleFinalize(ctx, in, next)
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// floorReadUnits raises the read units a GetItem, Query or Scan reports to DynamoDB's least charge for one:
// DynamoDB bills a read of an item that does not exist, and a Query or Scan that finds nothing, as a read of up
// to 4 KB (1 RCU strongly consistent, 0.5 eventually consistent); dynalite reports 0 for them.
func floorReadUnits(params, result any) {
	least := func(consistent *bool) float64 {
		if consistent != nil && *consistent {
			return 1
		}
		return 0.5
	}
	floor := func(cc **types.ConsumedCapacity, min float64) {
		if *cc == nil {
			*cc = &types.ConsumedCapacity{}
		}
		if aws.ToFloat64((*cc).CapacityUnits) < min {
			(*cc).CapacityUnits = aws.Float64(min)
		}
	}
	switch out := result.(type) {
	case *dynamodb.GetItemOutput:
		if in, ok := params.(*dynamodb.GetItemInput); ok {
			floor(&out.ConsumedCapacity, least(in.ConsistentRead))
		}
	case *dynamodb.QueryOutput:
		if in, ok := params.(*dynamodb.QueryInput); ok {
			floor(&out.ConsumedCapacity, least(in.ConsistentRead))
		}
	case *dynamodb.ScanOutput:
		if in, ok := params.(*dynamodb.ScanInput); ok {
			floor(&out.ConsumedCapacity, least(in.ConsistentRead))
		}
	}
}

func (ps *purposes) snapshot() map[string]dynamo.Counts {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := map[string]dynamo.Counts{}
	for name, p := range ps.by {
		out[name] = p.counter.Counts()
	}
	return out
}

func (ps *purposes) order() map[string]int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := map[string]int{}
	for name, p := range ps.by {
		out[name] = p.first
	}
	return out
}

const dynamoPkg = "github.com/agentloop/agentloop/lib/dynamo."

// purposeOf names the store method a request is made for: the outermost lib/dynamo function on the stack that
// is an exported method (Store's by its name, another type's as Type.Method), else the outermost lib/dynamo
// function (a goroutine the store started, such as readBase's); then, after "←", the function that called it
// from outside lib/dynamo (none for a goroutine the store started); "reader: " first when the context is GET
// /chat/{id}/stream's.
func purposeOf(ctx context.Context) string {
	pcs := make([]uintptr, 512)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	var exported, inner, caller string
	seen := false // a lib/dynamo frame was seen, and no frame outside it since
	for {
		f, more := frames.Next()
		if name, ok := storeMethod(f.Function); ok {
			inner, seen, caller = name, true, ""
			if r := name[strings.LastIndex(name, ".")+1:]; r != "" && unicode.IsUpper(rune(r[0])) {
				exported = name
			}
		} else if seen && caller == "" {
			caller = shortFunc(f.Function)
		}
		if !more {
			break
		}
	}
	name := cmp.Or(exported, inner, "(not a store method)")
	if caller != "" && !strings.HasPrefix(caller, "runtime.") {
		name += " ← " + caller
	}
	if r, _ := ctx.Value(routeKey{}).(string); r != "" {
		name = r + ": " + name
	}
	return name
}

// shortFunc is a function's name without the module path, its closures' ".funcN" and generic brackets.
func shortFunc(fn string) string {
	fn = strings.TrimPrefix(fn, "github.com/agentloop/agentloop/")
	fn = strings.TrimPrefix(fn, "lib/")
	if i := strings.Index(fn, "["); i >= 0 {
		fn = fn[:i] + fn[strings.Index(fn, "]")+1:]
	}
	for {
		i := strings.LastIndex(fn, ".func")
		if i < 0 {
			break
		}
		if _, err := strconv.Atoi(strings.ReplaceAll(fn[i+5:], ".", "")); err != nil {
			break
		}
		fn = fn[:i]
	}
	return fn
}

// storeMethod turns a lib/dynamo function's name ("…/lib/dynamo.(*Store).Heartbeat.func1") into its method
// ("Heartbeat"); ok is false for any other package (lib/dynamo/dynamotest included).
func storeMethod(fn string) (string, bool) {
	rest, ok := strings.CutPrefix(fn, dynamoPkg)
	if !ok {
		return "", false
	}
	typ := ""
	if strings.HasPrefix(rest, "(") {
		i := strings.Index(rest, ").")
		if i < 0 {
			return "", false
		}
		typ, rest = strings.Trim(rest[:i], "(*"), rest[i+2:]
	}
	if i := strings.IndexAny(rest, ".["); i >= 0 {
		rest = rest[:i]
	}
	if typ != "" && typ != "Store" {
		rest = typ + "." + rest
	}
	return rest, true
}

// costModel is an OpenAI-compatible streaming Chat Completions endpoint for the cost benchmark. It answers the
// newest user message: "/quick …" with three words at once; "/tool NAME" with a call of tool NAME (arguments
// {}), and once the request carries the tool's result, like any other text: costWords words, one every
// costStream/costWords.
type costModel struct{ calls atomic.Int64 }

func (cm *costModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		http.Error(w, `{"error":{"message":"only POST /v1/chat/completions","type":"invalid_request_error"}}`, http.StatusNotFound)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"want a chat completion with messages","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	var user json.RawMessage
	for _, m := range req.Messages {
		if m.Role == "user" {
			user = m.Content
		}
	}
	last := req.Messages[len(req.Messages)-1].Role
	model, _ := json.Marshal(req.Model)
	prefix := `data: {"id":"chatcmpl-cost","object":"chat.completion.chunk","created":1700000000,"model":` + string(model) +
		`,"choices":[{"index":0,"delta":`
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(s string) bool {
		if _, err := io.WriteString(w, s); err != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	send(prefix + `{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n")
	finish, words := "stop", 0
	switch {
	case last != "tool" && bytes.Contains(user, []byte("/tool ")):
		name := string(user[bytes.Index(user, []byte("/tool "))+6:])
		name = strings.TrimFunc(name, func(r rune) bool { return !unicode.IsLetter(r) && r != '_' })
		id := fmt.Sprintf("call_cost_%d", cm.calls.Add(1))
		send(prefix + `{"tool_calls":[{"index":0,"id":"` + id + `","type":"function","function":{"name":"` + name + `","arguments":"{}"}}]},"finish_reason":null}]}` + "\n\n")
		finish = "tool_calls"
	case last != "tool" && bytes.Contains(user, []byte("/quick")):
		send(prefix + `{"content":"hello there friend"},"finish_reason":null}]}` + "\n\n")
		words = 3
	default:
		every := costStream / costWords
		start := time.Now()
		for i := range costWords {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Until(start.Add(time.Duration(i+1) * every))):
			}
			if !send(prefix + `{"content":"word` + strconv.Itoa(i) + ` "},"finish_reason":null}]}` + "\n\n") {
				return
			}
		}
		words = costWords
	}
	tail := prefix + `{},"finish_reason":"` + finish + `"}]}` + "\n\n"
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		tail += `data: {"id":"chatcmpl-cost","object":"chat.completion.chunk","created":1700000000,"model":` + string(model) +
			`,"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":` + strconv.Itoa(words+1) + `,"total_tokens":` +
			strconv.Itoa(words+21) + `}}` + "\n\n"
	}
	send(tail + "data: [DONE]\n\n")
}
