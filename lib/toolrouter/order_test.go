package toolrouter_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/toolrouter"
)

// The offer is in catalog order, never by score, and the same for the same query: the tools are the start of the
// prompt a provider caches (issue 20 item 3), so a step that offers the same tools must send them byte for byte
// as the step before, and a tool the thread starts using joins the offer without moving the others.
func TestOfferCatalogOrder(t *testing.T) {
	t.Parallel()
	tools := catalog()
	position := map[string]int{}
	var vocab []string
	for i, tl := range tools {
		position[tl.Name] = i
		vocab = append(vocab, strings.Fields(strings.ToLower(strings.Trim(tl.Description, ".")))...)
	}
	r := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	for range 300 {
		var words []string
		for range 1 + r.IntN(6) {
			words = append(words, vocab[r.IntN(len(vocab))])
		}
		q := agent.ToolQuery{Text: strings.Join(words, " ")}
		got, _ := toolrouter.New(toolrouter.Deps{}, toolrouter.Config{}).Catalog(tools).Offer(ctx, q)
		again, _ := toolrouter.New(toolrouter.Deps{}, toolrouter.Config{}).Catalog(tools).Offer(ctx, q)
		if !slices.Equal(names(got), names(again)) {
			t.Fatalf("%q: offers %v and %v", q.Text, names(got), names(again))
		}
		if !slices.IsSortedFunc(got, func(a, b agent.ToolSpec) int { return position[a.Name] - position[b.Name] }) {
			t.Fatalf("%q: offer %v is not in catalog order", q.Text, names(got))
		}
		// A used tool joins; the others keep their order around it.
		q.Used = []string{tools[r.IntN(len(tools))].Name}
		used, _ := toolrouter.New(toolrouter.Deps{}, toolrouter.Config{}).Catalog(tools).Offer(ctx, q)
		without := slices.DeleteFunc(names(used), func(n string) bool { return n == q.Used[0] && !slices.Contains(names(got), n) })
		if !slices.Equal(without, names(got)) {
			t.Fatalf("%q used %s: offer %v, was %v", q.Text, q.Used[0], names(used), names(got))
		}
	}
}
