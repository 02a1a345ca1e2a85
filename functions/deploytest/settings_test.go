package deploytest_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// envBudget is what the template's own variables may take of Lambda's 4 KB environment (keys and values, every
// function): the rest is left for the short inline settings a deployment sets.
const envBudget = 3 << 10

// REVIEW H6: a system prompt or a price table of any size deploys. The environment (4 KB for all variables) cannot
// hold a long one, so each has a file parameter (SystemPromptFile, PriceTableFile: a path in the deployment
// package, which `make build` fills from bundle/) beside its short inline parameter, and the template's own
// variables leave room.
func TestLargeSettingsDeploy(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for param, env := range map[string]string{"SystemPromptFile": "AGENT_SYSTEM_PROMPT_FILE", "PriceTableFile": "AGENT_PRICES_FILE"} {
		p, ok := f.tmpl.Parameters[param]
		if !ok || p["Default"] != "" {
			t.Errorf("parameter %s = %v, want one defaulting to empty", param, p)
		}
		for _, fn := range f.funcs {
			if got := fn.Env[env]; !reflect.DeepEqual(got, ref(param)) {
				t.Errorf("%s: %s = %#v, want the %s parameter", fn.ID, env, got, param)
			}
		}
	}
	for _, fn := range f.funcs {
		size := 0
		for name, v := range fn.Env {
			size += len(name) + len(f.resolve(t, v))
		}
		if size > envBudget {
			t.Errorf("%s: the template's environment takes %d bytes of Lambda's 4096, more than %d", fn.ID, size, envBudget)
		}
	}
	makefile, err := os.ReadFile(filepath.Join(f.root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "bundle") {
		t.Error("the Makefile's function build does not copy bundle/ into the package")
	}
}
