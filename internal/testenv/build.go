package testenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
)

// BuildAgentloop builds cmd/agentloop into dir and returns the binary's path: the harnesses that run `agentloop
// dev` as a process of its own (the chaos soak, the peer benchmark) kill and measure that process, not a test's.
func BuildAgentloop(dir string) (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "agentloop")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/agentloop")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build agentloop: %v\n%s", err, out)
	}
	return bin, nil
}
