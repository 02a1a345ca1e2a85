// Package toolsfile reads the tools file (AGENT_TOOLS_FILE): the MCP servers and HTTP tools a deployment offers
// the model besides its Go tools, in YAML or JSON (JSON is YAML; one parser: go.yaml.in/yaml/v3). The file is
// checked whole at cold start, and every error names the file, the line and the field:
//
//	tools.yaml:12: httpTools[0].method: "FETCH" is not an HTTP method (want GET, POST, PUT, PATCH or DELETE)
//
// # The shape (a public interface: fields may be added, never renamed)
//
//	mcpServers:                       # each server's tools are offered as <name>__<tool>
//	  - name: github                  # ^[a-zA-Z0-9_-]+$, no "__", not ending in "_", at most 61 characters
//	    url: https://mcp.example.com/mcp   # absolute http(s), no credentials in it
//	    headers: {Authorization: "Bearer ${ssm:/agentloop/github-token}"}
//	    forwardUserToken: false       # true: the end user's JWT goes in Authorization (no Authorization header then)
//	    include: [search_issues]      # only these tools (the server's names); exclude: all but these
//	    exclude: []
//	    approval: annotations         # never | always | annotations (default)
//	    timeout: 30s                  # a Go duration, MinTimeout to MaxTimeout (default: the engine's tool timeout)
//	    maxOutputBytes: 65536         # 1 to MaxOutputBytes (default: the transcript's tool output cap)
//	    accept: {search_issues: 0123456789abcdef}   # a changed definition accepted (lib/mcptools, "Pinning")
//	    alwaysOn: false               # true: a router narrowing a large catalog offers every tool of it in every step
//	httpTools:
//	  - name: create_ticket           # ^[a-zA-Z0-9_-]{1,64}$, no "__" (kept for MCP names)
//	    description: Open a support ticket.
//	    inputSchema: {type: object, properties: {title: {type: string}, team: {type: string}}, required: [title]}
//	    inputExamples: [{title: "Printer on fire", team: ops}]   # each must pass inputSchema
//	    method: POST                  # GET (default), POST, PUT, PATCH, DELETE
//	    url: https://api.example.com/teams/{team}/tickets   # {name}: an inputSchema property, path or query only
//	    headers: {Authorization: "Bearer ${ssm:/agentloop/backend-token}"}
//	    approval: always              # never | always; omitted: GET never asks, other methods ask when the
//	                                  # thread's reviewTools setting is on
//	    timeout: 10s
//	    maxOutputBytes: 32768
//	    alwaysOn: false               # true: offered in every step when a router narrows a large catalog
//
// Unknown fields are errors, and so are duplicate keys and names used twice (an HTTP tool's name, a server's
// name, and any composed <server>__<tool> of an include list, also against the Go tools' names: Options.Reserved).
//
// # Secrets are references, never values
//
// A header value may hold references, ${env:NAME} (an environment variable) or ${ssm:/parameter/name} (an SSM
// SecureString parameter), inside other text ("Bearer ${ssm:/x}"). Anything else in ${…} is an error. A header
// that carries credentials by its name (Authorization, Proxy-Authorization, Cookie, X-Api-Key, Api-Key, and names
// ending in -Key, -Token, -Secret or -Password) must take its credential from references: its value, with the
// references taken out, may be empty or, for the Authorization headers, one scheme word ("Bearer"). Any header
// whose value starts "Bearer <literal>" is refused too. Other headers are not guessed at (no false positives on
// ordinary values). References are resolved through a Resolver the wiring fills (EnvResolver for ${env:…}; the
// functions' SSM one over lib/ssmsecrets for ${ssm:…}). In Lambda an ${ssm:…} reference must name a parameter
// under the path the functions' roles may read (Options.SSMScoped, AGENT_TOOLS_SECRETS_PATH); one outside it is
// an error at its line.
//
// # Where the file is
//
// AGENT_TOOLS_FILE is a path (in AWS a file bundled with the functions) or ssm:<parameter name>, e.g.
// ssm:/agentloop/tools: the whole file is the value of that SSM parameter (String or SecureString, read with
// decryption through a ParamReader the wiring fills; standard parameters hold 4 KB, advanced ones 8 KB). It has no
// extension, and needs none: YAML or JSON is told by the content, as for a file, and errors name the parameter
// where they name a file:
//
//	/agentloop/tools:12: httpTools[0].method: "FETCH" is not an HTTP method (want GET, POST, PUT, PATCH or DELETE)
//
// The wiring reads the file at cold start (Startup: a bad file fails it, and so does a reference that cannot be
// resolved) and builds the tool sources from it: lib/httptools for httpTools, lib/mcptools for mcpServers. This
// package is configuration, not an adapter: the tool sources import its types (and nothing else of each other).
package toolsfile

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agentloop/agentloop/lib/yamlcheck"
)

// Bounds of the per-tool settings.
const (
	MinTimeout     = 100 * time.Millisecond
	MaxTimeout     = 10 * time.Minute // below the run's wall clock (engine.DefaultRunTimeout)
	MaxOutputBytes = 8 << 20
	// MaxFileBytes bounds the file itself.
	MaxFileBytes = 1 << 20
	// MaxNameLen is the providers' limit on a tool's name.
	MaxNameLen = 64
)

// Approval policies a file may name.
const (
	ApprovalNever       = "never"
	ApprovalAlways      = "always"
	ApprovalAnnotations = "annotations" // MCP only: destructiveHint asks, readOnlyHint never asks, else reviewTools decides
)

// File is a checked tools file.
type File struct {
	// Name is the file's name as errors show it.
	Name       string
	MCPServers []MCPServer
	HTTPTools  []HTTPTool
}

