// Package transcript turns stored UI messages into the provider-neutral model transcript, and prunes it to the
// model's budget before every step. It is pure: it reads messages and never changes what is stored.
//
// The transcript it returns is always provider-valid (DESIGN principle 5):
//   - every tool call has exactly one result, right after the assistant message that made it (a call without a
//     result gets a synthesized one);
//   - it starts at a user message, and the messages the turn answers (Config.Protect) are never pruned;
//   - the run's own in-flight turn (the draft) is never split or dropped (its older tool pairs may be stubbed);
//   - a tool output is capped for the model (head, tail and a marker saying how much was cut); the stored output
//     stays whole.
//   - a stored file no model takes (a row written before the boundary refused it: another media type, data that
//     is not what its type says, a URL that is not https, a linked PDF past agent.MaxLinkedPDFs) is a line after
//     its message's text, "[attachment NAME (TYPE) not shown: WHY]", never a failed request or a silent gap.
//
// # Pruning tiers
//
// The budget is in tokens, estimated as chars/4 (a file by its own rule, see FileTokens) and scaled by what the
// provider reported for the previous request of the run (Reported), counting the system prompt and the tool
// specs (Config.FixedTokens). Tiers 1 to 3 run in transcript order, oldest message first, while the transcript is
// still over what it must shed (see Blocks); tier 0 always runs:
//
//	tier 0, always  a tool that declares its output a snapshot (agent.Tool.Snapshot) shows the model only its
//	                newest output; earlier ones become a one-line note. A stale snapshot misleads, so this runs
//	                even in a short thread.
//	tier 1          a step's reasoning is dropped (never the newest step of the last assistant message's)
//	tier 2          then the step's tool call/result pairs become one-line stubs: the call keeps its id and name
//	                (its arguments too when short), the result says what was cut. Both sides of a pair always
//	                stay. The last assistant message's older steps go too (REVIEW S1: a reply whose tool outputs
//	                passed the budget made the thread unanswerable); its newest step waits for tier 3.
//	tier 3          an older user message's attachments become a line naming the file; after all that, the
//	                newest step of the reply before the protected messages (not of the draft) is stubbed as well.
//	tier 4          whole turns (a user message and its replies) are dropped, oldest first, except the turns that
//	                hold something never pruned.
//
// Never pruned, whatever the budget: the messages the turn answers (Config.Protect, with their attachments), the
// draft's newest step (the results the model must answer now), tool calls still waiting for an approval or a
// client's output, and the surviving snapshots. When those alone are over the budget, Report.Over says so and
// the engine ends the turn with context_exhausted rather than send a request the provider refuses; the next
// message fits again, as the reply before it is no longer the draft. CheckMessage refuses, up front, a user
// message that alone could never fit.
//
// # Blocks
//
// A provider caches the prompt's prefix (system prompt, tools, older history) from one request to the next; a
// cutoff that moved at every step would change the prefix at every step and throw that cache away. So tiers 1 to
// 4 do not prune to the budget but by whole blocks (Config.BlockTokens, DefaultBlockPercent of the budget): the
// overflow is rounded up to a whole number of blocks (Report.Blocks) and the tiers prune that much. While the
// transcript grows within the same block, the same things are pruned and the request extends the previous one;
// only when the overflow crosses a block boundary does the cutoff move, by about a block. The block is counted
// in the transcript's own chars (the provider's scale only decides how many blocks), so a rescale within a
// block moves nothing. Tiers 1 to 3 run in transcript order for the same reason: what a step or turn adds comes
// after all that was pruned. Tier 4 rounds what is left to shed up to whole blocks again (Report.DropBlocks), so
// what tiers 1 to 3 freed may vary by less than a block without moving the turns it drops. Two changes remain by
// design: a newer snapshot output (tier 0) replaces the older one, and once tier 4 runs, the step that was the
// newest (never pruned then) is pruned when it no longer is. TestCacheStablePruning holds the package to this.
package transcript

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults, written once here (config maps env names onto Config).
const (
	// DefaultBudgetBytes is what the token budget's default is in bytes (chars/4). The byte budget
	// (AGENT_CONTEXT_BYTES, from before the token budget) is a cap only when set: then the smaller wins.
	DefaultBudgetBytes = DefaultBudgetTokens * 4
	// DefaultBudgetTokens is the model context budget in (estimated) tokens, system prompt and tool specs
	// included. It suits the default model (gpt-4o-mini: 128k tokens) with room for the reply.
	DefaultBudgetTokens = 100_000
	// DefaultToolOutputBytes caps one tool result as the model sees it.
	DefaultToolOutputBytes = 32 << 10
	// FileTokens is what an image, or a PDF by https URL (whose size the transcript cannot see), is estimated
	// to cost. A PDF by data URL costs FileTokens per started PDFChunkBytes of its bytes, at most MaxPDFTokens:
	// providers bill PDFs by pages, not by the length of their base64 (REVIEW S5: a 315 KB PDF counted as text
	// was over the whole budget).
	FileTokens    = 1_000
	PDFChunkBytes = 100_000
	MaxPDFTokens  = 50 * FileTokens
	// DefaultBlockPercent is the step, in percent of the budget, by which pruning moves its cutoff
	// (Config.BlockTokens): see "Blocks" above.
	DefaultBlockPercent = 10
)

