package dynamo

import (
	"strconv"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// The usage a release added, kept on the thread item per run (attrReleased + run id) until the orphan sweep finds
// the run's outcome recorded: FinishRun is two writes (the release on the thread item, then the outcome on the run
// item), and a crash between them leaves a claimless running run whose reply an answer may continue and overwrite
// under a later claim. The reaper then records this usage for the dead run (agent.Run.Released), so the thread's
// usage stays its runs' sum. It is one short string attribute, written by the release write itself (no extra
// request; about 50 bytes on the thread item while the run is unrecorded): input, output, total, cached,
// reasoning and cost, then the cache writes when not 0, comma separated.

// encodeReleased renders u as the kept attribute's value.
func encodeReleased(u agent.Usage) string {
	n := []int64{u.InputTokens, u.OutputTokens, u.TotalTokens, u.CachedInputTokens, u.ReasoningTokens, u.CostMicroUSD}
	if u.CacheWriteTokens != 0 {
		n = append(n, u.CacheWriteTokens)
	}
	s := make([]string, len(n))
	for i, v := range n {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ",")
}

// decodeReleased reads a kept value; ok is false for one that is not six counters, or seven (the cache writes,
// written only when not 0).
func decodeReleased(v string) (agent.Usage, bool) {
	f := strings.Split(v, ",")
	if len(f) != 6 && len(f) != 7 {
		return agent.Usage{}, false
	}
	n := make([]int64, len(f))
	for i, s := range f {
		var err error
		if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return agent.Usage{}, false
		}
	}
	u := agent.Usage{InputTokens: n[0], OutputTokens: n[1], TotalTokens: n[2], CachedInputTokens: n[3], ReasoningTokens: n[4], CostMicroUSD: n[5]}
	if len(n) == 7 {
		u.CacheWriteTokens = n[6]
	}
	return u, true
}

// withReleased sets run.Released from the thread item th (or the part of it read: the kept usage and the claim),
// for a run still recorded as running, or one a reaper's claim names: the orphan sweep never forgets a run while a
// reaper's claim names it, so a reaper that finishes an orphan and dies after its outcome leaves the usage kept,
// and the next reaper learns from Released that the run's usage is on the thread already. Otherwise, once the
// outcome is recorded, the run's own usage is the truth.
func withReleased(run agent.Run, th item) agent.Run {
	if run.Status != agent.RunRunning && getS(th, attrClaimRun) != agent.ReapRunID(run.ID) {
		return run
	}
	if u, ok := decodeReleased(getS(th, attrReleased+run.ID)); ok {
		run.Released = &u
	}
	return run
}
