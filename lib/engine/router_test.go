package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/modeltest/matrix"
	"github.com/agentloop/agentloop/lib/toolrouter"
)

// routedCatalog is 24 server tools, add_note always-on: over the router's default minimum (20).
func routedCatalog() []agent.Tool {
	defs := [][2]string{
		{"add_note", "Save a note for the user."},
		{"delete_file", "Delete a file from the workspace."},
		{"read_file", "Read the contents of a file in the workspace."},
		{"write_file", "Write text to a file in the workspace, replacing it."},
		{"list_directory", "List the entries of a directory in the workspace."},
		{"get_weather", "Current weather and forecast for a city."},
		{"send_email", "Send an email message to a recipient."},
		{"search_web", "Search the web and return the top results."},
		{"create_calendar_event", "Create an event in the user's calendar."},
		{"translate_text", "Translate text between languages."},
		{"convert_currency", "Convert an amount between currencies at today's rate."},
		{"github__create_issue", "Open an issue in a GitHub repository."},
		{"github__close_issue", "Close an issue in a GitHub repository."},
		{"jira__createTicket", "Create a ticket in a Jira project."},
		{"stock_quote", "The latest price of a stock ticker."},
		{"book_flight", "Book a flight between two airports."},
		{"hotel_search", "Find hotels in a city for given dates."},
		{"resize_image", "Resize an image to the given width and height."},
		{"run_sql", "Run a read-only SQL query against the analytics database."},
		{"profile_update", "Update the user's profile."},
		{"delete_user", "Delete a user account."},
		{"archive_file", "Move a file to the archive."},
		{"timezone_convert", "Convert a time between time zones."},
		{"ping", "Check that the service answers."},
	}
	tools := make([]agent.Tool, len(defs))
	for i, d := range defs {
		tools[i] = agent.Tool{Name: d[0], Description: d[1], Kind: agent.ToolServer, AlwaysOn: d[0] == "add_note",
			InputSchema: json.RawMessage(`{"type":"object"}`),
			Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
				return json.RawMessage(`"ok"`), nil
			}}
	}
	return tools
}

// Issue 19 item 5: above the router's minimum each step offers a subset, seen through the offline model's /tools
// (the names the request offered, in order): the always-on tools (add_note, and the job tool research), the
// keyword matches of the newest user text, the tools the thread used; "don't delete" picks no delete_* tool, and
// "never delete or archive" neither delete_* nor archive_*.
// A synonym no keyword matches is found by the embedding fallback (the offline model's embeddings through the
// openai adapter). Each routed step logs agent.tools_offered with the run and thread. Under the minimum, every
// tool is offered.
func TestRouterOffersSubset(t *testing.T) {
	matrix.Skip(t, "the embedding fallback needs an adapter that embeds (the OpenAI ones)", modelsfile.Anthropic, modelsfile.AnthropicBedrock, modelsfile.BedrockConverse)
	t.Parallel()
	var logs syncBuffer
	f := setup(t, withTools(routedCatalog()...), withJSONLog(&logs))
	offered := func(thread, msgID, text string) []string {
		t.Helper()
		run, chunks := f.turn(t, thread, msgID, text)
		if run.Status != agent.RunCompleted {
			t.Fatalf("%q: run %s %+v", text, run.Status, run.Error)
		}
		return strings.Split(textOf(chunks), "\n")
	}
	for i, tc := range []struct {
		text string
		want []string
	}{
		{"/tools what's the weather in Paris?", []string{"add_note", "get_weather", "research"}},
		{"/tool run_sql {}", nil}, // the model calls run_sql (a keyword match), which the thread then has used
		{"/tools thanks", []string{"add_note", "run_sql", "research"}},
		{"/tools don't delete the file, archive it", []string{"add_note", "read_file", "write_file", "run_sql", "archive_file", "research"}},
		{"/tools never delete or archive the files", []string{"add_note", "read_file", "write_file", "run_sql", "research"}},
		{"/tools delete the file", []string{"add_note", "delete_file", "read_file", "write_file", "run_sql", "delete_user", "archive_file", "research"}},
	} {
		got := offered("routed", fmt.Sprintf("u%d", i), tc.text)
		if tc.want != nil && !slices.Equal(got, tc.want) {
			t.Errorf("%q offered %q, want %q", tc.text, got, tc.want)
		}
	}
	// A synonym no keyword matches: the embedding fallback (the offline model's embeddings) finds delete_file.
	if got := offered("synonym", "s1", "/tools remove that document"); !slices.Contains(got, "delete_file") || got[0] != "add_note" {
		t.Errorf("a synonym offered %q, want delete_file by the embedding fallback", got)
	}
	recs := logs.records(t, "agent.tools_offered")
	if len(recs) == 0 {
		t.Fatal("no agent.tools_offered line")
	}
	first := recs[0]
	if first["thread_id"] != "routed" || first["run_id"] == "" || first["run_id"] == nil || num(t, first, "catalog") != 25 {
		t.Errorf("first agent.tools_offered line %v: want thread routed, a run id, catalog 25", first)
	}
	if names, _ := first["offered"].([]any); len(names) != 3 || names[1] != "get_weather" {
		t.Errorf("first agent.tools_offered names %v, want add_note get_weather research", first["offered"])
	}

	whole := setup(t, withTools(routedCatalog()...), withConfig(func(c *config.Config) { c.ToolRouterMin = 30 }))
	run, chunks := whole.turn(t, "whole", "u1", "/tools what's the weather?")
	got := strings.Split(textOf(chunks), "\n")
	if run.Status != agent.RunCompleted || len(got) != 25 || got[0] != "add_note" || got[24] != "research" {
		t.Errorf("under the minimum: offered %q (%s), want all 25 tools", got, run.Status)
	}
}