// MCPServer is one entry of mcpServers.
type MCPServer struct {
	Name string
	URL  string
	// Headers are sent as written, after their references are resolved (Secrets.Expand).
	Headers          map[string]string
	ForwardUserToken bool
	Include, Exclude []string
	// Approval is never, always or annotations (the default).
	Approval string
	// Timeout and MaxOutputBytes: zero means the engine's default.
	Timeout        time.Duration
	MaxOutputBytes int
	// Accept lets changed definitions be offered again: the server's tool name → the hash of the definition
	// accepted (the one the mcp.definition_changed log line printed). See lib/mcptools, "Pinning".
	Accept map[string]string
	// AlwaysOn: every tool of the server is offered in every step, whatever a router chooses (agent.Tool.AlwaysOn).
	AlwaysOn bool
	// Line is where the entry starts in the file.
	Line int
}

// HTTPTool is one entry of httpTools.
type HTTPTool struct {
	Name          string
	Description   string
	InputSchema   json.RawMessage
	InputExamples []json.RawMessage
	Method        string
	// URL is the template: {name} stands for the input property name (path and query only).
	URL     string
	Headers map[string]string
	// Approval is never, always, or "" (by method: GET never asks, other methods ask when the thread's
	// reviewTools setting is on).
	Approval       string
	Timeout        time.Duration
	MaxOutputBytes int
	// AlwaysOn: offered in every step, whatever a router chooses (agent.Tool.AlwaysOn).
	AlwaysOn bool
	Line     int
}

// Options adjust the check.
type Options struct {
	// Reserved are the names already taken (the Go tools'): no tool of the file may use one.
	Reserved []string
	// SSMScoped bounds the ${ssm:…} references to the parameters under SSMPrefix (a path ending in "/"; empty:
	// none), each one outside it an error at its line. The Lambda wiring sets it: a function's role may read only
	// the parameters under AGENT_TOOLS_SECRETS_PATH (the template's ToolsSecretsPath), so a reference outside it
	// fails the cold start here, by line, rather than as AccessDenied from SSM.
	SSMScoped bool
	SSMPrefix string
}

// ssmScopeError is why ref, an ${ssm:…} reference, may not be read under o ("" when it may).
func (o Options) ssmScopeError(ref Ref) string {
	switch {
	case ref.Scheme != RefSSM || !o.SSMScoped || (o.SSMPrefix != "" && strings.HasPrefix(ref.Name, o.SSMPrefix)):
		return ""
	case o.SSMPrefix == "":
		return fmt.Sprintf("%s: no SSM path is granted to read it from (set AGENT_TOOLS_SECRETS_PATH, the template's ToolsSecretsPath, to a prefix that holds it, e.g. /agentloop/tools/)", ref)
	}
	return fmt.Sprintf("%s is outside the SSM path the functions may read, %s (AGENT_TOOLS_SECRETS_PATH, the template's ToolsSecretsPath): move the parameter under it", ref, o.SSMPrefix)
}

// Load reads and checks the file at path (errors name it by its base name).
func Load(path string, o Options) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tools file: %w", err)
	}
	return Parse(filepath.Base(path), data, o)
}

// SSMSource starts AGENT_TOOLS_FILE's SSM form: ssm:/agentloop/tools is the file kept in that SSM parameter.
const SSMSource = "ssm:"

// SSMParameter returns the parameter name of source when it is the SSM form (ssm:<name>).
func SSMParameter(source string) (name string, ok bool) { return strings.CutPrefix(source, SSMSource) }

// ParamReader reads one SSM parameter's value, String or SecureString, decrypted. The functions' reads through
// lib/ssmsecrets (ReadParameter); `agentloop dev` has none.
type ParamReader interface {
	ReadParameter(ctx context.Context, name string) (string, error)
}

// Read reads and checks the tools file source: a path (Load), or ssm:<name>, read through params (nil: the SSM
// form is refused) and checked as Parse checks a file called name.
func Read(ctx context.Context, source string, o Options, params ParamReader) (*File, error) {
	name, ok := SSMParameter(source)
	if !ok {
		return Load(source, o)
	}
	if params == nil {
		return nil, fmt.Errorf("tools file %s: this process reads no SSM parameters", source)
	}
	data, err := params.ReadParameter(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("tools file %s: %w", source, err)
	}
	return Parse(name, []byte(data), o)
}

// Parse checks data, the contents of the file called name. The error, when there is one, is an Errors.
func Parse(name string, data []byte, o Options) (*File, error) {
	p := &parser{Checker: yamlcheck.Checker{File: name}, o: o}
	f := &File{Name: name}
	if len(data) > MaxFileBytes {
		p.Errs = append(p.Errs, Error{File: name, Line: 1, Msg: fmt.Sprintf("the file is %d bytes, the limit is %d", len(data), MaxFileBytes)})
		return nil, p.Errs
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.Errs = append(p.Errs, yamlcheck.SyntaxError(name, err))
		return nil, p.Errs
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return f, nil // an empty file offers nothing
	}
	root := doc.Content[0]
	p.Mapping(root, "", map[string]func(*yaml.Node, string){
		"mcpServers": func(n *yaml.Node, path string) {
			p.Sequence(n, path, func(item *yaml.Node, path string) { f.MCPServers = append(f.MCPServers, p.mcpServer(item, path)) })
		},
		"httpTools": func(n *yaml.Node, path string) {
			p.Sequence(n, path, func(item *yaml.Node, path string) { f.HTTPTools = append(f.HTTPTools, p.httpTool(item, path)) })
		},
	})
	p.names(f)
	if len(p.Errs) > 0 {
		p.Errs.Sort()
		return nil, p.Errs
	}
	return f, nil
}

// Error is one problem of the file: file:line: field: message.
type Error = yamlcheck.Error

// Errors are all the problems of a file, by line.
type Errors = yamlcheck.Errors