// Config bounds a transcript. Zero fields take the defaults above.
type Config struct {
	BudgetTokens    int
	BudgetBytes     int
	ToolOutputBytes int
	// Snapshots names the tools whose outputs supersede their earlier ones (the engine fills it from
	// agent.Tool.Snapshot).
	Snapshots map[string]bool
	// FixedTokens is what every request spends besides the messages: the system prompt and the tool specs
	// (see Fixed; the engine fills it).
	FixedTokens int
	// Protect names the messages the turn answers (the request's own message and the queued messages the turn
	// took, steers included): never pruned, whatever comes after them (REVIEW S6). Empty, or naming no message
	// of the history: the newest user message.
	Protect []string
	// BlockTokens is the step by which the pruning cutoff moves (DefaultBlockPercent of the budget when zero;
	// 1 prunes to the budget at every step, as before blocks).
	BlockTokens int
	// Scale is the provider's count over the estimate that the first Build starts from (see Reported): the
	// previous run's (agent.MessageMetadata.ContextScale), so that a run's first request is cut as the previous
	// run's last one was, not as if the provider counted chars/4 (which moved the cutoff at every turn). 0: 1.
	Scale float64
}

func (c Config) withDefaults() Config {
	c.BudgetTokens = cmp.Or(c.BudgetTokens, DefaultBudgetTokens)
	c.BlockTokens = cmp.Or(c.BlockTokens, max(c.budget()*DefaultBlockPercent/100, 1))
	c.ToolOutputBytes = cmp.Or(c.ToolOutputBytes, DefaultToolOutputBytes)
	return c
}

// budget is the effective budget in tokens: the token budget, or the byte budget's chars/4 when one is set and
// smaller.
func (c Config) budget() int {
	if c.BudgetBytes > 0 {
		return min(c.BudgetTokens, c.BudgetBytes/4)
	}
	return c.BudgetTokens
}

// Fixed estimates the tokens a request spends on the system prompt and the tool specs.
func Fixed(system string, tools []agent.ToolSpec) int {
	n := len(system)
	for _, t := range tools {
		n += len(t.Name) + len(t.Description) + len(t.Parameters)
		for _, ex := range t.InputExamples {
			n += len(ex)
		}
	}
	return tokens(n)
}

// History is a run's stored messages, converted once per run (each step then converts only the draft and
// prunes).
type History struct {
	cfg Config
	// calls counts the tool call ids the stored messages used: a model that repeats an id (a deterministic one
	// answering a regenerate whose first attempt is kept) must not make one id stand for two calls.
	calls   map[string]int
	entries []entry // one per stored message that reaches the model
	ncalls  int     // the calls of all entries
	// scale is the provider's count over the estimate for the last request (1 until Reported).
	scale float64
	last  Report
}

// NewHistory converts the stored messages (oldest first) once.
func NewHistory(msgs []agent.Message, cfg Config) *History {
	h := &History{cfg: cfg.withDefaults(), calls: map[string]int{}, scale: 1}
	if cfg.Scale > 0 {
		h.scale = quantScale(cfg.Scale)
	}
	h.entries = make([]entry, 0, len(msgs))
	for _, m := range msgs {
		if e, ok := convert(m, h.cfg.ToolOutputBytes, h.calls); ok {
			e = h.marked(e)
			h.entries = append(h.entries, e)
			h.ncalls += e.calls
		}
	}
	return h
}

// Build returns the transcript for the next model call: the history, then the run's draft (the parts of the
// assistant message in flight, as the engine holds them; empty for the first step), pruned to the budget.
func (h *History) Build(draft []agent.Part) []agent.ModelMessage {
	d := h.marked(assistant(draft, h.cfg.ToolOutputBytes, maps.Clone(h.calls)))
	p := newPruner(h.entries, h.ncalls, d, h.cfg, h.scale)
	p.prune()
	h.last = p.report
	return p.emit()
}

