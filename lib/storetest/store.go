package storetest

import (
	"github.com/agentloop/agentloop/lib/agent"
)

// storeTests are the cases that span ports: a thread's delete against its claims and children, and what every
// port does with a canceled context.
func storeTests() []test {
	type c = leaf[agent.Store]
	return group(wholeStore, []c{}...)
}
