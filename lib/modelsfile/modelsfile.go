// Package modelsfile reads the models file (AGENT_MODELS_FILE): the models a deployment may ask, each by a name of
// its own, with the provider (and so the adapter) that serves it, in YAML or JSON (JSON is YAML; one parser:
// go.yaml.in/yaml/v3). The file is checked whole when the configuration is read, and every error names the file,
// the line and the field, as the tools file's do (lib/toolsfile):
//
//	models.yaml:7: models[1].provider: "gemini" is not a provider (want openai-chat, openai-responses, anthropic, anthropic-bedrock or bedrock-converse)
//
// # The shape (a public interface: fields may be added, never renamed)
//
//	models:
//	  - name: main                    # what AGENT_MODEL, AGENT_SUBAGENT_MODEL and AGENT_TITLE_MODEL name; unique
//	    provider: openai-chat         # openai-chat | openai-responses | anthropic | anthropic-bedrock | bedrock-converse
//	    model: gpt-4o                 # the provider's model id (required)
//	    baseURL: https://api.openai.com/v1   # optional: an absolute http(s) URL, no credentials in it
//	    region: us-east-1             # the Bedrock providers only, and required there
//	    apiKey: ${ssm:/agentloop/openai-api-key}   # a reference only (${env:NAME} or ${ssm:/name}); not for Bedrock
//	    contextTokens: 128000         # the model's context budget (the smaller of this and AGENT_CONTEXT_TOKENS)
//	    maxOutputTokens: 8192         # caps every request to this model
//	    prices: {input: 2.5, cachedInput: 1.25, output: 10}   # USD per million tokens, as AGENT_PRICES writes one model
//	                                  # (cacheWrite: the price of a token written to the prompt cache; default input)
//	    fallback: [small]             # other entries' names, tried in order (none of them itself, no cycles)
//
// Unknown fields are errors, and so are duplicate keys and names. An API key written in the file is refused: the
// file holds a reference and the key stays in SSM or the environment. The Bedrock providers are called with the
// function's IAM role (SigV4) and take no key.
//
// # Secrets are references, resolved at cold start
//
// apiKey's references are resolved once through a secretref.Resolver the wiring fills (Startup): ${env:…} from
// the environment, ${ssm:…} SecureString parameters (in Lambda through lib/ssmsecrets). In Lambda an ${ssm:…}
// reference must name a parameter the functions' roles may read (Options.SSMScoped); one outside is an error at
// its line, not an AccessDenied from SSM.
//
// This package is configuration, not an adapter: lib/modelset builds one adapter per entry from it, through
// constructors the wiring gives.
package modelsfile

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/secretref"
	"github.com/agentloop/agentloop/lib/yamlcheck"
)

// The providers an entry may name: each is one adapter package.
const (
	OpenAIChat       = "openai-chat"       // lib/openai: Chat Completions, any OpenAI-compatible base URL
	OpenAIResponses  = "openai-responses"  // the OpenAI Responses API
	Anthropic        = "anthropic"         // Anthropic Messages, direct, with an API key
	AnthropicBedrock = "anthropic-bedrock" // Anthropic Messages on Bedrock, with the function's IAM role
	BedrockConverse  = "bedrock-converse"  // Bedrock ConverseStream (Nova, Llama, Mistral and the like)
)

// Providers are every provider an entry may name, in the order errors list them.
func Providers() []string {
	return []string{OpenAIChat, OpenAIResponses, Anthropic, AnthropicBedrock, BedrockConverse}
}

// Bedrock reports whether provider is called through Amazon Bedrock (a region, the IAM role, no API key).
func Bedrock(provider string) bool {
	return provider == AnthropicBedrock || provider == BedrockConverse
}

// Bounds of an entry's numbers.
const (
	MaxContextTokens = 10_000_000
	MaxOutputTokens  = 1_000_000
	MaxFileBytes     = 1 << 20
	MaxModels        = 100
	maxNameLen       = 64
)

// File is a checked models file.
type File struct {
	// Name is the file's name as errors show it.
	Name   string
	Models []Model
}

