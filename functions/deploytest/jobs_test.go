package deploytest_test

import (
	"cmp"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/jobs"
)

// The job state machine as the template declares it (the one AWS::Serverless::StateMachine).
const stateMachineID = "JobsStateMachine"

// stateMachineArn is the ARN the functions that start executions name it by: its Name is fixed, so no function
// needs a Ref to it (the wake function's would be a cycle: the machine invokes the wake function).
const stateMachineArn = "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}:stateMachine:${AWS::StackName}-jobs"

// The task states of infra/jobs.asl.json and the function each one invokes.
var taskFunctions = map[string]string{"RunSubagent": "./functions/subagent", "Deliver": "./functions/wake"}

func (f *fixture) stateMachine(t *testing.T) map[string]any {
	t.Helper()
	var found []string
	for id, r := range f.tmpl.Resources {
		if r.Type == "AWS::Serverless::StateMachine" || r.Type == "AWS::StepFunctions::StateMachine" {
			found = append(found, id)
		}
	}
	if len(found) != 1 || found[0] != stateMachineID || f.tmpl.Resources[stateMachineID].Type != "AWS::Serverless::StateMachine" {
		t.Fatalf("state machines %v, want exactly the AWS::Serverless::StateMachine %s", found, stateMachineID)
	}
	return f.tmpl.Resources[stateMachineID].Properties
}

// aslPath is the state machine's definition file (DefinitionUri, relative to the template).
func (f *fixture) aslPath(t *testing.T) string {
	t.Helper()
	uri, ok := f.stateMachine(t)["DefinitionUri"].(string)
	if !ok || uri == "" || filepath.IsAbs(uri) {
		t.Fatalf("DefinitionUri %#v, want a path relative to the template", f.stateMachine(t)["DefinitionUri"])
	}
	return filepath.Join(f.root, uri)
}

func readASL(t *testing.T, path string) (raw []byte, def map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the state machine's definition: %v", err)
	}
	if err := json.Unmarshal(raw, &def); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return raw, def
}

// aslTask is the Task state name of the definition in path.
func aslTask(t *testing.T, path, name string) map[string]any {
	t.Helper()
	_, def := readASL(t, path)
	st, _ := mapAt(def, "States")[name].(map[string]any)
	if st == nil || st["Type"] != "Task" {
		t.Fatalf("%s has no Task state %s", path, name)
	}
	return st
}