// marked counts e and notes on its calls which outputs are snapshots (once, not per step).
func (h *History) marked(e entry) entry {
	e.size = e.chars()
	for _, s := range e.steps {
		e.calls += len(s.calls)
	}
	if len(h.cfg.Snapshots) == 0 {
		return e
	}
	for s := range e.steps {
		for c := range e.steps[s].calls {
			cl := &e.steps[s].calls[c]
			cl.snapshot = cl.output && h.cfg.Snapshots[cl.name]
		}
	}
	return e
}

// Downloaded takes the sizes of files the model adapter downloaded (agent.ModelResult.FileBytes, by URL): later
// builds count those PDFs by their size instead of FileTokens (REVIEW S5).
func (h *History) Downloaded(sizes map[string]int64) {
	if len(sizes) == 0 {
		return
	}
	for i := range h.entries {
		e := &h.entries[i]
		changed := false
		for j, f := range e.files {
			if n, ok := sizes[f.URL]; ok && n != f.Bytes && !strings.HasPrefix(f.MediaType, "image/") {
				files := slices.Clone(e.files) // an entry's files may be shared with a transcript already sent
				files[j].Bytes = n
				e.files, changed = files, true
			}
		}
		if changed {
			e.size = e.chars()
		}
	}
}

// Last reports what the latest Build pruned.
func (h *History) Last() Report { return h.last }

// Reported takes the provider's count of the input tokens of the latest Build's request: later builds scale
// their estimate by it (the provider knows its tokenizer; chars/4 is a guess). A zero count (a provider that
// reports no usage) changes nothing, and the factor stays within [1/2, 4] so that one odd report cannot make
// the budget meaningless. The factor moves in 32nds, up at once, down only by more than scaleSlack (see
// quantScale): a cutoff that followed every report would move at every step.
func (h *History) Reported(inputTokens int) {
	est := h.last.EstimatedTokens
	if inputTokens <= 0 || est <= 0 {
		return
	}
	// EstimatedTokens is already scaled; the raw estimate is est/scale.
	s := quantScale(float64(inputTokens) * h.scale / float64(est))
	// A higher count is taken at once (the budget must hold); a lower one only when it is lower by more than
	// scaleSlack: requests of different kinds (text, tool calls) count a little differently, and a scale that
	// went back and forth between them moved the cutoff back and forth.
	if s > h.scale || s < h.scale-scaleSlack {
		h.scale = s
	}
}

// scaleSlack is how much lower a provider's count must be before the scale follows it down.
const scaleSlack = 1.0 / 8

// Scale is the provider's count over the estimate that the next Build prunes with (1 until Reported or
// Config.Scale): what the run's reply keeps for the next run (agent.MessageMetadata.ContextScale).
func (h *History) Scale() float64 { return h.scale }

// quantScale keeps a scale within [1/2, 4] and rounds it up to a 32nd: a provider's count varies a little from
// one request to the next, and a scale that followed it would move the budget, and so the cutoff, with it.
func quantScale(s float64) float64 {
	return min(max(math.Ceil(s*32)/32, 0.5), 4)
}

// MessageTokens estimates what a stored message costs in the transcript, in tokens (chars/4): what a bounded
// read sums, newest first, until the budget is met.
func MessageTokens(m agent.Message) int {
	e, _ := convert(m, DefaultToolOutputBytes, map[string]int{})
	return tokens(e.chars())
}

// MessageSize is what a message costs in the transcript, in bytes of text.
func MessageSize(m agent.Message) int {
	e, _ := convert(m, DefaultToolOutputBytes, map[string]int{})
	return e.chars()
}

// CheckMessage refuses a user message that alone is over the budget (it could never be sent to the model).
func CheckMessage(m agent.Message, cfg Config) error {
	cfg = cfg.withDefaults()
	if cfg.FixedTokens >= cfg.budget() {
		// No message could ever fit: the deployment is misconfigured, not the request (the client sees an
		// internal error; the log has this text).
		return agent.E(agent.KindInternal, agent.CodeInvalidConfig,
			"the system prompt and tool specs (about %d tokens) fill the model budget of %d: raise AGENT_CONTEXT_TOKENS",
			cfg.FixedTokens, cfg.budget())
	}
	if n, b := MessageTokens(m), cfg.budget()-cfg.FixedTokens; n > b {
		return agent.E(agent.KindTooLarge, agent.CodeMessageTooLarge,
			"the message is about %d tokens, more than the model budget of %d", n, b)
	}
	return nil
}

