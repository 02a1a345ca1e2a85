package auth

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentloop/agentloop/lib/agent"
)

// REVIEW S13: a token `agentloop token` or `agentloop dev` minted (aud agentloop-dev) is refused by a verifier
// that is not the dev server's, so a production secret copied to a laptop mints nothing a deployment takes; the
// dev server takes them, and a deployment whose audience is agentloop-dev (deliberately) does too. Tokens
// without aud, as tests and frontends mint them, keep working everywhere that names no audience.
func TestDevTokensOnlyInDev(t *testing.T) {
	t.Parallel()
	dev, err := MintHS256(secret, "alice", time.Hour, now, WithAudience("agentloop-dev"))
	if err != nil {
		t.Fatal(err)
	}
	both, err := MintHS256(secret, "alice", time.Hour, now, WithAudience("my-app", "agentloop-dev"))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := MintHS256(secret, "alice", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		tweak func(*Config)
		tok   string
		ok    bool
	}{
		{"deployment refuses a dev token", nil, dev, false},
		{"deployment refuses a dev token that names its audience too", func(c *Config) { c.Audience = "my-app" }, both, false},
		{"deployment takes a plain token", nil, plain, true},
		{"deployment that names agentloop-dev takes it", func(c *Config) { c.Audience = "agentloop-dev" }, dev, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, _ := setup(t, c.tweak)
			_, err := v.VerifyToken(context.Background(), c.tok)
			if c.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !c.ok && !errors.Is(err, &agent.Error{Code: CodeInvalidToken}) {
				t.Fatalf("err = %v, want invalid_token", err)
			}
		})
	}
}

// REVIEW S13: with MaxAge set (AGENT_JWT_MAX_AGE) a token must carry iat and be at most that old, whatever its
// exp; without it, exp alone bounds a token, as the contract has always said.
func TestMaxTokenAge(t *testing.T) {
	t.Parallel()
	week := 7 * 24 * time.Hour
	young, _ := MintHS256(secret, "alice", 30*24*time.Hour, now.Add(-time.Hour))
	old, _ := MintHS256(secret, "alice", 30*24*time.Hour, now.Add(-week-time.Hour))
	v, sign := setup(t, func(c *Config) { c.MaxAge = week })
	if _, err := v.VerifyToken(context.Background(), young); err != nil {
		t.Fatalf("a token an hour old: %v", err)
	}
	if _, err := v.VerifyToken(context.Background(), old); !errors.Is(err, &agent.Error{Code: CodeTokenExpired}) {
		t.Fatalf("a token a week and an hour old: %v, want token_expired", err)
	}
	noIat := sign(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Hour).Unix()})
	if _, err := v.VerifyToken(context.Background(), noIat); !errors.Is(err, &agent.Error{Code: CodeInvalidToken}) {
		t.Fatalf("no iat with a max age: %v, want invalid_token", err)
	}
	plain, _ := setup(t, nil)
	for _, tok := range []string{old, noIat} {
		if _, err := plain.VerifyToken(context.Background(), tok); err != nil {
			t.Fatalf("no max age: %v", err)
		}
	}
	if _, err := NewVerifier(Config{Keys: HMACKey{Secret: secret}, Clock: fixedClock{now}, MaxAge: -time.Second}); err == nil {
		t.Fatal("a negative MaxAge was accepted")
	}
}
