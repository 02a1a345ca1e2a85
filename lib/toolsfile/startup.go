package toolsfile

import (
	"context"
	"log/slog"
)

// Startup is the cold start's reading of the tools file at path ("": there is none, and nil is returned): it is
// read and checked whole (Load with o: the Go tools' names reserved, the ${ssm:…} references' scope), every reference of its headers is resolved
// through r (one that cannot be resolved fails the start: an unset variable, a missing SSM parameter, or a scheme
// r does not resolve), and one tools.file log line says what it holds. The wiring builds the tool sources
// (lib/httptools, lib/mcptools) from the file and the secrets returned.
func Startup(ctx context.Context, path string, o Options, r Resolver, log *slog.Logger) (*File, Secrets, error) {
	if path == "" {
		return nil, nil, nil
	}
	f, err := Load(path, o)
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
	log.Info("tools.file", "file", path, "mcp_servers", servers, "http_tools", tools, "env_refs", env, "ssm_refs", ssm)
	return f, secrets, nil
}