// Estimate is the chars/4 estimate of a transcript (what Report.EstimatedTokens counts, unscaled and without
// the fixed tokens).
func Estimate(msgs []agent.ModelMessage) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Text) + len(m.Reasoning)
		for _, f := range m.Files {
			n += fileChars(f)
		}
		for _, c := range m.ToolCalls {
			n += len(c.Arguments) + len(c.Name)
		}
	}
	return tokens(n)
}

func tokens(chars int) int { return (chars + 3) / 4 }

// entry is one stored message as the model sees it: a user message's text and files, or an assistant
// message's steps.
type entry struct {
	id    string // the stored message's (empty for the draft)
	role  agent.Role
	text  string
	files []agent.ModelFile
	steps []step
	size  int // chars(), counted once
	calls int // the calls of all its steps
}

// step is one model call of an assistant message: what it said and the calls it made, each with its result.
type step struct {
	reasoning, text string
	reasoningData   json.RawMessage // the provider's state of the reasoning (agent.ReasoningDataOf), replayed with it
	calls           []call
}

type call struct {
	id, name, args, result string
	output                 bool // the tool returned an output (not an error, a denial or nothing)
	open                   bool // waiting for an approval, a client's output or an execution
	snapshot               bool // an output of a snapshot tool (Config.Snapshots)
}

func (c call) chars() int { return len(c.name) + len(c.args) + len(c.result) }

func (e *entry) chars() int {
	n := len(e.text)
	for _, f := range e.files {
		n += fileChars(f)
	}
	for _, s := range e.steps {
		n += len(s.reasoning) + len(s.text)
		for _, c := range s.calls {
			n += c.chars()
		}
	}
	return n
}

func fileChars(f agent.ModelFile) int {
	switch {
	case strings.HasPrefix(f.MediaType, "image/"):
		return FileTokens * 4
	case strings.HasPrefix(f.URL, "data:"):
		return pdfTokens(dataBytes(f.URL)) * 4
	case f.Bytes > 0:
		return pdfTokens(int(min(f.Bytes, 1<<40))) * 4
	}
	return FileTokens * 4
}

// pdfTokens is what a PDF of n bytes is estimated to cost.
func pdfTokens(n int) int {
	return min(max((n+PDFChunkBytes-1)/PDFChunkBytes, 1)*FileTokens, MaxPDFTokens)
}

// dataBytes is the decoded size of a base64 data URL's payload (without decoding it).
func dataBytes(u string) int {
	_, payload, _ := strings.Cut(u, ",")
	return len(payload) * 3 / 4
}

// convert maps one UI message; ok is false when nothing of it reaches the model.
func convert(m agent.Message, toolOutputBytes int, calls map[string]int) (entry, bool) {
	switch m.Role {
	case agent.RoleUser:
		e := entry{id: m.ID, role: agent.RoleUser}
		var b strings.Builder
		var refused []string // lines for the stored files no model takes, after the text
		linked := 0
		for _, raw := range m.Parts {
			p, err := agent.DecodePart(raw)
			switch {
			case err != nil:
			case p.Type == "text":
				if b.Len() > 0 {
					b.WriteString("\n")
				}
				b.WriteString(p.Text)
			case p.Type == "file":
				f, why := modelFile(raw)
				if why == "" && f.MediaType == "application/pdf" && strings.HasPrefix(f.URL, "https:") {
					if linked++; linked > agent.MaxLinkedPDFs {
						why = fmt.Sprintf("a message links %d PDFs at most", agent.MaxLinkedPDFs)
					}
				}
				if why != "" {
					refused = append(refused, fmt.Sprintf("[attachment %s (%s) not shown: %s]",
						cmp.Or(f.Filename, "unnamed"), cmp.Or(f.MediaType, "unknown type"), why))
					continue
				}
				e.files = append(e.files, f)
			}
		}
		for _, line := range refused {
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(line)
		}
		e.text = b.String()
		return e, e.text != "" || len(e.files) > 0
	case agent.RoleAssistant:
		e := assistant(Decode(m.Parts), toolOutputBytes, calls)
		e.id = m.ID
		return e, len(e.steps) > 0
	}
	return entry{}, false
}

// modelFile reads a user file part ({type: "file", mediaType, url, filename}, the AI SDK's FileUIPart). Only
// images and PDFs by data or https URL, whose data is what their media type says, reach a model: the boundary
// refuses other files, and for a row stored before it did, why says what is wrong with it (the transcript sends
// a line in its place rather than failing the request or leaving it out without a word).
func modelFile(raw json.RawMessage) (f agent.ModelFile, why string) {
	var p struct {
		MediaType string `json:"mediaType"`
		URL       string `json:"url"`
		Filename  string `json:"filename"`
	}
	_ = json.Unmarshal(raw, &p)
	f = agent.ModelFile{MediaType: p.MediaType, URL: p.URL, Filename: p.Filename}
	switch err := agent.CheckModelFile(p.MediaType, p.URL); {
	case err == nil:
		return f, ""
	case !agent.ModelFileType(p.MediaType):
		return f, "the model reads images and PDFs only"
	default:
		return f, err.Message
	}
}

