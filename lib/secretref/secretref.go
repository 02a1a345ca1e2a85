// Package secretref is the secret references that configuration files write instead of secrets: ${env:NAME} (an
// environment variable) and ${ssm:/parameter/name} (an SSM SecureString parameter). It parses them and resolves
// them through a Resolver the wiring fills; the tools file (lib/toolsfile) and the models file (lib/modelsfile)
// share it. It is configuration, not an adapter: the SSM resolver lives in the wiring (over lib/ssmsecrets).
package secretref

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Ref is one reference: ${env:NAME} or ${ssm:/parameter/name}.
type Ref struct {
	Scheme string // Env or SSM
	Name   string
}

// Reference schemes.
const (
	Env = "env"
	SSM = "ssm"
)

func (r Ref) String() string { return "${" + r.Scheme + ":" + r.Name + "}" }

var (
	refRE     = regexp.MustCompile(`\$\{([^{}]*)\}`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// SSM parameter names: letters, digits and _.-/; hierarchies start with /.
	ssmNameRE = regexp.MustCompile(`^/[a-zA-Z0-9_.\-/]{1,1000}$`)
)

// Parse returns the references in value, or why it is not acceptable: anything in ${…} that is not a reference,
// or an unterminated ${.
func Parse(value string) ([]Ref, error) {
	var refs []Ref
	for _, m := range refRE.FindAllStringSubmatch(value, -1) {
		scheme, name, _ := strings.Cut(m[1], ":")
		switch {
		case scheme == Env && envNameRE.MatchString(name):
		case scheme == SSM && ssmNameRE.MatchString(name):
		default:
			return nil, fmt.Errorf("%s is not a reference (want ${env:NAME} or ${ssm:/parameter/name})", m[0])
		}
		refs = append(refs, Ref{Scheme: scheme, Name: name})
	}
	if rest := refRE.ReplaceAllString(value, ""); strings.Contains(rest, "${") {
		return nil, errors.New("an unterminated ${ reference")
	}
	return refs, nil
}

// Strip returns value with its references taken out (what was written around them).
func Strip(value string) string { return refRE.ReplaceAllString(value, "") }

// Resolver gives the values of references.
type Resolver interface {
	Resolve(ctx context.Context, refs []Ref) (map[Ref]string, error)
}

// EnvResolver resolves ${env:NAME} through getenv; an unset or empty variable is an error.
type EnvResolver func(string) string

func (getenv EnvResolver) Resolve(_ context.Context, refs []Ref) (map[Ref]string, error) {
	out := map[Ref]string{}
	var missing []string
	for _, r := range refs {
		if r.Scheme != Env {
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
		return nil, fmt.Errorf("environment variables that are not set: %s", strings.Join(missing, ", "))
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
	schemes := make([]string, 0, len(by))
	for s := range by {
		schemes = append(schemes, s)
	}
	slices.Sort(schemes)
	out := map[Ref]string{}
	for _, scheme := range schemes {
		r, ok := rs[scheme]
		if !ok {
			return nil, fmt.Errorf("%s references cannot be resolved here: %v", scheme, by[scheme])
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

// Values are resolved references.
type Values map[Ref]string

// Resolve resolves refs through r; every one must get a value.
func Resolve(ctx context.Context, r Resolver, refs []Ref) (Values, error) {
	if len(refs) == 0 {
		return Values{}, nil
	}
	vals, err := r.Resolve(ctx, refs)
	if err != nil {
		return nil, err
	}
	for _, ref := range refs {
		if _, ok := vals[ref]; !ok {
			return nil, fmt.Errorf("%s was not resolved", ref)
		}
	}
	return Values(vals), nil
}

// Expand returns value with its references replaced by their values.
func (v Values) Expand(value string) string {
	return refRE.ReplaceAllStringFunc(value, func(m string) string {
		scheme, name, _ := strings.Cut(m[2:len(m)-1], ":")
		return v[Ref{Scheme: scheme, Name: name}]
	})
}
