package deploytest_test

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/functions/deploytest"
	"github.com/agentloop/agentloop/internal/cfn"
	"github.com/agentloop/agentloop/lib/config"
)

const module = "github.com/agentloop/agentloop"

// template is the part of template.yaml these tests read, with short-form intrinsics expanded to their long
// forms ({"Ref": X}, {"Fn::GetAtt": [A, B]}, {"Fn::Sub": S}).
type template struct {
	Parameters map[string]map[string]any `yaml:"Parameters"`
	Conditions map[string]any            `yaml:"Conditions"`
	Rules      map[string]struct {
		RuleCondition any `yaml:"RuleCondition"`
		Assertions    []struct {
			Assert any `yaml:"Assert"`
		} `yaml:"Assertions"`
	} `yaml:"Rules"`
	Globals struct {
		Function map[string]any `yaml:"Function"`
	} `yaml:"Globals"`
	Resources map[string]struct {
		Type       string         `yaml:"Type"`
		Metadata   map[string]any `yaml:"Metadata"`
		Properties map[string]any `yaml:"Properties"`
	} `yaml:"Resources"`
	Outputs map[string]struct {
		Value any `yaml:"Value"`
	} `yaml:"Outputs"`
}

// function is one AWS::Serverless::Function with the Globals applied, and the Go main package that the
// Makefile's build-<LogicalId> target compiles for it.
type function struct {
	ID    string
	Pkg   string // e.g. ./functions/chat
	Props map[string]any
	Env   map[string]any
	Meta  map[string]any
}

type fixture struct {
	root  string
	tmpl  template
	funcs []function
}

func setup(t *testing.T) *fixture {
	t.Helper()
	root, err := deploytest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := parseTemplate(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{root: root, tmpl: tmpl}
	for id, r := range tmpl.Resources {
		if r.Type != "AWS::Serverless::Function" {
			continue
		}
		props := map[string]any{}
		for k, v := range tmpl.Globals.Function {
			props[k] = v
		}
		for k, v := range r.Properties {
			props[k] = v
		}
		env := map[string]any{}
		for _, src := range []map[string]any{tmpl.Globals.Function, r.Properties} {
			for k, v := range mapAt(src, "Environment", "Variables") {
				env[k] = v
			}
		}
		f.funcs = append(f.funcs, function{ID: id, Pkg: makeTargetPackage(makefile, id), Props: props, Env: env, Meta: r.Metadata})
	}
	slices.SortFunc(f.funcs, func(a, b function) int { return strings.Compare(a.ID, b.ID) })
	if len(f.funcs) < 5 {
		t.Fatalf("template has %d functions, want chat, api, subagent, wake and reaper", len(f.funcs))
	}
	return f
}

func parseTemplate(path string) (template, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return template{}, err
	}
	doc, err := cfn.Parse(data)
	if err != nil {
		return template{}, err
	}
	var t template
	if err := doc.Decode(&t); err != nil {
		return template{}, err
	}
	return t, nil
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// makeTargetPackage returns the ./functions/... package that the Makefile's build-<id> target builds.
func makeTargetPackage(makefile []byte, id string) string {
	re := regexp.MustCompile(`(?m)^build-` + regexp.QuoteMeta(id) + `:[^\n]*\n(?:\t[^\n]*\n)*?\t[^\n]*?(\./functions/[a-z0-9_]+)`)
	if m := re.FindSubmatch(makefile); m != nil {
		return string(m[1])
	}
	return ""
}

func mapAt(m map[string]any, path ...string) map[string]any {
	for _, k := range path {
		next, _ := m[k].(map[string]any)
		if next == nil {
			return nil
		}
		m = next
	}
	return m
}

func list(v any) []any {
	switch v := v.(type) {
	case []any:
		return v
	case nil:
		return nil
	default:
		return []any{v}
	}
}

func ref(name string) map[string]any { return map[string]any{"Ref": name} }

func (f *fixture) function(t *testing.T, pkg string) function {
	t.Helper()
	for _, fn := range f.funcs {
		if fn.Pkg == pkg {
			return fn
		}
	}
	t.Fatalf("no function in template.yaml builds %s", pkg)
	return function{}
}

// Every function is an arm64 provided.al2023 bootstrap built by its own Makefile target, with JSON logs into
// its own log group. The URL functions (chat, api) stream (RESPONSE_STREAM), leave authentication to the
// application (AuthType NONE), take CORS from the AllowedOrigins parameter, carry the post-2025 InvokeFunction
// permission for URL calls, and have an output with their URL. The task functions (subagent, wake, reaper) have
// no URL and no permission for anyone else to invoke them.
func TestTemplateFunctions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, pkg := range []string{"./functions/chat", "./functions/api", "./functions/subagent", "./functions/wake", "./functions/reaper"} {
		f.function(t, pkg)
	}
	for _, fn := range f.funcs {
		t.Run(fn.ID, func(t *testing.T) {
			t.Parallel()
			if fn.Pkg == "" {
				t.Fatalf("Makefile has no build-%s target building a ./functions package", fn.ID)
			}
			checks := []struct {
				what      string
				got, want any
			}{
				{"Runtime", fn.Props["Runtime"], "provided.al2023"},
				{"Architectures", fn.Props["Architectures"], []any{"arm64"}},
				{"Handler", fn.Props["Handler"], "bootstrap"},
				{"CodeUri", fn.Props["CodeUri"], "."},
				{"Metadata.BuildMethod", fn.Meta["BuildMethod"], "makefile"},
				{"LoggingConfig.LogFormat", mapAt(fn.Props, "LoggingConfig")["LogFormat"], "JSON"},
			}
			if url := mapAt(fn.Props, "FunctionUrlConfig"); url != nil {
				checks = append(checks, []struct {
					what      string
					got, want any
				}{
					{"FunctionUrlConfig.InvokeMode", url["InvokeMode"], "RESPONSE_STREAM"},
					{"FunctionUrlConfig.AuthType", url["AuthType"], "NONE"},
					{"FunctionUrlConfig.Cors.AllowOrigins", mapAt(url, "Cors")["AllowOrigins"], ref("AllowedOrigins")},
				}...)
			}
			for _, c := range checks {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("%s = %#v, want %#v", c.what, c.got, c.want)
				}
			}
			if _, err := os.Stat(filepath.Join(f.root, fn.Pkg, "main.go")); err != nil {
				t.Errorf("code path: %v", err)
			}
			logGroup, _ := mapAt(fn.Props, "LoggingConfig")["LogGroup"].(map[string]any)
			if name, _ := logGroup["Ref"].(string); f.tmpl.Resources[name].Type != "AWS::Logs::LogGroup" {
				t.Errorf("LoggingConfig.LogGroup = %#v, want a Ref to a log group of this template", logGroup)
			}
			if mapAt(fn.Props, "FunctionUrlConfig") == nil {
				for id, r := range f.tmpl.Resources {
					if r.Type == "AWS::Lambda::Permission" && reflect.DeepEqual(r.Properties["FunctionName"], ref(fn.ID)) {
						t.Errorf("%s lets %v invoke a function without a URL", id, r.Properties["Principal"])
					}
				}
				return
			}
			var permitted bool
			for _, r := range f.tmpl.Resources {
				p := r.Properties
				if r.Type == "AWS::Lambda::Permission" && reflect.DeepEqual(p["FunctionName"], ref(fn.ID)) &&
					p["Action"] == "lambda:InvokeFunction" && p["Principal"] == "*" && p["InvokedViaFunctionUrl"] == true {
					permitted = true
				}
			}
			if !permitted {
				t.Errorf("no lambda:InvokeFunction permission with InvokedViaFunctionUrl for %s", fn.ID)
			}
			var exported bool
			for _, o := range f.tmpl.Outputs {
				if reflect.DeepEqual(o.Value, map[string]any{"Fn::GetAtt": []any{fn.ID + "Url", "FunctionUrl"}}) {
					exported = true
				}
			}
			if !exported {
				t.Errorf("no output with %sUrl.FunctionUrl", fn.ID)
			}
		})
	}
	// Both HTTP functions are URL functions. The chat function outlives the run wall clock; the API answers
	// quickly.
	for _, pkg := range []string{"./functions/chat", "./functions/api"} {
		if mapAt(f.function(t, pkg).Props, "FunctionUrlConfig") == nil {
			t.Errorf("%s has no function URL", pkg)
		}
	}
	if got := f.function(t, "./functions/chat").Props["Timeout"]; got != 900 {
		t.Errorf("chat Timeout = %v, want 900", got)
	}
	if got, ok := f.function(t, "./functions/api").Props["Timeout"].(int); !ok || got > 60 {
		t.Errorf("api Timeout = %v, want at most 60", got)
	}
	// The task functions are no URL functions.
	for _, pkg := range []string{"./functions/subagent", "./functions/wake", "./functions/reaper"} {
		if mapAt(f.function(t, pkg).Props, "FunctionUrlConfig") != nil {
			t.Errorf("%s has a function URL: it is a task, invoked by Step Functions or the schedule only", pkg)
		}
	}
	// The sub-agent outlives its task's TimeoutSeconds, so that Step Functions' timeout fires first (and its
	// Catch takes the failure path) rather than the Lambda's; not by much, so a stuck attempt costs little.
	taskTimeout := time.Duration(aslTask(t, f.aslPath(t), "RunSubagent")["TimeoutSeconds"].(float64)) * time.Second
	if got := timeoutOf(t, f.function(t, "./functions/subagent")); got <= taskTimeout || got > taskTimeout+2*time.Minute {
		t.Errorf("subagent Timeout = %s, want above the task's TimeoutSeconds %s (by at most 2 min)", got, taskTimeout)
	}
	if got := timeoutOf(t, f.function(t, "./functions/wake")); got != 900*time.Second {
		t.Errorf("wake Timeout = %s, want 900s (a delivery pass runs whole turns)", got)
	}
}

