package deploytest_test

import (
	"reflect"
	"slices"
	"testing"
)

// The chat function's reserved concurrency comes from the ChatReservedConcurrency parameter (default 100), and
// -1 leaves it unset (AWS::NoValue) for accounts whose quota cannot spare a reservation. The other functions
// reserve nothing: their concurrency is bounded by the schedule and the state machine.
func TestChatReservedConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p, ok := f.tmpl.Parameters["ChatReservedConcurrency"]
	if !ok {
		t.Fatal("no ChatReservedConcurrency parameter")
	}
	if p["Type"] != "Number" || p["Default"] != 100 || p["MinValue"] != -1 {
		t.Errorf("ChatReservedConcurrency = %v, want a Number, default 100, MinValue -1", p)
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
	for _, pkg := range []string{"./functions/api", "./functions/subagent", "./functions/wake", "./functions/reaper"} {
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
