package toolsfile

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agentloop/agentloop/lib/toolschema"
	"github.com/agentloop/agentloop/lib/yamlcheck"
)

// parser walks the YAML nodes, so every error knows its line and field.
type parser struct {
	yamlcheck.Checker // File, Errs: every problem by line and field
	o                 Options
}

func (p *parser) boolean(n *yaml.Node, path string) bool {
	n = yamlcheck.Resolve(n)
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		p.Errorf(n, path, "want true or false, got %s", yamlcheck.KindOf(n))
	}
	return b
}

func (p *parser) strings(n *yaml.Node, path string) []string {
	var out []string
	seen := map[string]bool{}
	p.Sequence(n, path, func(c *yaml.Node, path string) {
		s, ok := p.Str(c, path)
		switch {
		case !ok:
		case strings.TrimSpace(s) == "":
			p.Errorf(c, path, "must not be empty")
		case seen[s]:
			p.Errorf(c, path, "%q is listed twice", s)
		default:
			seen[s] = true
			out = append(out, s)
		}
	})
	return out
}

func (p *parser) timeout(n *yaml.Node, path string) time.Duration {
	n = yamlcheck.Resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.Errorf(n, path, "want a duration such as 30s, got %s", yamlcheck.KindOf(n))
		return 0
	}
	s := n.Value
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		p.Errorf(n, path, "%q is not a duration (write e.g. 30s or 2m)", s)
	case d < MinTimeout || d > MaxTimeout:
		p.Errorf(n, path, "%s is out of bounds (%s to %s)", d, MinTimeout, MaxTimeout)
	}
	return d
}

func (p *parser) maxOutput(n *yaml.Node, path string) int {
	n = yamlcheck.Resolve(n)
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		p.Errorf(n, path, "want a whole number of bytes, got %s", yamlcheck.KindOf(n))
		return 0
	}
	if v < 1 || v > MaxOutputBytes {
		p.Errorf(n, path, "%d is out of bounds (1 to %d)", v, MaxOutputBytes)
	}
	return v
}

func (p *parser) approval(n *yaml.Node, path string, allowed ...string) string {
	s, ok := p.Str(n, path)
	if ok && !slices.Contains(allowed, s) {
		p.Errorf(n, path, "%q is not an approval policy (want %s)", s, yamlcheck.OrList(allowed))
	}
	return s
}

// json converts a YAML value to JSON (mappings must have string keys).
func (p *parser) json(n *yaml.Node, path string) (json.RawMessage, bool) {
	var v any
	if err := yamlcheck.Resolve(n).Decode(&v); err != nil {
		p.Errorf(n, path, "cannot be read: %v", err)
		return nil, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		p.Errorf(n, path, "is not JSON-compatible (mapping keys must be strings)")
		return nil, false
	}
	return b, true
}

var (
	nameRE       = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
	headerNameRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

var definitionHashRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// accepts checks an MCP server's accept: a mapping of the server's tool names to definition hashes.
func (p *parser) accepts(n *yaml.Node, path string) map[string]string {
	n = yamlcheck.Resolve(n)
	if n.Kind != yaml.MappingNode {
		p.Errorf(n, path, "want a mapping of tool names to definition hashes, got %s", yamlcheck.KindOf(n))
		return nil
	}
	out := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := yamlcheck.Join(path, k.Value)
		if _, dup := out[k.Value]; dup {
			p.Errorf(k, field, "given twice")
			continue
		}
		h, ok := p.Str(v, field)
		if !ok {
			continue
		}
		if !definitionHashRE.MatchString(h) {
			p.Errorf(v, field, "%q is not a definition hash (16 hex digits, as the mcp.definition_changed log line gives it)", h)
			continue
		}
		out[k.Value] = h
	}
	return out
}

