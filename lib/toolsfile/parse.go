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
)

// parser walks the YAML nodes, so every error knows its line and field.
type parser struct {
	file string
	o    Options
	errs Errors
}

func (p *parser) errorf(n *yaml.Node, field, format string, args ...any) {
	p.errs = append(p.errs, Error{File: p.file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// mapping calls the field's handler for each key of n; unknown and repeated keys are errors.
func (p *parser) mapping(n *yaml.Node, path string, fields map[string]func(*yaml.Node, string)) (present map[string]bool) {
	present = map[string]bool{}
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a mapping of fields, got %s", kindOf(n))
		return present
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		field := join(path, key)
		handle, known := fields[key]
		switch {
		case k.Kind != yaml.ScalarNode:
			p.errorf(k, path, "a field name must be a plain string")
		case present[key]:
			p.errorf(k, field, "given twice")
		case !known:
			p.errorf(k, field, "unknown field (known: %s)", strings.Join(sortedKeys(fields), ", "))
		default:
			present[key] = true
			handle(v, field)
		}
	}
	return present
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// resolve follows an alias.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func kindOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func (p *parser) sequence(n *yaml.Node, path string, item func(*yaml.Node, string)) {
	n = resolve(n)
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, "want a list, got %s", kindOf(n))
		return
	}
	for i, c := range n.Content {
		item(resolve(c), fmt.Sprintf("%s[%d]", path, i))
	}
}

func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		p.errorf(n, path, "want a string, got %s", kindOf(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) boolean(n *yaml.Node, path string) bool {
	n = resolve(n)
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		p.errorf(n, path, "want true or false, got %s", kindOf(n))
	}
	return b
}

func (p *parser) strings(n *yaml.Node, path string) []string {
	var out []string
	seen := map[string]bool{}
	p.sequence(n, path, func(c *yaml.Node, path string) {
		s, ok := p.str(c, path)
		switch {
		case !ok:
		case strings.TrimSpace(s) == "":
			p.errorf(c, path, "must not be empty")
		case seen[s]:
			p.errorf(c, path, "%q is listed twice", s)
		default:
			seen[s] = true
			out = append(out, s)
		}
	})
	return out
}

func (p *parser) timeout(n *yaml.Node, path string) time.Duration {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.errorf(n, path, "want a duration such as 30s, got %s", kindOf(n))
		return 0
	}
	s := n.Value
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		p.errorf(n, path, "%q is not a duration (write e.g. 30s or 2m)", s)
	case d < MinTimeout || d > MaxTimeout:
		p.errorf(n, path, "%s is out of bounds (%s to %s)", d, MinTimeout, MaxTimeout)
	}
	return d
}

func (p *parser) maxOutput(n *yaml.Node, path string) int {
	n = resolve(n)
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		p.errorf(n, path, "want a whole number of bytes, got %s", kindOf(n))
		return 0
	}
	if v < 1 || v > MaxOutputBytes {
		p.errorf(n, path, "%d is out of bounds (1 to %d)", v, MaxOutputBytes)
	}
	return v
}

func (p *parser) approval(n *yaml.Node, path string, allowed ...string) string {
	s, ok := p.str(n, path)
	if ok && !slices.Contains(allowed, s) {
		p.errorf(n, path, "%q is not an approval policy (want %s)", s, orList(allowed))
	}
	return s
}

func orList(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// json converts a YAML value to JSON (mappings must have string keys).
func (p *parser) json(n *yaml.Node, path string) (json.RawMessage, bool) {
	var v any
	if err := resolve(n).Decode(&v); err != nil {
		p.errorf(n, path, "cannot be read: %v", err)
		return nil, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		p.errorf(n, path, "is not JSON-compatible (mapping keys must be strings)")
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
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a mapping of tool names to definition hashes, got %s", kindOf(n))
		return nil
	}
	out := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := join(path, k.Value)
		if _, dup := out[k.Value]; dup {
			p.errorf(k, field, "given twice")
			continue
		}
		h, ok := p.str(v, field)
		if !ok {
			continue
		}
		if !definitionHashRE.MatchString(h) {
			p.errorf(v, field, "%q is not a definition hash (16 hex digits, as the mcp.definition_changed log line gives it)", h)
			continue
		}
		out[k.Value] = h
	}
	return out
}

