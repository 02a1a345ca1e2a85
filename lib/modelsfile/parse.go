package modelsfile

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/secretref"
)

// parser walks the YAML nodes, so every error knows its line and field.
type parser struct {
	file string
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
			keys := make([]string, 0, len(fields))
			for k := range fields {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			p.errorf(k, field, "unknown field (known: %s)", strings.Join(keys, ", "))
		default:
			present[key] = true
			handle(v, field)
		}
	}
	return present
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
	if strings.TrimSpace(n.Value) == "" {
		p.errorf(n, path, "must not be empty")
		return "", false
	}
	return n.Value, true
}

func (p *parser) count(n *yaml.Node, path, what string, maxValue int) int {
	n = resolve(n)
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		p.errorf(n, path, "want a whole number of %s, got %s", what, kindOf(n))
		return 0
	}
	if v < 1 || v > maxValue {
		p.errorf(n, path, "%d is out of bounds (1 to %d)", v, maxValue)
		return 0
	}
	return v
}

func orList(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

var (
	// nameRE is an entry's name: what the environment names it by, and what the engine sends as the model.
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)
	regionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)
)

func (p *parser) model(n *yaml.Node, path string) Model {
	m := Model{Line: n.Line}
	var keyNode *yaml.Node
	present := p.mapping(n, path, map[string]func(*yaml.Node, string){
		"name": func(v *yaml.Node, f string) {
			name, ok := p.str(v, f)
			switch {
			case !ok:
			case len(name) > maxNameLen || !nameRE.MatchString(name):
				p.errorf(v, f, "%q is not a valid name (1 to %d letters, digits and _.:-, starting with a letter or digit)", name, maxNameLen)
			default:
				m.Name = name
			}
		},
		"provider": func(v *yaml.Node, f string) {
			s, ok := p.str(v, f)
			if ok && !slices.Contains(Providers(), s) {
				p.errorf(v, f, "%q is not a provider (want %s)", s, orList(Providers()))
				return
			}
			m.Provider = s
		},
		"model": func(v *yaml.Node, f string) { m.Model, _ = p.str(v, f) },
		"baseURL": func(v *yaml.Node, f string) {
			raw, ok := p.str(v, f)
			if !ok {
				return
			}
			u, err := url.Parse(raw)
			switch {
			case err != nil:
				p.errorf(v, f, "%q is not a URL", raw)
			case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
				p.errorf(v, f, "%q is not an absolute http or https URL", raw)
			case u.User != nil:
				p.errorf(v, f, "credentials in the URL: give the key in apiKey, as a reference (${ssm:/...})")
			default:
				m.BaseURL = raw
			}
		},
		"region": func(v *yaml.Node, f string) {
			s, ok := p.str(v, f)
			if ok && !regionRE.MatchString(s) {
				p.errorf(v, f, "%q is not an AWS region (e.g. us-east-1)", s)
				return
			}
			m.Region = s
		},
		"apiKey": func(v *yaml.Node, f string) {
			keyNode = v
			s, ok := p.str(v, f)
			if !ok {
				return
			}
			refs, err := secretref.Parse(s)
			switch {
			case err != nil:
				p.errorf(v, f, "%v", err)
			case len(refs) == 0:
				p.errorf(v, f, "looks like a key written in the file: write a reference instead, e.g. \"${ssm:/agentloop/openai-api-key}\" or \"${env:OPENAI_API_KEY}\"")
			case len(refs) > 1 || strings.TrimSpace(secretref.Strip(s)) != "":
				p.errorf(v, f, "want one reference and nothing around it (the adapter sends the key as its provider wants it)")
			default:
				m.APIKey, m.keyLine = s, v.Line
			}
		},
		"contextTokens":   func(v *yaml.Node, f string) { m.ContextTokens = p.count(v, f, "tokens", MaxContextTokens) },
		"maxOutputTokens": func(v *yaml.Node, f string) { m.MaxOutputTokens = p.count(v, f, "tokens", MaxOutputTokens) },
		"prices":          func(v *yaml.Node, f string) { m.Prices = p.price(v, f) },
		"fallback": func(v *yaml.Node, f string) {
			p.sequence(v, f, func(c *yaml.Node, f string) {
				s, ok := p.str(c, f)
				switch {
				case !ok:
				case slices.Contains(m.Fallback, s):
					p.errorf(c, f, "%q is listed twice", s)
				default:
					m.Fallback = append(m.Fallback, s)
				}
			})
		},
	})
	if resolve(n).Kind != yaml.MappingNode {
		return m
	}
	for _, req := range []string{"name", "provider", "model"} {
		if !present[req] {
			p.errorf(n, join(path, req), "is required")
		}
	}
	if m.Provider == "" {
		return m
	}
	switch {
	case Bedrock(m.Provider) && !present["region"]:
		p.errorf(n, join(path, "region"), "is required for %s (the Bedrock region the model is called in)", m.Provider)
	case !Bedrock(m.Provider) && present["region"]:
		p.errorf(n, join(path, "region"), "is for the Bedrock providers only, not %s", m.Provider)
	}
	if Bedrock(m.Provider) && keyNode != nil {
		p.errorf(keyNode, join(path, "apiKey"), "%s is called with the function's IAM role: it takes no API key", m.Provider)
	}
	return m
}