func timeoutOf(t *testing.T, fn function) time.Duration {
	t.Helper()
	n, ok := fn.Props["Timeout"].(int)
	if !ok {
		t.Fatalf("%s: Timeout %#v is not a number of seconds", fn.ID, fn.Props["Timeout"])
	}
	return time.Duration(n) * time.Second
}

// `make build` (what `sam build` runs per function) yields, for each function, a stripped, static linux/arm64
// bootstrap of the right main package built with lambda.norpc and -trimpath, without SQLite, plus a built
// template that points each function at its artifact folder.
func TestTemplateBuild(t *testing.T) {
	t.Parallel()
	f := setup(t)
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Fatalf("make is needed to build the functions: %v", err)
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, makeBin, "--no-print-directory", "build", "BUILD_DIR="+out)
	cmd.Dir = f.root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, b)
	}
	built, err := parseTemplate(filepath.Join(out, "template.yaml"))
	if err != nil {
		t.Fatalf("built template: %v", err)
	}
	// The state machine's definition stays where it is; the built template (in another folder) still finds it.
	uri, _ := built.Resources[stateMachineID].Properties["DefinitionUri"].(string)
	if !filepath.IsAbs(uri) {
		uri = filepath.Join(out, uri)
	}
	if got, want := readFile(t, uri), readFile(t, f.aslPath(t)); !bytes.Equal(got, want) {
		t.Errorf("the built template's DefinitionUri %s is not infra/jobs.asl.json", uri)
	}
	for _, fn := range f.funcs {
		t.Run(fn.ID, func(t *testing.T) {
			bin := filepath.Join(out, fn.ID, "bootstrap")
			if got := built.Resources[fn.ID].Properties["CodeUri"]; got != fn.ID {
				t.Errorf("built template CodeUri = %v, want %s", got, fn.ID)
			}
			e, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if e.Machine != elf.EM_AARCH64 || e.Type != elf.ET_EXEC {
				t.Errorf("ELF machine %v type %v, want an AArch64 executable", e.Machine, e.Type)
			}
			if e.Section(".symtab") != nil {
				t.Error("bootstrap has a symbol table: built without -ldflags=-s")
			}
			// The build is deterministic (same tree, same toolchain, -trimpath), so its size is a fact to bound,
			// not a timing: a dependency that drags a whole SDK in fails here (issue 18 item 6).
			st, err := os.Stat(bin)
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() > deploytest.MaxBootstrapBytes {
				t.Errorf("bootstrap is %d bytes, want at most %d: see `go list -deps %s` and `go tool nm -size -sort size` of a build without -s -w",
					st.Size(), deploytest.MaxBootstrapBytes, fn.Pkg)
			}
			info, err := buildinfo.ReadFile(bin)
			if err != nil {
				t.Fatal(err)
			}
			if want := module + strings.TrimPrefix(fn.Pkg, "."); info.Path != want {
				t.Errorf("main package %s, want %s", info.Path, want)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			for k, want := range map[string]string{"GOOS": "linux", "GOARCH": "arm64", "CGO_ENABLED": "0",
				"-tags": "lambda.norpc", "-trimpath": "true"} {
				if settings[k] != want {
					t.Errorf("build setting %s = %q, want %q", k, settings[k], want)
				}
			}
			for _, d := range info.Deps {
				if strings.HasPrefix(d.Path, "modernc.org/") {
					t.Errorf("bootstrap links %s: Lambda binaries must not link SQLite", d.Path)
				}
			}
		})
	}
}

