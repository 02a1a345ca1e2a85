package toolrouter_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/toolrouter"
)

// catalog is 24 tools, two of them always-on (add_note, ask_user_question): over DefaultMin.
func catalog() []agent.Tool {
	defs := [][2]string{
		{"add_note", "Save a note for the user."},
		{"ask_user_question", "Ask the user a question and wait for the answer."},
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
	}
	tools := make([]agent.Tool, len(defs))
	for i, d := range defs {
		tools[i] = agent.Tool{Name: d[0], Description: d[1], AlwaysOn: d[0] == "add_note" || d[0] == "ask_user_question"}
	}
	return tools
}

func names(specs []agent.ToolSpec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Name
	}
	return out
}

func TestOffer(t *testing.T) {
	t.Parallel()
	always := []string{"add_note", "ask_user_question"}
	tests := []struct {
		name   string
		cfg    toolrouter.Config
		tools  []agent.Tool
		text   string
		used   []string
		want   []string // the offer, in catalog order
		routed bool
	}{
		{name: "keyword hit", text: "What's the weather in Paris?",
			want: append(always, "get_weather"), routed: true},
		{name: "name and description words, plural", text: "please send emails to Bob",
			want: append(always, "send_email"), routed: true},
		{name: "word boundaries: file is not profile", text: "show me my profile",
			want: append(always, "profile_update"), routed: true},
		{name: "case change and server prefix in names", text: "a jira ticket",
			want: append(always, "jira__createTicket"), routed: true},
		{name: "several hits in catalog order", text: "translate the weather forecast",
			want: append(always, "get_weather", "translate_text"), routed: true},
		{name: "don't delete", text: "Don't delete the file, archive it",
			want: append(always, "read_file", "write_file", "archive_file"), routed: true},
		{name: "do not delete", text: "do not delete the file; move it to the archive",
			want: append(always, "read_file", "write_file", "archive_file"), routed: true},
		{name: "never delete", text: "never delete accounts",
			want: always, routed: true},
		{name: "typographic apostrophe", text: "don’t delete my account",
			want: always, routed: true},
		{name: "negation scopes one word", text: "don't worry, delete the file",
			want: append(always, "delete_file", "read_file", "write_file", "delete_user", "archive_file"), routed: true},
		{name: "delete when asked", text: "delete the file",
			want: append(always, "delete_file", "read_file", "write_file", "delete_user", "archive_file"), routed: true},
		{name: "threshold drops weak matches", cfg: toolrouter.Config{Threshold: 4}, text: "delete the file",
			want: append(always, "delete_file"), routed: true},
		{name: "no threshold keeps every match", cfg: toolrouter.Config{Threshold: -1}, text: "convert",
			want: append(always, "convert_currency", "timezone_convert"), routed: true},
		{name: "top-K keeps the best", cfg: toolrouter.Config{TopK: 1}, text: "delete the file",
			want: append(always, "delete_file"), routed: true},
		{name: "used tools kept", text: "thanks", used: []string{"run_sql", "gone_tool"},
			want: append(always, "run_sql"), routed: true},
		{name: "used tool kept though negated", text: "don't delete the file", used: []string{"delete_file"},
			want: append(always, "delete_file", "read_file", "write_file", "archive_file"), routed: true},
		{name: "no words", text: "?!", want: always, routed: true},
		{name: "under the minimum: all", tools: catalog()[:20], text: "weather",
			want: names(specs(catalog()[:20])), routed: false},
		{name: "minimum configurable", cfg: toolrouter.Config{Min: 30}, text: "weather",
			want: names(specs(catalog())), routed: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tools := tc.tools
			if tools == nil {
				tools = catalog()
			}
			got, routed := toolrouter.New(toolrouter.Deps{}, tc.cfg).Catalog(tools).Offer(context.Background(), agent.ToolQuery{Text: tc.text, Used: tc.used})
			if !slices.Equal(names(got), tc.want) || routed != tc.routed {
				t.Errorf("offer %q = %v (routed %v), want %v (routed %v)", tc.text, names(got), routed, tc.want, tc.routed)
			}
		})
	}
}

