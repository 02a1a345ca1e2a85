package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
)

// idp is a local identity provider: a JWKS URL serving its current public keys (rotated by the test) and a
// count of how often the key set was fetched.
type idp struct {
	mu      sync.Mutex
	rsa     map[string]*rsa.PrivateKey
	ec      map[string]*ecdsa.PrivateKey
	fetches atomic.Int32
	srv     *httptest.Server
}

func newIDP(t *testing.T) *idp {
	t.Helper()
	p := &idp{rsa: map[string]*rsa.PrivateKey{}, ec: map[string]*ecdsa.PrivateKey{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.fetches.Add(1)
		p.mu.Lock()
		defer p.mu.Unlock()
		b64 := base64.RawURLEncoding.EncodeToString
		var keys []map[string]string
		for kid, k := range p.rsa {
			keys = append(keys, map[string]string{"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
				"n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())})
		}
		for kid, k := range p.ec {
			keys = append(keys, map[string]string{"kty": "EC", "kid": kid, "alg": "ES256", "use": "sig", "crv": "P-256",
				"x": b64(k.X.FillBytes(make([]byte, 32))), "y": b64(k.Y.FillBytes(make([]byte, 32)))})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": keys})
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *idp) addRSA(t *testing.T, kid string) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.rsa[kid] = k
	p.mu.Unlock()
}

func (p *idp) addEC(t *testing.T, kid string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ec[kid] = k
	p.mu.Unlock()
}

// retire removes a key from the served set (a rotation); its private half still signs, for the test.
func (p *idp) retire(kid string) (*rsa.PrivateKey, *ecdsa.PrivateKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, e := p.rsa[kid], p.ec[kid]
	delete(p.rsa, kid)
	delete(p.ec, kid)
	return r, e
}

func (p *idp) sign(t *testing.T, kid string, claims jwt.MapClaims) string {
	t.Helper()
	p.mu.Lock()
	r, e := p.rsa[kid], p.ec[kid]
	p.mu.Unlock()
	var tok *jwt.Token
	var key any
	switch {
	case r != nil:
		tok, key = jwt.NewWithClaims(jwt.SigningMethodRS256, claims), r
	case e != nil:
		tok, key = jwt.NewWithClaims(jwt.SigningMethodES256, claims), e
	default:
		// A kid the provider never served: sign with a throwaway key.
		k, _ := rsa.GenerateKey(rand.Reader, 2048)
		tok, key = jwt.NewWithClaims(jwt.SigningMethodRS256, claims), k
	}
	tok.Header["kid"] = kid
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const (
	issuer   = "https://idp.example/pool"
	audience = "agentloop-app"
)

func claimsFor(now time.Time) jwt.MapClaims {
	return jwt.MapClaims{"sub": "u-123", "email": "ada@example.com", "iss": issuer, "aud": audience,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

func setupJWKS(t *testing.T, subjectClaim string) (*idp, *auth.Verifier, agent.Clock) {
	t.Helper()
	p := newIDP(t)
	p.addRSA(t, "r1")
	p.addEC(t, "e1")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	keys, err := auth.NewJWKSKeys(ctx, auth.JWKSConfig{URL: p.srv.URL, Client: p.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	clock := agent.SystemClock{}
	v, err := auth.NewVerifier(auth.Config{Keys: auth.Keys{auth.HMACKey{Secret: []byte(testSecret)}, keys}, Clock: clock,
		Issuer: issuer, Audience: audience, SubjectClaim: subjectClaim})
	if err != nil {
		t.Fatal(err)
	}
	return p, v, clock
}

const testSecret = "jwks-test-application-secret-0123456789"

// Tokens of the deployer's identity provider, RS256 and ES256, verified through its JWKS URL beside the
// application secret's HS256; the issuer, audience and algorithm are enforced.
func TestJWKSVerifies(t *testing.T) {
	t.Parallel()
	p, v, clock := setupJWKS(t, "")
	now := clock.Now()
	with := func(change func(jwt.MapClaims)) jwt.MapClaims {
		c := claimsFor(now)
		change(c)
		return c
	}
	hs := func(c jwt.MapClaims, secret string) string {
		s, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(secret))
		return s
	}
	pub := p.rsa["r1"].PublicKey
	tests := []struct {
		name  string
		token string
		code  string // "" means accepted as u-123
	}{
		{"RS256", p.sign(t, "r1", claimsFor(now)), ""},
		{"ES256", p.sign(t, "e1", claimsFor(now)), ""},
		{"HS256 with the application secret", hs(claimsFor(now), testSecret), ""},
		{"wrong issuer", p.sign(t, "r1", with(func(c jwt.MapClaims) { c["iss"] = "https://other.example" })), auth.CodeInvalidToken},
		{"no issuer", p.sign(t, "r1", with(func(c jwt.MapClaims) { delete(c, "iss") })), auth.CodeInvalidToken},
		{"wrong audience", p.sign(t, "r1", with(func(c jwt.MapClaims) { c["aud"] = "someone-else" })), auth.CodeInvalidToken},
		{"expired", p.sign(t, "r1", with(func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Hour).Unix() })), auth.CodeTokenExpired},
		// The RSA public key as an HMAC secret (algorithm confusion): HS256 is checked only with the secret.
		{"HS256 signed with the public key", hs(claimsFor(now), string(pub.N.Bytes())), auth.CodeInvalidToken},
		{"RS384", func() string {
			tok := jwt.NewWithClaims(jwt.SigningMethodRS384, claimsFor(now))
			tok.Header["kid"] = "r1"
			s, _ := tok.SignedString(p.rsa["r1"])
			return s
		}(), auth.CodeInvalidToken},
		{"alg none", func() string {
			s, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claimsFor(now)).SignedString(jwt.UnsafeAllowNoneSignatureType)
			return s
		}(), auth.CodeInvalidToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := v.VerifyToken(context.Background(), tt.token)
			switch {
			case tt.code == "" && (err != nil || got.Subject != "u-123"):
				t.Fatalf("got %+v, %v; want u-123", got, err)
			case tt.code != "" && !errors.Is(err, agent.E(agent.KindUnauthenticated, tt.code, "")):
				t.Fatalf("got %+v, %v; want %s", got, err, tt.code)
			}
		})
	}
}

// A rotated key is picked up by one fetch when a token first names it; tokens naming key ids the provider does
// not serve cause at most one more fetch per period, however many arrive.
func TestJWKSRotation(t *testing.T) {
	t.Parallel()
	p, v, clock := setupJWKS(t, "")
	ctx := context.Background()
	if _, err := v.VerifyToken(ctx, p.sign(t, "r1", claimsFor(clock.Now()))); err != nil {
		t.Fatal(err)
	}
	start := p.fetches.Load()
	p.addRSA(t, "r2")
	p.retire("r1")
	if got, err := v.VerifyToken(ctx, p.sign(t, "r2", claimsFor(clock.Now()))); err != nil || got.Subject != "u-123" {
		t.Fatalf("a token of the rotated key: %+v, %v", got, err)
	}
	if n := p.fetches.Load() - start; n != 1 {
		t.Fatalf("the rotated key took %d fetches, want 1", n)
	}
	for range 5 {
		if _, err := v.VerifyToken(ctx, p.sign(t, "made-up", claimsFor(clock.Now()))); !errors.Is(err, agent.E(agent.KindUnauthenticated, auth.CodeInvalidToken, "")) {
			t.Fatalf("an unknown kid: %v", err)
		}
	}
	if n := p.fetches.Load() - start; n != 1 {
		t.Fatalf("five tokens with an unknown kid made %d more fetches, want none (one per %s)", n-1, auth.DefaultJWKSUnknownKIDEvery)
	}
}

// The principal may come from another claim than sub (an identity provider's email, say).
func TestSubjectClaim(t *testing.T) {
	t.Parallel()
	p, v, clock := setupJWKS(t, "email")
	got, err := v.VerifyToken(context.Background(), p.sign(t, "r1", claimsFor(clock.Now())))
	if err != nil || got.Subject != "ada@example.com" {
		t.Fatalf("got %+v, %v", got, err)
	}
	c := claimsFor(clock.Now())
	c["email"] = 42
	if _, err := v.VerifyToken(context.Background(), p.sign(t, "r1", c)); !errors.Is(err, agent.E(agent.KindUnauthenticated, auth.CodeInvalidToken, "")) {
		t.Fatalf("a subject claim that is not a string: %v", err)
	}
}
