package deploytest_test

import (
	"reflect"
	"testing"
)

// The sub-agent and wake functions' reserved concurrency comes from a parameter of each (REVIEW S2: a burst of
// jobs, or of delivery turns, took the account's concurrency from the API, the reaper and each other). Unset by
// default (-1: AWS::NoValue), as an account with a low quota cannot spare a reservation; a number reserves it.
func TestJobFunctionsReservedConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for pkg, param := range map[string]string{"./functions/subagent": "SubagentReservedConcurrency", "./functions/wake": "WakeReservedConcurrency"} {
		p, ok := f.tmpl.Parameters[param]
		if !ok {
			t.Errorf("no %s parameter", param)
			continue
		}
		if p["Type"] != "Number" || p["Default"] != -1 || p["MinValue"] != -1 {
			t.Errorf("%s = %v, want a Number, default -1 (unset), MinValue -1", param, p)
		}
		cond := "Has" + param
		want := map[string]any{"Fn::Not": []any{map[string]any{"Fn::Equals": []any{ref(param), -1}}}}
		if got := f.tmpl.Conditions[cond]; !reflect.DeepEqual(got, want) {
			t.Errorf("condition %s = %#v, want %#v", cond, got, want)
		}
		wantProp := map[string]any{"Fn::If": []any{cond, ref(param), ref("AWS::NoValue")}}
		if got := f.function(t, pkg).Props["ReservedConcurrentExecutions"]; !reflect.DeepEqual(got, wantProp) {
			t.Errorf("%s ReservedConcurrentExecutions = %#v, want %#v", pkg, got, wantProp)
		}
	}
}
