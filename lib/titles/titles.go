// Package titles gives a thread a short generated title after its first reply (issue 20 item 5).
//
// The engine calls Generator.FirstReply once a thread's first reply is stored completed and its stream has
// ended (the final segment and [DONE] are out: the reply never waits for a title). The generator asks the title
// model (AGENT_TITLE_MODEL, the main model's when unset) once, with a short prompt: the first user message and
// the reply, each cut to Config.MaxInputBytes, and at most Config.MaxOutputTokens of answer. It cleans the answer
// into one short line (Sanitize) and stores it with agent.ThreadStore.SetGeneratedTitle, the conditional write
// that replaces only the provisional title the thread was created with (its first message's text), never one its
// owner set (PATCH /threads/{id}, which wins whether it lands before or after) nor one generated before.
// A failure (the model's, an empty answer, the store's) is logged and changes nothing a client sees: the thread
// simply has no title.
//
// Where it runs. In a long-lived process (`agentloop dev`) with Config.Background: in a goroutine of its own,
// at most Config.MaxInFlight at once (one more is skipped, logged), which Wait waits for. In Lambda without it:
// on the request's goroutine, after the stream's last byte is written and before the handler returns, because
// Lambda freezes the execution environment once the response ends and a goroutine left running would stop
// mid-request and resume, its deadline passed, in some later invocation. The client has the whole reply by then
// ([DONE] is flushed); only the connection's close waits, at most Config.Timeout. The job runner (Step
// Functions) was the other way: its executions are sub-agent jobs with a job item, a tool call and a delivery
// into the thread as a steer, none of which a title has, so a title there would be a new route through the state
// machine, its tasks and the Jobs port for one small model call and one write.
//
// What a title costs is the thread's: the title request's usage (priced with Deps.Prices) is added to the
// thread's usage totals (agent.ThreadStore.AddUsage, keyed by the run, so a retried write counts once) whenever
// the model answered, a title stored or not, and handed to the metrics (agent.TitleSpend, when Deps.Metrics
// implements it: lib/emf's Titles and Title* metrics), never to a run's.
//
// Every attempt is logged once as "agent.title" with thread_id, run_id and model, and, once the model answered,
// its tokens and cost as "agent.run" logs a run's (input_tokens, output_tokens, cached_input_tokens,
// reasoning_tokens, total_tokens, cost_micro_usd).
package titles

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults, written once here.
const (
	// DefaultTimeout bounds one title: the model call and the write.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxOutputTokens bounds the model's answer (a title is a few words).
	DefaultMaxOutputTokens = 16
	// DefaultMaxInputBytes bounds each of the user message and the reply in the prompt.
	DefaultMaxInputBytes = 2000
	// DefaultMaxTitleRunes bounds a stored title (threads.MaxTitleBytes bounds the owner's, in bytes).
	DefaultMaxTitleRunes = 80
	// DefaultMaxInFlight bounds the titles generated at once in the background.
	DefaultMaxInFlight = 16
)

// Instruction opens the prompt's user message. The offline model (lib/offline) answers a request whose newest
// user message begins with it with a deterministic title: keep the two in step.
const Instruction = "Title this conversation."

// System is the title request's system prompt.
const System = "You write the title of a conversation: three to six words that say what it is about, in the " +
	"language of the user's message. Answer with the title alone: no quotes, no trailing period, no preamble."

// Store is what the generator writes through.
type Store interface {
	SetGeneratedTitle(ctx context.Context, g agent.GeneratedTitle) (agent.Thread, bool, error)
	AddUsage(ctx context.Context, u agent.ThreadUsage) error
}

// Deps are the generator's ports.
type Deps struct {
	Store  Store
	Model  agent.Model
	Clock  agent.Clock
	Logger *slog.Logger
	// Prices prices the title request's usage (the zero value prices nothing), as the engine prices a run's.
	Prices agent.Prices
	// Metrics receives each title's spend when it implements agent.TitleSpend (nil: none).
	Metrics agent.Metrics
}

