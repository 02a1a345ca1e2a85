package deploytest_test

import (
	"go/ast"
	"reflect"
	"testing"
)

// callsBoot reports whether pkg's main calls boot.<name>.
func callsBoot(t *testing.T, root, pkg, name string) bool {
	t.Helper()
	found := false
	ast.Inspect(parseMain(t, root, pkg), func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "boot" && sel.Sel.Name == name {
				found = true
			}
		}
		return !found
	})
	return found
}

// Runs longer than one invocation and background runs (issue 21): the one function that continues its runs in
// itself (its main uses boot.SelfLauncher and serves continuation events, boot.StartContinuing) may invoke
// exactly itself, through one policy on its generated role; no other grant of lambda:* exists.
func TestTemplateSelfInvoke(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, fn := range f.funcs {
		launches := callsBoot(t, f.root, fn.Pkg, "SelfLauncher")
		if serves := callsBoot(t, f.root, fn.Pkg, "StartContinuing"); launches != serves {
			t.Errorf("%s: launches continuations %v, serves them %v: a function that invokes itself must take its own events", fn.Pkg, launches, serves)
		}
		if want := fn.ID == "ChatFunction"; launches != want {
			t.Errorf("%s launches continuations: %v, want %v (the chat function only)", fn.ID, launches, want)
		}
	}
	var grants []string
	for id, r := range f.tmpl.Resources {
		if r.Type == "AWS::IAM::Policy" {
			grants = append(grants, id)
		}
	}
	if len(grants) != 1 || grants[0] != "ChatSelfInvokePolicy" {
		t.Fatalf("IAM policies %v, want only ChatSelfInvokePolicy", grants)
	}
	p := f.tmpl.Resources["ChatSelfInvokePolicy"].Properties
	if !reflect.DeepEqual(list(p["Roles"]), []any{ref("ChatFunctionRole")}) {
		t.Errorf("ChatSelfInvokePolicy roles %#v, want only the chat function's generated role", p["Roles"])
	}
	doc, _ := p["PolicyDocument"].(map[string]any)
	sts := list(doc["Statement"])
	if len(sts) != 1 {
		t.Fatalf("ChatSelfInvokePolicy statements %#v, want one", sts)
	}
	st, _ := sts[0].(map[string]any)
	self := map[string]any{"Fn::GetAtt": []any{"ChatFunction", "Arn"}}
	if st["Effect"] != "Allow" || !reflect.DeepEqual(list(st["Action"]), []any{"lambda:InvokeFunction"}) ||
		!reflect.DeepEqual(list(st["Resource"]), []any{self}) || st["Condition"] != nil {
		t.Errorf("ChatSelfInvokePolicy statement %#v, want Allow lambda:InvokeFunction on the chat function's ARN only", st)
	}
}
