// Package ssmsecrets loads the application's secrets (the OpenAI API key, the application secret) from SSM
// Parameter Store SecureString parameters. The Lambda mains call Load once at cold start, with the parameter
// names taken from the environment, and keep the values for the life of the container: no request ever waits on
// SSM, and a secret is never a plain template parameter or environment variable in AWS.
//
// A secret whose parameter name is unset falls back to a plain value (the AGENT_SECRET / OPENAI_API_KEY
// environment variables), for local runs and tests where there is no SSM. A secret whose parameter name is set
// never falls back: a missing, empty or non-SecureString parameter is an error, so a misconfigured deployment
// fails at cold start instead of running with a value nobody meant.
//
// ReadParameter reads one parameter whole, String or SecureString: a configuration too large for an environment
// variable that a deployment keeps in SSM rather than in its package (the tools file, AGENT_TOOLS_FILE=ssm:<name>).
package ssmsecrets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/aws-sdk-go-v2/service/ssm/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// MissingParams is the cause of a CodeMissing error: the names of the SSM parameters to create.
type MissingParams []string

func (m MissingParams) Error() string { return "missing SSM parameters: " + strings.Join(m, ", ") }

// Stable error codes; every Load error is an *agent.Error with one of them.
const (
	CodeUnavailable = agent.CodeSecretUnavailable // the SSM request failed (KindUnavailable)
	CodeMissing     = agent.CodeSecretMissing     // a named parameter does not exist or is empty
	CodeNotSecure   = agent.CodeSecretNotSecure   // a named parameter is not a SecureString
	CodeUnset       = agent.CodeSecretUnset       // a required secret has neither a parameter name nor a fallback value
)

// maxNamesPerCall is SSM's limit on the names of one GetParameters request.
const maxNamesPerCall = 10

// API is the part of the SSM client Load uses; *ssm.Client implements it.
type API interface {
	GetParameters(ctx context.Context, in *ssm.GetParametersInput, optFns ...func(*ssm.Options)) (*ssm.GetParametersOutput, error)
}

// Secret says where one secret comes from.
type Secret struct {
	// Label names the secret in errors, e.g. "application secret". Never the value.
	Label string
	// Param is the SSM parameter name (or ARN). When set, SSM is the only source.
	Param string
	// Fallback is the plain value used when Param is empty (local runs and tests).
	Fallback string
	// Optional lets the secret resolve to "" when both Param and Fallback are empty.
	Optional bool
}

// Load resolves secrets in order and returns their values in the same order. The parameters are read with
// decryption in as few GetParameters calls as possible (one for up to ten distinct names). api is used only when
// some secret names a parameter, so it may be nil otherwise.
func Load(ctx context.Context, api API, secrets ...Secret) ([]string, error) {
	var names []string
	for _, s := range secrets {
		if s.Param != "" && !slices.Contains(names, s.Param) {
			names = append(names, s.Param)
		}
	}
	params := map[string]types.Parameter{}
	if len(names) > 0 {
		if api == nil {
			return nil, agent.E(agent.KindInternal, CodeUnavailable, "ssmsecrets: parameters named but no SSM client given")
		}
		for batch := range slices.Chunk(names, maxNamesPerCall) {
			out, err := api.GetParameters(ctx, &ssm.GetParametersInput{Names: batch, WithDecryption: aws.Bool(true)})
			if err != nil {
				return nil, agent.Wrap(err, agent.KindUnavailable, CodeUnavailable, "read secrets from SSM Parameter Store")
			}
			for _, p := range out.Parameters {
				name := aws.ToString(p.Name)
				params[name] = p
				// A versioned or labelled name ("name:3") comes back as the bare name plus its selector.
				if sel := aws.ToString(p.Selector); sel != "" {
					params[name+sel] = p
				}
			}
		}
	}
	values := make([]string, len(secrets))
	var missing MissingParams
	var labels []string
	for _, s := range secrets {
		if p, ok := params[s.Param]; s.Param != "" && (!ok || aws.ToString(p.Value) == "") && !slices.Contains(missing, s.Param) {
			missing, labels = append(missing, s.Param), append(labels, fmt.Sprintf("%s (%s)", s.Param, s.Label))
		}
	}
	if len(missing) > 0 {
		// Every one at once: a first deploy learns all it must create from one failed cold start.
		return nil, agent.Wrap(missing, agent.KindInternal, CodeMissing, fmt.Sprintf(
			"SSM SecureString parameters that do not exist or are empty in this account and region: %s", strings.Join(labels, ", ")))
	}
	for i, s := range secrets {
		switch {
		case s.Param != "":
			p := params[s.Param]
			if p.Type != types.ParameterTypeSecureString {
				return nil, agent.E(agent.KindInternal, CodeNotSecure, "%s: SSM parameter %q is a %s, want a SecureString", s.Label, s.Param, p.Type)
			}
			values[i] = aws.ToString(p.Value)
		case s.Fallback != "":
			values[i] = s.Fallback
		case !s.Optional:
			return nil, agent.E(agent.KindInternal, CodeUnset, "%s is not configured: set its SSM parameter name (or, outside AWS, its plain variable)", s.Label)
		}
	}
	return values, nil
}

// ParameterAPI is the part of the SSM client ReadParameter uses; *ssm.Client implements it.
type ParameterAPI interface {
	GetParameter(ctx context.Context, in *ssm.GetParameterInput, optFns ...func(*ssm.Options)) (*ssm.GetParameterOutput, error)
}

// ReadParameter returns the value of the parameter name, read with decryption (one GetParameter request, which
// the caller's role must be granted on exactly that parameter). Any type is accepted, String or SecureString: the
// value is a configuration, its secrets references inside it. A parameter that does not exist (or is empty) is a
// CodeMissing error whose cause is MissingParams{name}, so the caller can say what to create; any other failure
// (AccessDenied: the role may not read it; a KMS key it may not use) is CodeUnavailable.
func ReadParameter(ctx context.Context, api ParameterAPI, name string) (string, error) {
	if api == nil {
		return "", agent.E(agent.KindInternal, CodeUnavailable, "ssmsecrets: parameter %s named but no SSM client given", name)
	}
	out, err := api.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name), WithDecryption: aws.Bool(true)})
	var notFound *types.ParameterNotFound
	switch {
	case errors.As(err, &notFound):
		return "", agent.Wrap(MissingParams{name}, agent.KindInternal, CodeMissing,
			fmt.Sprintf("SSM parameter %s does not exist in this account and region", name))
	case err != nil:
		return "", agent.Wrap(err, agent.KindUnavailable, CodeUnavailable, "read SSM parameter "+name)
	case out.Parameter == nil || aws.ToString(out.Parameter.Value) == "":
		return "", agent.Wrap(MissingParams{name}, agent.KindInternal, CodeMissing, fmt.Sprintf("SSM parameter %s is empty", name))
	}
	return aws.ToString(out.Parameter.Value), nil
}