func (p *parser) headers(n *yaml.Node, path string) map[string]string {
	n = yamlcheck.Resolve(n)
	if n.Kind != yaml.MappingNode {
		p.Errorf(n, path, "want a mapping of header names to values, got %s", yamlcheck.KindOf(n))
		return nil
	}
	out := map[string]string{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := yamlcheck.Join(path, k.Value)
		canon := strings.ToLower(k.Value)
		switch {
		case k.Kind != yaml.ScalarNode || !headerNameRE.MatchString(k.Value):
			p.Errorf(k, field, "is not a valid header name")
			continue
		case seen[canon]:
			p.Errorf(k, field, "given twice")
			continue
		}
		seen[canon] = true
		val, ok := p.Str(v, field)
		if !ok {
			continue
		}
		if strings.ContainsAny(val, "\r\n") {
			p.Errorf(v, field, "a header value must be one line")
			continue
		}
		if msg := checkHeaderValue(k.Value, val); msg != "" {
			p.Errorf(v, field, "%s", msg)
			continue
		}
		refs, _ := parseRefs(val) // checked above
		scoped := true
		for _, ref := range refs {
			if msg := p.o.ssmScopeError(ref); msg != "" {
				p.Errorf(v, field, "%s", msg)
				scoped = false
			}
		}
		if !scoped {
			continue
		}
		out[k.Value] = val
	}
	return out
}

// checkURL checks an absolute http(s) URL without credentials; it returns the parsed URL (nil on error).
func (p *parser) checkURL(n *yaml.Node, path, raw string) *url.URL {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		p.Errorf(n, path, "%q is not a URL", raw)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		p.Errorf(n, path, "%q is not an absolute http or https URL", raw)
	case u.User != nil:
		p.Errorf(n, path, "credentials in the URL: send them in a header, as a reference (${ssm:/...})")
	default:
		return u
	}
	return nil
}

func (p *parser) mcpServer(n *yaml.Node, path string) MCPServer {
	s := MCPServer{Line: n.Line, Approval: ApprovalAnnotations}
	present := p.Mapping(n, path, map[string]func(*yaml.Node, string){
		"name": func(v *yaml.Node, f string) {
			if s.Name, _ = p.Str(v, f); s.Name != "" {
				p.serverName(v, f, s.Name)
			}
		},
		"url": func(v *yaml.Node, f string) {
			if s.URL, _ = p.Str(v, f); s.URL != "" {
				p.checkURL(v, f, s.URL)
			}
		},
		"headers":          func(v *yaml.Node, f string) { s.Headers = p.headers(v, f) },
		"forwardUserToken": func(v *yaml.Node, f string) { s.ForwardUserToken = p.boolean(v, f) },
		"include":          func(v *yaml.Node, f string) { s.Include = p.strings(v, f) },
		"exclude":          func(v *yaml.Node, f string) { s.Exclude = p.strings(v, f) },
		"approval": func(v *yaml.Node, f string) {
			s.Approval = p.approval(v, f, ApprovalNever, ApprovalAlways, ApprovalAnnotations)
		},
		"timeout":        func(v *yaml.Node, f string) { s.Timeout = p.timeout(v, f) },
		"maxOutputBytes": func(v *yaml.Node, f string) { s.MaxOutputBytes = p.maxOutput(v, f) },
		"accept":         func(v *yaml.Node, f string) { s.Accept = p.accepts(v, f) },
		"alwaysOn":       func(v *yaml.Node, f string) { s.AlwaysOn = p.boolean(v, f) },
	})
	if yamlcheck.Resolve(n).Kind != yaml.MappingNode {
		return s
	}
	for _, req := range []string{"name", "url"} {
		if !present[req] {
			p.Errorf(n, yamlcheck.Join(path, req), "is required")
		}
	}
	if s.ForwardUserToken {
		for h := range s.Headers {
			if strings.EqualFold(h, "Authorization") {
				p.Errorf(n, yamlcheck.Join(path, "headers."+h), "forwardUserToken sends the user's token in Authorization: set one or the other")
			}
		}
	}
	return s
}

// serverName checks an MCP server's name: its tools are offered as <name>__<tool>, which must stay a valid,
// unambiguous tool name.
func (p *parser) serverName(n *yaml.Node, path, name string) {
	switch {
	case !nameRE.MatchString(name):
		p.Errorf(n, path, "%q is not a valid name (letters, digits, _ and -)", name)
	case len(name) > MaxNameLen-3:
		p.Errorf(n, path, "%q is too long: its tools are offered as %s__<tool>, at most %d characters", name, name, MaxNameLen)
	case strings.Contains(name, "__") || strings.HasSuffix(name, "_"):
		p.Errorf(n, path, "%q must not contain \"__\" or end in \"_\": its tools are offered as %s__<tool>", name, name)
	}
}

