package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// REVIEW S13: `agentloop token` mints dev tokens: aud agentloop-dev (so no deployment takes one, even with a
// copied secret). In what looks like a Lambda deployment's environment (AGENT_SECRET_PARAM) it mints nothing; with
// TABLE_NAME set, as `agentloop serve` has it, it mints a deployment's token only from AGENT_SECRET given
// explicitly, without the dev audience (TestServeReplicas checks serve takes it and refuses the dev one).
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
	for _, env := range [][]string{{"AGENT_SECRET_PARAM=/agentloop/secret"}, {"AGENT_SECRET_PARAM=/agentloop/secret", "TABLE_NAME=agentloop"},
		{"TABLE_NAME=agentloop", "AGENT_SECRET="}} {
		out, err := mint(append([]string{"AGENT_SECRET=0123456789abcdef0123456789abcdef"}, env...)...)
		if err == nil || strings.HasPrefix(out, "eyJ") || !strings.Contains(out, strings.Split(env[0], "=")[0]) {
			t.Fatalf("with %s: err %v, output %q: want a refusal that names it", env, err, out)
		}
	}
	serveTok, err := mint("TABLE_NAME=agentloop", "AGENT_SECRET=0123456789abcdef0123456789abcdef", "AGENT_JWT_AUDIENCE=my-app")
	if err != nil || !strings.HasPrefix(serveTok, "eyJ") {
		t.Fatalf("with TABLE_NAME and AGENT_SECRET: %v %q, want a token", err, serveTok)
	}
	payload, err = base64.RawURLEncoding.DecodeString(strings.Split(serveTok, ".")[1])
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(payload, []byte("agentloop-dev")) || !bytes.Contains(payload, []byte(`"aud":["my-app"]`)) && !bytes.Contains(payload, []byte(`"aud":"my-app"`)) {
		t.Fatalf("serve token claims %s: want aud my-app (AGENT_JWT_AUDIENCE), never agentloop-dev", payload)
	}
}
