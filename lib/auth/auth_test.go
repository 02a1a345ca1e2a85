package auth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentloop/agentloop/lib/agent"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

var (
	now    = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	secret = []byte("0123456789abcdef0123456789abcdef")
)

// setup returns a verifier for secret at now with the given tweaks, and a helper to sign claims with any
// method and key.
func setup(t *testing.T, tweak func(*Config)) (*Verifier, func(jwt.SigningMethod, any, jwt.MapClaims) string) {
	t.Helper()
	cfg := Config{Keys: HMACKey{Secret: secret}, Clock: fixedClock{now}}
	if tweak != nil {
		tweak(&cfg)
	}
	v, err := NewVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(m jwt.SigningMethod, key any, c jwt.MapClaims) string {
		t.Helper()
		s, err := jwt.NewWithClaims(m, c).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return v, sign
}

func claims(sub string, exp time.Time) jwt.MapClaims {
	c := jwt.MapClaims{"iat": now.Add(-time.Minute).Unix()}
	if sub != "" {
		c["sub"] = sub
	}
	if !exp.IsZero() {
		c["exp"] = exp.Unix()
	}
	return c
}

// forge builds header.payload.signature by hand, HMAC-signed with secret whatever the header claims.
func forge(header, payload string) string {
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signing))
	return signing + "." + enc.EncodeToString(mac.Sum(nil))
}

// unsigned builds header.payload. with an empty signature.
func unsigned(header, payload string) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload)) + "."
}

func TestVerify(t *testing.T) {
	t.Parallel()
	_, sign := setup(t, nil)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	hour := now.Add(time.Hour)
	valid := sign(jwt.SigningMethodHS256, secret, claims("alice", hour))
	payload := `{"sub":"alice","exp":` + strconv.FormatInt(hour.Unix(), 10) + `}`

	tests := []struct {
		name   string
		header string // Authorization header; empty means none
		tweak  func(*Config)
		code   string // expected error code, empty for success
	}{
		{name: "valid", header: "Bearer " + valid},
		{name: "lowercase scheme", header: "bearer " + valid},
		{name: "missing header", code: CodeMissingToken},
		{name: "wrong scheme", header: "Basic " + valid, code: CodeMissingToken},
		{name: "empty bearer", header: "Bearer ", code: CodeMissingToken},
		{name: "no token separator", header: "Bearer", code: CodeMissingToken},
		{name: "garbage", header: "Bearer not.a.jwt", code: CodeInvalidToken},
		{name: "bad signature", header: "Bearer " + sign(jwt.SigningMethodHS256, []byte("another-secret-another-secret-xx"), claims("alice", hour)), code: CodeInvalidToken},
		{name: "tampered payload", header: "Bearer " + tamper(valid), code: CodeInvalidToken},
		{name: "expired", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, claims("alice", now.Add(-time.Minute))), code: CodeTokenExpired},
		{name: "expired within leeway", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, claims("alice", now.Add(-10*time.Second)))},
		{name: "expired, no leeway", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, claims("alice", now.Add(-10*time.Second))),
			tweak: func(c *Config) { c.Leeway = -1 }, code: CodeTokenExpired},
		{name: "no exp", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, claims("alice", time.Time{})), code: CodeInvalidToken},
		{name: "no exp allowed", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, claims("alice", time.Time{})),
			tweak: func(c *Config) { c.AllowNoExpiry = true }},
		{name: "not yet valid", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "alice", "exp": hour.Unix(), "nbf": now.Add(time.Hour).Unix()}), code: CodeInvalidToken},
		{name: "issued in the future", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "alice", "exp": hour.Unix(), "iat": now.Add(10 * time.Minute).Unix()}), code: CodeInvalidToken},
		{name: "missing sub", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, claims("", hour)), code: CodeInvalidToken},
		{name: "alg none", header: "Bearer " + sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("alice", hour)), code: CodeInvalidToken},
		{name: "alg none, empty signature", header: "Bearer " + unsigned(`{"alg":"none","typ":"JWT"}`, payload), code: CodeInvalidToken},
		{name: "wrong alg HS512 with the same secret", header: "Bearer " + sign(jwt.SigningMethodHS512, secret, claims("alice", hour)), code: CodeInvalidToken},
		{name: "RS256 header with HMAC signature (key confusion)", header: "Bearer " + forge(`{"alg":"RS256","typ":"JWT"}`, payload), code: CodeInvalidToken},
		{name: "real RS256 token", header: "Bearer " + sign(jwt.SigningMethodRS256, rsaKey, claims("alice", hour)), code: CodeInvalidToken},
		{name: "hand made HS256 is accepted", header: "Bearer " + forge(`{"alg":"HS256","typ":"JWT"}`, payload)},
		{name: "oversized token", header: "Bearer " + strings.Repeat("a", MaxTokenBytes+1), code: CodeInvalidToken},
		{name: "issuer required and missing", header: "Bearer " + valid,
			tweak: func(c *Config) { c.Issuer = "https://issuer.example" }, code: CodeInvalidToken},
		{name: "issuer matches", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "alice", "exp": hour.Unix(), "iss": "https://issuer.example"}),
			tweak: func(c *Config) { c.Issuer = "https://issuer.example" }},
		{name: "audience mismatch", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "alice", "exp": hour.Unix(), "aud": "other"}),
			tweak: func(c *Config) { c.Audience = "agentloop" }, code: CodeInvalidToken},
		{name: "audience among several", header: "Bearer " + sign(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "alice", "exp": hour.Unix(), "aud": []string{"other", "agentloop"}}),
			tweak: func(c *Config) { c.Audience = "agentloop" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v, _ := setup(t, tt.tweak)
			r := httptest.NewRequest(http.MethodGet, "/threads", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			p, err := v.Verify(context.Background(), r)
			if tt.code == "" {
				if err != nil || p.Subject != "alice" {
					t.Fatalf("Verify = %+v, %v; want alice", p, err)
				}
				return
			}
			if agent.KindOf(err) != agent.KindUnauthenticated || agent.CodeOf(err) != tt.code {
				t.Fatalf("Verify = %+v, %v; want unauthenticated %s", p, err, tt.code)
			}
			if p != (Principal{}) {
				t.Errorf("a failed Verify returned principal %+v", p)
			}
		})
	}
}