// assistant maps an assistant message's parts: one step per model call, each with its tool results. used counts
// the tool call ids used so far in the transcript: a repeated id is renamed (id~2, id~3, …) for its call and its
// result alike, so every call stays one call. A step that said nothing and called nothing is left out (its
// reasoning alone is no valid assistant message).
func assistant(parts []agent.Part, toolOutputBytes int, used map[string]int) entry {
	e := entry{role: agent.RoleAssistant}
	var cur step
	var text, reason strings.Builder
	flush := func() {
		cur.text, cur.reasoning = text.String(), reason.String()
		if cur.text != "" || len(cur.calls) > 0 {
			e.steps = append(e.steps, cur)
		}
		cur = step{}
		text.Reset()
		reason.Reset()
	}
	for _, p := range parts {
		switch {
		case p.Type == "step-start":
			flush()
		case p.Type == "text":
			text.WriteString(p.Text)
		case p.Type == "reasoning":
			reason.WriteString(p.Text)
			if data := agent.ReasoningDataOf(p); data != nil {
				cur.reasoningData = data
			}
		case agent.IsToolPart(p.Type):
			args := "{}"
			if len(p.Input) > 0 {
				args = string(p.Input)
			}
			id := p.ToolCallID
			if n := used[id]; n > 0 {
				id = fmt.Sprintf("%s~%d", id, n+1)
			}
			used[p.ToolCallID]++
			cur.calls = append(cur.calls, call{id: id, name: p.ToolNameOf(), args: args,
				result: Cap(ResultText(p), toolOutputBytes), output: p.State == agent.StateOutputAvailable, open: p.Waiting()})
		}
	}
	flush()
	return e
}

// ResultText is what the model sees as the result of a tool part.
func ResultText(p agent.Part) string {
	switch p.State {
	case agent.StateOutputAvailable:
		var s string
		if json.Unmarshal(p.Output, &s) == nil {
			return s
		}
		return string(p.Output)
	case agent.StateOutputError:
		return "Error: " + p.ErrorText
	case agent.StateOutputDenied:
		return "The user denied this tool call."
	default:
		return "No result: the tool call was not completed."
	}
}

// Cap keeps the head and tail of s within limit bytes, with a marker saying how much was cut. It cuts on UTF-8
// boundaries.
func Cap(s string, limit int) string {
	if limit <= 0 || len(s) <= limit {
		return s
	}
	const markerRoom = 32 // the marker below, with the count's digits
	keep := max(limit-markerRoom, 0)
	head, tail := keep/2, keep-keep/2
	h := s[:head]
	for len(h) > 0 && !utf8Start(s[len(h)]) {
		h = h[:len(h)-1]
	}
	tStart := len(s) - tail
	for tStart < len(s) && !utf8Start(s[tStart]) {
		tStart++
	}
	return h + fmt.Sprintf("\n[… %d bytes cut …]\n", tStart-len(h)) + s[tStart:]
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// Synthesize gives every tool part without a result an output-error saying errorText (or, when outcome reports
// one, the outcome the tool recorded), so a finished message never holds an orphan call. The text must be true
// (principle 9): "not executed" only where the caller knows the tool never ran. parts is changed in place.
func Synthesize(parts []agent.Part, errorText string, outcome func(p agent.Part) (json.RawMessage, bool)) []agent.Part {
	for i, p := range parts {
		if !p.Waiting() {
			continue
		}
		p.Approval = nil
		if o, ok := recorded(outcome, p); ok {
			p.State, p.Output = agent.StateOutputAvailable, o
		} else {
			p.State, p.ErrorText = agent.StateOutputError, errorText
		}
		parts[i] = p
	}
	return parts
}

func recorded(outcome func(p agent.Part) (json.RawMessage, bool), p agent.Part) (json.RawMessage, bool) {
	if outcome == nil {
		return nil, false
	}
	return outcome(p)
}

// Decode decodes a stored message's parts (parts that are not JSON objects are skipped).
func Decode(raw []json.RawMessage) []agent.Part {
	parts := make([]agent.Part, 0, len(raw))
	for _, r := range raw {
		if p, err := agent.DecodePart(r); err == nil {
			parts = append(parts, p)
		}
	}
	return parts
}