// Config configures titles. Zero values take the defaults.
type Config struct {
	// Model is the models-file entry (or provider model id) the title request names.
	Model           string
	Timeout         time.Duration
	MaxOutputTokens int
	MaxInputBytes   int
	MaxTitleRunes   int
	// Background: FirstReply returns at once and the title is made in a goroutine (a long-lived process only).
	Background  bool
	MaxInFlight int
}

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxOutputTokens = cmp.Or(c.MaxOutputTokens, DefaultMaxOutputTokens)
	c.MaxInputBytes = cmp.Or(c.MaxInputBytes, DefaultMaxInputBytes)
	c.MaxTitleRunes = cmp.Or(c.MaxTitleRunes, DefaultMaxTitleRunes)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	return c
}

// Generator makes titles.
type Generator struct {
	store  Store
	model  agent.Model
	clock  agent.Clock
	timers agent.Timers
	log    *slog.Logger
	prices agent.Prices
	spend  agent.TitleSpend
	cfg    Config
	slots  chan struct{}
	wg     sync.WaitGroup
}

// New builds a generator.
func New(d Deps, cfg Config) *Generator {
	g := &Generator{store: d.Store, model: d.Model, clock: d.Clock, log: d.Logger, prices: d.Prices, cfg: cfg.withDefaults()}
	g.spend, _ = d.Metrics.(agent.TitleSpend)
	if g.clock == nil {
		g.clock = agent.SystemClock{}
	}
	g.timers = agent.TimersOf(g.clock)
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.slots = make(chan struct{}, g.cfg.MaxInFlight)
	return g
}

// FirstReply titles r's thread (engine.Titler): at once, or in the background with Config.Background.
func (g *Generator) FirstReply(ctx context.Context, r agent.FirstReply) {
	ctx = context.WithoutCancel(ctx)
	if !g.cfg.Background {
		g.Title(ctx, r)
		return
	}
	select {
	case g.slots <- struct{}{}:
	default:
		g.log.WarnContext(ctx, "agent.title", "thread_id", r.ThreadID, "run_id", r.RunID, "model", g.cfg.Model,
			"skipped", "too many titles in flight", "in_flight", g.cfg.MaxInFlight)
		return
	}
	g.wg.Go(func() {
		defer func() { <-g.slots }()
		g.Title(ctx, r)
	})
}

// Wait blocks until every title started in the background has ended (at once for a nil generator).
func (g *Generator) Wait() {
	if g != nil {
		g.wg.Wait()
	}
}

// errTimeout is the cause of a title that took longer than Config.Timeout.
var errTimeout = errors.New("title timed out")

// Title makes r's thread's title and stores it unless the thread has one; it returns the title stored by this
// call ("" when none was: the thread had one, or something failed, which it logs).
func (g *Generator) Title(ctx context.Context, r agent.FirstReply) string {
	start := g.clock.Now()
	ctx, cancel := g.timers.WithTimeoutCause(ctx, g.cfg.Timeout, errTimeout)
	defer cancel()
	attrs := []any{"thread_id", r.ThreadID, "run_id", r.RunID, "model", g.cfg.Model}
	fail := func(stage string, err error) string {
		if c := context.Cause(ctx); c != nil && errors.Is(c, errTimeout) {
			err = fmt.Errorf("%w after %s: %w", errTimeout, g.cfg.Timeout, err)
		}
		g.log.WarnContext(ctx, "agent.title", append(attrs, "set", false, "stage", stage, "err", err,
			"duration_ms", g.clock.Now().Sub(start).Milliseconds())...)
		return ""
	}
	var text strings.Builder
	res, err := g.model.Stream(ctx, g.request(r), func(ev agent.ModelEvent) error {
		if ev.Type == agent.EventTextDelta && text.Len() < 4*g.cfg.MaxTitleRunes*utf8.UTFMax {
			text.WriteString(ev.Delta)
		}
		return nil
	})
	if err != nil {
		return fail("model", err)
	}
	u := g.record(ctx, r, res, g.clock.Now().Sub(start))
	attrs = append(attrs, "input_tokens", u.InputTokens, "output_tokens", u.OutputTokens, "cached_input_tokens", u.CachedInputTokens,
		"reasoning_tokens", u.ReasoningTokens, "total_tokens", u.TotalTokens, "cost_micro_usd", u.CostMicroUSD)
	title := Sanitize(text.String(), g.cfg.MaxTitleRunes)
	if title == "" {
		return fail("answer", fmt.Errorf("the model's answer holds no title (%d bytes)", text.Len()))
	}
	_, set, err := g.store.SetGeneratedTitle(ctx, agent.GeneratedTitle{ThreadID: r.ThreadID, CreatedAt: r.CreatedAt, Replaces: r.Title, Title: title})
	if err != nil {
		return fail("store", err)
	}
	g.log.InfoContext(ctx, "agent.title", append(attrs, "set", set, "title_bytes", len(title),
		"duration_ms", g.clock.Now().Sub(start).Milliseconds())...)
	if !set {
		return ""
	}
	return title
}