// Model is one entry of models.
type Model struct {
	Name     string
	Provider string
	// Model is the provider's model id, sent in every request to this entry.
	Model   string
	BaseURL string // "": the provider's own endpoint (in `agentloop dev`, with no APIKey either: the offline one)
	Region  string // the Bedrock providers only
	// APIKey is a reference (${env:…} or ${ssm:…}), never a key; Startup's values expand it.
	APIKey string
	// ContextTokens and MaxOutputTokens: zero means the deployment's (AGENT_CONTEXT_TOKENS, AGENT_MAX_OUTPUT_TOKENS).
	ContextTokens   int
	MaxOutputTokens int
	// Prices is the entry's price as written (nil: the price table's, AGENT_PRICES, if any).
	Prices *agent.Price
	// Fallback are other entries' names, in order.
	Fallback []string
	// Line is where the entry starts in the file; keyLine where its apiKey is.
	Line    int
	keyLine int
}

// Entry returns the entry called name.
func (f *File) Entry(name string) (Model, bool) {
	for _, m := range f.Models {
		if m.Name == name {
			return m, true
		}
	}
	return Model{}, false
}

// Names are the entries' names, in file order.
func (f *File) Names() []string {
	out := make([]string, len(f.Models))
	for i, m := range f.Models {
		out[i] = m.Name
	}
	return out
}

// Load reads and checks the file at path (errors name it by its base name).
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("models file: %w", err)
	}
	return Parse(filepath.Base(path), data)
}

// Parse checks data, the contents of the file called name. The error, when there is one, is an Errors.
func Parse(name string, data []byte) (*File, error) {
	p := &parser{Checker: yamlcheck.Checker{File: name}}
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
		p.Errs = append(p.Errs, Error{File: name, Line: 1, Field: "models", Msg: "is required: the file lists no models"})
		return nil, p.Errs
	}
	root := doc.Content[0]
	present := p.Mapping(root, "", map[string]func(*yaml.Node, string){
		"models": func(n *yaml.Node, path string) {
			p.Sequence(n, path, func(item *yaml.Node, path string) { f.Models = append(f.Models, p.model(item, path)) })
		},
	})
	switch {
	case yamlcheck.Resolve(root).Kind != yaml.MappingNode:
	case !present["models"]:
		p.Errorf(root, "models", "is required: the file lists no models")
	case len(f.Models) == 0:
		p.Errorf(root, "models", "lists no models")
	case len(f.Models) > MaxModels:
		p.Errorf(root, "models", "lists %d models, the limit is %d", len(f.Models), MaxModels)
	}
	p.names(f)
	p.fallbacks(f)
	if len(p.Errs) > 0 {
		p.Errs.Sort()
		return nil, p.Errs
	}
	return f, nil
}

// Options bound where references may point.
type Options struct {
	// SSMScoped bounds the ${ssm:…} references to SSMParams (exact parameter names) and the parameters under
	// SSMPrefix (a path ending in "/"; empty: none), each other one an error at its line. The Lambda wiring sets
	// it: the functions that ask a model may read the model key parameter (OPENAI_API_KEY_PARAM, the template's
	// OpenAIKeyParameterName) and those under AGENT_MODEL_KEYS_PATH (the template's ModelKeysPath), no other.
	SSMScoped bool
	SSMParams []string
	SSMPrefix string
	// SSMHint says, in an error, how to grant another parameter.
	SSMHint string
}