// A catalog whose specs alone exceed the context budget still runs when routed: the fixed cost counts the
// sources' tools the turn offers, not every tool of the catalog (counted whole, the turn fails
// context_exhausted before any model request, as it does without a router).
func TestRoutedCatalogFitsTheBudget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var tools []agent.Tool
	for i := range 200 {
		tools = append(tools, agent.Tool{Name: fmt.Sprintf("svc__tool_%d", i), Kind: agent.ToolServer,
			Description: fmt.Sprintf("Tool number %d. ", i) + strings.Repeat("lorem ipsum dolor sit amet ", 40),
			InputSchema: json.RawMessage(`{"type":"object"}`),
			Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
				return json.RawMessage(`"ok"`), nil
			}})
	}
	cfg := f.eng.Config()
	cfg.Transcript.BudgetTokens = 20_000 // the 200 specs are some 55,000
	for _, tc := range []struct {
		name   string
		router agent.ToolRouter
		want   agent.RunStatus
	}{
		{"no router", nil, agent.RunFailed},
		{"routed", toolrouter.New(toolrouter.Deps{}, toolrouter.Config{}), agent.RunCompleted},
	} {
		model := &scriptedModel{}
		eng := engine.New(engine.Deps{Store: f.store, Model: model, Sources: []agent.ToolSource{staticSource{name: "svc", tools: tools}},
			Router: tc.router, Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, cfg)
		tr, err := eng.Begin(context.Background(), submit("budget-"+strings.ReplaceAll(tc.name, " ", "-"), "u1", "use tool 7"))
		if err != nil {
			t.Fatal(err)
		}
		run := tr.Stream(context.Background(), io.Discard)
		if run.Status != tc.want {
			t.Errorf("%s: run %s %+v, want %s", tc.name, run.Status, run.Error, tc.want)
		}
		if tc.router != nil && (len(model.requests()) != 1 || len(model.requests()[0].Tools) > toolrouter.DefaultTopK) {
			t.Errorf("%s: requests %d, want 1 offering at most %d tools", tc.name, len(model.requests()), toolrouter.DefaultTopK)
		}
	}
}
