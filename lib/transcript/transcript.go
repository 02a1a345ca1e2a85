// Package transcript turns stored UI messages into the provider-neutral model transcript, and prunes it to the
// model's budget. It is pure: it reads messages and never changes what is stored.
//
// The transcript it returns is always provider-valid (DESIGN principle 5):
//   - every tool call has exactly one result, right after the assistant message that made it (a call without a
//     result gets a synthesized one);
//   - it starts at a user message, and the newest user message is never pruned;
//   - the run's own in-flight turn (the draft) is never split or dropped;
//   - a tool output is capped for the model (head, tail and a marker saying how much was cut); the stored output
//     stays whole.
//
// Pruning drops whole older turns from the front until the transcript fits the budget. A request whose newest
// user message alone is over the budget is refused before anything is written (see CheckMessage).
package transcript

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults, written once here (config maps env names onto Config).
const (
	// DefaultBudgetBytes is the model context budget, in bytes of transcript text.
	DefaultBudgetBytes = 400_000
	// DefaultBudgetTokens is the model context budget in (estimated) tokens.
	DefaultBudgetTokens = 100_000
	// DefaultToolOutputBytes caps one tool result as the model sees it.
	DefaultToolOutputBytes = 32 << 10
)

// Config bounds a transcript. Zero fields take the defaults above.
type Config struct {
	BudgetTokens    int
	BudgetBytes     int
	ToolOutputBytes int
}

func (c Config) withDefaults() Config {
	c.BudgetTokens = cmp.Or(c.BudgetTokens, DefaultBudgetTokens)
	c.BudgetBytes = cmp.Or(c.BudgetBytes, DefaultBudgetBytes)
	c.ToolOutputBytes = cmp.Or(c.ToolOutputBytes, DefaultToolOutputBytes)
	return c
}

// History is a run's stored messages, converted once per run (each step then only adds the draft).
type History struct {
	cfg Config
	// calls counts the tool call ids the stored messages used: a model that repeats an id (a deterministic one
	// answering a regenerate whose first attempt is kept) must not make one id stand for two calls.
	calls      map[string]int
	turns      [][]agent.ModelMessage // one entry per stored message
	sizes      []int
	newestUser int // index into turns of the newest user message, -1 when none
}

// NewHistory converts the stored messages (oldest first) once.
func NewHistory(msgs []agent.Message, cfg Config) *History {
	h := &History{cfg: cfg.withDefaults(), newestUser: -1, calls: map[string]int{}}
	for _, m := range msgs {
		turn := convert(m, h.cfg.ToolOutputBytes, h.calls)
		if len(turn) == 0 {
			continue
		}
		if m.Role == agent.RoleUser {
			h.newestUser = len(h.turns)
		}
		h.turns = append(h.turns, turn)
		h.sizes = append(h.sizes, size(turn))
	}
	return h
}

// Build returns the transcript for the next model call: the history, then the run's draft (the parts of the
// assistant message in flight, as the engine holds them; empty for the first step), pruned to the budget.
func (h *History) Build(draft []agent.Part) []agent.ModelMessage {
	tail := assistant(draft, h.cfg.ToolOutputBytes, maps.Clone(h.calls))
	total := size(tail)
	for _, s := range h.sizes {
		total += s
	}
	// Drop whole turns from the front, never the newest user message or anything after it.
	start := 0
	keepFrom := len(h.turns)
	if h.newestUser >= 0 {
		keepFrom = h.newestUser
	}
	for total > h.cfg.BudgetBytes && start < keepFrom {
		total -= h.sizes[start]
		start++
	}
	// Start at a user message, so no tool result is ever separated from its call.
	for start < len(h.turns) && h.turns[start][0].Role != "user" {
		start++
	}
	var out []agent.ModelMessage
	for _, turn := range h.turns[start:] {
		out = append(out, turn...)
	}
	return append(out, tail...)
}

// MessageTokens estimates what a stored message costs in the transcript, in tokens (chars/4): what a bounded
// read sums, newest first, until the budget is met.
func MessageTokens(m agent.Message) int {
	return (size(convert(m, DefaultToolOutputBytes, map[string]int{})) + 3) / 4
}

// MessageSize is what a user message costs in the transcript, to check it against the budget up front.
func MessageSize(m agent.Message) int {
	return size(convert(m, DefaultToolOutputBytes, map[string]int{}))
}

// CheckMessage refuses a user message that alone is over the budget (it could never be sent to the model).
func CheckMessage(m agent.Message, cfg Config) error {
	cfg = cfg.withDefaults()
	if n := MessageSize(m); n > cfg.BudgetBytes {
		return agent.E(agent.KindTooLarge, agent.CodeMessageTooLarge,
			"the message is %d bytes of text, more than the model budget of %d", n, cfg.BudgetBytes)
	}
	return nil
}

func size(msgs []agent.ModelMessage) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Text)
		for _, c := range m.ToolCalls {
			n += len(c.Arguments) + len(c.Name)
		}
	}
	return n
}

// convert maps one UI message to model messages.
func convert(m agent.Message, toolOutputBytes int, calls map[string]int) []agent.ModelMessage {
	switch m.Role {
	case agent.RoleUser:
		var b strings.Builder
		var files []agent.ModelFile
		for _, raw := range m.Parts {
			p, err := agent.DecodePart(raw)
			if err == nil && p.Type == "file" {
				// Files the boundary would refuse (stored by an older version) are left out.
				var f struct{ MediaType, URL, Filename string }
				if json.Unmarshal(raw, &f) == nil && agent.CheckModelFile(f.MediaType, f.URL) == nil {
					files = append(files, agent.ModelFile(f))
				}
			}
			if err != nil || p.Type != "text" {
				continue
			}
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(p.Text)
		}
		if b.Len() == 0 && len(files) == 0 {
			return nil
		}
		return []agent.ModelMessage{{Role: "user", Text: b.String(), Files: files}}
	case agent.RoleAssistant:
		return assistant(Decode(m.Parts), toolOutputBytes, calls)
	}
	return nil
}

// assistant maps an assistant message's parts: one model message per step, each followed by its tool results.
// used counts the tool call ids used so far in the transcript: a repeated id is renamed (id~2, id~3, …) for
// its call and its result alike, so every call stays one call.
func assistant(parts []agent.Part, toolOutputBytes int, used map[string]int) []agent.ModelMessage {
	var out []agent.ModelMessage
	var text strings.Builder
	var calls []agent.ToolCall
	var results []agent.ModelMessage
	flush := func() {
		if text.Len() > 0 || len(calls) > 0 {
			out = append(out, agent.ModelMessage{Role: "assistant", Text: text.String(), ToolCalls: calls})
			out = append(out, results...)
		}
		text.Reset()
		calls, results = nil, nil
	}
	for _, p := range parts {
		switch {
		case p.Type == "step-start":
			flush()
		case p.Type == "text":
			text.WriteString(p.Text)
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
			calls = append(calls, agent.ToolCall{ID: id, Name: p.ToolNameOf(), Arguments: args})
			results = append(results, agent.ModelMessage{Role: "tool", ToolCallID: id,
				Text: Cap(ResultText(p), toolOutputBytes)})
		}
	}
	flush()
	return out
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
