package toolsfile_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/toolsfile"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// TestValid: the worked file reads the same from YAML and from JSON, with every field where it was written.
func TestValid(t *testing.T) {
	t.Parallel()
	var files []*toolsfile.File
	for _, name := range []string{"valid.yaml", "valid.json"} {
		f, err := toolsfile.Load(filepath.Join("testdata", name), toolsfile.Options{Reserved: []string{"add_note"}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		files = append(files, f)
	}
	y, j := files[0], files[1]
	if y.Name != "valid.yaml" || j.Name != "valid.json" {
		t.Errorf("names %q %q", y.Name, j.Name)
	}
	// Lines differ between the two; everything else is the same.
	for _, f := range files {
		f.Name = ""
		for i := range f.MCPServers {
			f.MCPServers[i].Line = 0
		}
		for i := range f.HTTPTools {
			f.HTTPTools[i].Line = 0
			var v any
			_ = json.Unmarshal(f.HTTPTools[i].InputSchema, &v) // key order differs; compare values
			f.HTTPTools[i].InputSchema, _ = json.Marshal(v)
			for k, ex := range f.HTTPTools[i].InputExamples {
				_ = json.Unmarshal(ex, &v)
				f.HTTPTools[i].InputExamples[k], _ = json.Marshal(v)
			}
		}
	}
	if !reflect.DeepEqual(y, j) {
		t.Errorf("YAML and JSON differ:\n%+v\n%+v", y, j)
	}
	gh, docs, ticket := y.MCPServers[0], y.MCPServers[1], y.HTTPTools[0]
	if gh.Name != "github" || gh.URL != "https://mcp.example.com/mcp" || gh.Approval != toolsfile.ApprovalAnnotations ||
		gh.Timeout != 30*time.Second || gh.MaxOutputBytes != 65536 || strings.Join(gh.Include, ",") != "search_issues,get_issue" ||
		gh.Headers["Authorization"] != "Bearer ${ssm:/agentloop/github-token}" {
		t.Errorf("github %+v", gh)
	}
	if !docs.ForwardUserToken || docs.Approval != toolsfile.ApprovalAnnotations || strings.Join(docs.Exclude, ",") != "delete_page" {
		t.Errorf("docs %+v (approval defaults to annotations)", docs)
	}
	if ticket.Method != "POST" || ticket.Approval != toolsfile.ApprovalAlways || ticket.Timeout != 10*time.Second ||
		ticket.URL != "https://api.example.com/teams/{team}/tickets?notify={team}" || len(ticket.InputExamples) != 1 {
		t.Errorf("create_ticket %+v", ticket)
	}
	want := []toolsfile.Ref{{Scheme: "env", Name: "BACKEND_API_KEY"}, {Scheme: "ssm", Name: "/agentloop/backend-token"},
		{Scheme: "ssm", Name: "/agentloop/github-token"}}
	if got := y.Refs(); !reflect.DeepEqual(got, want) {
		t.Errorf("refs %v, want %v", got, want)
	}
}

// TestDefaults: an HTTP tool without method, schema or approval is a GET with an empty object schema whose
// approval goes by method; an empty file offers nothing.
func TestDefaults(t *testing.T) {
	t.Parallel()
	f, err := toolsfile.Parse("t.yaml", []byte("httpTools:\n  - name: ping\n    description: Ping.\n    url: https://api.example.com/ping\n"), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tl := f.HTTPTools[0]; tl.Method != "GET" || tl.Approval != "" || string(tl.InputSchema) != `{"type":"object","properties":{}}` {
		t.Errorf("%+v", tl)
	}
	for _, empty := range []string{"", "# nothing yet\n"} {
		if f, err := toolsfile.Parse("t.yaml", []byte(empty), toolsfile.Options{}); err != nil || len(f.MCPServers)+len(f.HTTPTools) != 0 {
			t.Errorf("%q: %+v %v", empty, f, err)
		}
	}
}

// TestErrors: every error names the file, the line and the field (golden: testdata/errors.golden).
func TestErrors(t *testing.T) {
	t.Parallel()
	const tool = "httpTools:\n  - name: t\n    description: d\n    url: https://api.example.com/x\n"
	cases := []struct{ name, file string }{
		{"not YAML", "mcpServers: [\n  - name: a\n"},
		{"not a mapping", "- a\n- b\n"},
		{"unknown top-level field", "mcpServer: []\n"},
		{"unknown field", tool + "    verb: GET\n"},
		{"duplicate key", tool + "    url: https://api.example.com/y\n"},
		{"bad method", tool + "    method: FETCH\n"},
		{"missing fields", "httpTools:\n  - method: GET\n"},
		{"bad name", "httpTools:\n  - name: create ticket\n    description: d\n    url: https://api.example.com/x\n"},
		{"double underscore", "httpTools:\n  - name: a__b\n    description: d\n    url: https://api.example.com/x\n"},
		{"name taken twice", tool + "  - name: t\n    description: d\n    url: https://api.example.com/y\n"},
		{"name of a Go tool", "httpTools:\n  - name: add_note\n    description: d\n    url: https://api.example.com/x\n"},
		{"relative url", "httpTools:\n  - name: t\n    description: d\n    url: /x\n"},
		{"ftp url", "mcpServers:\n  - name: s\n    url: ftp://example.com/mcp\n"},
		{"credentials in the url", "mcpServers:\n  - name: s\n    url: https://user:pw@example.com/mcp\n"},
		{"placeholder not in the schema", tool[:len(tool)-len("    url: https://api.example.com/x\n")] +
			"    url: https://api.example.com/teams/{team}\n    inputSchema: {type: object, properties: {id: {type: string}}}\n"},
		{"placeholder in the host", "httpTools:\n  - name: t\n    description: d\n    url: https://{host}.example.com/x\n" +
			"    inputSchema: {type: object, properties: {host: {type: string}}}\n"},
		{"schema not an object", tool + "    inputSchema: {type: string}\n"},
		{"schema invalid", tool + "    inputSchema: {type: object, properties: {n: {type: integer, minimum: one}}}\n"},
		{"example refused by the schema", tool + "    inputSchema: {type: object, properties: {n: {type: integer}}}\n    inputExamples: [{n: two}]\n"},
		{"timeout not a duration", tool + "    timeout: 10\n"},
		{"timeout out of bounds", tool + "    timeout: 1h\n"},
		{"maxOutputBytes not positive", tool + "    maxOutputBytes: 0\n"},
		{"maxOutputBytes not a number", tool + "    maxOutputBytes: lots\n"},
		{"http approval annotations", tool + "    approval: annotations\n"},
		{"mcp approval", "mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    approval: sometimes\n"},
		{"server name too long", "mcpServers:\n  - name: " + strings.Repeat("s", 62) + "\n    url: https://example.com/mcp\n"},
		{"server name ambiguous", "mcpServers:\n  - name: gh_\n    url: https://example.com/mcp\n"},
		{"servers with one name", "mcpServers:\n  - name: s\n    url: https://example.com/a\n  - name: s\n    url: https://example.com/b\n"},
		{"include composes an invalid name", "mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    include: [repo.list]\n"},
		{"include and exclude", "mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    include: [a]\n    exclude: [a]\n"},
		{"include clashes with an HTTP tool", "mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    include: [t]\n" +
			"httpTools:\n  - name: s__t\n    description: d\n    url: https://api.example.com/x\n"},
		{"include listed twice", "mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    include: [a, a]\n"},
		{"forwardUserToken and Authorization", "mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    forwardUserToken: true\n" +
			"    headers: {Authorization: \"Bearer ${env:T}\"}\n"},
		{"forwardUserToken not a bool", "mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    forwardUserToken: yes please\n"},
		{"headers not a mapping", tool + "    headers: [Authorization]\n"},
	}
	var golden strings.Builder
	for _, tc := range cases {
		_, err := toolsfile.Parse("tools.yaml", []byte(tc.file), toolsfile.Options{Reserved: []string{"add_note"}})
		var errs toolsfile.Errors
		if !errors.As(err, &errs) || len(errs) == 0 {
			t.Errorf("%s: err %v, want Errors", tc.name, err)
			continue
		}
		for _, e := range errs {
			if e.Line < 1 {
				t.Errorf("%s: %v has no line", tc.name, e)
			}
		}
		golden.WriteString("# " + tc.name + "\n" + err.Error() + "\n")
	}
	checkGolden(t, "errors.golden", golden.String())
}

// TestSecretReferences: header values hold references, never secrets; references must be well formed
// (golden: testdata/secrets.golden).
func TestSecretReferences(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, header, value string
		ok                  bool
	}{
		{"bearer from ssm", "Authorization", "Bearer ${ssm:/agentloop/token}", true},
		{"bearer from env", "Authorization", "Bearer ${env:BACKEND_TOKEN}", true},
		{"whole value a reference", "Authorization", "${ssm:/agentloop/authorization}", true},
		{"api key from env", "X-Api-Key", "${env:KEY}", true},
		{"two references", "X-Service-Token", "${env:A}${env:B}", true},
		{"an ordinary header", "Accept", "application/json", true},
		{"an ordinary header with a reference", "X-Tenant", "tenant-${env:TENANT}", true},
		{"a token type is not a token", "X-Token-Type", "jwt", true},
		{"inline bearer", "Authorization", "Bearer sk-live-1234567890", false},
		{"inline bearer in another header", "X-Forward-Auth", "bearer abc.def.ghi", false},
		{"inline basic", "Authorization", "Basic dXNlcjpwYXNz", false},
		{"inline api key", "X-Api-Key", "abcd1234", false},
		{"inline token beside a reference", "X-Service-Token", "abc${env:B}", false},
		{"inline cookie", "Cookie", "session=abc", false},
		{"unknown scheme", "Authorization", "Bearer ${vault:secret/token}", false},
		{"env name invalid", "X-Api-Key", "${env:1KEY}", false},
		{"ssm name relative", "X-Api-Key", "${ssm:agentloop/token}", false},
		{"unterminated", "X-Api-Key", "${env:KEY", false},
		{"two lines", "Accept", "a\nb", false},
	}
	var golden strings.Builder
	for _, tc := range cases {
		value, _ := json.Marshal(tc.value)
		file := "httpTools:\n  - name: t\n    description: d\n    url: https://api.example.com/x\n    headers:\n      " + tc.header + ": " + string(value) + "\n"
		f, err := toolsfile.Parse("tools.yaml", []byte(file), toolsfile.Options{})
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.name, err, tc.ok)
			continue
		}
		if err != nil {
			golden.WriteString("# " + tc.name + "\n" + err.Error() + "\n")
			continue
		}
		if f.HTTPTools[0].Headers[tc.header] != tc.value {
			t.Errorf("%s: header %q", tc.name, f.HTTPTools[0].Headers[tc.header])
		}
	}
	checkGolden(t, "secrets.golden", golden.String())
}

