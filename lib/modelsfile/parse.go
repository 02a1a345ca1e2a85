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
	"github.com/agentloop/agentloop/lib/yamlcheck"
)

// parser walks the YAML nodes, so every error knows its line and field.
type parser struct {
	yamlcheck.Checker // File, Errs: every problem by line and field
}

func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	v, ok := p.Str(n, path)
	if ok && strings.TrimSpace(v) == "" {
		p.Errorf(yamlcheck.Resolve(n), path, "must not be empty")
		return "", false
	}
	return v, ok
}

func (p *parser) count(n *yaml.Node, path, what string, maxValue int) int {
	n = yamlcheck.Resolve(n)
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		p.Errorf(n, path, "want a whole number of %s, got %s", what, yamlcheck.KindOf(n))
		return 0
	}
	if v < 1 || v > maxValue {
		p.Errorf(n, path, "%d is out of bounds (1 to %d)", v, maxValue)
		return 0
	}
	return v
}

var (
	// nameRE is an entry's name: what the environment names it by, and what the engine sends as the model.
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)
	regionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)
)

func (p *parser) model(n *yaml.Node, path string) Model {
	m := Model{Line: n.Line}
	var keyNode *yaml.Node
	present := p.Mapping(n, path, map[string]func(*yaml.Node, string){
		"name": func(v *yaml.Node, f string) {
			name, ok := p.str(v, f)
			switch {
			case !ok:
			case len(name) > maxNameLen || !nameRE.MatchString(name):
				p.Errorf(v, f, "%q is not a valid name (1 to %d letters, digits and _.:-, starting with a letter or digit)", name, maxNameLen)
			default:
				m.Name = name
			}
		},
		"provider": func(v *yaml.Node, f string) {
			s, ok := p.str(v, f)
			if ok && !slices.Contains(Providers(), s) {
				p.Errorf(v, f, "%q is not a provider (want %s)", s, yamlcheck.OrList(Providers()))
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
				p.Errorf(v, f, "%q is not a URL", raw)
			case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
				p.Errorf(v, f, "%q is not an absolute http or https URL", raw)
			case u.User != nil:
				p.Errorf(v, f, "credentials in the URL: give the key in apiKey, as a reference (${ssm:/...})")
			default:
				m.BaseURL = raw
			}
		},
		"region": func(v *yaml.Node, f string) {
			s, ok := p.str(v, f)
			if ok && !regionRE.MatchString(s) {
				p.Errorf(v, f, "%q is not an AWS region (e.g. us-east-1)", s)
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
				p.Errorf(v, f, "%v", err)
			case len(refs) == 0:
				p.Errorf(v, f, "looks like a key written in the file: write a reference instead, e.g. \"${ssm:/agentloop/openai-api-key}\" or \"${env:OPENAI_API_KEY}\"")
			case len(refs) > 1 || strings.TrimSpace(secretref.Strip(s)) != "":
				p.Errorf(v, f, "want one reference and nothing around it (the adapter sends the key as its provider wants it)")
			default:
				m.APIKey, m.keyLine = s, v.Line
			}
		},
		"contextTokens":   func(v *yaml.Node, f string) { m.ContextTokens = p.count(v, f, "tokens", MaxContextTokens) },
		"maxOutputTokens": func(v *yaml.Node, f string) { m.MaxOutputTokens = p.count(v, f, "tokens", MaxOutputTokens) },
		"prices":          func(v *yaml.Node, f string) { m.Prices = p.price(v, f) },
		"fallback": func(v *yaml.Node, f string) {
			p.Sequence(v, f, func(c *yaml.Node, f string) {
				s, ok := p.str(c, f)
				switch {
				case !ok:
				case slices.Contains(m.Fallback, s):
					p.Errorf(c, f, "%q is listed twice", s)
				default:
					m.Fallback = append(m.Fallback, s)
				}
			})
		},
	})
	if yamlcheck.Resolve(n).Kind != yaml.MappingNode {
		return m
	}
	for _, req := range []string{"name", "provider", "model"} {
		if !present[req] {
			p.Errorf(n, yamlcheck.Join(path, req), "is required")
		}
	}
	if m.Provider == "" {
		return m
	}
	switch {
	case Bedrock(m.Provider) && !present["region"]:
		p.Errorf(n, yamlcheck.Join(path, "region"), "is required for %s (the Bedrock region the model is called in)", m.Provider)
	case !Bedrock(m.Provider) && present["region"]:
		p.Errorf(n, yamlcheck.Join(path, "region"), "is for the Bedrock providers only, not %s", m.Provider)
	}
	if Bedrock(m.Provider) && keyNode != nil {
		p.Errorf(keyNode, yamlcheck.Join(path, "apiKey"), "%s is called with the function's IAM role: it takes no API key", m.Provider)
	}
	return m
}

// price reads an entry's prices: {input, cachedInput, cacheWrite, output}, USD per million tokens, as one model of the price
// table (agent.ParsePrices).
func (p *parser) price(n *yaml.Node, path string) *agent.Price {
	n = yamlcheck.Resolve(n)
	var pr agent.Price
	present := p.Mapping(n, path, map[string]func(*yaml.Node, string){
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
			p.Errorf(n, yamlcheck.Join(path, req), "is required")
		}
	}
	if err := pr.Check(); err != nil {
		field, msg, _ := strings.Cut(err.Error(), ": ")
		p.Errorf(n, yamlcheck.Join(path, field), "%s", msg)
		return nil
	}
	return &pr
}

func (p *parser) number(n *yaml.Node, path string) json.Number {
	n = yamlcheck.Resolve(n)
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		p.Errorf(n, path, "want a number of USD per million tokens, got %s", yamlcheck.KindOf(n))
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
			p.Errs = append(p.Errs, Error{File: p.File, Line: m.Line, Field: fmt.Sprintf("models[%d].name", i),
				Msg: fmt.Sprintf("%q names models[%d] too", m.Name, j)})
			continue
		}
		by[m.Name] = i
		if m.Prices == nil || m.Model == "" {
			continue
		}
		if j, ok := priced[m.Model]; ok && !samePrice(*f.Models[j].Prices, *m.Prices) {
			p.Errs = append(p.Errs, Error{File: p.File, Line: m.Line, Field: fmt.Sprintf("models[%d].prices", i),
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
				p.Errs = append(p.Errs, Error{File: p.File, Line: m.Line, Field: field, Msg: fmt.Sprintf("%q is the entry itself", name)})
				bad = true
			case !ok:
				p.Errs = append(p.Errs, Error{File: p.File, Line: m.Line, Field: field,
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
				p.Errs = append(p.Errs, Error{File: p.File, Line: f.Models[first].Line, Field: fmt.Sprintf("models[%d].fallback", first),
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