// `go list -deps` of each function (as built for Lambda) names no SQLite package: the import graph itself keeps
// SQLite out, not an accident of the linker.
func TestNoSQLiteInFunctions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, fn := range f.funcs {
		t.Run(fn.ID, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(deploytest.GoCommand(), "list", "-deps", "-tags", "lambda.norpc", fn.Pkg)
			cmd.Dir = f.root
			cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
			b, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list: %v", err)
			}
			deps := strings.Fields(string(b))
			if len(deps) == 0 {
				t.Fatal("go list printed no packages")
			}
			for _, d := range deps {
				if strings.HasPrefix(d, "modernc.org/sqlite") || d == module+"/lib/sqlite" {
					t.Errorf("%s depends on %s", fn.Pkg, d)
				}
			}
		})
	}
}

// envRead returns the environment variables main reads: those config.Load asks for (recorded through its
// getenv) plus any os.Getenv / os.LookupEnv literal in main.go itself.
func envRead(t *testing.T, root, pkg string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	if _, err := config.Load(func(k string) string { names[k] = true; return "" }); err != nil {
		t.Fatalf("config.Load with an empty environment: %v", err)
	}
	file := parseMain(t, root, pkg)
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && id.Name == "os" {
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				names[s] = true
			}
		}
		return true
	})
	return names
}

func parseMain(t *testing.T, root, pkg string) *ast.File {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, pkg, "main.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return file
}

// configFields returns the config.Config fields main.go reads (cfg.X selectors).
func configFields(t *testing.T, root, pkg string) map[string]bool {
	t.Helper()
	fields := map[string]bool{}
	ast.Inspect(parseMain(t, root, pkg), func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "cfg" {
				fields[sel.Sel.Name] = true
			}
		}
		return true
	})
	return fields
}

// fieldEnv maps each string field of config.Config to the variable it is read from, by loading an environment
// in which every variable's value is its own name.
func fieldEnv(t *testing.T) map[string]string {
	t.Helper()
	cfg, _ := config.Load(func(k string) string {
		if strings.HasSuffix(k, "_PARAM") || slices.Contains(config.ResourceEnv(), k) || k == "TABLE_NAME" {
			return k
		}
		return ""
	})
	out := map[string]string{}
	v := reflect.ValueOf(cfg)
	for i := range v.NumField() {
		if s, ok := v.Field(i).Interface().(string); ok && s != "" {
			out[v.Type().Field(i).Name] = s
		}
	}
	return out
}

// pseudo are sample values of the pseudo parameters, for resolve.
var pseudo = []string{"${AWS::Partition}", "aws", "${AWS::Region}", "us-east-1", "${AWS::AccountId}", "123456789012",
	"${AWS::StackName}", "agentloop"}

// resolve turns a template env value into what Lambda would pass, with parameters at their defaults.
func (f *fixture) resolve(t *testing.T, v any) string {
	t.Helper()
	return f.resolveWith(t, v, nil)
}

// resolveWith is resolve with the template's parameters at params (else their defaults): an Fn::If takes the
// branch its condition chooses, and an Fn::Sub may name parameters.
func (f *fixture) resolveWith(t *testing.T, v any, params map[string]string) string {
	t.Helper()
	switch v := v.(type) {
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	case map[string]any:
		if args := list(v["Fn::If"]); len(args) == 3 {
			if f.condition(t, fmt.Sprint(args[0]), params) {
				return f.resolveWith(t, args[1], params)
			}
			return f.resolveWith(t, args[2], params)
		}
		if sub, ok := v["Fn::Sub"].(string); ok {
			sub = strings.NewReplacer(pseudo...).Replace(sub)
			for name := range f.tmpl.Parameters {
				if strings.Contains(sub, "${"+name+"}") {
					sub = strings.ReplaceAll(sub, "${"+name+"}", f.param(t, name, params))
				}
			}
			if !strings.Contains(sub, "${") {
				return sub
			}
		}
		if att, ok := v["Fn::GetAtt"].([]any); ok && len(att) == 2 && att[1] == "FunctionUrl" {
			return "https://" + strings.ToLower(fmt.Sprint(att[0])) + ".lambda-url.us-east-1.on.aws/"
		}
		if name, ok := v["Ref"].(string); ok {
			if name == "Table" {
				return "agentloop-Table-0123"
			}
			if r, ok := f.tmpl.Resources[name]; ok && r.Type == "AWS::Serverless::Function" {
				return "agentloop-" + name + "-0123"
			}
			if _, ok := f.tmpl.Parameters[name]; ok {
				return f.param(t, name, params)
			}
		}
	}
	t.Fatalf("cannot resolve env value %#v", v)
	return ""
}

