package sfntest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
)

// WithContract writes a contract that Contract reads back, and leaves the rest of the machine alone.
func TestWithContractRoundTrips(t *testing.T) {
	t.Parallel()
	def, err := sfntest.ReadDefinition()
	if err != nil {
		t.Fatal(err)
	}
	c := agent.JobContract{TaskTimeout: time.Second, TaskRetries: 3, DeliverRetries: 1, RetryInterval: 50 * time.Millisecond, ExecutionTimeout: 7 * time.Second}
	scaled, err := sfntest.WithContract(def, c)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sfntest.Contract(scaled); err != nil || got != c {
		t.Fatalf("Contract(WithContract(c)) = %+v, %v; want %+v", got, err, c)
	}
	for _, keep := range []string{"${SubagentFunctionArn}", "${WakeFunctionArn}", `"States.ALL"`, `"$.failure"`, `"IsPresent": true`} {
		if !strings.Contains(string(scaled), keep) {
			t.Errorf("the scaled definition lost %s", keep)
		}
	}
}

func TestContractErrors(t *testing.T) {
	t.Parallel()
	def, err := sfntest.ReadDefinition()
	if err != nil {
		t.Fatal(err)
	}
	ok := agent.JobContract{TaskTimeout: time.Second, TaskRetries: 1, DeliverRetries: 1, RetryInterval: time.Second, ExecutionTimeout: 9 * time.Second}
	fractional := ok
	fractional.TaskTimeout = 1500 * time.Millisecond
	if _, err := sfntest.WithContract(def, fractional); err == nil {
		t.Error("WithContract took a TaskTimeout of 1.5 s (TimeoutSeconds is an integer)")
	}
	cases := []struct{ name, from, to, want string }{
		{"backoff", `"BackoffRate": 2
        }`, `"BackoffRate": 3
        }`, "BackoffRate"},
		{"no retry", `"Retry"`, `"NoRetry"`, "no Retry"},
		{"no task", `"RunSubagent": {`, `"Other": {`, "no state RunSubagent"},
		{"intervals differ", `"IntervalSeconds": 2,
          "MaxAttempts": 5`, `"IntervalSeconds": 3,
          "MaxAttempts": 5`, "intervals differ"},
	}
	for _, tc := range cases {
		broken := strings.Replace(string(def), tc.from, tc.to, 1)
		if broken == string(def) {
			t.Fatalf("%s: %q is not in the definition", tc.name, tc.from)
		}
		if _, err := sfntest.Contract([]byte(broken)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Contract = %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestSubstitute(t *testing.T) {
	t.Parallel()
	got, err := sfntest.Substitute([]byte(`{"a":"${A}","b":"${A}-${B}"}`), map[string]string{"A": "1", "B": "2"})
	if err != nil || string(got) != `{"a":"1","b":"1-2"}` {
		t.Fatalf("Substitute = %s, %v", got, err)
	}
	if _, err := sfntest.Substitute([]byte(`"${A}${C}"`), map[string]string{"A": "1"}); err == nil || !strings.Contains(err.Error(), "C") {
		t.Fatalf("Substitute with a missing value: %v, want an error naming C", err)
	}
}
