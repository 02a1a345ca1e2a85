package emf_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/emf"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// units are CloudWatch's StandardUnit values, the only ones EMF accepts.
var units = map[string]bool{}

func init() {
	for _, u := range strings.Fields(`Seconds Microseconds Milliseconds Bytes Kilobytes Megabytes Gigabytes Terabytes
		Bits Kilobits Megabits Gigabits Terabits Percent Count Bytes/Second Kilobytes/Second Megabytes/Second
		Gigabytes/Second Terabytes/Second Bits/Second Kilobits/Second Megabits/Second Gigabits/Second
		Terabits/Second Count/Second None`) {
		units[u] = true
	}
}

// validate checks one document against the EMF specification's rules and returns it decoded.
func validate(t *testing.T, line []byte) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(line, &doc); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, line)
	}
	meta, ok := doc["_aws"].(map[string]any)
	if !ok {
		t.Fatalf("no _aws object: %s", line)
	}
	ts, ok := meta["Timestamp"].(float64)
	if !ok || ts != float64(int64(ts)) || ts <= 0 {
		t.Fatalf("_aws.Timestamp %v is not a positive integer of milliseconds", meta["Timestamp"])
	}
	directives, ok := meta["CloudWatchMetrics"].([]any)
	if !ok || len(directives) == 0 {
		t.Fatalf("_aws.CloudWatchMetrics missing or empty: %s", line)
	}
	for _, d := range directives {
		dir := d.(map[string]any)
		if ns, ok := dir["Namespace"].(string); !ok || ns == "" || len(ns) > 255 {
			t.Fatalf("Namespace %v", dir["Namespace"])
		}
		sets, ok := dir["Dimensions"].([]any)
		if !ok {
			t.Fatalf("Dimensions missing: %s", line)
		}
		for _, s := range sets {
			keys := s.([]any)
			if len(keys) > 30 {
				t.Fatalf("dimension set of %d keys", len(keys))
			}
			for _, k := range keys {
				v, ok := doc[k.(string)].(string)
				if !ok || v == "" || len(v) > 1024 {
					t.Fatalf("dimension %v: value %v is not a non-empty string", k, doc[k.(string)])
				}
			}
		}
		metrics, ok := dir["Metrics"].([]any)
		if !ok || len(metrics) == 0 || len(metrics) > 100 {
			t.Fatalf("Metrics: %v", dir["Metrics"])
		}
		seen := map[string]bool{}
		for _, m := range metrics {
			def := m.(map[string]any)
			name, _ := def["Name"].(string)
			if name == "" || len(name) > 1024 || seen[name] {
				t.Fatalf("metric name %q empty, too long or repeated", name)
			}
			seen[name] = true
			if u, ok := def["Unit"]; ok && !units[u.(string)] {
				t.Fatalf("metric %s: unit %v is no CloudWatch unit", name, u)
			}
			if _, ok := doc[name].(float64); !ok {
				t.Fatalf("metric %s: top-level value %v is not a number", name, doc[name])
			}
		}
	}
	return doc
}

// lines splits the writer's output into documents: each ends with a newline.
func lines(t *testing.T, b []byte) [][]byte {
	t.Helper()
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Fatalf("output does not end with a newline: %q", b)
	}
	return bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
}

