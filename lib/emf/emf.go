// Package emf writes CloudWatch Embedded Metric Format documents: one JSON object per line, which CloudWatch
// Logs turns into metrics when the line reaches a log group (in Lambda: printed to stdout). It implements
// agent.Metrics.
//
// Each document is
//
//	{"_aws": {"Timestamp": <unix ms>, "CloudWatchMetrics": [{"Namespace": ..., "Dimensions": [[...], ...],
//	  "Metrics": [{"Name": ..., "Unit": ...}, ...]}]}, "<dimension>": "<value>", "<metric>": <number>, ...}
//
// (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html).
// The metrics, all in the namespace given to New:
//
//	Runs              Count         one per finished run, by Outcome (completed, interrupted, canceled, failed,
//	                                fenced) and overall
//	RunLatency        Milliseconds  the run's wall time from its claim, by Outcome and overall
//	InputTokens       Count         the run's tokens, by Outcome and overall (CachedInputTokens and
//	OutputTokens      Count         ReasoningTokens are parts of them)
//	CachedInputTokens Count
//	ReasoningTokens   Count
//	CostMicroUSD      None          the run's cost in micro-USD (0 without a price table)
//	StoreRequests     Count         the run's store requests
//	StoreWriteUnits   None          the run's store write units (as the store reported them)
//	ReapedRuns        Count         runs the reaper finished (no dimension)
//	StoreThrottled    Count         store requests refused for throughput (no dimension)
//	Refusals          Count         requests refused with an error status (HTTP 4xx, 5xx), by Code and overall
//	Failovers         Count         model requests that went on to a fallback entry, by Model (the entry that
//	                                failed) and overall
//	Titles            Count         generated titles (lib/titles) whose model answered, by Model (the title
//	                                model) and overall; their spend is no run's, so it is kept apart:
//	TitleLatency      Milliseconds  the title request's time
//	TitleInputTokens  Count         its tokens (TitleCachedInputTokens a part of TitleInputTokens)
//	TitleOutputTokens Count
//	TitleCachedInputTokens Count
//	TitleCostMicroUSD None          its cost in micro-USD (0 without a price table)
//
// A dimension set of [] publishes the metrics without dimensions too, so totals need no metric math.
package emf

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// DefaultNamespace is the CloudWatch namespace when none is configured (AGENT_METRICS_NAMESPACE).
const DefaultNamespace = "agentloop"

// Metric units used here (EMF takes CloudWatch's StandardUnit names).
const (
	UnitCount        = "Count"
	UnitMilliseconds = "Milliseconds"
	UnitNone         = "None"
)

// Writer writes EMF documents to an io.Writer, one line each. It is safe for concurrent use.
type Writer struct {
	mu        sync.Mutex
	w         io.Writer
	namespace string
	clock     agent.Clock
}

// New returns a Writer into w (os.Stdout in Lambda) in namespace ("" is DefaultNamespace); clock nil is the
// system clock.
func New(w io.Writer, namespace string, clock agent.Clock) *Writer {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	if clock == nil {
		clock = agent.SystemClock{}
	}
	return &Writer{w: w, namespace: namespace, clock: clock}
}

var _ agent.Metrics = (*Writer)(nil)

// Metric is one value of a document.
type Metric struct {
	Name  string
	Unit  string
	Value float64
}

// MaxMetrics is the most metrics one EMF directive may define.
const MaxMetrics = 100

// Write writes one document: the metrics, under every dimension set given (each a list of keys of dims; nil is
// one set without dimensions). More than MaxMetrics metrics, or a set naming a key dims lacks, is an error.
func (w *Writer) Write(dims map[string]string, sets [][]string, metrics ...Metric) error {
	if len(metrics) > MaxMetrics {
		return fmt.Errorf("emf: %d metrics in one document, at most %d", len(metrics), MaxMetrics)
	}
	for _, set := range sets {
		for _, k := range set {
			if _, ok := dims[k]; !ok {
				return fmt.Errorf("emf: dimension %q has no value", k)
			}
		}
	}
	defs := make([]metricDef, len(metrics))
	doc := make(map[string]any, len(metrics)+len(dims)+1)
	for k, v := range dims {
		doc[k] = v
	}
	for i, m := range metrics {
		defs[i] = metricDef{Name: m.Name, Unit: m.Unit}
		doc[m.Name] = m.Value
	}
	if sets == nil {
		sets = [][]string{{}}
	}
	doc["_aws"] = awsMeta{Timestamp: w.clock.Now().UnixMilli(),
		CloudWatchMetrics: []directive{{Namespace: w.namespace, Dimensions: sets, Metrics: defs}}}
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err = w.w.Write(append(b, '\n'))
	return err
}

