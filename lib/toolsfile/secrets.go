package toolsfile

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/agentloop/agentloop/lib/secretref"
)

// Ref is a secret reference in a header value: ${env:NAME} or ${ssm:/parameter/name} (lib/secretref, which
// the models file shares).
type Ref = secretref.Ref

// Reference schemes.
const (
	RefEnv = secretref.Env
	RefSSM = secretref.SSM
)

// parseRefs returns the references in value, or why it is not acceptable.
func parseRefs(value string) ([]Ref, error) { return secretref.Parse(value) }

// credentialHeader reports whether a header carries credentials by its name, and whether a scheme word
// ("Bearer") may precede them.
func credentialHeader(name string) (credential, scheme bool) {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization":
		return true, true
	case "cookie", "x-api-key", "api-key", "apikey":
		return true, false
	}
	for _, suffix := range []string{"-key", "-token", "-secret", "-password"} {
		if strings.HasSuffix(n, suffix) {
			return true, false
		}
	}
	return false, false
}

var (
	schemeOnlyRE    = regexp.MustCompile(`^\s*([A-Za-z][A-Za-z0-9_-]*\s+)?$`)
	inlineBearerRE  = regexp.MustCompile(`(?i)^\s*bearer\s+[^\s$]`)
	referenceOnlyRE = regexp.MustCompile(`^\s*$`)
)

// checkHeaderValue returns why value may not be sent in header name ("" when it may): references must parse,
// and credentials must come from references, never be written in the file.
func checkHeaderValue(name, value string) string {
	refs, err := parseRefs(value)
	if err != nil {
		return err.Error()
	}
	rest := secretref.Strip(value)
	credential, scheme := credentialHeader(name)
	inline := "looks like a secret written in the file: write a reference instead, e.g. \"Bearer ${ssm:/agentloop/token}\" or \"${env:TOKEN}\""
	switch {
	case inlineBearerRE.MatchString(value):
		return inline
	case !credential:
		return ""
	case len(refs) == 0:
		return inline
	case scheme && !schemeOnlyRE.MatchString(rest), !scheme && !referenceOnlyRE.MatchString(rest):
		return inline
	}
	return ""
}

// Refs are the references of the file's headers, each once, sorted.
func (f *File) Refs() []Ref {
	var all []Ref
	add := func(headers map[string]string) {
		for _, v := range headers {
			refs, _ := parseRefs(v) // checked by Parse
			all = append(all, refs...)
		}
	}
	for _, s := range f.MCPServers {
		add(s.Headers)
	}
	for _, t := range f.HTTPTools {
		add(t.Headers)
	}
	slices.SortFunc(all, func(a, b Ref) int { return cmp.Or(cmp.Compare(a.Scheme, b.Scheme), cmp.Compare(a.Name, b.Name)) })
	return slices.Compact(all)
}

// Resolver gives the values of references. The wiring fills it: EnvResolver for ${env:…}; SSM through
// lib/ssmsecrets (one GetParameters request per ten names, SecureString only).
type Resolver = secretref.Resolver

// EnvResolver resolves ${env:NAME} through getenv; an unset or empty variable is an error.
type EnvResolver func(string) string

func (getenv EnvResolver) Resolve(_ context.Context, refs []Ref) (map[Ref]string, error) {
	out := map[Ref]string{}
	var missing []string
	for _, r := range refs {
		if r.Scheme != RefEnv {
			return nil, fmt.Errorf("%s: not an environment reference", r)
		}
		v := getenv(r.Name)
		if v == "" {
			missing = append(missing, r.Name)
			continue
		}
		out[r] = v
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the tools file refers to environment variables that are not set: %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// Resolvers dispatches references by scheme; a scheme without a resolver is an error that names its references.
type Resolvers map[string]Resolver

func (rs Resolvers) Resolve(ctx context.Context, refs []Ref) (map[Ref]string, error) {
	by := map[string][]Ref{}
	for _, r := range refs {
		by[r.Scheme] = append(by[r.Scheme], r)
	}
	out := map[Ref]string{}
	for _, scheme := range slices.Sorted(maps.Keys(by)) {
		r, ok := rs[scheme]
		if !ok {
			return nil, fmt.Errorf("the tools file's %s references cannot be resolved here: %v", scheme, by[scheme])
		}
		vals, err := r.Resolve(ctx, by[scheme])
		if err != nil {
			return nil, err
		}
		for k, v := range vals {
			out[k] = v
		}
	}
	return out, nil
}

// Secrets are resolved references.
type Secrets map[Ref]string

// Resolve resolves the file's references through r.
func (f *File) Resolve(ctx context.Context, r Resolver) (Secrets, error) {
	refs := f.Refs()
	if len(refs) == 0 {
		return Secrets{}, nil
	}
	vals, err := r.Resolve(ctx, refs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	for _, ref := range refs {
		if _, ok := vals[ref]; !ok {
			return nil, fmt.Errorf("%s: %s was not resolved", f.Name, ref)
		}
	}
	return Secrets(vals), nil
}

// Expand returns value with its references replaced by their values (a header to send).
func (s Secrets) Expand(value string) string { return secretref.Values(s).Expand(value) }
