package storetest

import (
	"github.com/agentloop/agentloop/lib/agent"
)

func valueTests() []test {
	return group(valuePort,
		leaf[agent.ValueStore]{"PutGetListDelete", testValues},
		leaf[agent.ValueStore]{"NamespacesIsolated", testValueNamespaces},
		leaf[agent.ValueStore]{"OpaqueBytes", testValueBytes},
	)
}

func wantValues(e *env[agent.ValueStore], ns string, want ...agent.KV) {
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

func wantValue(e *env[agent.ValueStore], ns, key string, want []byte) {
	e.t.Helper()
	got, err := e.s.GetValue(e.ctx, ns, key)
	must(e.t, err, "GetValue("+ns+", "+key+")")
	sameBytes(e.t, "GetValue("+ns+", "+key+")", got, want)
}

func testValues(e *env[agent.ValueStore]) {
	t := e.t
	ns := "notes/" + e.id("user")
	for _, k := range []string{"b", "a", "c"} {
		must(t, e.s.PutValue(e.ctx, ns, k, []byte("value "+k)), "PutValue")
	}
	wantValue(e, ns, "a", []byte("value a"))
	wantValues(e, ns, agent.KV{Key: "a", Value: []byte("value a")}, agent.KV{Key: "b", Value: []byte("value b")},
		agent.KV{Key: "c", Value: []byte("value c")})

	must(t, e.s.PutValue(e.ctx, ns, "b", []byte("new b")), "PutValue(overwrite)")
	wantValue(e, ns, "b", []byte("new b"))

	must(t, e.s.DeleteValue(e.ctx, ns, "a"), "DeleteValue")
	_, err := e.s.GetValue(e.ctx, ns, "a")
	wantErr(t, err, agent.KindNotFound, "", "GetValue after delete")
	must(t, e.s.DeleteValue(e.ctx, ns, "a"), "DeleteValue again")
	must(t, e.s.DeleteValue(e.ctx, "notes/"+e.id("nobody"), "a"), "DeleteValue(unknown namespace)")
	wantValues(e, ns, agent.KV{Key: "b", Value: []byte("new b")}, agent.KV{Key: "c", Value: []byte("value c")})

	_, err = e.s.GetValue(e.ctx, ns, "zzz")
	wantErr(t, err, agent.KindNotFound, "", "GetValue(unknown key)")
	wantValues(e, "notes/"+e.id("nobody"))
}

// Namespaces that share a prefix must not leak into each other (a begins_with query would).
func testValueNamespaces(e *env[agent.ValueStore]) {
	t := e.t
	ns := "notes/" + e.id("user")
	spaces := []string{ns, ns + "0", ns + "/sub", "x" + ns}
	for _, s := range spaces {
		must(t, e.s.PutValue(e.ctx, s, "k", []byte("in "+s)), "PutValue")
	}
	for _, s := range spaces {
		wantValue(e, s, "k", []byte("in "+s))
		wantValues(e, s, agent.KV{Key: "k", Value: []byte("in " + s)})
	}
	must(t, e.s.DeleteValue(e.ctx, ns, "k"), "DeleteValue")
	wantValues(e, ns)
	for _, s := range spaces[1:] {
		wantValue(e, s, "k", []byte("in "+s))
	}
}

func testValueBytes(e *env[agent.ValueStore]) {
	t := e.t
	ns := "bin/" + e.id("user")
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	must(t, e.s.PutValue(e.ctx, ns, "all", all), "PutValue(all bytes)")
	must(t, e.s.PutValue(e.ctx, ns, "empty", []byte{}), "PutValue(empty)")
	must(t, e.s.PutValue(e.ctx, ns, "ünï/cødé key", []byte(`{"json":true}`)), "PutValue(unicode key)")
	wantValue(e, ns, "all", all)
	wantValue(e, ns, "empty", nil)
	wantValues(e, ns, agent.KV{Key: "all", Value: all}, agent.KV{Key: "empty"},
		agent.KV{Key: "ünï/cødé key", Value: []byte(`{"json":true}`)})
}
