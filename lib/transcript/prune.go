package transcript

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// Report says what one Build pruned (for tests, benchmarks and logs).
type Report struct {
	// EstimatedTokens is the transcript as sent, fixed tokens included, scaled by the provider's reports.
	EstimatedTokens int
	BudgetTokens    int
	// Over: the transcript is still over the budget (what is never pruned does not fit).
	Over             bool
	Superseded       int // tier 0: snapshot outputs replaced by a note
	ReasoningDropped int // tier 1: assistant steps whose reasoning was left out
	PairsStubbed     int // tier 2: tool call/result pairs collapsed to stubs
	FilesStubbed     int // tier 3: attachments replaced by a line naming them
	MessagesDropped  int // tier 4 (and leading replies before the first user message): stored messages left out
	// Blocks is how many blocks (Config.BlockTokens) tiers 1 to 4 had to prune: the cutoff, and so the
	// prompt's prefix, changes only when this does (0: nothing beyond tier 0).
	Blocks int
	// DropBlocks is how many blocks of that tier 4 pruned (rounded up again: what tiers 1 to 3 freed may vary
	// by less than a block without moving tier 4's cutoff).
	DropBlocks int
}

// stubArgsBytes is the longest argument JSON a stubbed call keeps (longer ones become "{}"): short arguments
// say what was asked at little cost.
const stubArgsBytes = 256

// Marks a pruner puts on a call.
const (
	callKept uint8 = iota
	callSuperseded
	callStubbed
)

// pruner decides, for one Build, what of the history and the draft the model sees. It never writes to the
// entries (they are the history's, shared by every step of the run): its decisions are marks beside them.
type pruner struct {
	es    []*entry // the history, then the draft when it made a step
	cfg   Config
	scale float64
	// total is the transcript's size in chars as pruned so far, the fixed tokens included; cur is each entry's.
	total int
	// target is what tiers 1 to 4 prune down to, in chars: the total less whole blocks (see prune).
	target int
	cur    []int
	start  int // entries before start are left out (replies before the first user message)
	// lastAssistant indexes es (-1 when none), newest is its newest step; draft says it is the run's draft.
	lastAssistant, newest int
	draft                 bool
	protect               []bool          // per entry: a message the turn answers (Config.Protect)
	refs                  []callRef       // every call from start on, in transcript order
	mark                  []uint8         // per ref
	survivor              []bool          // per ref: the newest output of a snapshot tool
	keep                  []bool          // per entry: holds something never pruned (tier 4 keeps its turn)
	reasonless            map[[2]int]bool // the steps (entry, step) whose reasoning is left out
	fileStub              []bool          // per entry
	dropped               []bool          // per entry (nil until tier 4 runs)
	report                Report
}

type callRef struct{ e, s, c int }

func (p *pruner) call(r callRef) *call { return &p.es[r.e].steps[r.s].calls[r.c] }

func newPruner(history []entry, calls int, draft entry, cfg Config, scale float64) *pruner {
	es := make([]*entry, 0, len(history)+1)
	for i := range history {
		es = append(es, &history[i])
	}
	if len(draft.steps) > 0 {
		es = append(es, &draft)
	}
	p := &pruner{es: es, cfg: cfg, scale: scale, lastAssistant: -1, newest: -1, draft: len(draft.steps) > 0,
		cur: make([]int, len(es)), keep: make([]bool, len(es)), fileStub: make([]bool, len(es)), protect: make([]bool, len(es)),
		refs: make([]callRef, 0, calls+draft.calls), reasonless: map[[2]int]bool{}}
	p.report.BudgetTokens = cfg.budget()
	// The transcript starts at a user message: replies before the first one (a bounded read that began mid-
	// thread) are left out, as no tool result may come without its call's turn.
	for p.start < len(es) && es[p.start].role != agent.RoleUser {
		p.start++
	}
	if p.start == len(es) {
		p.start = 0 // no user message at all: nothing to align to
	}
	p.report.MessagesDropped = p.start
	p.total = cfg.FixedTokens * 4
	for i := p.start; i < len(es); i++ {
		e := es[i]
		p.cur[i] = e.size
		p.total += p.cur[i]
		if e.role == agent.RoleAssistant {
			p.lastAssistant, p.newest = i, len(e.steps)-1
		}
		for s := range e.steps {
			for c, cl := range e.steps[s].calls {
				p.refs = append(p.refs, callRef{i, s, c})
				if cl.open {
					p.keep[i] = true // an unresolved interactive part
				}
			}
		}
	}
	p.mark = make([]uint8, len(p.refs))
	p.survivor = make([]bool, len(p.refs))
	p.protectAnswered()
	if p.draft {
		p.keep[len(es)-1] = true
	}
	return p
}

