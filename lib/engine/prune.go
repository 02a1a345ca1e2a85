package engine

import (
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// transcriptConfig is the engine's transcript bounds with the messages this turn answers protected from pruning
// (REVIEW S6): the request's own message and the queued messages the turn takes, steers included, wherever they
// stand. A continuation or a regenerate takes nothing new: it answers the user messages after the history's last
// reply.
func (p *turnPlan) transcriptConfig(cfg transcript.Config) transcript.Config {
	var ids []string
	if p.user != nil {
		ids = append(ids, p.user.ID)
	}
	for _, tk := range p.takes {
		if !tk.present {
			ids = append(ids, tk.entry.Message.ID)
		}
	}
	if len(ids) == 0 {
		for i := len(p.history) - 1; i >= 0 && p.history[i].Role == agent.RoleUser; i-- {
			ids = append(ids, p.history[i].ID)
		}
	}
	cfg.Protect = ids
	return cfg
}

// contextExhausted ends a turn whose never-prunable part alone is over the model's budget (the pruning report
// says so) instead of sending a request the provider refuses.
func contextExhausted(r transcript.Report) error {
	return agent.E(agent.KindTooLarge, agent.CodeContextExhausted,
		"This reply needs more context than the model takes (about %d tokens, budget %d): its newest tool results or the messages it answers are too large. Send a new message to go on.",
		r.EstimatedTokens, r.BudgetTokens)
}