// Scope checks the file's references against o: Errors by line, nil when every reference may be read.
func (f *File) Scope(o Options) error {
	if !o.SSMScoped {
		return nil
	}
	var errs Errors
	for i, m := range f.Models {
		refs, _ := secretref.Parse(m.APIKey) // checked by Parse
		for _, ref := range refs {
			if ref.Scheme != secretref.SSM || slices.Contains(o.SSMParams, ref.Name) ||
				o.SSMPrefix != "" && strings.HasPrefix(ref.Name, o.SSMPrefix) {
				continue
			}
			msg := fmt.Sprintf("%s is not a parameter the functions may read", ref)
			if may := slices.Clone(o.SSMParams); len(may) > 0 || o.SSMPrefix != "" {
				if o.SSMPrefix != "" {
					may = append(may, "those under "+o.SSMPrefix)
				}
				msg += fmt.Sprintf(" (they may read %s)", strings.Join(may, ", "))
			}
			if o.SSMHint != "" {
				msg += ": " + o.SSMHint
			}
			errs = append(errs, Error{File: f.Name, Line: m.keyLine, Field: fmt.Sprintf("models[%d].apiKey", i), Msg: msg})
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// Refs are the references of the entries' keys, each once, in file order.
func (f *File) Refs() []secretref.Ref {
	var all []secretref.Ref
	for _, m := range f.Models {
		refs, _ := secretref.Parse(m.APIKey) // checked by Parse
		for _, r := range refs {
			if !slices.Contains(all, r) {
				all = append(all, r)
			}
		}
	}
	return all
}

// Startup is the cold start's part: the file's references checked against o and resolved through r (one that
// cannot be resolved fails the start: an unset variable, a missing SSM parameter, or a scheme r does not
// resolve), and one models.file log line saying what it holds. The values expand each entry's APIKey
// (Values.Expand); lib/modelset builds the adapters from both.
func Startup(ctx context.Context, f *File, o Options, r secretref.Resolver, log *slog.Logger) (secretref.Values, error) {
	if f == nil {
		return nil, nil
	}
	if err := f.Scope(o); err != nil {
		return nil, err
	}
	vals, err := secretref.Resolve(ctx, r, f.Refs())
	if err != nil {
		return nil, fmt.Errorf("models file %s: %w", f.Name, err)
	}
	providers := map[string]int{}
	for _, m := range f.Models {
		providers[m.Provider]++
	}
	log.Info("models.file", "file", f.Name, "models", f.Names(), "providers", providers, "refs", len(f.Refs()))
	return vals, nil
}

// Prices is the entries' price table: each priced entry under its name and under its provider model id (the
// engine prices a step by the model the provider reports, a dated snapshot of it included: agent.Prices).
func (f *File) Prices() (agent.Prices, error) {
	table := map[string]agent.Price{}
	for _, m := range f.Models {
		if m.Prices == nil {
			continue
		}
		table[m.Name] = *m.Prices
		table[m.Model] = *m.Prices // names agree: Parse refuses two prices for one model id
	}
	if len(table) == 0 {
		return agent.Prices{}, nil
	}
	return agent.PricesOf(table)
}

// Roles are the entries the deployment asks for each purpose.
type Roles struct {
	Default  string // AGENT_MODEL: the engine's turns
	Subagent string // AGENT_SUBAGENT_MODEL: the research sub-agent
	Title    string // AGENT_TITLE_MODEL: thread titles
}

// Roles checks the names the environment gives for each purpose against the entries: each must name one. An
// empty default is the first entry; an empty sub-agent or title model is the default.
func (f *File) Roles(def, subagent, title string) (Roles, error) {
	r := Roles{Default: def}
	if r.Default == "" {
		r.Default = f.Models[0].Name
	}
	r.Subagent, r.Title = subagent, title
	if r.Subagent == "" {
		r.Subagent = r.Default
	}
	if r.Title == "" {
		r.Title = r.Default
	}
	var errs []string
	for _, c := range []struct{ env, name string }{{"AGENT_MODEL", r.Default}, {"AGENT_SUBAGENT_MODEL", r.Subagent}, {"AGENT_TITLE_MODEL", r.Title}} {
		if _, ok := f.Entry(c.name); !ok {
			errs = append(errs, fmt.Sprintf("%s=%q names no entry of the models file %s (its entries: %s)", c.env, c.name, f.Name, strings.Join(f.Names(), ", ")))
		}
	}
	if len(errs) > 0 {
		return r, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return r, nil
}

// Error is one problem of the file: file:line: field: message.
type Error = yamlcheck.Error

// Errors are all the problems of a file, by line.
type Errors = yamlcheck.Errors