// Issue 19: in Lambda (Options.SSMScoped) an ${ssm:…} reference must lie under the SSM path the functions'
// roles may read; one outside it, or any when no path is set, is an error naming the file, the line, the field
// and the path, before anything asks SSM. ${env:…} references and unscoped parsing (agentloop dev) are not
// bounded.
func TestSSMScope(t *testing.T) {
	t.Parallel()
	file := `httpTools:
  - name: t
    description: d
    url: https://api.example.com/x
    headers:
      X-Tenant: "${env:TENANT}"
      Authorization: "Bearer ${ssm:%s}"
`
	for _, tc := range []struct {
		name, param string
		o           toolsfile.Options
		want        string // "" when accepted
	}{
		{"unscoped", "/elsewhere/token", toolsfile.Options{}, ""},
		{"under the path", "/agentloop/tools/token", toolsfile.Options{SSMScoped: true, SSMPrefix: "/agentloop/tools/"}, ""},
		{"deeper under the path", "/agentloop/tools/a/b", toolsfile.Options{SSMScoped: true, SSMPrefix: "/agentloop/tools/"}, ""},
		{"outside the path", "/agentloop/agent-secret", toolsfile.Options{SSMScoped: true, SSMPrefix: "/agentloop/tools/"},
			"tools.yaml:7: httpTools[0].headers.Authorization: ${ssm:/agentloop/agent-secret} is outside the SSM path the functions may read, /agentloop/tools/ (AGENT_TOOLS_SECRETS_PATH"},
		{"a sibling of the path", "/agentloop/toolsx/token", toolsfile.Options{SSMScoped: true, SSMPrefix: "/agentloop/tools/"},
			"tools.yaml:7: httpTools[0].headers.Authorization: ${ssm:/agentloop/toolsx/token} is outside the SSM path the functions may read, /agentloop/tools/"},
		{"no path", "/agentloop/tools/token", toolsfile.Options{SSMScoped: true},
			"tools.yaml:7: httpTools[0].headers.Authorization: ${ssm:/agentloop/tools/token}: no SSM path is granted to read it from (set AGENT_TOOLS_SECRETS_PATH"},
	} {
		_, err := toolsfile.Parse("tools.yaml", []byte(fmt.Sprintf(file, tc.param)), tc.o)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %s", tc.name, err, tc.want)
		}
	}
}

