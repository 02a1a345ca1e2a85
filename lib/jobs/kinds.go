package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/agentloop/agentloop/lib/agent"
)

// Kind is one kind of sub-agent job: the tool the main model calls to dispatch it, the sub-agent that runs it,
// and the steer text that tells the main model what came back.
type Kind struct {
	// Name is the job kind and the dispatching tool's name.
	Name        string
	Description string
	InputSchema json.RawMessage
	// Check refuses an input the sub-agent cannot work with (the dispatch fails; no job is created).
	Check func(input json.RawMessage) error
	// Run is the sub-agent: an isolated loop with its own system prompt and model calls through the Model port.
	// It reports progress with env.Activity and returns the result (the steer artifact's payload).
	Run func(ctx context.Context, env Env, input json.RawMessage) (json.RawMessage, error)
	// SteerText is what the main model reads when the result arrives (the UI renders the artifact instead).
	SteerText func(result json.RawMessage) string
}

// Env is what a sub-agent gets to work with.
type Env struct {
	Model agent.Model
	// ModelName is the model the sub-agent asks (the main model's, unless configured).
	ModelName string
	MaxSteps  int
	// Activity replaces the job's live activity line (best effort: a failed write does not stop the work).
	Activity func(line string)
	// Used counts what a model call reported (nil: not counted); the task stores the sum with the result.
	Used func(agent.Usage)
}

// used reports u to env.Used, when set.
func (env Env) used(u agent.Usage) {
	if env.Used != nil {
		env.Used(u)
	}
}

// Registry holds the job kinds by name.
type Registry map[string]Kind

// NewRegistry indexes kinds by name.
func NewRegistry(kinds ...Kind) Registry {
	r := Registry{}
	for _, k := range kinds {
		r[k.Name] = k
	}
	return r
}

// DefaultSubagentSteps caps a sub-agent's model calls.
const DefaultSubagentSteps = 8

// ResearchInput is the research tool's input.
type ResearchInput struct {
	Question string `json:"question"`
	Context  string `json:"context,omitempty"`
}

// ResearchResult is a research job's result.
type ResearchResult struct {
	Brief   string   `json:"brief"`
	Sources []Source `json:"sources"`
}

// Source is one source a research brief cites.
type Source struct {
	Title string `json:"title"`
	URL   string `json:"url"`
}

// researchSystem is the researcher's own system prompt: its context is isolated from the main thread's.
const researchSystem = "You are a research assistant working for another assistant. Answer the question with a short, " +
	"factual brief. Call note_source for every source you rely on, and cite sources as markdown links [title](url)."

var noteSourceSpec = agent.ToolSpec{Name: "note_source", Description: "Record a source the brief relies on.",
	Parameters: json.RawMessage(`{"type":"object","properties":{"title":{"type":"string"},"url":{"type":"string"}},"required":["title","url"],"additionalProperties":false}`)}

// markdownLink finds [title](https://...) citations in the brief. Compiled on first use: its counted repetitions
// make a program of some thousand instructions, 4 ms and 660 KB to build, which at package init was the largest
// part of every Lambda's cold start (issue 18 item 6), though only the research task reads briefs.
var markdownLink = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`\[([^\]\n]{1,200})\]\((https?://[^\s)]{1,1000})\)`)
})

// Research is the demo job kind: `research {question, context?}` runs a researcher sub-agent and returns
// {brief, sources[]}. Under the offline model the researcher's reply is deterministic (the question is its
// newest user text, so the offline commands work on it: `/slow N`, `/error STATUS`, `/tool note_source {...}`).
func Research() Kind {
	return Kind{
		Name: "research",
		Description: "Dispatch a research sub-agent that investigates a question in the background. Returns at once with " +
			"an acknowledgement; the brief arrives later in this thread as a separate message. Keep talking meanwhile.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"question":{"type":"string","description":"What to find out."},` +
			`"context":{"type":"string","description":"What the answer is for."}},"required":["question"],"additionalProperties":false}`),
		Check: func(input json.RawMessage) error {
			var in ResearchInput
			if err := json.Unmarshal(input, &in); err != nil || strings.TrimSpace(in.Question) == "" {
				return agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "research needs a non-empty question")
			}
			return nil
		},
		Run:       runResearch,
		SteerText: researchSteer,
	}
}

func runResearch(ctx context.Context, env Env, input json.RawMessage) (json.RawMessage, error) {
	var in ResearchInput
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, &agent.JobFailedError{Reason: "the research input is not valid"}
	}
	system := researchSystem
	if in.Context != "" {
		system += "\n\nWhat the answer is for: " + in.Context
	}
	msgs := []agent.ModelMessage{{Role: "user", Text: in.Question}}
	var sources []Source
	seen := map[string]bool{}
	add := func(s Source) {
		if s.URL != "" && !seen[s.URL] {
			seen[s.URL] = true
			sources = append(sources, s)
		}
	}
	steps := max(env.MaxSteps, 1)
	for step := 0; step < steps; step++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		env.Activity(fmt.Sprintf("researching (step %d): %s", step+1, clip(in.Question, 80)))
		var text strings.Builder
		var calls []agent.ToolCall
		res, err := env.Model.Stream(ctx, agent.ModelRequest{Model: env.ModelName, System: system, Messages: msgs,
			Tools: []agent.ToolSpec{noteSourceSpec}}, func(ev agent.ModelEvent) error {
			switch ev.Type {
			case agent.EventTextDelta:
				text.WriteString(ev.Delta)
			case agent.EventToolCall:
				calls = append(calls, agent.ToolCall{ID: ev.ToolCallID, Name: ev.ToolName, Arguments: ev.Arguments})
			}
			return nil
		})
		env.used(res.Usage)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, agent.ModelMessage{Role: "assistant", Text: text.String(), ToolCalls: calls})
		if len(calls) == 0 {
			brief := strings.TrimSpace(text.String())
			for _, m := range markdownLink().FindAllStringSubmatch(brief, -1) {
				add(Source{Title: m[1], URL: m[2]})
			}
			env.Activity("brief written")
			return json.Marshal(ResearchResult{Brief: brief, Sources: append([]Source{}, sources...)})
		}
		for _, c := range calls {
			out := `{"ok":true}`
			var s Source
			if c.Name != noteSourceSpec.Name || json.Unmarshal([]byte(c.Arguments), &s) != nil || !httpsURL(s.URL) {
				out = `{"ok":false,"error":"note_source takes {title, url}, url an https URL"}`
			} else {
				add(s)
				env.Activity("noted source: " + clip(s.Title, 80))
			}
			msgs = append(msgs, agent.ModelMessage{Role: "tool", ToolCallID: c.ID, Text: out})
		}
	}
	return nil, &agent.JobFailedError{Reason: fmt.Sprintf("the researcher did not finish within %d steps", steps)}
}

// httpsURL reports whether s is an absolute https URL: a source becomes a link in the job's artifact part, and
// another scheme (javascript:, data:) must not (REVIEW S18).
func httpsURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.Scheme == "https" && u.Host != ""
}

func researchSteer(result json.RawMessage) string {
	var r ResearchResult
	_ = json.Unmarshal(result, &r)
	var b strings.Builder
	b.WriteString("Research complete. The researcher's brief follows; use it and cite its sources when you rely on them.\n\n")
	b.WriteString(r.Brief)
	for _, s := range r.Sources {
		fmt.Fprintf(&b, "\n- %s: %s", s.Title, s.URL)
	}
	return b.String()
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// names returns the kinds' names in order (tools are offered to the model in a stable order).
func (r Registry) names() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
