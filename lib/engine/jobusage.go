package engine

import "github.com/agentloop/agentloop/lib/agent"

// deliveredUsage is the usage the steers this turn stores carry (a sub-agent's model calls, which its job kept with
// its result: lib/jobs puts it in the steer's metadata.usage), priced as the run's model: the run that delivers a
// job counts its sub-agent's tokens, so they reach the run's usage, its agent.run line and metrics, and the
// thread's totals, once (a steer the thread holds already was counted by the turn that stored it).
func (s *stepper) deliveredUsage() agent.Usage {
	var u agent.Usage
	for _, tk := range s.turn.plan.takes {
		if tk.present || tk.entry.Kind != agent.QueueSteer {
			continue
		}
		if used := tk.entry.Message.Meta().Usage; used != nil {
			priced := *used
			priced.CostMicroUSD = 0
			u = u.Add(s.price(s.turn.e.cfg.Model, priced))
		}
	}
	return u
}