// TestResolve: references resolve through the wiring's resolvers, by scheme; a scheme with none, or an unset
// variable, is an error that names them; Expand writes the values into a header.
func TestResolve(t *testing.T) {
	t.Parallel()
	f, err := toolsfile.Load(filepath.Join("testdata", "valid.yaml"), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := toolsfile.EnvResolver(func(name string) string { return map[string]string{"BACKEND_API_KEY": "k1"}[name] })
	ssm := resolverFunc(func(_ context.Context, refs []toolsfile.Ref) (map[toolsfile.Ref]string, error) {
		out := map[toolsfile.Ref]string{}
		for _, r := range refs {
			if r.Scheme != toolsfile.RefSSM {
				t.Errorf("the SSM resolver got %v", r)
			}
			out[r] = "v" + r.Name
		}
		return out, nil
	})
	secrets, err := f.Resolve(context.Background(), toolsfile.Resolvers{toolsfile.RefEnv: env, toolsfile.RefSSM: ssm})
	if err != nil {
		t.Fatal(err)
	}
	h := f.HTTPTools[0].Headers
	if got := secrets.Expand(h["Authorization"]); got != "Bearer v/agentloop/backend-token" {
		t.Errorf("Authorization %q", got)
	}
	if got := secrets.Expand(h["X-Api-Key"]); got != "k1" {
		t.Errorf("X-Api-Key %q", got)
	}
	if _, err := f.Resolve(context.Background(), toolsfile.Resolvers{toolsfile.RefEnv: env}); err == nil ||
		!strings.Contains(err.Error(), "ssm references cannot be resolved here") {
		t.Errorf("no SSM resolver: %v", err)
	}
	unset := toolsfile.EnvResolver(func(string) string { return "" })
	if _, err := f.Resolve(context.Background(), toolsfile.Resolvers{toolsfile.RefEnv: unset, toolsfile.RefSSM: ssm}); err == nil ||
		!strings.Contains(err.Error(), "BACKEND_API_KEY") {
		t.Errorf("unset variable: %v", err)
	}
}

type resolverFunc func(context.Context, []toolsfile.Ref) (map[toolsfile.Ref]string, error)

func (f resolverFunc) Resolve(ctx context.Context, refs []toolsfile.Ref) (map[toolsfile.Ref]string, error) {
	return f(ctx, refs)
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update to rewrite it):\n--- got\n%s--- want\n%s", name, got, want)
	}
}

