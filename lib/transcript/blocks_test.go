package transcript_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// genRun makes a run's steps: 1–3 steps of genSteps (reasoning, text, finished tool calls), then a last step
// that only answers.
func genRun(r *rand.Rand, ids *int) [][]agent.Part {
	var steps [][]agent.Part
	for range r.IntN(3) {
		steps = append(steps, genSteps(r, ids, false))
	}
	last := []agent.Part{stepStart()}
	if r.IntN(3) == 0 {
		last = append(last, reasoning(words(r, 2000)))
	}
	return append(steps, append(last, text(words(r, 800))))
}

// newestStep is where the newest assistant step of msgs begins.
func newestStep(msgs []agent.ModelMessage) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "assistant" {
			return i
		}
	}
	return len(msgs)
}

// TestCacheStablePruning is the prompt cache's property (issue 20 item 3): over random threads, run turn by turn
// and step by step as the engine does (a History per run, Build before each step, the provider's count
// reported after it), every request extends the previous one, byte for byte, unless the pruning crossed a block
// boundary (Report.Blocks changed); and the budget holds.
func TestCacheStablePruning(t *testing.T) {
	t.Parallel()
	const threads = 30
	var requests, stable, pruning, crossed int
	for seed := range uint64(threads) {
		r := rand.New(rand.NewPCG(seed, 20))
		ids := 0
		cfg := transcript.Config{BudgetTokens: 6000 + r.IntN(20_000), FixedTokens: r.IntN(500)}
		// The provider's tokenizer against chars/4: fixed per thread, as a model's is.
		factor := 0.8 + r.Float64()*0.4
		var history []agent.Message
		var prev []agent.ModelMessage
		prevBlocks, prevDrop := -1, -1
		for turn := range 20 + r.IntN(40) {
			history = append(history, msg(fmt.Sprintf("u%d", turn), agent.RoleUser, text(words(r, 1500))))
			h := transcript.NewHistory(history, cfg)
			var draft []agent.Part
			for step, parts := range genRun(r, &ids) {
				got := h.Build(draft)
				rep := h.Last()
				fail := func(format string, args ...any) {
					t.Helper()
					t.Fatalf("seed %d turn %d step %d: %s (report %+v)", seed, turn, step, fmt.Sprintf(format, args...), rep)
				}
				valid(t, got)
				if !rep.Over && rep.EstimatedTokens > cfg.BudgetTokens {
					fail("%d tokens over a budget of %d without saying so", rep.EstimatedTokens, cfg.BudgetTokens)
				}
				requests++
				if rep.Blocks > 0 {
					pruning++
				}
				switch {
				case prev == nil:
				case rep.Blocks != prevBlocks || rep.DropBlocks != prevDrop:
					crossed++
				default:
					if rep.Blocks > 0 {
						stable++
					}
					same := len(prev)
					if rep.MessagesDropped > 0 {
						// Tier 4 runs once tiers 1 to 3 pruned all they may: the step that was the newest
						// (never pruned then) is pruned as soon as it is not, and only it.
						same = newestStep(prev)
					}
					if len(got) < same {
						fail("%d messages after %d within block %d", len(got), len(prev), rep.Blocks)
					}
					for i := range same {
						if !reflect.DeepEqual(prev[i], got[i]) {
							fail("message %d of %d changed within block %d:\nwas %+.300v\nnow %+.300v", i, len(prev), rep.Blocks, prev[i], got[i])
						}
					}
				}
				prev, prevBlocks, prevDrop = got, rep.Blocks, rep.DropBlocks
				h.Reported(int(float64(rep.EstimatedTokens) * factor))
				draft = append(draft, parts...)
			}
			history = append(history, msg(fmt.Sprintf("a%d", turn), agent.RoleAssistant, draft...))
		}
	}
	// The property must be exercised where it matters: pruned requests within a block. (The generator's steps
	// are large, a block or so each, so about half of them cross one.)
	if pruning < requests/2 || stable < requests/6 {
		t.Errorf("%d requests, %d pruned, %d pruned within the previous one's blocks, %d crossing a block: the generator proves little", requests, pruning, stable, crossed)
	}
	t.Logf("%d requests, %d pruned, %d pruned within the previous one's blocks, %d crossing a block", requests, pruning, stable, crossed)
}