// Every variable a main reads is set by the template, the plain-text secret variables are not, and nothing
// the template sets goes unread. The values, parameters at their defaults, form a valid configuration whose
// bounds fit the functions: a run (and a resumed stream's tail) ends before the chat Lambda's timeout, and the
// body limit is below the function URL's 6 MB.
func TestTemplateEnv(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, fn := range f.funcs {
		t.Run(fn.ID, func(t *testing.T) {
			t.Parallel()
			read := envRead(t, f.root, fn.Pkg)
			// A resource (the job state machine's ARN, the chat function's URL) is set only on the functions whose
			// main uses it: the others have no permission on the resource either (TestTemplatePolicies).
			fields := configFields(t, f.root, fn.Pkg)
			for field, name := range fieldEnv(t) {
				if slices.Contains(config.ResourceEnv(), name) && !fields[field] {
					delete(read, name)
				}
			}
			if v, set := fn.Env["AGENT_CHAT_FUNCTION"]; set && !reflect.DeepEqual(v, ref("ChatFunction")) {
				t.Errorf("AGENT_CHAT_FUNCTION = %#v, want the chat function's name (Ref ChatFunction)", v)
			}
			if v, set := fn.Env["JOBS_STATE_MACHINE_ARN"]; set && !reflect.DeepEqual(v, map[string]any{"Fn::Sub": stateMachineArn}) {
				t.Errorf("JOBS_STATE_MACHINE_ARN = %#v, want the job state machine's ARN %s", v, stateMachineArn)
			}
			for _, secret := range config.SecretEnv() {
				if _, set := fn.Env[secret]; set {
					t.Errorf("template sets %s: secrets must come from SSM, never from a plain variable", secret)
				}
				delete(read, secret)
			}
			// The tools file's variables are set on the functions that read it (they compose the agent), and no
			// other: their roles alone hold the ToolsSecretsPath grant (TestTemplatePolicies).
			agentFn := composesAgent(t, f.root, fn.Pkg)
			for _, name := range config.AgentEnv() {
				if _, set := fn.Env[name]; set != agentFn {
					t.Errorf("template sets %s: %v, want %v (only on the functions that read the tools file)", name, set, agentFn)
				}
				if !agentFn {
					delete(read, name)
				}
			}
			if v, set := fn.Env["AGENT_MODEL_KEYS_PATH"]; set && !reflect.DeepEqual(v, ref("ModelKeysPath")) {
				t.Errorf("AGENT_MODEL_KEYS_PATH = %#v, want the ModelKeysPath parameter (the path its role may read)", v)
			}
			if v, set := fn.Env["AGENT_TOOLS_SECRETS_PATH"]; set && !reflect.DeepEqual(v, ref("ToolsSecretsPath")) {
				t.Errorf("AGENT_TOOLS_SECRETS_PATH = %#v, want the ToolsSecretsPath parameter (the path its role may read)", v)
			}
			// The tools file: ssm:<ToolsFileParameterName> (the one parameter its role may read) when that is set,
			// else the ToolsFile parameter (a path in the package).
			toolsFileEnv := map[string]any{"Fn::If": []any{"HasToolsFileParameter",
				map[string]any{"Fn::Sub": "ssm:${ToolsFileParameterName}"}, ref("ToolsFile")}}
			if v, set := fn.Env["AGENT_TOOLS_FILE"]; set && !reflect.DeepEqual(v, toolsFileEnv) {
				t.Errorf("AGENT_TOOLS_FILE = %#v, want %#v", v, toolsFileEnv)
			}
			for _, local := range config.LocalEnv() {
				if _, set := fn.Env[local]; set {
					t.Errorf("template sets %s, which only agentloop dev acts on", local)
				}
				delete(read, local)
			}
			for name := range read {
				if _, set := fn.Env[name]; !set {
					t.Errorf("main reads %s but the template does not set it", name)
				}
			}
			env := map[string]string{}
			for name, v := range fn.Env {
				if !read[name] {
					t.Errorf("template sets %s, which no code of %s reads", name, fn.Pkg)
				}
				env[name] = f.resolve(t, v)
			}
			cfg, err := config.Load(func(k string) string { return env[k] })
			if err != nil {
				t.Fatalf("the template's environment is not a valid configuration: %v", err)
			}
			if agentFn {
				// And with ToolsSecretsPath set, the path reaches the configuration as given.
				env["AGENT_TOOLS_SECRETS_PATH"] = toolsSecretsPath
				if c, err := config.Load(func(k string) string { return env[k] }); err != nil || c.ToolsSecretsPath != toolsSecretsPath {
					t.Errorf("with ToolsSecretsPath set: %q %v, want %q", c.ToolsSecretsPath, err, toolsSecretsPath)
				}
				// And the tools file reaches it as the parameter's SSM form, or as the path in the package.
				for _, tc := range []struct {
					params map[string]string
					want   string
				}{
					{map[string]string{"ToolsFileParameterName": toolsFileParam}, "ssm:" + toolsFileParam},
					{map[string]string{"ToolsFile": "bundle/tools.yaml"}, "/var/task/bundle/tools.yaml"},
				} {
					env["AGENT_TOOLS_FILE"], env["LAMBDA_TASK_ROOT"] = f.resolveWith(t, fn.Env["AGENT_TOOLS_FILE"], tc.params), "/var/task"
					if c, err := config.Load(func(k string) string { return env[k] }); err != nil || c.ToolsFile != tc.want {
						t.Errorf("with %v: AGENT_TOOLS_FILE %q, ToolsFile %q %v, want %q", tc.params, env["AGENT_TOOLS_FILE"], c.ToolsFile, err, tc.want)
					}
				}
			}
			if cfg.MaxBodyBytes > 6_000_000 {
				t.Errorf("AGENT_MAX_BODY_BYTES = %d, above the 6 MB function URL request limit", cfg.MaxBodyBytes)
			}
			if fn.Pkg == "./functions/chat" {
				timeout := time.Duration(fn.Props["Timeout"].(int)) * time.Second
				// httpapi's resumed stream tails for at most RunTimeout + 1 min.
				if cfg.RunTimeout+time.Minute > timeout {
					t.Errorf("AGENT_RUN_TIMEOUT %s + 1 min exceeds the chat timeout %s", cfg.RunTimeout, timeout)
				}
			}
		})
	}
}

var ssmParamArn = regexp.MustCompile(`^arn:\$\{AWS::Partition\}:ssm:\$\{AWS::Region\}:\$\{AWS::AccountId\}:parameter\$\{([A-Za-z0-9]+)\}$`)