// record prices the title request's usage, adds it to the thread's totals and hands it to the metrics; it
// returns the priced usage. A failed write is logged (the title goes on: its spend is then missing from the
// thread's totals, as a lost run's would be).
func (g *Generator) record(ctx context.Context, r agent.FirstReply, res agent.ModelResult, took time.Duration) agent.Usage {
	u := res.Usage
	model := cmp.Or(res.Model, g.cfg.Model)
	if g.prices.Len() > 0 {
		cost, known := g.prices.Cost(model, u)
		if !known && u != (agent.Usage{}) {
			g.log.WarnContext(ctx, "agent.price_unknown", "model", model)
		}
		u.CostMicroUSD = cost
	}
	if g.spend != nil {
		g.spend.TitleSpent(model, u, took)
	}
	if u == (agent.Usage{}) {
		return u
	}
	if err := g.store.AddUsage(ctx, agent.ThreadUsage{ThreadID: r.ThreadID, CreatedAt: r.CreatedAt, Key: "title:" + r.RunID, Usage: u}); err != nil {
		g.log.WarnContext(ctx, "agent.title_usage", "thread_id", r.ThreadID, "run_id", r.RunID, "err", err)
	}
	return u
}

// request is the title request for r.
func (g *Generator) request(r agent.FirstReply) agent.ModelRequest {
	n := g.cfg.MaxInputBytes
	prompt := Instruction + "\n\n<user>\n" + cut(strings.TrimSpace(r.User), n) + "\n</user>\n\n<assistant>\n" +
		cut(strings.TrimSpace(r.Reply), n) + "\n</assistant>"
	return agent.ModelRequest{Model: g.cfg.Model, System: System, MaxOutputTokens: g.cfg.MaxOutputTokens,
		Messages: []agent.ModelMessage{{Role: "user", Text: prompt}}}
}

// cut returns s cut to at most n bytes, on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// quotes are what a model wraps a title in, stripped from both ends.
const quotes = "\"'`*_#“”‘’«»„"

// Sanitize turns a model's answer into a title of at most maxRunes runes: its first line with text, a
// "Title:" label dropped, whitespace collapsed, control and format characters removed, wrapping quotes and
// markdown stripped, a trailing period, colon or comma dropped, and cut at a word boundary when too long. ""
// when nothing is left.
func Sanitize(answer string, maxRunes int) string {
	var line string
	for l := range strings.Lines(answer) {
		if l = strings.TrimSpace(l); l != "" {
			line = l
			break
		}
	}
	line = strings.Map(func(r rune) rune {
		switch {
		case r == utf8.RuneError:
			return -1
		case unicode.IsSpace(r):
			return ' '
		case unicode.IsControl(r), unicode.Is(unicode.Cf, r):
			return -1
		}
		return r
	}, line)
	line = strings.Join(strings.Fields(line), " ")
	if len(line) >= 6 && strings.EqualFold(line[:6], "title:") {
		line = strings.TrimSpace(line[6:])
	}
	for {
		t := strings.TrimRight(strings.Trim(line, quotes+" "), ".:;,")
		if t == line {
			break
		}
		line = t
	}
	if utf8.RuneCountInString(line) <= maxRunes {
		return line
	}
	runes := []rune(line)[:maxRunes]
	if i := strings.LastIndexByte(string(runes), ' '); i > 0 {
		return strings.TrimRight(string(runes)[:i], ".:;, ")
	}
	return string(runes)
}