// price reads an entry's prices: {input, cachedInput, cacheWrite, output}, USD per million tokens, as one model of the price
// table (agent.ParsePrices).
func (p *parser) price(n *yaml.Node, path string) *agent.Price {
	n = resolve(n)
	var pr agent.Price
	present := p.mapping(n, path, map[string]func(*yaml.Node, string){
		"input":       func(v *yaml.Node, f string) { pr.Input = p.number(v, f) },
		"cachedInput": func(v *yaml.Node, f string) { c := p.number(v, f); pr.CachedInput = &c },
		"cacheWrite":  func(v *yaml.Node, f string) { c := p.number(v, f); pr.CacheWrite = &c },
		"output":      func(v *yaml.Node, f string) { pr.Output = p.number(v, f) },
	})
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for _, req := range []string{"input", "output"} {
		if !present[req] {
			p.errorf(n, join(path, req), "is required")
		}
	}
	if err := pr.Check(); err != nil {
		field, msg, _ := strings.Cut(err.Error(), ": ")
		p.errorf(n, join(path, field), "%s", msg)
		return nil
	}
	return &pr
}

func (p *parser) number(n *yaml.Node, path string) json.Number {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		p.errorf(n, path, "want a number of USD per million tokens, got %s", kindOf(n))
		return ""
	}
	return json.Number(n.Value)
}

// names checks that every entry's name is unique, and that one model id has one price.
func (p *parser) names(f *File) {
	by := map[string]int{}
	priced := map[string]int{}
	for i, m := range f.Models {
		if m.Name == "" {
			continue
		}
		if j, dup := by[m.Name]; dup {
			p.errs = append(p.errs, Error{File: p.file, Line: m.Line, Field: fmt.Sprintf("models[%d].name", i),
				Msg: fmt.Sprintf("%q names models[%d] too", m.Name, j)})
			continue
		}
		by[m.Name] = i
		if m.Prices == nil || m.Model == "" {
			continue
		}
		if j, ok := priced[m.Model]; ok && !samePrice(*f.Models[j].Prices, *m.Prices) {
			p.errs = append(p.errs, Error{File: p.file, Line: m.Line, Field: fmt.Sprintf("models[%d].prices", i),
				Msg: fmt.Sprintf("differ from models[%d]'s, the same model %q: a step is priced by the model the provider reports", j, m.Model)})
			continue
		}
		priced[m.Model] = i
	}
}

func samePrice(a, b agent.Price) bool {
	ca, cb := a.Input, b.Input
	if a.CachedInput != nil {
		ca = *a.CachedInput
	}
	if b.CachedInput != nil {
		cb = *b.CachedInput
	}
	wa, wb := a.Input, b.Input
	if a.CacheWrite != nil {
		wa = *a.CacheWrite
	}
	if b.CacheWrite != nil {
		wb = *b.CacheWrite
	}
	return a.Input == b.Input && a.Output == b.Output && ca == cb && wa == wb
}

// fallbacks checks each fallback list: other entries' names, none the entry itself, and no cycle through them.
func (p *parser) fallbacks(f *File) {
	index := map[string]int{}
	for i, m := range f.Models {
		if m.Name != "" {
			if _, dup := index[m.Name]; !dup {
				index[m.Name] = i
			}
		}
	}
	bad := false
	for i, m := range f.Models {
		field := fmt.Sprintf("models[%d].fallback", i)
		for _, name := range m.Fallback {
			_, ok := index[name]
			switch {
			case name == m.Name:
				p.errs = append(p.errs, Error{File: p.file, Line: m.Line, Field: field, Msg: fmt.Sprintf("%q is the entry itself", name)})
				bad = true
			case !ok:
				p.errs = append(p.errs, Error{File: p.file, Line: m.Line, Field: field,
					Msg: fmt.Sprintf("%q names no entry (entries: %s)", name, strings.Join(f.Names(), ", "))})
				bad = true
			}
		}
	}
	if bad {
		return
	}
	// A cycle is reported once, at the first entry of it in file order, with its path.
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(f.Models))
	reported := false
	var visit func(i int, path []string) bool
	visit = func(i int, path []string) bool {
		state[i] = onPath
		path = append(path, f.Models[i].Name)
		for _, name := range f.Models[i].Fallback {
			j := index[name]
			switch state[j] {
			case onPath:
				start := slices.Index(path, name)
				cycle := append(slices.Clone(path[start:]), name)
				first := index[cycle[0]]
				p.errs = append(p.errs, Error{File: p.file, Line: f.Models[first].Line, Field: fmt.Sprintf("models[%d].fallback", first),
					Msg: fmt.Sprintf("a cycle: %s", strings.Join(cycle, " → "))})
				return true
			case unseen:
				if visit(j, path) {
					return true
				}
			}
		}
		state[i] = done
		return false
	}
	for i := range f.Models {
		if state[i] == unseen && !reported {
			reported = visit(i, nil)
		}
	}
}