var aslPlaceholder = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)\}`)

// The template's state machine runs infra/jobs.asl.json as a STANDARD machine (execution names are used once:
// a job id names one execution), every ${...} placeholder of the definition has a substitution and every
// substitution is used, each Lambda task state invokes its function (RunSubagent the sub-agent function, Deliver
// the wake function) by its ARN, and the machine's role may invoke exactly those two functions, nothing else.
func TestTemplateStateMachine(t *testing.T) {
	t.Parallel()
	f := setup(t)
	sm := f.stateMachine(t)
	if typ, ok := sm["Type"]; ok && typ != "STANDARD" {
		t.Errorf("Type = %v, want STANDARD (an EXPRESS machine does not keep execution names unique)", typ)
	}
	if want := map[string]any{"Fn::Sub": "${AWS::StackName}-jobs"}; !reflect.DeepEqual(sm["Name"], want) {
		t.Errorf("Name = %#v, want %#v (the functions name the machine by %s)", sm["Name"], want, stateMachineArn)
	}
	if sm["Definition"] != nil {
		t.Error("Definition is inline: the definition is infra/jobs.asl.json (DefinitionUri), the file lib/sfn tests")
	}
	path := f.aslPath(t)
	if filepath.ToSlash(path) != filepath.ToSlash(filepath.Join(f.root, "infra", "jobs.asl.json")) {
		t.Errorf("DefinitionUri %s, want infra/jobs.asl.json", path)
	}
	raw, def := readASL(t, path)

	subs := mapAt(sm, "DefinitionSubstitutions")
	used := map[string]bool{}
	for _, m := range aslPlaceholder.FindAllSubmatch(raw, -1) {
		name := string(m[1])
		used[name] = true
		if _, ok := subs[name]; !ok {
			t.Errorf("the definition's ${%s} has no DefinitionSubstitutions entry", name)
		}
	}
	for name := range subs {
		if !used[name] {
			t.Errorf("DefinitionSubstitutions.%s is not used by the definition", name)
		}
	}

	// Each task state invokes its function, named through a substitution that is that function's ARN.
	var invoked []any
	for state, pkg := range taskFunctions {
		st := aslTask(t, path, state)
		if st["Resource"] != "arn:aws:states:::lambda:invoke" {
			t.Errorf("%s: Resource %v, want the lambda:invoke integration", state, st["Resource"])
		}
		name, _ := mapAt(st, "Parameters")["FunctionName"].(string)
		m := aslPlaceholder.FindStringSubmatch(name)
		if m == nil || m[0] != name {
			t.Errorf("%s: FunctionName %q, want one ${...} placeholder", state, name)
			continue
		}
		fn := f.function(t, pkg)
		arn := map[string]any{"Fn::GetAtt": []any{fn.ID, "Arn"}}
		if !reflect.DeepEqual(subs[m[1]], arn) {
			t.Errorf("%s invokes ${%s} = %#v, want %s's ARN %#v", state, m[1], subs[m[1]], pkg, arn)
		}
		invoked = append(invoked, arn)
	}
	// No other Task state calls anything.
	for name, s := range mapAt(def, "States") {
		if st, _ := s.(map[string]any); st["Type"] == "Task" && taskFunctions[name] == "" {
			t.Errorf("Task state %s is not one of %v", name, slices.Sorted(maps.Keys(taskFunctions)))
		}
	}

	// The role: lambda:InvokeFunction on exactly the two task functions.
	var actions, resources []any
	for _, p := range list(sm["Policies"]) {
		doc, ok := p.(map[string]any)
		if !ok || doc["Statement"] == nil {
			t.Fatalf("policy %#v is not an inline policy document", p)
		}
		for _, s := range list(doc["Statement"]) {
			st, _ := s.(map[string]any)
			if st["Effect"] != "Allow" || st["NotAction"] != nil || st["NotResource"] != nil || st["Condition"] != nil {
				t.Errorf("statement %#v: want a plain Allow with Action and Resource", st)
			}
			actions = append(actions, list(st["Action"])...)
			resources = append(resources, list(st["Resource"])...)
		}
	}
	if !reflect.DeepEqual(actions, []any{"lambda:InvokeFunction"}) {
		t.Errorf("the state machine's actions %v, want only lambda:InvokeFunction", actions)
	}
	sortAny := func(v []any) []any {
		out := slices.Clone(v)
		slices.SortFunc(out, func(a, b any) int { return strings.Compare(jsonString(a), jsonString(b)) })
		return out
	}
	if !reflect.DeepEqual(sortAny(resources), sortAny(invoked)) {
		t.Errorf("the state machine may invoke %#v, want exactly its task functions %#v", resources, invoked)
	}
	if sm["Role"] != nil {
		t.Error("Role is set: the state machine's role is SAM's, built from the Policies checked here")
	}
}

// The reaper runs on a schedule, once per AGENT_REAPER_INTERVAL (rate(1 minute)), and nothing else is
// scheduled. A sweep ends within the interval (its Timeout), and a failed sweep is not retried: the next one
// comes anyway, and an old event is worth nothing.
func TestTemplateSchedule(t *testing.T) {
	t.Parallel()
	f := setup(t)
	reaper := f.function(t, "./functions/reaper")
	for _, fn := range f.funcs {
		for name, e := range mapAt(fn.Props, "Events") {
			ev, _ := e.(map[string]any)
			typ := ev["Type"]
			if fn.ID != reaper.ID {
				t.Errorf("%s has an event %s (%v): only the reaper is triggered by events", fn.ID, name, typ)
				continue
			}
			if typ != "Schedule" && typ != "ScheduleV2" {
				t.Errorf("reaper event %s has type %v, want Schedule", name, typ)
			}
		}
	}
	events := mapAt(reaper.Props, "Events")
	if len(events) != 1 {
		t.Fatalf("reaper events %#v, want one schedule", events)
	}
	var props map[string]any
	for _, e := range events {
		props = mapAt(e.(map[string]any), "Properties")
	}
	if props["Schedule"] != "rate(1 minute)" {
		t.Errorf("reaper schedule %v, want rate(1 minute)", props["Schedule"])
	}
	if enabled, ok := props["Enabled"]; ok && enabled != true {
		t.Errorf("reaper schedule Enabled = %v", enabled)
	}
	if props["Input"] != nil || props["State"] != nil && props["State"] != "ENABLED" {
		t.Errorf("reaper schedule %#v: want the plain scheduled event, enabled", props)
	}
	env := map[string]string{}
	for k, v := range reaper.Env {
		env[k] = f.resolve(t, v)
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ReaperInterval != time.Minute {
		t.Errorf("AGENT_REAPER_INTERVAL = %s, want 1m: the schedule's rate", cfg.ReaperInterval)
	}
	if got := timeoutOf(t, reaper); got > time.Minute {
		t.Errorf("reaper Timeout %s, want at most the 1 min interval", got)
	}
	retry := mapAt(reaper.Props, "EventInvokeConfig")
	if retry["MaximumRetryAttempts"] != 0 {
		t.Errorf("reaper EventInvokeConfig.MaximumRetryAttempts = %v, want 0 (the next sweep is the retry)", retry["MaximumRetryAttempts"])
	}
}

// A delivery pass fits in the wake function: its time budget plus one whole run, with a minute to spare for
// the final writes.
func TestTemplateWakeBudget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	wake := f.function(t, "./functions/wake")
	env := map[string]string{}
	for k, v := range wake.Env {
		env[k] = f.resolve(t, v)
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	run := cmp.Or(cfg.RunTimeout, engine.DefaultRunTimeout)
	if need := jobs.DefaultDrainBudget + run + time.Minute; need > timeoutOf(t, wake) {
		t.Errorf("a delivery pass needs up to %s (budget %s + one run %s + 1 min), above the wake Timeout %s",
			need, jobs.DefaultDrainBudget, run, timeoutOf(t, wake))
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
