package deploytest_test

import (
	"reflect"
	"slices"
	"testing"
)

// The chat function's reserved concurrency comes from the ChatReservedConcurrency parameter, and -1 (the
// default: REVIEW H6, a new account's quota of 10 cannot spare a reservation of 100) leaves it unset
// (AWS::NoValue). The other functions
// reserve nothing: their concurrency is bounded by the schedule and the state machine.
func TestChatReservedConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p, ok := f.tmpl.Parameters["ChatReservedConcurrency"]
	if !ok {
		t.Fatal("no ChatReservedConcurrency parameter")
	}
	if p["Type"] != "Number" || p["Default"] != -1 || p["MinValue"] != -1 {
		t.Errorf("ChatReservedConcurrency = %v, want a Number, default -1 (unset), MinValue -1", p)
	}
	cond := "HasChatReservedConcurrency"
	want := map[string]any{"Fn::Not": []any{map[string]any{"Fn::Equals": []any{ref("ChatReservedConcurrency"), -1}}}}
	if got := f.tmpl.Conditions[cond]; !reflect.DeepEqual(got, want) {
		t.Errorf("condition %s = %#v, want %#v", cond, got, want)
	}
	chat := f.function(t, "./functions/chat")
	wantProp := map[string]any{"Fn::If": []any{cond, ref("ChatReservedConcurrency"), ref("AWS::NoValue")}}
	if got := chat.Props["ReservedConcurrentExecutions"]; !reflect.DeepEqual(got, wantProp) {
		t.Errorf("chat ReservedConcurrentExecutions = %#v, want %#v", got, wantProp)
	}
	for _, pkg := range []string{"./functions/api", "./functions/reaper"} { // subagent, wake: jobs_concurrency_test.go
		if got, set := f.function(t, pkg).Props["ReservedConcurrentExecutions"]; set {
			t.Errorf("%s reserves concurrency %#v", pkg, got)
		}
	}
}

// The chat URL's CORS exposes Retry-After, which browsers otherwise hide from a 429 (it is not safelisted).
func TestChatExposesRetryAfter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	cors := mapAt(mapAt(f.function(t, "./functions/chat").Props, "FunctionUrlConfig"), "Cors")
	exposed, _ := cors["ExposeHeaders"].([]any)
	if !slices.Contains(exposed, any("retry-after")) {
		t.Fatalf("chat Cors.ExposeHeaders = %v, want retry-after in it", exposed)
	}
}

// REVIEW S20: Lambda gives a JSON line without a level (every EMF document) the level INFO, so an application log
// level above INFO would drop every metric and every agent.* line: LogLevel offers only DEBUG and INFO.
func TestLogLevelKeepsMetrics(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.tmpl.Parameters["LogLevel"]
	allowed, _ := p["AllowedValues"].([]any)
	if len(allowed) == 0 {
		t.Fatalf("LogLevel = %v: no AllowedValues", p)
	}
	for _, v := range allowed {
		if v != "DEBUG" && v != "INFO" {
			t.Errorf("LogLevel allows %v: EMF documents and agent.* lines (INFO) would be dropped", v)
		}
	}
}