// Negation covers a coordinated list (issue 19 item 5's guard, beyond one word): the words right after a
// negator joined by or, and, nor, or by commas in a list a conjunction closes, up to the list's object, a comma
// that opens a new clause, a clause break, or a new negator. Cases marked "edge" are the rule's chosen limits.
func TestNegationScope(t *testing.T) {
	t.Parallel()
	tools := append(catalog(),
		agent.Tool{Name: "remove_member", Description: "Remove a member from a team."},
		agent.Tool{Name: "drop_table", Description: "Drop a table from the analytics database."},
		agent.Tool{Name: "erase_disk", Description: "Erase a disk volume."})
	tests := []struct {
		text string
		want []string // offered
		none []string // not offered
	}{
		{text: "don't delete or archive the files", want: []string{"read_file", "write_file"},
			none: []string{"delete_file", "delete_user", "archive_file"}},
		{text: "never erase, remove or drop anything", none: []string{"erase_disk", "remove_member", "drop_table"}},
		{text: "never erase, remove, or drop the table", none: []string{"erase_disk", "remove_member", "drop_table"}},
		{text: "don't delete and archive the files", want: []string{"read_file"}, none: []string{"delete_file", "archive_file"}},
		{text: "neither delete nor archive the files", want: []string{"read_file"}, none: []string{"delete_file", "archive_file"}},
		{text: "don't delete it or archive it", want: []string{"archive_file"}, none: []string{"delete_file"}}, // edge: an object ends the list
		{text: "don't delete the file or archive it", want: []string{"archive_file"}, none: []string{"delete_file"}},
		{text: "don't delete it, just archive it", want: []string{"archive_file"}, none: []string{"delete_file", "delete_user"}},
		{text: "don't delete, archive the file", want: []string{"archive_file"}, none: []string{"delete_file"}},
		{text: "never erase, remove the member", want: []string{"remove_member"}, none: []string{"erase_disk"}}, // edge: no conjunction closes it
		{text: "don't delete but archive the file", want: []string{"archive_file"}, none: []string{"delete_file"}},
		{text: "don't delete or, instead, archive the file", want: []string{"archive_file"}, none: []string{"delete_file"}},
		{text: "never delete; archive the file", want: []string{"archive_file"}, none: []string{"delete_file"}},
		{text: "No. Archive the files", want: []string{"archive_file"}},
		{text: "don't archive, never delete the files", want: []string{"read_file"}, none: []string{"archive_file", "delete_file"}},
		{text: "don't delete 1,000 files or archive.zip", want: []string{"archive_file"}, none: []string{"delete_file"}},
		{text: "don't worry, delete the file", want: []string{"delete_file", "archive_file"}},
	}
	r := toolrouter.New(toolrouter.Deps{}, toolrouter.Config{})
	for _, tc := range tests {
		t.Run(tc.text, func(t *testing.T) {
			t.Parallel()
			got, _ := r.Catalog(tools).Offer(context.Background(), agent.ToolQuery{Text: tc.text})
			for _, w := range tc.want {
				if !slices.Contains(names(got), w) {
					t.Errorf("offer %q = %v: want %s in it", tc.text, names(got), w)
				}
			}
			for _, n := range tc.none {
				if slices.Contains(names(got), n) {
					t.Errorf("offer %q = %v: want no %s", tc.text, names(got), n)
				}
			}
		})
	}
}

// A router reuses its index only for the catalog it indexed: a turn whose tools read differently is indexed anew.
func TestIndexFollowsCatalog(t *testing.T) {
	t.Parallel()
	r := toolrouter.New(toolrouter.Deps{}, toolrouter.Config{})
	q := agent.ToolQuery{Text: "what does the weather say"}
	before, _ := r.Catalog(catalog()).Offer(context.Background(), q)
	changed := catalog()
	changed[6].Description = "Current conditions for a city."
	changed[7].Description = "Send an email about the weather."
	after, _ := r.Catalog(changed).Offer(context.Background(), q)
	again, _ := r.Catalog(catalog()).Offer(context.Background(), q)
	if !slices.Equal(names(before), []string{"add_note", "ask_user_question", "get_weather"}) ||
		!slices.Contains(names(after), "send_email") || !slices.Equal(names(again), names(before)) {
		t.Errorf("offers %v, %v, %v: want get_weather; then send_email too (its description says weather now); then as first", names(before), names(after), names(again))
	}
}