// Each function's policies are inline statements naming only this stack's table (and its indexes) with exactly
// the item operations lib/dynamo reaches from the store ports the function uses, only the SSM parameters (by
// name, from template parameters) whose names the function's main reads, and, for a main that reads the job
// state machine's ARN (it starts executions), exactly the Step Functions actions lib/sfn calls on that one
// state machine; a main that does not read it (api, subagent) may start none. No wildcard resource but one, no
// managed policy, no Deny tricks. The one: a function that reads the tools file (chat, wake) may read the SSM
// parameters under ToolsSecretsPath (<path>*), only when that parameter is set (issue 19: its ${ssm:…}
// references used to fail the cold start with AccessDenied); checked with it unset and set. Such a function may
// also read the tools file itself from SSM: ssm:GetParameter on exactly the parameter ToolsFileParameterName
// names, only when it is set.
func TestTemplatePolicies(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tableResources := []any{
		map[string]any{"Fn::GetAtt": []any{"Table", "Arn"}},
		map[string]any{"Fn::Sub": "${Table.Arn}/index/*"},
	}
	envOf := fieldEnv(t)
	// Who starts executions: the functions that dispatch jobs or ask for delivery passes, and no other.
	for pkg, starts := range map[string]bool{"./functions/chat": true, "./functions/wake": true, "./functions/reaper": true,
		"./functions/api": false, "./functions/subagent": false} {
		if got := configFields(t, f.root, pkg)["JobsStateMachineARN"]; got != starts {
			t.Errorf("%s reads the job state machine's ARN: %v, want %v", pkg, got, starts)
		}
	}
	for _, tc := range []struct {
		name   string
		params map[string]string
	}{
		{"ToolsSecretsPath unset", nil},
		{"ToolsSecretsPath set", map[string]string{"ToolsSecretsPath": toolsSecretsPath}},
		{"ToolsFileParameterName set", map[string]string{"ToolsFileParameterName": toolsFileParam}},
		{"both set", map[string]string{"ToolsSecretsPath": toolsSecretsPath, "ToolsFileParameterName": toolsFileParam}},
		{"BedrockModelArns set", map[string]string{"BedrockModelArns": bedrockModelArns}},
		{"ModelKeysPath set", map[string]string{"ModelKeysPath": modelKeysPath}},
	} {
		for _, fn := range f.funcs {
			t.Run(tc.name+"/"+fn.ID, func(t *testing.T) {
				t.Parallel()
				f.checkPolicies(t, fn, tc.params, tableResources, envOf)
			})
		}
	}
}

// toolsSecretsPath is a sample ToolsSecretsPath; toolsSecretsArn the one resource a function's grant on it may name.
// toolsFileParam is a sample ToolsFileParameterName; toolsFileArn the one resource its grant names.
const (
	toolsSecretsPath = "/agentloop/tools/"
	toolsSecretsArn  = "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter${ToolsSecretsPath}*"
	toolsFileParam   = "/agentloop/tools"
	// modelKeysPath is a sample ModelKeysPath; modelKeysArn the one resource a function's grant on it may name.
	modelKeysPath = "/agentloop/models/"
	modelKeysArn  = "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter${ModelKeysPath}*"
	toolsFileArn  = "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter${ToolsFileParameterName}"
	// defaultBusArn is the one EventBridge resource: the account's default bus (completion signals).
	defaultBusArn = "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:event-bus/default"
	// bedrockModelArns is a sample BedrockModelArns: a foundation model and an inference profile.
	bedrockModelArns = "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0," +
		"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-lite-v1:0"
)

// composesAgent reports whether pkg's main builds the agent (boot.NewAgent): it runs turns, reads the tools file
// and resolves its ${ssm:…} references (so it alone holds the ToolsSecretsPath grant and AGENT_TOOLS_*).
func composesAgent(t *testing.T, root, pkg string) bool {
	t.Helper()
	found := false
	ast.Inspect(parseMain(t, root, pkg), func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "boot" && sel.Sel.Name == "NewAgent" {
				found = true
			}
		}
		return !found
	})
	return found
}

// param is a template parameter's value: params' when given, else its default.
func (f *fixture) param(t *testing.T, name string, params map[string]string) string {
	t.Helper()
	if v, ok := params[name]; ok {
		return v
	}
	p, ok := f.tmpl.Parameters[name]
	if !ok {
		t.Fatalf("no template parameter %s", name)
	}
	return fmt.Sprint(p["Default"])
}

// value evaluates a condition's operand: a string, or a Ref to a parameter.
func (f *fixture) value(t *testing.T, v any, params map[string]string) string {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		if name, ok := v["Ref"].(string); ok && len(v) == 1 {
			return f.param(t, name, params)
		}
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	}
	t.Fatalf("cannot evaluate %#v in a condition", v)
	return ""
}

// holds evaluates a condition expression (Fn::Not, Fn::And, Fn::Or, Fn::Equals, Condition) with params.
func (f *fixture) holds(t *testing.T, expr any, params map[string]string) bool {
	t.Helper()
	m, _ := expr.(map[string]any)
	if len(m) != 1 {
		t.Fatalf("cannot evaluate condition %#v", expr)
	}
	for op, arg := range m {
		args := list(arg)
		switch op {
		case "Condition":
			return f.condition(t, fmt.Sprint(arg), params)
		case "Fn::Not":
			return !f.holds(t, args[0], params)
		case "Fn::And", "Fn::Or":
			all, some := true, false
			for _, a := range args {
				h := f.holds(t, a, params)
				all, some = all && h, some || h
			}
			return all && op == "Fn::And" || some && op == "Fn::Or"
		case "Fn::Equals":
			return f.value(t, args[0], params) == f.value(t, args[1], params)
		}
	}
	t.Fatalf("cannot evaluate condition %#v", expr)
	return false
}

// condition evaluates the template's condition name with params (the other parameters at their defaults).
func (f *fixture) condition(t *testing.T, name string, params map[string]string) bool {
	t.Helper()
	expr, ok := f.tmpl.Conditions[name]
	if !ok {
		t.Fatalf("no condition %s", name)
	}
	return f.holds(t, expr, params)
}