var methods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

func (p *parser) httpTool(n *yaml.Node, path string) HTTPTool {
	t := HTTPTool{Line: n.Line, Method: "GET"}
	var urlNode, schemaNode *yaml.Node
	var exampleNodes []*yaml.Node
	present := p.Mapping(n, path, map[string]func(*yaml.Node, string){
		"name": func(v *yaml.Node, f string) {
			name, ok := p.Str(v, f)
			switch {
			case !ok:
			case !nameRE.MatchString(name):
				p.Errorf(v, f, "%q is not a valid tool name (1 to %d letters, digits, _ and -)", name, MaxNameLen)
			case strings.Contains(name, "__"):
				p.Errorf(v, f, "%q must not contain \"__\" (kept for MCP tools, offered as <server>__<tool>)", name)
			default:
				t.Name = name
			}
		},
		"description": func(v *yaml.Node, f string) {
			if t.Description, _ = p.Str(v, f); strings.TrimSpace(t.Description) == "" {
				p.Errorf(v, f, "must not be empty: the model chooses tools by it")
			}
		},
		"inputSchema": func(v *yaml.Node, f string) {
			schemaNode = v
			t.InputSchema, _ = p.json(v, f)
		},
		"inputExamples": func(v *yaml.Node, f string) {
			p.Sequence(v, f, func(c *yaml.Node, f string) {
				if ex, ok := p.json(c, f); ok {
					t.InputExamples = append(t.InputExamples, ex)
					exampleNodes = append(exampleNodes, c)
				}
			})
		},
		"method": func(v *yaml.Node, f string) {
			m, ok := p.Str(v, f)
			if ok && !slices.Contains(methods, m) {
				p.Errorf(v, f, "%q is not an HTTP method (want %s)", m, yamlcheck.OrList(methods))
			}
			t.Method = m
		},
		"url": func(v *yaml.Node, f string) {
			urlNode = v
			t.URL, _ = p.Str(v, f)
		},
		"headers":        func(v *yaml.Node, f string) { t.Headers = p.headers(v, f) },
		"approval":       func(v *yaml.Node, f string) { t.Approval = p.approval(v, f, ApprovalNever, ApprovalAlways) },
		"timeout":        func(v *yaml.Node, f string) { t.Timeout = p.timeout(v, f) },
		"maxOutputBytes": func(v *yaml.Node, f string) { t.MaxOutputBytes = p.maxOutput(v, f) },
		"alwaysOn":       func(v *yaml.Node, f string) { t.AlwaysOn = p.boolean(v, f) },
	})
	if yamlcheck.Resolve(n).Kind != yaml.MappingNode {
		return t
	}
	for _, req := range []string{"name", "description", "url"} {
		if !present[req] {
			p.Errorf(n, yamlcheck.Join(path, req), "is required")
		}
	}
	props := map[string]bool{}
	schemaOK := false
	if schemaNode == nil {
		t.InputSchema = json.RawMessage(`{"type":"object","properties":{}}`)
		schemaOK = true
	} else if t.InputSchema != nil {
		schemaOK = p.inputSchema(schemaNode, yamlcheck.Join(path, "inputSchema"), t.InputSchema, props)
	}
	if schemaOK {
		for i, ex := range t.InputExamples {
			if err := toolschema.ValidateJSON(t.InputSchema, ex); err != nil {
				p.Errorf(exampleNodes[i], fmt.Sprintf("%s.inputExamples[%d]", path, i), "%v", err)
			}
		}
	}
	if urlNode != nil && t.URL != "" {
		p.urlTemplate(urlNode, yamlcheck.Join(path, "url"), t.URL, props, schemaOK)
	}
	return t
}