func TestDocuments(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	run := agent.RunMetrics{Outcome: "completed", Model: "m", Duration: 1500 * time.Millisecond,
		Usage: agent.Usage{InputTokens: 120, OutputTokens: 30, CachedInputTokens: 100, ReasoningTokens: 7, CostMicroUSD: 42},
		Store: agent.StoreUsage{Requests: 9, WriteUnits: 7.5}}
	for _, tc := range []struct {
		name     string
		emit     func(w *emf.Writer)
		dims     [][]string
		want     map[string]float64
		wantDims map[string]string
	}{
		{"run", func(w *emf.Writer) { w.RunFinished(run) }, [][]string{{"Outcome"}, {}},
			map[string]float64{"Runs": 1, "RunLatency": 1500, "InputTokens": 120, "OutputTokens": 30, "CachedInputTokens": 100,
				"ReasoningTokens": 7, "CostMicroUSD": 42, "StoreRequests": 9, "StoreWriteUnits": 7.5},
			map[string]string{"Outcome": "completed"}},
		{"reaped", func(w *emf.Writer) { w.Reaped(3) }, [][]string{{}}, map[string]float64{"ReapedRuns": 3}, nil},
		{"throttled", func(w *emf.Writer) { w.StoreThrottled(2) }, [][]string{{}}, map[string]float64{"StoreThrottled": 2}, nil},
		{"failover", func(w *emf.Writer) { w.FailedOver("main", agent.CodeModelError) }, [][]string{{"Model"}, {}},
			map[string]float64{"Failovers": 1}, map[string]string{"Model": "main"}},
		{"title", func(w *emf.Writer) {
			w.TitleSpent("cheap", agent.Usage{InputTokens: 90, OutputTokens: 6, CachedInputTokens: 10, CostMicroUSD: 33}, 250*time.Millisecond)
		}, [][]string{{"Model"}, {}}, map[string]float64{"Titles": 1, "TitleLatency": 250, "TitleInputTokens": 90, "TitleOutputTokens": 6,
			"TitleCachedInputTokens": 10, "TitleCostMicroUSD": 33}, map[string]string{"Model": "cheap"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			tc.emit(emf.New(&buf, "", fixedClock{now}))
			docs := lines(t, buf.Bytes())
			if len(docs) != 1 {
				t.Fatalf("%d documents, want 1: %s", len(docs), buf.Bytes())
			}
			doc := validate(t, docs[0])
			meta := doc["_aws"].(map[string]any)
			if meta["Timestamp"].(float64) != float64(now.UnixMilli()) {
				t.Fatalf("Timestamp %v, want %d", meta["Timestamp"], now.UnixMilli())
			}
			dir := meta["CloudWatchMetrics"].([]any)[0].(map[string]any)
			if dir["Namespace"] != emf.DefaultNamespace {
				t.Fatalf("Namespace %v", dir["Namespace"])
			}
			if got := fmt.Sprint(dir["Dimensions"]); got != fmt.Sprint(tc.dims) {
				t.Fatalf("Dimensions %s, want %v", got, tc.dims)
			}
			names := map[string]bool{}
			for _, m := range dir["Metrics"].([]any) {
				names[m.(map[string]any)["Name"].(string)] = true
			}
			for name, v := range tc.want {
				if !names[name] || doc[name] != v {
					t.Fatalf("metric %s = %v (declared %v), want %v", name, doc[name], names[name], v)
				}
			}
			if len(names) != len(tc.want) {
				t.Fatalf("metrics %v, want exactly %v", names, tc.want)
			}
			for k, v := range tc.wantDims {
				if doc[k] != v {
					t.Fatalf("dimension %s = %v, want %s", k, doc[k], v)
				}
			}
		})
	}
}

// Counts of zero write nothing; a namespace is carried; malformed documents are refused, not written.
func TestWriterEdges(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	w := emf.New(&buf, "shop/agents", nil)
	w.Reaped(0)
	w.StoreThrottled(0)
	if buf.Len() != 0 {
		t.Fatalf("zero counts wrote %q", buf.Bytes())
	}
	many := make([]emf.Metric, emf.MaxMetrics+1)
	for i := range many {
		many[i] = emf.Metric{Name: fmt.Sprintf("m%d", i), Unit: emf.UnitCount, Value: 1}
	}
	if err := w.Write(nil, nil, many...); err == nil {
		t.Fatal("101 metrics in one document were accepted")
	}
	if err := w.Write(nil, [][]string{{"Outcome"}}, emf.Metric{Name: "x", Unit: emf.UnitCount, Value: 1}); err == nil {
		t.Fatal("a dimension without a value was accepted")
	}
	if buf.Len() != 0 {
		t.Fatalf("refused documents were written: %q", buf.Bytes())
	}
	if err := w.Write(nil, nil, many[:emf.MaxMetrics]...); err != nil {
		t.Fatal(err)
	}
	doc := validate(t, lines(t, buf.Bytes())[0])
	if ns := doc["_aws"].(map[string]any)["CloudWatchMetrics"].([]any)[0].(map[string]any)["Namespace"]; ns != "shop/agents" {
		t.Fatalf("Namespace %v", ns)
	}
}