// statements are a policy document's statements as CloudFormation would pass them with params: an
// {Fn::If: [cond, a, b]} item is a or b, and AWS::NoValue drops it. cond is the condition each came under ("").
func (f *fixture) statements(t *testing.T, doc map[string]any, params map[string]string) (sts []map[string]any, conds []string) {
	t.Helper()
	for _, s := range list(doc["Statement"]) {
		cond := ""
		if m, ok := s.(map[string]any); ok && m["Fn::If"] != nil {
			args := list(m["Fn::If"])
			if len(args) != 3 {
				t.Fatalf("Fn::If %#v: want [condition, then, else]", m)
			}
			cond = fmt.Sprint(args[0])
			if f.condition(t, cond, params) {
				s = args[1]
			} else {
				s = args[2]
			}
			if reflect.DeepEqual(s, ref("AWS::NoValue")) {
				continue
			}
		}
		st, _ := s.(map[string]any)
		sts, conds = append(sts, st), append(conds, cond)
	}
	return sts, conds
}

// checkPolicies is TestTemplatePolicies for one function, the template's parameters at params (else defaults).
func (f *fixture) checkPolicies(t *testing.T, fn function, params map[string]string, tableResources []any, envOf map[string]string) {
	t.Helper()
	ops := dynamoOps(t, f.root, storeMethods(fn.Pkg))
	var wantStates []string
	if configFields(t, f.root, fn.Pkg)["JobsStateMachineARN"] {
		wantStates = statesOps()
	}
	// The SSM parameters this function needs: those behind the *_PARAM variables its main reads.
	var wantParams []string
	for field := range configFields(t, f.root, fn.Pkg) {
		name := envOf[field]
		if !strings.HasSuffix(name, "_PARAM") {
			continue
		}
		r, _ := fn.Env[name].(map[string]any)
		p, _ := r["Ref"].(string)
		if _, ok := f.tmpl.Parameters[p]; !ok {
			t.Fatalf("%s must be a Ref to a template parameter, got %#v", name, fn.Env[name])
		}
		wantParams = append(wantParams, p)
	}
	slices.Sort(wantParams)

	// The tools file's secrets: the parameters under ToolsSecretsPath, for a function that reads the file,
	// only when the parameter is set.
	wantToolsGrant := composesAgent(t, f.root, fn.Pkg) && f.param(t, "ToolsSecretsPath", params) != ""
	toolsGrant := false
	// The tools file kept in SSM: its one parameter, for a function that reads the file, only when it is named.
	wantFileGrant := composesAgent(t, f.root, fn.Pkg) && f.param(t, "ToolsFileParameterName", params) != ""
	fileGrant := false
	// The Bedrock models (issue 20): a function that asks a model (its main reads the model key's parameter) may
	// invoke exactly the BedrockModelArns, only when some are named.
	wantBedrockGrant := configFields(t, f.root, fn.Pkg)["OpenAIAPIKeyParam"] && f.param(t, "BedrockModelArns", params) != ""
	bedrockGrant := false
	// The models file's keys under ModelKeysPath: the same functions, only when the parameter is set.
	wantKeysGrant := configFields(t, f.root, fn.Pkg)["OpenAIAPIKeyParam"] && f.param(t, "ModelKeysPath", params) != ""
	keysGrant := false
	// Completion signals (issue 21 item 4): a function whose main names the webhook's secret records runs' ends
	// (it runs turns or reaps), so it puts agentloop.run.finished on the default bus, and on no other.
	wantEventsGrant := configFields(t, f.root, fn.Pkg)["WebhookSecretParam"]
	eventsGrant := false
	// Handed-over runs (issue 21 item 1): a function whose main reads AGENT_CHAT_FUNCTION (the reaper) continues
	// them by invoking the chat function, and only it (the chat function's own grant is ChatSelfInvokePolicy).
	wantInvokeGrant := configFields(t, f.root, fn.Pkg)["ChatFunction"]
	invokeGrant := false

	var gotOps, gotParams, gotStates []string
	policies := list(fn.Props["Policies"])
	if len(policies) == 0 {
		t.Fatal("no Policies")
	}
	for _, p := range policies {
		doc, ok := p.(map[string]any)
		if !ok || doc["Statement"] == nil || len(doc) > 2 {
			t.Fatalf("policy %#v is not an inline policy document (managed policies and SAM policy templates are too broad to check)", p)
		}
		sts, conds := f.statements(t, doc, params)
		for i, st := range sts {
			if st["Effect"] != "Allow" || st["NotAction"] != nil || st["NotResource"] != nil || st["Condition"] != nil {
				t.Errorf("statement %#v: want a plain Allow with Action and Resource", st)
				continue
			}
			actions := list(st["Action"])
			resources := list(st["Resource"])
			var service string
			for _, a := range actions {
				s, _ := a.(string)
				svc, op, _ := strings.Cut(s, ":")
				if strings.Contains(op, "*") || (service != "" && svc != service) {
					t.Errorf("statement %v: action %q (one service per statement, no wildcards)", st["Sid"], s)
				}
				service = svc
				switch svc {
				case "dynamodb":
					gotOps = append(gotOps, s)
				case "states":
					gotStates = append(gotStates, s)
				}
			}
			switch service {
			case "dynamodb":
				if !reflect.DeepEqual(resources, tableResources) {
					t.Errorf("DynamoDB resources %#v, want only the table and its indexes %#v", resources, tableResources)
				}
			case "ssm":
				if reflect.DeepEqual(actions, []any{"ssm:GetParameter"}) {
					// The tools file's parameter (what ssmsecrets.ReadParameter calls): exactly its ARN, alone in its
					// statement, under a condition that holds exactly when ToolsFileParameterName is set.
					switch {
					case !reflect.DeepEqual(resources, []any{map[string]any{"Fn::Sub": toolsFileArn}}):
						t.Errorf("statement %v: ssm:GetParameter on %v, want only the ToolsFileParameterName parameter %s", st["Sid"], resources, toolsFileArn)
					case conds[i] == "" || f.condition(t, conds[i], map[string]string{"ToolsFileParameterName": ""}) ||
						!f.condition(t, conds[i], map[string]string{"ToolsFileParameterName": toolsFileParam}):
						t.Errorf("statement %v: the ToolsFileParameterName grant must be under a condition that holds exactly when it is set (it is under %q)", st["Sid"], conds[i])
					}
					fileGrant = true
					continue
				}
				if !reflect.DeepEqual(actions, []any{"ssm:GetParameters"}) {
					t.Errorf("SSM actions %v, want only ssm:GetParameters (what ssmsecrets calls)", actions)
				}
				for _, r := range resources {
					sub, _ := r.(map[string]any)
					s, _ := sub["Fn::Sub"].(string)
					// The one wildcard: the ToolsSecretsPath prefix (a path ending in "/": TestTemplateParameters),
					// alone in its statement, granted only under a condition that holds exactly when it is set.
					if s == toolsSecretsArn {
						switch {
						case len(resources) != 1:
							t.Errorf("statement %v: the ToolsSecretsPath grant shares its statement with %v", st["Sid"], resources)
						case conds[i] == "" || f.condition(t, conds[i], map[string]string{"ToolsSecretsPath": ""}) ||
							!f.condition(t, conds[i], map[string]string{"ToolsSecretsPath": toolsSecretsPath}):
							t.Errorf("statement %v: the ToolsSecretsPath grant must be under a condition that holds exactly when it is set (it is under %q)", st["Sid"], conds[i])
						}
						toolsGrant = true
						continue
					}
					// The other prefix: ModelKeysPath's, under the same rules.
					if s == modelKeysArn {
						switch {
						case len(resources) != 1:
							t.Errorf("statement %v: the ModelKeysPath grant shares its statement with %v", st["Sid"], resources)
						case conds[i] == "" || f.condition(t, conds[i], map[string]string{"ModelKeysPath": ""}) ||
							!f.condition(t, conds[i], map[string]string{"ModelKeysPath": modelKeysPath}):
							t.Errorf("statement %v: the ModelKeysPath grant must be under a condition that holds exactly when it is set (it is under %q)", st["Sid"], conds[i])
						}
						keysGrant = true
						continue
					}
					m := ssmParamArn.FindStringSubmatch(s)
					if m == nil {
						t.Errorf("SSM resource %#v is not one named parameter of this template", r)
						continue
					}
					gotParams = append(gotParams, m[1])
				}
			case "bedrock":
				want := []any{map[string]any{"Fn::Split": []any{",", ref("BedrockModelArns")}}}
				switch {
				case !reflect.DeepEqual(actions, []any{"bedrock:InvokeModelWithResponseStream"}):
					t.Errorf("statement %v: Bedrock actions %v, want only bedrock:InvokeModelWithResponseStream (what ConverseStream and InvokeModelWithResponseStream need)", st["Sid"], actions)
				case !reflect.DeepEqual(list(st["Resource"]), want) && !reflect.DeepEqual(st["Resource"], want[0]):
					t.Errorf("statement %v: Bedrock resources %#v, want exactly the BedrockModelArns", st["Sid"], st["Resource"])
				case conds[i] == "" || f.condition(t, conds[i], map[string]string{"BedrockModelArns": ""}) ||
					!f.condition(t, conds[i], map[string]string{"BedrockModelArns": bedrockModelArns}):
					t.Errorf("statement %v: the Bedrock grant must be under a condition that holds exactly when BedrockModelArns is set (it is under %q)", st["Sid"], conds[i])
				}
				bedrockGrant = true
			case "events":
				if !reflect.DeepEqual(actions, []any{"events:PutEvents"}) {
					t.Errorf("statement %v: EventBridge actions %v, want only events:PutEvents", st["Sid"], actions)
				}
				if want := []any{map[string]any{"Fn::Sub": defaultBusArn}}; !reflect.DeepEqual(resources, want) {
					t.Errorf("statement %v: EventBridge resources %#v, want only the default bus %s", st["Sid"], resources, defaultBusArn)
				}
				eventsGrant = true
			case "lambda":
				if !reflect.DeepEqual(actions, []any{"lambda:InvokeFunction"}) {
					t.Errorf("statement %v: Lambda actions %v, want only lambda:InvokeFunction", st["Sid"], actions)
				}
				if want := []any{map[string]any{"Fn::GetAtt": []any{"ChatFunction", "Arn"}}}; !reflect.DeepEqual(resources, want) {
					t.Errorf("statement %v: Lambda resources %#v, want only the chat function's ARN", st["Sid"], resources)
				}
				invokeGrant = true
			case "states":
				if want := []any{map[string]any{"Fn::Sub": stateMachineArn}}; !reflect.DeepEqual(resources, want) {
					t.Errorf("Step Functions resources %#v, want only the job state machine %#v", resources, want)
				}
			default:
				t.Errorf("statement %v grants %v: only DynamoDB, SSM, Step Functions, Bedrock, EventBridge and Lambda (the reaper's) are expected", st["Sid"], actions)
			}
		}
	}
	slices.Sort(gotOps)
	slices.Sort(gotParams)
	if !slices.Equal(gotOps, ops) {
		t.Errorf("DynamoDB actions %v, want exactly the operations lib/dynamo reaches from the function's store ports %v", gotOps, ops)
	}
	if !slices.Equal(gotParams, wantParams) {
		t.Errorf("SSM parameters %v, want exactly the ones main reads %v", gotParams, wantParams)
	}
	if toolsGrant != wantToolsGrant {
		t.Errorf("ssm:GetParameters on the ToolsSecretsPath prefix: %v, want %v (a function that reads the tools file, when the parameter is set)", toolsGrant, wantToolsGrant)
	}
	if keysGrant != wantKeysGrant {
		t.Errorf("ssm:GetParameters on the ModelKeysPath prefix: %v, want %v (a function that asks a model, when the parameter is set)", keysGrant, wantKeysGrant)
	}
	if bedrockGrant != wantBedrockGrant {
		t.Errorf("bedrock:InvokeModelWithResponseStream on the BedrockModelArns: %v, want %v (a function that asks a model, when the parameter is set)", bedrockGrant, wantBedrockGrant)
	}
	if invokeGrant != wantInvokeGrant {
		t.Errorf("lambda:InvokeFunction on the chat function: %v, want %v (a function whose main reads AGENT_CHAT_FUNCTION)", invokeGrant, wantInvokeGrant)
	}
	if eventsGrant != wantEventsGrant {
		t.Errorf("events:PutEvents on the default bus: %v, want %v (a function that records runs' ends: its main names the webhook secret)", eventsGrant, wantEventsGrant)
	}
	if fileGrant != wantFileGrant {
		t.Errorf("ssm:GetParameter on the ToolsFileParameterName parameter: %v, want %v (a function that reads the tools file, when the parameter is set)", fileGrant, wantFileGrant)
	}
	slices.Sort(gotStates)
	switch {
	case wantStates == nil && gotStates != nil:
		t.Errorf("Step Functions actions %v: %s starts no executions (its main does not read JOBS_STATE_MACHINE_ARN)", gotStates, fn.Pkg)
	case !slices.Equal(gotStates, wantStates):
		t.Errorf("Step Functions actions %v, want exactly the ones lib/sfn calls %v", gotStates, wantStates)
	}
}