// Issue 19 item 5: alwaysOn (an added field) marks an HTTP tool, or every tool of an MCP server, to be offered
// in every step when a router narrows a large catalog; it defaults to false and must be a boolean.
func TestAlwaysOn(t *testing.T) {
	t.Parallel()
	f, err := toolsfile.Parse("t.yaml", []byte("mcpServers:\n  - name: s\n    url: https://example.com/mcp\n    alwaysOn: true\n"+
		"  - name: r\n    url: https://example.com/r\n"+
		"httpTools:\n  - name: ping\n    description: Ping.\n    url: https://api.example.com/ping\n    alwaysOn: true\n"+
		"  - name: pong\n    description: Pong.\n    url: https://api.example.com/pong\n"), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !f.MCPServers[0].AlwaysOn || f.MCPServers[1].AlwaysOn || !f.HTTPTools[0].AlwaysOn || f.HTTPTools[1].AlwaysOn {
		t.Errorf("alwaysOn read as %v %v %v %v, want true false true false", f.MCPServers[0].AlwaysOn, f.MCPServers[1].AlwaysOn,
			f.HTTPTools[0].AlwaysOn, f.HTTPTools[1].AlwaysOn)
	}
	_, err = toolsfile.Parse("t.yaml", []byte("httpTools:\n  - name: ping\n    description: Ping.\n    url: https://api.example.com/ping\n    alwaysOn: often\n"), toolsfile.Options{})
	if err == nil || !strings.Contains(err.Error(), "t.yaml:5: httpTools[0].alwaysOn") {
		t.Errorf("alwaysOn: often: %v, want an error at t.yaml:5 naming httpTools[0].alwaysOn", err)
	}
}

// params is the tools file's SSM parameter store, a ParamReader over a map: in the functions the reader is
// lib/ssmsecrets.ReadParameter over the SDK's client (tested there and in functions/internal/boot against a fake
// SSM endpoint; real SSM cannot run here), so this package sees only values and errors.
type params map[string]string

func (p params) ReadParameter(_ context.Context, name string) (string, error) {
	v, ok := p[name]
	if !ok {
		return "", fmt.Errorf("SSM parameter %s does not exist", name)
	}
	return v, nil
}

// Issue 19 item 1: AGENT_TOOLS_FILE=ssm:<name> reads the whole file from that SSM parameter, YAML or JSON told by
// the content (there is no extension), checked as a file is with the parameter's name where a file's would be;
// its ${ssm:…} references still resolve through the scoped resolver. A missing parameter, or a process that reads
// no SSM (params nil: agentloop dev), fails the start naming the parameter.
func TestReadFromSSM(t *testing.T) {
	t.Parallel()
	yamlFile, err := os.ReadFile(filepath.Join("testdata", "valid.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	jsonFile, err := os.ReadFile(filepath.Join("testdata", "valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	store := params{
		"/agentloop/tools":      string(yamlFile),
		"/agentloop/tools-json": string(jsonFile),
		"/agentloop/tools-bad":  "httpTools:\n  - name: t\n    description: d\n    url: https://api.example.com/x\n    method: FETCH\n",
		"/agentloop/tools-scope": "httpTools:\n  - name: t\n    description: d\n    url: https://api.example.com/x\n" +
			"    headers: {Authorization: \"Bearer ${ssm:/elsewhere/token}\"}\n",
	}
	scoped := toolsfile.Options{Reserved: []string{"add_note"}, SSMScoped: true, SSMPrefix: "/agentloop/"}
	tests := []struct {
		name    string
		source  string
		params  toolsfile.ParamReader
		tools   []string // the HTTP tools read, when it reads
		wantErr string   // in the error, when it fails
	}{
		{name: "YAML", source: "ssm:/agentloop/tools", params: store, tools: []string{"create_ticket"}},
		{name: "JSON", source: "ssm:/agentloop/tools-json", params: store, tools: []string{"create_ticket"}},
		{name: "a path is still a file", source: filepath.Join("testdata", "valid.yaml"), tools: []string{"create_ticket"}},
		{name: "missing parameter", source: "ssm:/agentloop/gone", params: store, wantErr: "tools file ssm:/agentloop/gone: SSM parameter /agentloop/gone does not exist"},
		{name: "error names the parameter and line", source: "ssm:/agentloop/tools-bad", params: store,
			wantErr: `/agentloop/tools-bad:5: httpTools[0].method: "FETCH" is not an HTTP method`},
		{name: "references stay scoped", source: "ssm:/agentloop/tools-scope", params: store,
			wantErr: "/agentloop/tools-scope:5: httpTools[0].headers.Authorization: ${ssm:/elsewhere/token} is outside the SSM path"},
		{name: "no SSM here", source: "ssm:/agentloop/tools", wantErr: "tools file ssm:/agentloop/tools: this process reads no SSM parameters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := toolsfile.Read(context.Background(), tt.source, scoped, tt.params)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to say %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, h := range f.HTTPTools {
				got = append(got, h.Name)
			}
			if !reflect.DeepEqual(got, tt.tools) || len(f.MCPServers) != 2 {
				t.Errorf("read %v and %d servers, want %v and 2", got, len(f.MCPServers), tt.tools)
			}
			if name, ok := toolsfile.SSMParameter(tt.source); ok && f.Name != name {
				t.Errorf("Name = %q, want the parameter %q (errors name it)", f.Name, name)
			}
		})
	}
}

// Startup reads the SSM form too, resolving the file's references as for a file.
func TestStartupFromSSM(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("testdata", "valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	resolve := toolsfile.Resolvers{
		toolsfile.RefEnv: toolsfile.EnvResolver(func(string) string { return "k1" }),
		toolsfile.RefSSM: resolverFunc(func(_ context.Context, refs []toolsfile.Ref) (map[toolsfile.Ref]string, error) {
			out := map[toolsfile.Ref]string{}
			for _, r := range refs {
				out[r] = "v" + r.Name
			}
			return out, nil
		}),
	}
	f, secrets, err := toolsfile.Startup(context.Background(), "ssm:/agentloop/tools", toolsfile.Options{}, resolve,
		params{"/agentloop/tools": string(data)}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := secrets.Expand(f.HTTPTools[0].Headers["Authorization"]); got != "Bearer v/agentloop/backend-token" {
		t.Errorf("Authorization %q", got)
	}
}
