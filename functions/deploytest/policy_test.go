package deploytest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/sfn"
)

// storePorts names the store ports each function's components take (boot hands its *dynamo.Store to them), when
// that is less than the whole agent.Store: the sub-agent task touches only its job's item (jobs.SubagentStore);
// the reaper its own port (reaper.Store, which holds the leases it gives back), and the tools' recorded outcomes:
// tool state read only (boot's Tools without Jobs: agent.ReadOnlyValues) and jobs. Its DynamoDB actions are those
// the adapter's methods of these ports reach (REVIEW H11).
var storePorts = map[string][]reflect.Type{
	"./functions/subagent": {reflect.TypeFor[jobs.SubagentStore]()},
	"./functions/reaper": {reflect.TypeFor[reaper.Store](), reflect.TypeFor[agent.ValueReader](), reflect.TypeFor[agent.JobStore](),
		reflect.TypeFor[agent.EditCleaner](), reflect.TypeFor[agent.RunStubber](), // a dead edit's cleanup, a missing run's stub
		reflect.TypeFor[agent.SignalStore]()}, // the completion signals' sweep (lib/signals)
}

// storeMethods are the store methods fn's components may call.
func storeMethods(pkg string) []string {
	ports, ok := storePorts[pkg]
	if !ok {
		ports = []reflect.Type{reflect.TypeFor[agent.Store]()}
	}
	var names []string
	for _, p := range ports {
		for i := range p.NumMethod() {
			names = append(names, p.Method(i).Name)
		}
	}
	// The constructor and its options run in every function.
	return append(names, "New", "WithLogger")
}

// dynamoOps lists the DynamoDB operations that lib/dynamo's non-test code can reach from the functions and
// methods named entries: calls client.X(...) and dynamodb.NewXPaginator(...) in any function that the entries
// reach through references by name (a call, a method value, any use of the name), which over-approximates (a
// name shared by two methods, or a local variable, counts as a reference to both) but never misses a call.
func dynamoOps(t *testing.T, root string, entries []string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "lib", "dynamo", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	type decl struct {
		ops  map[string]bool
		refs map[string]bool
	}
	decls := map[string]*decl{} // by function or method name (methods of all receivers under one name)
	fset := token.NewFileSet()
	for _, p := range files {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, p, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			dd := decls[fd.Name.Name]
			if dd == nil {
				dd = &decl{ops: map[string]bool{}, refs: map[string]bool{}}
				decls[fd.Name.Name] = dd
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok {
						break
					}
					switch x := sel.X.(type) {
					case *ast.Ident:
						if x.Name == "client" {
							dd.ops["dynamodb:"+sel.Sel.Name] = true
						}
						if x.Name == "dynamodb" && strings.HasPrefix(sel.Sel.Name, "New") && strings.HasSuffix(sel.Sel.Name, "Paginator") {
							dd.ops["dynamodb:"+strings.TrimSuffix(strings.TrimPrefix(sel.Sel.Name, "New"), "Paginator")] = true
						}
					case *ast.SelectorExpr:
						if x.Sel.Name == "client" {
							dd.ops["dynamodb:"+sel.Sel.Name] = true
						}
					}
				case *ast.Ident:
					dd.refs[n.Name] = true
				}
				return true
			})
		}
	}
	seen := map[string]bool{}
	ops := map[string]bool{}
	var visit func(name string)
	visit = func(name string) {
		d := decls[name]
		if d == nil || seen[name] {
			return
		}
		seen[name] = true
		for op := range d.ops {
			ops[op] = true
		}
		for r := range d.refs {
			visit(r)
		}
	}
	for _, e := range entries {
		if decls[e] == nil {
			t.Errorf("lib/dynamo has no function or method %s", e)
		}
		visit(e)
	}
	if len(ops) == 0 {
		t.Fatal("found no DynamoDB calls in lib/dynamo")
	}
	out := make([]string, 0, len(ops))
	for op := range ops {
		out = append(out, op)
	}
	slices.Sort(out)
	return out
}

// statesOps are the Step Functions actions the Jobs adapter (lib/sfn) calls: the methods of its API.
func statesOps() []string {
	api := reflect.TypeFor[sfn.API]()
	var out []string
	for i := range api.NumMethod() {
		out = append(out, "states:"+api.Method(i).Name)
	}
	slices.Sort(out)
	return out
}

// The analysis sees through helpers: the whole store reaches every operation the adapter calls, and the jobs
// and queues alone reach a subset of them that holds at least their item reads and updates.
func TestDynamoOps(t *testing.T) {
	t.Parallel()
	root := setup(t).root
	all := dynamoOps(t, root, storeMethods("./functions/chat"))
	for _, op := range []string{"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:Query",
		"dynamodb:BatchGetItem", "dynamodb:BatchWriteItem"} {
		if !slices.Contains(all, op) {
			t.Errorf("the whole store reaches %v, not %s", all, op)
		}
	}
	sub := dynamoOps(t, root, storeMethods("./functions/subagent"))
	for _, op := range sub {
		if !slices.Contains(all, op) {
			t.Errorf("the job store reaches %s, which the whole store does not", op)
		}
	}
	for _, op := range []string{"dynamodb:GetItem", "dynamodb:UpdateItem"} {
		if !slices.Contains(sub, op) {
			t.Errorf("the job store reaches %v, not %s (GetJob, FinishJob)", sub, op)
		}
	}
}

// REVIEW H11: the reaper deletes no item, so the policy derived from its ports does not grant DeleteItem (its port
// used to embed the whole agent.ThreadStore, whose DeleteThread reaches it, and its tools held a ValueStore that
// can delete). BatchWriteItem stays: a message or segment over 300 KiB is written as chunk items (lib/dynamo
// doc.go), and the reaper writes the dead run's reply and the stream's final segment.
func TestReaperPolicyDeletesNothing(t *testing.T) {
	t.Parallel()
	ops := dynamoOps(t, setup(t).root, storeMethods("./functions/reaper"))
	if slices.Contains(ops, "dynamodb:DeleteItem") {
		t.Errorf("the reaper's store ports reach dynamodb:DeleteItem (%v)", ops)
	}
	if !slices.Contains(ops, "dynamodb:BatchWriteItem") {
		t.Errorf("the reaper's store ports do not reach dynamodb:BatchWriteItem (%v): its large writes are chunked", ops)
	}
}
