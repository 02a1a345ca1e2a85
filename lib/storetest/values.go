package storetest

import (
	"github.com/agentloop/agentloop/lib/agent"
)

func valueTests() []test {
	return []test{
		{"PutGetListDelete", testValues},
		{"NamespacesIsolated", testValueNamespaces},
		{"OpaqueBytes", testValueBytes},
	}
}

func (e *env) wantValues(ns string, want ...agent.KV) {
	e.t.Helper()
	got, err := e.s.ListValues(e.ctx, ns)
	must(e.t, err, "ListValues")
	if len(got) != len(want) {
		e.t.Fatalf("ListValues(%s) = %s, want %s", ns, show(got), show(want))
	}
	for i := range want {
		if got[i].Key != want[i].Key {
			e.t.Fatalf("ListValues(%s)[%d].Key = %q, want %q", ns, i, got[i].Key, want[i].Key)
		}
		sameBytes(e.t, "ListValues("+ns+")["+want[i].Key+"]", got[i].Value, want[i].Value)
	}
}

func (e *env) wantValue(ns, key string, want []byte) {
	e.t.Helper()
	got, err := e.s.GetValue(e.ctx, ns, key)
	must(e.t, err, "GetValue("+ns+", "+key+")")
	sameBytes(e.t, "GetValue("+ns+", "+key+")", got, want)
}

func testValues(e *env) {
	t := e.t
	ns := "notes/" + e.id("user")
	for _, k := range []string{"b", "a", "c"} {
		must(t, e.s.PutValue(e.ctx, ns, k, []byte("value "+k)), "PutValue")
	}
	e.wantValue(ns, "a", []byte("value a"))
	e.wantValues(ns, agent.KV{Key: "a", Value: []byte("value a")}, agent.KV{Key: "b", Value: []byte("value b")},
		agent.KV{Key: "c", Value: []byte("value c")})

	must(t, e.s.PutValue(e.ctx, ns, "b", []byte("new b")), "PutValue(overwrite)")
	e.wantValue(ns, "b", []byte("new b"))

	must(t, e.s.DeleteValue(e.ctx, ns, "a"), "DeleteValue")
	_, err := e.s.GetValue(e.ctx, ns, "a")
	wantErr(t, err, agent.KindNotFound, "", "GetValue after delete")
	must(t, e.s.DeleteValue(e.ctx, ns, "a"), "DeleteValue again")
	must(t, e.s.DeleteValue(e.ctx, "notes/"+e.id("nobody"), "a"), "DeleteValue(unknown namespace)")
	e.wantValues(ns, agent.KV{Key: "b", Value: []byte("new b")}, agent.KV{Key: "c", Value: []byte("value c")})

	_, err = e.s.GetValue(e.ctx, ns, "zzz")
	wantErr(t, err, agent.KindNotFound, "", "GetValue(unknown key)")
	e.wantValues("notes/" + e.id("nobody"))
}

// Namespaces that share a prefix must not leak into each other (a begins_with query would).
func testValueNamespaces(e *env) {
	t := e.t
	ns := "notes/" + e.id("user")
	spaces := []string{ns, ns + "0", ns + "/sub", "x" + ns}
	for _, s := range spaces {
		must(t, e.s.PutValue(e.ctx, s, "k", []byte("in "+s)), "PutValue")
	}
	for _, s := range spaces {
		e.wantValue(s, "k", []byte("in "+s))
		e.wantValues(s, agent.KV{Key: "k", Value: []byte("in " + s)})
	}
	must(t, e.s.DeleteValue(e.ctx, ns, "k"), "DeleteValue")
	e.wantValues(ns)
	for _, s := range spaces[1:] {
		e.wantValue(s, "k", []byte("in "+s))
	}
}

func testValueBytes(e *env) {
	t := e.t
	ns := "bin/" + e.id("user")
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	must(t, e.s.PutValue(e.ctx, ns, "all", all), "PutValue(all bytes)")
	must(t, e.s.PutValue(e.ctx, ns, "empty", []byte{}), "PutValue(empty)")
	must(t, e.s.PutValue(e.ctx, ns, "ünï/cødé key", []byte(`{"json":true}`)), "PutValue(unicode key)")
	e.wantValue(ns, "all", all)
	e.wantValue(ns, "empty", nil)
	e.wantValues(ns, agent.KV{Key: "all", Value: all}, agent.KV{Key: "empty"},
		agent.KV{Key: "ünï/cødé key", Value: []byte(`{"json":true}`)})
}
