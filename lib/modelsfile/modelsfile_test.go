package modelsfile_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/secretref"
)

var update = flag.Bool("update", false, "rewrite testdata/errors.golden")

// TestParseErrors checks every refusal of the file against testdata/errors.golden: file, line, field and message
// (go test -run TestParseErrors -update rewrites it).
func TestParseErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, yaml string }{
		{"empty file", ""},
		{"no models", "models: []\n"},
		{"not a mapping", "- name: a\n"},
		{"unknown top field", "models:\n  - {name: a, provider: openai-chat, model: m}\nextra: 1\n"},
		{"unknown provider", "models:\n  - name: a\n    provider: gemini\n    model: m\n"},
		{"duplicate name", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n  - name: a\n    provider: openai-chat\n    model: n\n"},
		{"missing model", "models:\n  - name: a\n    provider: openai-chat\n"},
		{"missing name and provider", "models:\n  - model: m\n"},
		{"empty model", "models:\n  - name: a\n    provider: openai-chat\n    model: \"\"\n"},
		{"bad name", "models:\n  - name: \"a b\"\n    provider: openai-chat\n    model: m\n"},
		{"region required for bedrock", "models:\n  - name: claude\n    provider: anthropic-bedrock\n    model: anthropic.claude-sonnet-4\n"},
		{"region required for converse", "models:\n  - name: nova\n    provider: bedrock-converse\n    model: amazon.nova-pro-v1:0\n"},
		{"region refused for openai", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    region: us-east-1\n"},
		{"region refused for anthropic", "models:\n  - name: a\n    provider: anthropic\n    model: claude-sonnet-4\n    region: us-east-1\n"},
		{"bad region", "models:\n  - name: a\n    provider: bedrock-converse\n    model: m\n    region: mars\n"},
		{"api key on bedrock", "models:\n  - name: a\n    provider: anthropic-bedrock\n    model: m\n    region: us-east-1\n    apiKey: ${env:KEY}\n"},
		{"literal api key", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    apiKey: sk-proj-abc123\n"},
		{"bearer api key", "models:\n  - name: a\n    provider: anthropic\n    model: m\n    apiKey: \"Bearer ${env:KEY}\"\n"},
		{"two references", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    apiKey: \"${env:A}${env:B}\"\n"},
		{"bad reference", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    apiKey: ${vault:x}\n"},
		{"bad base url", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    baseURL: ftp://x\n"},
		{"credentials in base url", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    baseURL: https://u:p@x.example/v1\n"},
		{"bad numbers", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    contextTokens: 0\n    maxOutputTokens: lots\n"},
		{"bad prices", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    prices: {input: 1.1234567, output: 2}\n"},
		{"prices missing output", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    prices: {input: 1}\n"},
		{"prices unknown field", "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    prices: {input: 1, output: 2, cacheRead: 1}\n"},
		{"two prices for one model", "models:\n  - {name: a, provider: openai-chat, model: m, prices: {input: 1, output: 2}}\n  - {name: b, provider: openai-chat, model: m, prices: {input: 1, output: 3}}\n"},
		{"fallback to itself", "models:\n  - {name: a, provider: openai-chat, model: m, fallback: [a]}\n"},
		{"fallback unknown", "models:\n  - {name: a, provider: openai-chat, model: m, fallback: [z]}\n"},
		{"fallback twice", "models:\n  - {name: a, provider: openai-chat, model: m, fallback: [b, b]}\n  - {name: b, provider: openai-chat, model: n}\n"},
		{"fallback cycle", "models:\n  - {name: a, provider: openai-chat, model: m, fallback: [b]}\n  - {name: b, provider: openai-chat, model: n, fallback: [c]}\n  - {name: c, provider: openai-chat, model: o, fallback: [a]}\n"},
		{"not yaml", "models: [\n"},
		{"json with a bad provider", `{"models": [{"name": "a", "provider": "openai", "model": "m"}]}`},
	}
	var got strings.Builder
	for _, c := range cases {
		_, err := modelsfile.Parse("models.yaml", []byte(c.yaml))
		var errs modelsfile.Errors
		if !errors.As(err, &errs) {
			t.Errorf("%s: err = %v, want modelsfile.Errors", c.name, err)
			continue
		}
		fmt.Fprintf(&got, "== %s\n%s\n", c.name, errs)
	}
	golden := filepath.Join("testdata", "errors.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("errors differ from %s (-update rewrites it):\n%s", golden, got.String())
	}
}

func TestParseExample(t *testing.T) {
	t.Parallel()
	f, err := modelsfile.Load(filepath.Join("testdata", "models.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(f.Names(), ","), "main,small,claude,nova"; got != want {
		t.Fatalf("names = %s, want %s", got, want)
	}
	main, _ := f.Entry("main")
	if main.Provider != modelsfile.OpenAIChat || main.Model != "gpt-4o" || main.ContextTokens != 128000 || main.MaxOutputTokens != 4096 ||
		main.APIKey != "${ssm:/agentloop/openai-api-key}" || strings.Join(main.Fallback, ",") != "small" || main.Line != 2 {
		t.Errorf("main = %+v", main)
	}
	claude, _ := f.Entry("claude")
	if claude.Region != "us-west-2" || claude.APIKey != "" {
		t.Errorf("claude = %+v", claude)
	}
	prices, err := f.Prices()
	if err != nil {
		t.Fatal(err)
	}
	u := agent.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000}
	for model, want := range map[string]int64{"main": 12_500_000, "gpt-4o": 12_500_000, "gpt-4o-2024-08-06": 12_500_000, "small": 750_000, "nova": 0} {
		if got, _ := prices.Cost(model, u); got != want {
			t.Errorf("cost of %s = %d, want %d", model, got, want)
		}
	}
	// Cache writes at their own price: 1M in of which 200k read and 400k written, 1M out:
	// 400k×3 + 200k×0.3 + 400k×3.75 + 1M×15 = 1.2 + 0.06 + 1.5 + 15 = 17.76 $.
	cached := agent.Usage{InputTokens: 1_000_000, CachedInputTokens: 200_000, CacheWriteTokens: 400_000, OutputTokens: 1_000_000}
	if got, _ := prices.Cost("claude", cached); got != 17_760_000 {
		t.Errorf("cost of claude's cache writes = %d, want 17760000", got)
	}
	roles, err := f.Roles("", "small", "")
	if err != nil || roles != (modelsfile.Roles{Default: "main", Subagent: "small", Title: "main"}) {
		t.Errorf("roles = %+v, %v", roles, err)
	}
	_, err = f.Roles("big", "small", "tiny")
	if want := `AGENT_MODEL="big" names no entry of the models file models.yaml (its entries: main, small, claude, nova); ` +
		`AGENT_TITLE_MODEL="tiny" names no entry of the models file models.yaml (its entries: main, small, claude, nova)`; err == nil || err.Error() != want {
		t.Errorf("roles err = %v, want %s", err, want)
	}
}

// TestStartupScope: in Lambda an ${ssm:…} key must be a parameter the roles may read, refused at its line before
// SSM is asked; ${env:…} keys resolve from the environment, and an unset one fails the start.
func TestStartupScope(t *testing.T) {
	t.Parallel()
	file := "models:\n  - name: a\n    provider: openai-chat\n    model: m\n    apiKey: ${ssm:/agentloop/openai-api-key}\n" +
		"  - name: b\n    provider: anthropic\n    model: c\n    apiKey: ${ssm:/other/key}\n" +
		"  - name: c\n    provider: openai-chat\n    model: m\n    apiKey: ${env:C_KEY}\n"
	f, err := modelsfile.Parse("models.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	ssm := fakeSSM{"/agentloop/openai-api-key": "sk-a", "/other/key": "sk-b"}
	env := secretref.EnvResolver(func(name string) string { return map[string]string{"C_KEY": "sk-c"}[name] })
	r := secretref.Resolvers{secretref.Env: env, secretref.SSM: ssm}
	log := slog.New(slog.DiscardHandler)
	cases := []struct {
		name string
		o    modelsfile.Options
		r    secretref.Resolver
		err  string
		keys map[string]string
	}{
		{name: "scoped, one outside", o: modelsfile.Options{SSMScoped: true, SSMParams: []string{"/agentloop/openai-api-key"}, SSMHint: "keep model keys there"},
			r: r, err: "models.yaml:9: models[1].apiKey: ${ssm:/other/key} is not a parameter the functions may read (they may read /agentloop/openai-api-key): keep model keys there"},
		{name: "scoped, one under the path", o: modelsfile.Options{SSMScoped: true, SSMParams: []string{"/agentloop/openai-api-key"}, SSMPrefix: "/other/"},
			r: r, keys: map[string]string{"a": "sk-a", "b": "sk-b", "c": "sk-c"}},
		{name: "scoped, outside the path", o: modelsfile.Options{SSMScoped: true, SSMPrefix: "/agentloop/"}, r: r,
			err: "models.yaml:9: models[1].apiKey: ${ssm:/other/key} is not a parameter the functions may read (they may read those under /agentloop/)"},
		{name: "scoped, none granted", o: modelsfile.Options{SSMScoped: true}, r: r,
			err: "models.yaml:5: models[0].apiKey: ${ssm:/agentloop/openai-api-key} is not a parameter the functions may read\n" +
				"models.yaml:9: models[1].apiKey: ${ssm:/other/key} is not a parameter the functions may read"},
		{name: "unscoped", r: r, keys: map[string]string{"a": "sk-a", "b": "sk-b", "c": "sk-c"}},
		{name: "no ssm resolver", r: secretref.Resolvers{secretref.Env: env},
			err: "models file models.yaml: ssm references cannot be resolved here: [${ssm:/agentloop/openai-api-key} ${ssm:/other/key}]"},
		{name: "env unset", r: secretref.Resolvers{secretref.Env: secretref.EnvResolver(func(string) string { return "" }), secretref.SSM: ssm},
			err: "models file models.yaml: environment variables that are not set: C_KEY"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			vals, err := modelsfile.Startup(context.Background(), f, c.o, c.r, log)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("err = %v\nwant %s", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range c.keys {
				m, _ := f.Entry(name)
				if got := vals.Expand(m.APIKey); got != want {
					t.Errorf("%s key = %q, want %q", name, got, want)
				}
			}
		})
	}
}

type fakeSSM map[string]string

func (s fakeSSM) Resolve(_ context.Context, refs []secretref.Ref) (map[secretref.Ref]string, error) {
	out := map[secretref.Ref]string{}
	for _, r := range refs {
		if v, ok := s[r.Name]; ok {
			out[r] = v
		}
	}
	return out, nil
}