// protectAnswered marks the messages the turn answers: those Config.Protect names, else the newest user message.
func (p *pruner) protectAnswered() {
	newestUser := -1
	for i := p.start; i < len(p.es); i++ {
		if p.es[i].role != agent.RoleUser {
			continue
		}
		newestUser = i
		if len(p.cfg.Protect) > 0 && slices.Contains(p.cfg.Protect, p.es[i].id) {
			p.protect[i], p.keep[i] = true, true
		}
	}
	if !slices.Contains(p.protect, true) && newestUser >= 0 {
		p.protect[newestUser], p.keep[newestUser] = true, true
	}
}

// newestStep: call r is in the newest step of the last assistant message.
func (p *pruner) newestStep(r callRef) bool { return r.e == p.lastAssistant && r.s == p.newest }

// overBudget: the transcript as pruned so far is over the budget.
func (p *pruner) overBudget() bool {
	return float64(p.total)*p.scale > float64(p.cfg.budget())*4
}

// over: tiers 1 to 4 have not yet pruned their whole blocks.
func (p *pruner) over() bool { return p.total > p.target }

// blocks sets the target: the overflow over the budget (in the transcript's chars, unscaled) rounded up to whole
// blocks, so that the same target, and so the same cutoff, holds while the transcript grows within a block.
func (p *pruner) blocks() {
	p.target = p.total
	limit := float64(p.cfg.budget()) * 4 / p.scale
	if overflow := float64(p.total) - limit; overflow > 0 {
		block := p.cfg.BlockTokens * 4
		p.report.Blocks = int(math.Ceil(overflow / float64(block)))
		p.target = p.total - p.report.Blocks*block
	}
}

// cut takes n chars off entry i.
func (p *pruner) cut(i, n int) {
	p.cur[i] -= n
	p.total -= n
}

func (p *pruner) prune() {
	p.supersede()
	p.blocks()
	p.compact()
	if p.over() && !p.draft && p.lastAssistant >= 0 {
		p.stubNewestReply()
	}
	if p.over() {
		p.dropTurns()
	}
	p.report.Over = p.overBudget()
	p.report.EstimatedTokens = int(math.Ceil(float64(p.total) * p.scale / 4))
}

// supersede is tier 0: the newest output of each snapshot tool survives, earlier ones become a note.
func (p *pruner) supersede() {
	if len(p.cfg.Snapshots) == 0 {
		return
	}
	seen := map[string]bool{}
	for k := len(p.refs) - 1; k >= 0; k-- {
		r := p.refs[k]
		c := p.call(r)
		if !c.snapshot {
			continue
		}
		if !seen[c.name] {
			seen[c.name] = true
			p.survivor[k], p.keep[r.e] = true, true
			continue
		}
		p.mark[k] = callSuperseded
		p.cut(r.e, len(c.result)-len(supersededText(c.name)))
		p.report.Superseded++
	}
}

// compact is tiers 1 to 3 in transcript order: oldest message first, each step of a reply losing its
// reasoning (tier 1), then its tool call/result pairs becoming stubs (tier 2), each older user message its
// attachments (tier 3). Transcript order, not tier order, is what keeps the prompt's prefix stable: what a new
// step or turn adds comes after everything already pruned, so pruning the same blocks prunes the same things.
// Left alone here: the newest step of the last assistant message (stubNewestReply's), the messages the turn
// answers, calls still waiting, surviving snapshots.
func (p *pruner) compact() {
	k := 0 // the next ref
	for i := p.start; i < len(p.es) && p.over(); i++ {
		e := p.es[i]
		if e.role == agent.RoleUser {
			p.stubFiles(i)
			continue
		}
		for si, s := range e.steps {
			if s.reasoning != "" && p.over() && (i != p.lastAssistant || si != p.newest) {
				p.reasonless[[2]int{i, si}] = true
				p.cut(i, len(s.reasoning))
				p.report.ReasoningDropped++
			}
			for ; k < len(p.refs) && p.refs[k].e == i && p.refs[k].s == si; k++ {
				if p.over() && !p.newestStep(p.refs[k]) {
					p.stubPair(k)
				}
			}
		}
	}
}

// stubPair collapses call k to a stub unless it must stay (a call still waiting, a surviving snapshot) or is
// already marked.
func (p *pruner) stubPair(k int) {
	r := p.refs[k]
	c := p.call(r)
	saved := c.chars() - (len(c.name) + len(stubArgs(c.args)) + stubbedLen(*c))
	if c.open || p.survivor[k] || p.mark[k] != callKept || saved <= 0 { // a short result is its own stub
		return
	}
	p.mark[k] = callStubbed
	p.cut(r.e, saved)
	p.report.PairsStubbed++
}

// stubNewestReply ends tier 3: the newest step of the reply before the protected messages (not a draft's) loses
// its reasoning and its pairs.
func (p *pruner) stubNewestReply() {
	if r := p.es[p.lastAssistant].steps[p.newest].reasoning; r != "" {
		p.reasonless[[2]int{p.lastAssistant, p.newest}] = true
		p.cut(p.lastAssistant, len(r))
		p.report.ReasoningDropped++
	}
	for k, r := range p.refs {
		if p.over() && p.newestStep(r) {
			p.stubPair(k)
		}
	}
}