// tamper flips the subject in the payload without re-signing.
func tamper(token string) string {
	parts := strings.Split(token, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	payload = bytes.Replace(payload, []byte(`"alice"`), []byte(`"mallory"`), 1)
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	return strings.Join(parts, ".")
}

func TestMintHS256RoundTrip(t *testing.T) {
	t.Parallel()
	v, _ := setup(t, func(c *Config) { c.Issuer = "agentloop-dev"; c.Audience = "agentloop" })
	tok, err := MintHS256(secret, "bob", time.Hour, now, WithIssuer("agentloop-dev"), WithAudience("agentloop"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := v.VerifyToken(context.Background(), tok)
	if err != nil || p.Subject != "bob" {
		t.Fatalf("VerifyToken = %+v, %v", p, err)
	}
	// The same token is expired an hour (plus leeway) later.
	later, _ := setup(t, func(c *Config) {
		c.Clock = fixedClock{now.Add(time.Hour + DefaultLeeway + time.Second)}
		c.Issuer, c.Audience = "agentloop-dev", "agentloop"
	})
	if _, err := later.VerifyToken(context.Background(), tok); agent.CodeOf(err) != CodeTokenExpired {
		t.Errorf("an hour later: %v, want %s", err, CodeTokenExpired)
	}
}

func TestMintHS256Rejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		secret  []byte
		subject string
		ttl     time.Duration
		code    string
	}{
		{"short secret", []byte("short"), "bob", time.Hour, CodeWeakSecret},
		{"no subject", secret, "", time.Hour, "invalid_subject"},
		{"zero ttl", secret, "bob", 0, "invalid_ttl"},
		{"negative ttl", secret, "bob", -time.Second, "invalid_ttl"},
	}
	for _, tt := range tests {
		if _, err := MintHS256(tt.secret, tt.subject, tt.ttl, now); agent.CodeOf(err) != tt.code {
			t.Errorf("%s: MintHS256 = %v, want %s", tt.name, err, tt.code)
		}
	}
}

func TestNewVerifierRejectsBadConfig(t *testing.T) {
	t.Parallel()
	if _, err := NewHS256Verifier([]byte("too short"), fixedClock{now}); agent.CodeOf(err) != CodeWeakSecret {
		t.Errorf("short secret: %v", err)
	}
	if _, err := NewVerifier(Config{Keys: HMACKey{Secret: secret}}); err == nil {
		t.Error("a verifier without a clock was accepted")
	}
	if _, err := NewVerifier(Config{Clock: fixedClock{now}}); err == nil {
		t.Error("a verifier without keys was accepted")
	}
}

func TestDeriveKey(t *testing.T) {
	t.Parallel()
	// RFC 5869 test case 3 (SHA-256, empty salt and info): the first 32 bytes of its OKM.
	ikm := bytes.Repeat([]byte{0x0b}, 22)
	want, _ := hex.DecodeString("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d")
	if got := DeriveKey(ikm, ""); !bytes.Equal(got, want) {
		t.Errorf("DeriveKey(RFC 5869 case 3) = %x, want %x", got, want)
	}
	a, b := DeriveKey(secret, "approvals"), DeriveKey(secret, "tokens")
	if len(a) != DerivedKeyBytes || bytes.Equal(a, b) || bytes.Equal(a, secret[:DerivedKeyBytes]) {
		t.Errorf("labels must give distinct keys unrelated to the secret: %x %x", a, b)
	}
	if !bytes.Equal(a, DeriveKey(secret, "approvals")) {
		t.Error("DeriveKey is not deterministic")
	}
}

// The HMAC key source refuses to hand its secret to any other algorithm, even if a parser let one through.
func TestHMACKeyOnlyServesHS256(t *testing.T) {
	t.Parallel()
	k := HMACKey{Secret: secret}
	for _, m := range []jwt.SigningMethod{jwt.SigningMethodHS384, jwt.SigningMethodRS256, jwt.SigningMethodNone} {
		if key, err := k.Key(context.Background(), &jwt.Token{Method: m}); err == nil || key != nil {
			t.Errorf("%s: Key = %v, %v; want an error", m.Alg(), key, err)
		}
	}
	if key, err := k.Key(context.Background(), &jwt.Token{Method: jwt.SigningMethodHS256}); err != nil || !bytes.Equal(key.([]byte), secret) {
		t.Errorf("HS256: Key = %v, %v", key, err)
	}
}