// The SSM parameter names are template parameters that hold names, never values: they start with "/" (the
// policy ARNs are built as ...:parameter${Name}), an SSM path (…Path) is "/" + segments + "/" (the policies grant
// ...:parameter${Path}*), and no template parameter carries a secret value.
func TestTemplateParameters(t *testing.T) {
	t.Parallel()
	f := setup(t)
	secretish := regexp.MustCompile(`(?i)secret|key|token|password`)
	for name, p := range f.tmpl.Parameters {
		if p["NoEcho"] == true {
			t.Errorf("parameter %s is NoEcho: secrets belong in SSM, not in template parameters", name)
		}
		if !secretish.MatchString(name) {
			continue
		}
		if strings.HasSuffix(name, "Path") {
			// An SSM path whose parameters the functions may read (policies grant <path>*): empty, or "/" +
			// segments + "/", so the grant never reaches beyond the path (not "/", not a name prefix).
			pattern, _ := p["AllowedPattern"].(string)
			re, err := regexp.Compile(pattern)
			if err != nil || pattern == "" {
				t.Errorf("parameter %s: AllowedPattern %q", name, pattern)
				continue
			}
			for v, ok := range map[string]bool{fmt.Sprint(p["Default"]): true, "": true, "/agentloop/tools/": true, "/a/b/": true,
				"/": false, "/agentloop/tools": false, "agentloop/tools/": false, "//": false, "/a//b/": false, "/a/*/": false, "*": false, "sk-live-123": false} {
				if re.MatchString(v) != ok {
					t.Errorf("parameter %s: AllowedPattern %q matches %q: %v, want %v", name, pattern, v, !ok, ok)
				}
			}
			continue
		}
		if !strings.HasSuffix(name, "ParameterName") {
			t.Errorf("parameter %s looks like a secret value; pass an SSM parameter name (…ParameterName) or path (…Path) instead", name)
			continue
		}
		pattern, _ := p["AllowedPattern"].(string)
		def, _ := p["Default"].(string)
		if !strings.HasPrefix(pattern, "^/") || !regexp.MustCompile(pattern).MatchString(def) {
			t.Errorf("parameter %s: AllowedPattern %q must require a leading / and accept the default %q", name, pattern, def)
		}
	}
}

