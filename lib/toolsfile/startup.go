package toolsfile

import (
	"context"
	"log/slog"
)

// Startup is the cold start's reading of the tools file source, a path or ssm:<parameter name> read through
// params ("": there is none, and nil is returned): it is read and checked whole (Read with o: the Go tools' names
// reserved, the ${ssm:…} references' scope), every reference of its headers is resolved through r (one that
// cannot be resolved fails the start: an unset variable, a missing SSM parameter, or a scheme r does not
// resolve), and one tools.file log line says what it holds. The wiring builds the tool sources (lib/httptools,
// lib/mcptools) from the file and the secrets returned.
func Startup(ctx context.Context, source string, o Options, r Resolver, params ParamReader, log *slog.Logger) (*File, Secrets, error) {
	if source == "" {
		return nil, nil, nil
	}
	f, err := Read(ctx, source, o, params)
	if err != nil {
		return nil, nil, err
	}
	secrets, err := f.Resolve(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	env, ssm := 0, 0
	for _, ref := range f.Refs() {
		if ref.Scheme == RefEnv {
			env++
		} else {
			ssm++
		}
	}
	var servers, tools []string
	for _, s := range f.MCPServers {
		servers = append(servers, s.Name)
	}
	for _, t := range f.HTTPTools {
		tools = append(tools, t.Name)
	}
	log.Info("tools.file", "file", source, "mcp_servers", servers, "http_tools", tools, "env_refs", env, "ssm_refs", ssm)
	return f, secrets, nil
}