type awsMeta struct {
	Timestamp         int64       `json:"Timestamp"`
	CloudWatchMetrics []directive `json:"CloudWatchMetrics"`
}

type directive struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []metricDef `json:"Metrics"`
}

type metricDef struct {
	Name string `json:"Name"`
	Unit string `json:"Unit,omitempty"`
}

// RunFinished writes one document for the run, by Outcome and overall. Metrics never fail a run: a write error
// is dropped (stdout does not fail in Lambda).
func (w *Writer) RunFinished(m agent.RunMetrics) {
	_ = w.Write(map[string]string{"Outcome": m.Outcome}, [][]string{{"Outcome"}, {}},
		Metric{"Runs", UnitCount, 1},
		Metric{"RunLatency", UnitMilliseconds, float64(m.Duration.Milliseconds())},
		Metric{"InputTokens", UnitCount, float64(m.Usage.InputTokens)},
		Metric{"OutputTokens", UnitCount, float64(m.Usage.OutputTokens)},
		Metric{"CachedInputTokens", UnitCount, float64(m.Usage.CachedInputTokens)},
		Metric{"ReasoningTokens", UnitCount, float64(m.Usage.ReasoningTokens)},
		Metric{"CostMicroUSD", UnitNone, float64(m.Usage.CostMicroUSD)},
		Metric{"StoreRequests", UnitCount, float64(m.Store.Requests)},
		Metric{"StoreWriteUnits", UnitNone, m.Store.WriteUnits},
	)
}

// Reaped writes the ReapedRuns count (nothing for 0).
func (w *Writer) Reaped(n int) {
	if n > 0 {
		_ = w.Write(nil, nil, Metric{"ReapedRuns", UnitCount, float64(n)})
	}
}

var _ agent.Refusals = (*Writer)(nil)

// Refused writes one Refusals count, by Code and overall.
func (w *Writer) Refused(code string, status int) {
	_ = w.Write(map[string]string{"Code": cmp.Or(code, "none")}, [][]string{{"Code"}, {}}, Metric{"Refusals", UnitCount, 1})
}

var _ agent.Failovers = (*Writer)(nil)

// FailedOver writes one Failovers count, by Model (the entry that failed) and overall.
func (w *Writer) FailedOver(from, code string) {
	_ = w.Write(map[string]string{"Model": from}, [][]string{{"Model"}, {}}, Metric{"Failovers", UnitCount, 1})
}

var _ agent.TitleSpend = (*Writer)(nil)

// TitleSpent writes one Titles count and the title request's tokens, cost and latency, by Model (the title
// model) and overall: a title's spend is no run's, so it is kept out of the run metrics.
func (w *Writer) TitleSpent(model string, u agent.Usage, took time.Duration) {
	_ = w.Write(map[string]string{"Model": model}, [][]string{{"Model"}, {}},
		Metric{"Titles", UnitCount, 1},
		Metric{"TitleLatency", UnitMilliseconds, float64(took.Milliseconds())},
		Metric{"TitleInputTokens", UnitCount, float64(u.InputTokens)},
		Metric{"TitleOutputTokens", UnitCount, float64(u.OutputTokens)},
		Metric{"TitleCachedInputTokens", UnitCount, float64(u.CachedInputTokens)},
		Metric{"TitleCostMicroUSD", UnitNone, float64(u.CostMicroUSD)},
	)
}

// StoreThrottled writes the StoreThrottled count (nothing for 0).
func (w *Writer) StoreThrottled(n int) {
	if n > 0 {
		_ = w.Write(nil, nil, Metric{"StoreThrottled", UnitCount, float64(n)})
	}
}
