package toolsfile

import (
	"context"
	"log/slog"
)

// Startup is the cold start's check of the tools file at path ("" : there is none, nil is returned): it is read
// and checked whole (Load, with reserved the Go tools' names), its ${env:…} references are resolved through
// getenv (an unset variable fails the start), its ${ssm:…} references are checked for form only (they are
// read with the tools that send them), and one tools.file log line says what it holds.
//
// Nothing of the file is offered to the model yet: MCP and HTTP execution come later (issue 19).
func Startup(path string, reserved []string, getenv func(string) string, log *slog.Logger) (*File, error) {
	if path == "" {
		return nil, nil
	}
	f, err := Load(path, Options{Reserved: reserved})
	if err != nil {
		return nil, err
	}
	var env []Ref
	ssm := 0
	for _, r := range f.Refs() {
		if r.Scheme == RefEnv {
			env = append(env, r)
		} else {
			ssm++
		}
	}
	if _, err := EnvResolver(getenv).Resolve(context.Background(), env); err != nil {
		return nil, err
	}
	var servers, tools []string
	for _, s := range f.MCPServers {
		servers = append(servers, s.Name)
	}
	for _, t := range f.HTTPTools {
		tools = append(tools, t.Name)
	}
	log.Info("tools.file", "file", path, "mcp_servers", servers, "http_tools", tools, "env_refs", len(env), "ssm_refs", ssm,
		"offered", false, "note", "checked only: MCP and HTTP tools are not offered to the model yet")
	return f, nil
}