func (p *parser) headers(n *yaml.Node, path string) map[string]string {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a mapping of header names to values, got %s", kindOf(n))
		return nil
	}
	out := map[string]string{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := join(path, k.Value)
		canon := strings.ToLower(k.Value)
		switch {
		case k.Kind != yaml.ScalarNode || !headerNameRE.MatchString(k.Value):
			p.errorf(k, field, "is not a valid header name")
			continue
		case seen[canon]:
			p.errorf(k, field, "given twice")
			continue
		}
		seen[canon] = true
		val, ok := p.str(v, field)
		if !ok {
			continue
		}
		if strings.ContainsAny(val, "\r\n") {
			p.errorf(v, field, "a header value must be one line")
			continue
		}
		if msg := checkHeaderValue(k.Value, val); msg != "" {
			p.errorf(v, field, "%s", msg)
			continue
		}
		refs, _ := parseRefs(val) // checked above
		scoped := true
		for _, ref := range refs {
			if msg := p.o.ssmScopeError(ref); msg != "" {
				p.errorf(v, field, "%s", msg)
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
		p.errorf(n, path, "%q is not a URL", raw)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		p.errorf(n, path, "%q is not an absolute http or https URL", raw)
	case u.User != nil:
		p.errorf(n, path, "credentials in the URL: send them in a header, as a reference (${ssm:/...})")
	default:
		return u
	}
	return nil
}

func (p *parser) mcpServer(n *yaml.Node, path string) MCPServer {
	s := MCPServer{Line: n.Line, Approval: ApprovalAnnotations}
	present := p.mapping(n, path, map[string]func(*yaml.Node, string){
		"name": func(v *yaml.Node, f string) {
			if s.Name, _ = p.str(v, f); s.Name != "" {
				p.serverName(v, f, s.Name)
			}
		},
		"url": func(v *yaml.Node, f string) {
			if s.URL, _ = p.str(v, f); s.URL != "" {
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
	if resolve(n).Kind != yaml.MappingNode {
		return s
	}
	for _, req := range []string{"name", "url"} {
		if !present[req] {
			p.errorf(n, join(path, req), "is required")
		}
	}
	if s.ForwardUserToken {
		for h := range s.Headers {
			if strings.EqualFold(h, "Authorization") {
				p.errorf(n, join(path, "headers."+h), "forwardUserToken sends the user's token in Authorization: set one or the other")
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
		p.errorf(n, path, "%q is not a valid name (letters, digits, _ and -)", name)
	case len(name) > MaxNameLen-3:
		p.errorf(n, path, "%q is too long: its tools are offered as %s__<tool>, at most %d characters", name, name, MaxNameLen)
	case strings.Contains(name, "__") || strings.HasSuffix(name, "_"):
		p.errorf(n, path, "%q must not contain \"__\" or end in \"_\": its tools are offered as %s__<tool>", name, name)
	}
}

var methods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

func (p *parser) httpTool(n *yaml.Node, path string) HTTPTool {
	t := HTTPTool{Line: n.Line, Method: "GET"}
	var urlNode, schemaNode *yaml.Node
	var exampleNodes []*yaml.Node
	present := p.mapping(n, path, map[string]func(*yaml.Node, string){
		"name": func(v *yaml.Node, f string) {
			name, ok := p.str(v, f)
			switch {
			case !ok:
			case !nameRE.MatchString(name):
				p.errorf(v, f, "%q is not a valid tool name (1 to %d letters, digits, _ and -)", name, MaxNameLen)
			case strings.Contains(name, "__"):
				p.errorf(v, f, "%q must not contain \"__\" (kept for MCP tools, offered as <server>__<tool>)", name)
			default:
				t.Name = name
			}
		},
		"description": func(v *yaml.Node, f string) {
			if t.Description, _ = p.str(v, f); strings.TrimSpace(t.Description) == "" {
				p.errorf(v, f, "must not be empty: the model chooses tools by it")
			}
		},
		"inputSchema": func(v *yaml.Node, f string) {
			schemaNode = v
			t.InputSchema, _ = p.json(v, f)
		},
		"inputExamples": func(v *yaml.Node, f string) {
			p.sequence(v, f, func(c *yaml.Node, f string) {
				if ex, ok := p.json(c, f); ok {
					t.InputExamples = append(t.InputExamples, ex)
					exampleNodes = append(exampleNodes, c)
				}
			})
		},
		"method": func(v *yaml.Node, f string) {
			m, ok := p.str(v, f)
			if ok && !slices.Contains(methods, m) {
				p.errorf(v, f, "%q is not an HTTP method (want %s)", m, orList(methods))
			}
			t.Method = m
		},
		"url": func(v *yaml.Node, f string) {
			urlNode = v
			t.URL, _ = p.str(v, f)
		},
		"headers":        func(v *yaml.Node, f string) { t.Headers = p.headers(v, f) },
		"approval":       func(v *yaml.Node, f string) { t.Approval = p.approval(v, f, ApprovalNever, ApprovalAlways) },
		"timeout":        func(v *yaml.Node, f string) { t.Timeout = p.timeout(v, f) },
		"maxOutputBytes": func(v *yaml.Node, f string) { t.MaxOutputBytes = p.maxOutput(v, f) },
		"alwaysOn":       func(v *yaml.Node, f string) { t.AlwaysOn = p.boolean(v, f) },
	})
	if resolve(n).Kind != yaml.MappingNode {
		return t
	}
	for _, req := range []string{"name", "description", "url"} {
		if !present[req] {
			p.errorf(n, join(path, req), "is required")
		}
	}
	props := map[string]bool{}
	schemaOK := false
	if schemaNode == nil {
		t.InputSchema = json.RawMessage(`{"type":"object","properties":{}}`)
		schemaOK = true
	} else if t.InputSchema != nil {
		schemaOK = p.inputSchema(schemaNode, join(path, "inputSchema"), t.InputSchema, props)
	}
	if schemaOK {
		for i, ex := range t.InputExamples {
			if err := toolschema.ValidateJSON(t.InputSchema, ex); err != nil {
				p.errorf(exampleNodes[i], fmt.Sprintf("%s.inputExamples[%d]", path, i), "%v", err)
			}
		}
	}
	if urlNode != nil && t.URL != "" {
		p.urlTemplate(urlNode, join(path, "url"), t.URL, props, schemaOK)
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
		p.errorf(n, path, "want a JSON Schema object, got %s", kindOf(resolve(n)))
		return false
	}
	if top.Type != "object" {
		p.errorf(n, path, `the input is an object: the schema needs "type: object"`)
		return false
	}
	if err := toolschema.Compile(schema); err != nil {
		p.errorf(n, path, "%v", err)
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
		p.errorf(n, path, "unbalanced { } in %q", raw)
		return
	}
	for _, m := range placeholderRE.FindAllStringSubmatch(raw, -1) {
		switch name := m[1]; {
		case !paramRE.MatchString(name):
			p.errorf(n, path, "placeholder {%s} is not a property name", name)
			return
		case schemaOK && !props[name]:
			p.errorf(n, path, "placeholder {%s} is not a property of inputSchema", name)
		}
	}
	filled := placeholderRE.ReplaceAllString(raw, placeholderMark)
	u := p.checkURL(n, path, filled)
	if u != nil && strings.Contains(strings.ToLower(u.Host), placeholderMark) {
		p.errorf(n, path, "a placeholder in the host: the input may fill the path and the query only")
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
			p.errs = append(p.errs, Error{File: p.file, Line: s.Line, Field: field, Msg: fmt.Sprintf("%q names another server too", s.Name)})
		}
		servers[s.Name] = true
		for j, tool := range s.Include {
			composed := s.Name + "__" + tool
			ifield := fmt.Sprintf("mcpServers[%d].include[%d]", i, j)
			switch {
			case !nameRE.MatchString(composed):
				p.errs = append(p.errs, Error{File: p.file, Line: s.Line, Field: ifield,
					Msg: fmt.Sprintf("%q would be offered as %q, not a valid tool name (1 to %d letters, digits, _ and -)", tool, composed, MaxNameLen)})
			case taken[composed] != "":
				p.errs = append(p.errs, Error{File: p.file, Line: s.Line, Field: ifield, Msg: fmt.Sprintf("%q is taken by %s", composed, taken[composed])})
			default:
				taken[composed] = fmt.Sprintf("mcpServers[%d]", i)
			}
			if slices.Contains(s.Exclude, tool) {
				p.errs = append(p.errs, Error{File: p.file, Line: s.Line, Field: ifield, Msg: fmt.Sprintf("%q is both included and excluded", tool)})
			}
		}
	}
	for i, t := range f.HTTPTools {
		if t.Name == "" {
			continue
		}
		field := fmt.Sprintf("httpTools[%d].name", i)
		if by := taken[t.Name]; by != "" {
			p.errs = append(p.errs, Error{File: p.file, Line: t.Line, Field: field, Msg: fmt.Sprintf("%q is taken by %s", t.Name, by)})
			continue
		}
		taken[t.Name] = fmt.Sprintf("httpTools[%d]", i)
	}
}