// inputSchema checks that schema is a JSON Schema for an object, and collects its top-level properties.
func (p *parser) inputSchema(n *yaml.Node, path string, schema json.RawMessage, props map[string]bool) bool {
	var top struct {
		Type       any                        `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(schema, &top); err != nil {
		p.Errorf(n, path, "want a JSON Schema object, got %s", yamlcheck.KindOf(yamlcheck.Resolve(n)))
		return false
	}
	if top.Type != "object" {
		p.Errorf(n, path, `the input is an object: the schema needs "type: object"`)
		return false
	}
	if err := toolschema.Compile(schema); err != nil {
		p.Errorf(n, path, "%v", err)
		return false
	}
	for name := range top.Properties {
		props[name] = true
	}
	return true
}

var placeholderRE = regexp.MustCompile(`\{([^{}]*)\}`)
var paramRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// placeholderMark stands for a placeholder while the URL is parsed (lower case: hosts are compared lowered).
const placeholderMark = "agentloop-placeholder"

// urlTemplate checks an HTTP tool's URL: absolute http(s) once its {name} placeholders are filled, each
// placeholder an input property, none in the scheme or the host (the model never picks where a call goes).
func (p *parser) urlTemplate(n *yaml.Node, path, raw string, props map[string]bool, schemaOK bool) {
	if strings.Count(raw, "{") != strings.Count(raw, "}") {
		p.Errorf(n, path, "unbalanced { } in %q", raw)
		return
	}
	for _, m := range placeholderRE.FindAllStringSubmatch(raw, -1) {
		switch name := m[1]; {
		case !paramRE.MatchString(name):
			p.Errorf(n, path, "placeholder {%s} is not a property name", name)
			return
		case schemaOK && !props[name]:
			p.Errorf(n, path, "placeholder {%s} is not a property of inputSchema", name)
		}
	}
	filled := placeholderRE.ReplaceAllString(raw, placeholderMark)
	u := p.checkURL(n, path, filled)
	if u != nil && strings.Contains(strings.ToLower(u.Host), placeholderMark) {
		p.Errorf(n, path, "a placeholder in the host: the input may fill the path and the query only")
	}
}

// names checks that every name the model would see is unique: HTTP tools, servers, the composed names of
// include lists, and the reserved (Go) tools.
func (p *parser) names(f *File) {
	taken := map[string]string{}
	for _, r := range p.o.Reserved {
		taken[r] = "a Go tool"
	}
	servers := map[string]bool{}
	for i, s := range f.MCPServers {
		if s.Name == "" {
			continue
		}
		field := fmt.Sprintf("mcpServers[%d].name", i)
		if servers[s.Name] {
			p.Errs = append(p.Errs, Error{File: p.File, Line: s.Line, Field: field, Msg: fmt.Sprintf("%q names another server too", s.Name)})
		}
		servers[s.Name] = true
		for j, tool := range s.Include {
			composed := s.Name + "__" + tool
			ifield := fmt.Sprintf("mcpServers[%d].include[%d]", i, j)
			switch {
			case !nameRE.MatchString(composed):
				p.Errs = append(p.Errs, Error{File: p.File, Line: s.Line, Field: ifield,
					Msg: fmt.Sprintf("%q would be offered as %q, not a valid tool name (1 to %d letters, digits, _ and -)", tool, composed, MaxNameLen)})
			case taken[composed] != "":
				p.Errs = append(p.Errs, Error{File: p.File, Line: s.Line, Field: ifield, Msg: fmt.Sprintf("%q is taken by %s", composed, taken[composed])})
			default:
				taken[composed] = fmt.Sprintf("mcpServers[%d]", i)
			}
			if slices.Contains(s.Exclude, tool) {
				p.Errs = append(p.Errs, Error{File: p.File, Line: s.Line, Field: ifield, Msg: fmt.Sprintf("%q is both included and excluded", tool)})
			}
		}
	}
	for i, t := range f.HTTPTools {
		if t.Name == "" {
			continue
		}
		field := fmt.Sprintf("httpTools[%d].name", i)
		if by := taken[t.Name]; by != "" {
			p.Errs = append(p.Errs, Error{File: p.File, Line: t.Line, Field: field, Msg: fmt.Sprintf("%q is taken by %s", t.Name, by)})
			continue
		}
		taken[t.Name] = fmt.Sprintf("httpTools[%d]", i)
	}
}