// stubFiles is tier 3 for user message i.
func (p *pruner) stubFiles(i int) {
	e := p.es[i]
	if p.protect[i] || len(e.files) == 0 {
		return
	}
	n := len(e.text) // the stub text replaces it
	for _, f := range e.files {
		n += fileChars(f)
	}
	p.fileStub[i] = true
	p.cut(i, n-len(fileStubText(e)))
	p.report.FilesStubbed += len(e.files)
}

// dropTurns is tier 4: whole turns (a user message and the replies up to the next one), oldest first, except
// those holding something never pruned (an old surviving snapshot keeps its turn, not every turn after it).
// The newest turn always stays.
func (p *pruner) dropTurns() {
	p.dropped = make([]bool, len(p.es))
	block := p.cfg.BlockTokens * 4
	p.report.DropBlocks = (p.total - p.target + block - 1) / block
	p.target = p.total - p.report.DropBlocks*block
	for i := p.start; p.over(); {
		next := i + 1
		for next < len(p.es) && p.es[next].role != agent.RoleUser {
			next++
		}
		if next == len(p.es) {
			return
		}
		if !slices.Contains(p.keep[i:next], true) {
			for j := i; j < next; j++ {
				p.total -= p.cur[j]
				p.cur[j] = 0
				p.dropped[j] = true
			}
			p.report.MessagesDropped += next - i
		}
		i = next
	}
}

// emit builds the model messages from the entries and the marks.
func (p *pruner) emit() []agent.ModelMessage {
	n := len(p.es) - p.start
	for _, d := range p.dropped {
		if d {
			n--
		}
	}
	out := make([]agent.ModelMessage, 0, 2*n) // a reply is usually a call, its result and some text
	k := 0                                    // the next ref
	for len(p.refs) > k && p.refs[k].e < p.start {
		k++
	}
	for i := p.start; i < len(p.es); i++ {
		e := p.es[i]
		if p.dropped != nil && p.dropped[i] {
			for k < len(p.refs) && p.refs[k].e == i {
				k++
			}
			continue
		}
		if e.role == agent.RoleUser {
			m := agent.ModelMessage{Role: "user", Text: e.text, Files: e.files}
			if p.fileStub[i] {
				m.Text, m.Files = fileStubText(e), nil
			}
			out = append(out, m)
			continue
		}
		for si, s := range e.steps {
			m := agent.ModelMessage{Role: "assistant", Text: s.text}
			if !p.reasonless[[2]int{i, si}] {
				m.Reasoning, m.ReasoningData = s.reasoning, s.reasoningData
			}
			at := len(out)
			out = append(out, m)
			calls := make([]agent.ToolCall, len(s.calls))
			for j, c := range s.calls {
				args, result := c.args, c.result
				switch p.mark[k] {
				case callSuperseded:
					result = supersededText(c.name)
				case callStubbed:
					args, result = stubArgs(c.args), stubbedText(c)
				}
				k++
				calls[j] = agent.ToolCall{ID: c.id, Name: c.name, Arguments: args}
				out = append(out, agent.ModelMessage{Role: "tool", ToolCallID: c.id, Text: result})
			}
			if len(calls) > 0 {
				out[at].ToolCalls = calls
			}
		}
	}
	return out
}

func supersededText(tool string) string {
	return "[superseded: a later " + tool + " result replaces this one]"
}

// The stub of a pruned result, in three pieces around its size and the tool's name. Tier 2 counts a stub's
// length for every pair it collapses, so the length has its own function (formatting thousands of stubs that
// tier 4 then drops would be most of a prune's time).
const (
	stubHead = "[pruned to fit the context: the "
	stubMid  = "-byte result of this "
	stubTail = " call is not shown; call it again if it is needed]"
)

func stubbedText(c call) string {
	return stubHead + strconv.Itoa(len(c.result)) + stubMid + c.name + stubTail
}

func stubbedLen(c call) int {
	digits := 1
	for n := len(c.result); n >= 10; n /= 10 {
		digits++
	}
	return len(stubHead) + digits + len(stubMid) + len(c.name) + len(stubTail)
}

func stubArgs(args string) string {
	if len(args) <= stubArgsBytes {
		return args
	}
	return "{}"
}

// fileStubText is a user message's text with a line for each of its attachments.
func fileStubText(e *entry) string {
	var b strings.Builder
	b.WriteString(e.text)
	for _, f := range e.files {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		name := f.Filename
		if name == "" {
			name = "unnamed"
		}
		fmt.Fprintf(&b, "[attachment %s (%s) not shown: pruned to fit the context]", name, f.MediaType)
	}
	return b.String()
}
