package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// REVIEW S13: `agentloop token` mints dev tokens only: aud agentloop-dev (so no deployment takes one, even with
// a copied secret), and it refuses to mint at all in what looks like a deployment's environment (TABLE_NAME or
// AGENT_SECRET_PARAM set).
func TestTokenIsADevToken(t *testing.T) {
	t.Parallel()
	bin, data := setup(t)
	mint := func(env ...string) (string, error) {
		cmd := exec.Command(bin, "token", "--user", "alice", "--data", data)
		cmd.Env = append(append(os.Environ(), "AGENT_SECRET=", "TABLE_NAME=", "AGENT_SECRET_PARAM="), env...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	tok, err := mint()
	if err != nil {
		t.Fatalf("token: %v: %s", err, tok)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", tok)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Aud any `json:"aud"`
		Iat int64
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(claims.Aud); !strings.Contains(string(b), `"agentloop-dev"`) {
		t.Fatalf("aud = %s, want agentloop-dev", b)
	}
	for _, env := range []string{"TABLE_NAME=agentloop", "AGENT_SECRET_PARAM=/agentloop/secret"} {
		out, err := mint(env, "AGENT_SECRET=0123456789abcdef0123456789abcdef")
		if err == nil || strings.HasPrefix(out, "eyJ") || !strings.Contains(out, strings.Split(env, "=")[0]) {
			t.Fatalf("with %s: err %v, output %q: want a refusal that names it", env, err, out)
		}
	}
}
