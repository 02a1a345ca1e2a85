package agent

import "time"

// Metrics receives the operational numbers an operator graphs (lib/emf writes them as CloudWatch Embedded Metric
// Format). Implementations must be safe for concurrent use and must not block for long: they are called on the
// run's path.
type Metrics interface {
	// RunFinished is called once per run that reached an outcome (an abandoned run included, as "fenced").
	RunFinished(RunMetrics)
	// Reaped counts runs the reaper finished.
	Reaped(n int)
	// StoreThrottled counts store requests refused for throughput.
	StoreThrottled(n int)
}

// RunMetrics is one run's outcome as metrics see it.
type RunMetrics struct {
	// Outcome is the run status, or "fenced" for a run that lost its claim.
	Outcome  string
	Model    string
	Usage    Usage
	Duration time.Duration
	Store    StoreUsage
}

// Refusals counts requests refused with an error status (HTTP 4xx and 5xx), by the error's code (code "" when
// the refusal carried none). lib/emf implements it beside Metrics.
type Refusals interface {
	Refused(code string, status int)
}

// Failovers counts model requests that went on to a fallback entry (lib/modelset), by the entry that failed and
// the code of its error. lib/emf implements it beside Metrics.
type Failovers interface {
	FailedOver(from, code string)
}

// TitleSpend counts the model spend of generated titles (lib/titles), which is no run's: by the title model.
// lib/emf implements it beside Metrics.
type TitleSpend interface {
	TitleSpent(model string, u Usage, took time.Duration)
}

// NopMetrics discards everything: the default.
type NopMetrics struct{}

func (NopMetrics) RunFinished(RunMetrics)                  {}
func (NopMetrics) Reaped(int)                              {}
func (NopMetrics) StoreThrottled(int)                      {}
func (NopMetrics) Refused(string, int)                     {}
func (NopMetrics) FailedOver(string, string)               {}
func (NopMetrics) TitleSpent(string, Usage, time.Duration) {}