// samconfig.toml deploys with sensible defaults: a stack name, IAM capability for the function roles, a managed
// artifact bucket and a region.
func TestSamconfig(t *testing.T) {
	t.Parallel()
	f := setup(t)
	data, err := os.ReadFile(filepath.Join(f.root, "samconfig.toml"))
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{} // "section.key" → raw value
	section := ""
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("samconfig.toml: cannot read %q", line)
			}
			settings[section+"."+strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	for key, want := range map[string]string{
		"default.global.parameters.stack_name":   `"agentloop"`,
		"default.deploy.parameters.capabilities": `"CAPABILITY_IAM"`,
		"default.deploy.parameters.resolve_s3":   "true",
	} {
		if settings[key] != want {
			t.Errorf("%s = %q, want %q", key, settings[key], want)
		}
	}
	if settings["default.deploy.parameters.region"] == "" {
		t.Error("no default region")
	}
}

// Issue 19 item 1: the tools file may be kept in SSM. ToolsFileParameterName is empty (no grant) or one name in a
// hierarchy, so the grant ...:parameter${ToolsFileParameterName} names exactly one parameter (no path, no
// wildcard, no "/" alone); and a rule refuses it beside ToolsFile (the functions would read only one of the two).
func TestTemplateToolsFileParameter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p, ok := f.tmpl.Parameters["ToolsFileParameterName"]
	if !ok {
		t.Fatal("no ToolsFileParameterName parameter")
	}
	pattern, _ := p["AllowedPattern"].(string)
	re, err := regexp.Compile(pattern)
	if err != nil || pattern == "" || p["Default"] != "" {
		t.Fatalf("ToolsFileParameterName: AllowedPattern %q (%v), Default %#v, want a pattern and an empty default", pattern, err, p["Default"])
	}
	for v, ok := range map[string]bool{"": true, toolsFileParam: true, "/a": true, "/agentloop/tools.v2": true, "/a-b/c_d": true,
		"/": false, "/agentloop/": false, "agentloop/tools": false, "//a": false, "/a//b": false, "/a/*": false, "*": false, "/a b": false} {
		if re.MatchString(v) != ok {
			t.Errorf("ToolsFileParameterName: AllowedPattern %q matches %q: %v, want %v", pattern, v, !ok, ok)
		}
		// What the template accepts, the functions' configuration accepts too (and the reverse).
		if v != "" {
			_, err := config.Load(func(k string) string { return map[string]string{"AGENT_TOOLS_FILE": "ssm:" + v}[k] })
			if (err == nil) != ok {
				t.Errorf("AGENT_TOOLS_FILE=ssm:%s: config error %v, want one exactly when the template refuses it (%v)", v, err, !ok)
			}
		}
	}
	for _, tc := range []struct {
		params map[string]string
		ok     bool
	}{
		{nil, true},
		{map[string]string{"ToolsFile": "bundle/tools.yaml"}, true},
		{map[string]string{"ToolsFileParameterName": toolsFileParam}, true},
		{map[string]string{"ToolsFile": "bundle/tools.yaml", "ToolsFileParameterName": toolsFileParam}, false},
	} {
		ok := true
		for name, rule := range f.tmpl.Rules {
			if rule.RuleCondition != nil && !f.holds(t, rule.RuleCondition, tc.params) {
				continue
			}
			for _, a := range rule.Assertions {
				if !f.holds(t, a.Assert, tc.params) {
					ok = false
					t.Logf("rule %s refuses %v", name, tc.params)
				}
			}
		}
		if ok != tc.ok {
			t.Errorf("the template's rules accept %v: %v, want %v", tc.params, ok, tc.ok)
		}
	}
}