func specs(tools []agent.Tool) []agent.ToolSpec {
	out := make([]agent.ToolSpec, len(tools))
	for i, t := range tools {
		out[i] = t.Spec()
	}
	return out
}

// BenchmarkRoute is what routing adds over 20, 200 and 2,000 tools: indexing a catalog (a cold start's first
// turn, or a catalog that changed), a turn's catalog when the index is reused (every turn but those), and one
// step's offer. 20 is the default minimum: that catalog is offered whole, never indexed.
func BenchmarkRoute(b *testing.B) {
	for _, n := range []int{20, 200, 2000} {
		tools := make([]agent.Tool, n)
		for i := range tools {
			tools[i] = agent.Tool{Name: fmt.Sprintf("svc%d__%s_%s", i/50, verbs[i%len(verbs)], nouns[(i/len(verbs))%len(nouns)]),
				Description: fmt.Sprintf("%s a %s in the %s service; returns the %s as JSON with its id, owner and timestamps.",
					verbs[i%len(verbs)], nouns[(i/len(verbs))%len(nouns)], nouns[(i/7)%len(nouns)], nouns[(i/3)%len(nouns)])}
		}
		r := toolrouter.New(toolrouter.Deps{}, toolrouter.Config{})
		q := agent.ToolQuery{Text: "Please don't delete anything: find the invoice for customer 42 and email it to finance.",
			Used: []string{tools[n/2].Name}}
		b.Run(fmt.Sprintf("tools=%d/index", n), func(b *testing.B) { // a cold start's first turn, or a changed catalog
			for b.Loop() {
				toolrouter.New(toolrouter.Deps{}, toolrouter.Config{}).Catalog(tools)
			}
		})
		b.Run(fmt.Sprintf("tools=%d/catalog", n), func(b *testing.B) { // every later turn: the index reused
			for b.Loop() {
				r.Catalog(tools)
			}
		})
		c := r.Catalog(tools)
		b.Run(fmt.Sprintf("tools=%d/offer", n), func(b *testing.B) {
			for b.Loop() {
				c.Offer(context.Background(), q)
			}
		})
		// The embedding fallback's share of a step, vectors in hand (offline.Embedding's 512 dimensions, no HTTP):
		// a text keywords find nothing for, a new catalog per turn (so the text's vector is asked once per turn).
		er := toolrouter.New(toolrouter.Deps{Embedder: localEmbedder{}, Logger: slog.New(slog.DiscardHandler)}, toolrouter.Config{})
		fq := agent.ToolQuery{Text: "please erase that old paperwork, it is obsolete"}
		er.Catalog(tools).Offer(context.Background(), fq) // the tools' vectors, once
		b.Run(fmt.Sprintf("tools=%d/offer-embeddings", n), func(b *testing.B) {
			for b.Loop() {
				er.Catalog(tools).Offer(context.Background(), fq)
			}
		})
	}
}

// localEmbedder is the offline model's embeddings without HTTP, for the benchmark.
type localEmbedder struct{}

func (localEmbedder) EmbeddingModel() string { return "offline" }

func (localEmbedder) Embed(_ context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		out[i] = offline.Embedding(t)
	}
	return out, nil
}

var (
	verbs = []string{"get", "list", "create", "update", "delete", "search", "send", "archive", "export", "sync"}
	nouns = []string{"invoice", "customer", "order", "ticket", "email", "report", "file", "user", "payment",
		"shipment", "contract", "calendar", "repository", "issue", "message", "document", "product", "coupon",
		"subscription", "webhook"}
)
