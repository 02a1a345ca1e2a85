// Package auth authenticates requests: `Authorization: Bearer <JWT>`, HS256 with the application's shared
// secret, and RS256/ES256 tokens of the deployer's identity provider through its JWKS URL (JWKSKeys, jwks.go). The token's subject is the principal
// that owns threads. It also mints the HS256 tokens `agentloop token` prints, and derives purpose-bound
// sub-keys from the single application secret (DeriveKey).
package auth

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentloop/agentloop/lib/agent"
)

// Stable error codes; every Verify error is an *agent.Error of KindUnauthenticated with one of them.
const (
	CodeMissingToken = agent.CodeMissingToken // no Authorization: Bearer header
	CodeInvalidToken = agent.CodeInvalidToken // malformed, bad signature, wrong algorithm, issuer, audience or subject
	CodeTokenExpired = agent.CodeTokenExpired // exp is past (beyond the leeway)
)

// Bounds and defaults.
const (
	// DefaultLeeway absorbs clock skew between the token issuer and this server on exp, nbf and iat.
	DefaultLeeway = 30 * time.Second
	// MaxTokenBytes bounds the token a request may carry.
	MaxTokenBytes = 8 << 10
	// MinSecretBytes is the shortest HS256 secret accepted (RFC 7518 §3.2: at least the hash size).
	MinSecretBytes = 32
	// DevAudience is the aud of every token `agentloop token` and `agentloop dev` mint. A verifier refuses a token
	// that names it unless it is the dev server's (Config.DevTokens) or its own Audience is DevAudience, so a
	// production secret copied to a laptop mints nothing a deployment takes (REVIEW S13). Tokens without aud are
	// not affected.
	DevAudience = "agentloop-dev"
)

// CodeWeakSecret is the code of the error for an HS256 secret shorter than MinSecretBytes.
const CodeWeakSecret = agent.CodeWeakSecret

// Principal is the authenticated caller.
type Principal struct {
	Subject string
	// Token is the bearer token the subject was verified from: the end user's JWT, which tools that act as the
	// user at another service receive (agent.ToolInvocation.UserToken). Never stored or logged.
	Token string
}

// KeySource supplies the verification keys of one signing scheme. HS256 is HMACKey; an RS256 JWKS source
// (keys by kid, fetched and cached from a URL) would implement the same interface.
type KeySource interface {
	// Algorithms lists the JWS "alg" values this source verifies; tokens with any other alg are rejected before
	// Key is called.
	Algorithms() []string
	// Key returns the key that verifies t's signature.
	Key(ctx context.Context, t *jwt.Token) (any, error)
}

// HMACKey verifies HS256 tokens with a shared secret.
type HMACKey struct {
	Secret []byte
}

// Algorithms implements KeySource.
func (HMACKey) Algorithms() []string { return []string{jwt.SigningMethodHS256.Alg()} }

// Key implements KeySource. It checks the algorithm again, so the secret can never be used as the key of
// another algorithm whatever the parser options (the RS256/HS256 confusion attack).
func (k HMACKey) Key(_ context.Context, t *jwt.Token) (any, error) {
	if t.Method != jwt.SigningMethodHS256 {
		return nil, errors.New("unexpected signing method " + t.Method.Alg())
	}
	return k.Secret, nil
}

// Config configures a Verifier.
type Config struct {
	// Keys verifies signatures. Required.
	Keys KeySource
	// Clock is the time source for exp/nbf/iat. Required.
	Clock agent.Clock
	// Leeway for exp/nbf/iat; 0 means DefaultLeeway, negative means none.
	Leeway time.Duration
	// Issuer, when set, must equal the token's iss.
	Issuer string
	// Audience, when set, must be among the token's aud.
	Audience string
	// AllowNoExpiry accepts tokens without exp. By default exp is required: a token that never expires
	// cannot be revoked short of rotating the secret.
	AllowNoExpiry bool
	// DevTokens accepts tokens whose aud names DevAudience: the dev server's verifier sets it.
	DevTokens bool
	// MaxAge, when positive, bounds how old a token may be whatever its exp: iat is then required, and a token
	// issued longer than MaxAge ago (beyond the leeway) is token_expired. 0: no bound but exp. There is no
	// default: the contract takes any HS256 token with a subject and an exp, and frontends that mint without iat,
	// or with long lifetimes, must keep working until their operator sets AGENT_JWT_MAX_AGE.
	MaxAge time.Duration
	// SubjectClaim names the claim that holds the principal (an identity provider's "email" or "username", say);
	// "" means "sub".
	SubjectClaim string
}

// Verifier authenticates requests. It is safe for concurrent use.
type Verifier struct {
	keys      KeySource
	parser    *jwt.Parser
	clock     agent.Clock
	leeway    time.Duration
	devTokens bool
	maxAge    time.Duration
	subject   string
}

// NewVerifier checks cfg and returns a Verifier.
func NewVerifier(cfg Config) (*Verifier, error) {
	if cfg.Keys == nil || cfg.Clock == nil {
		return nil, agent.E(agent.KindInternal, agent.CodeInvalidConfig, "auth: Keys and Clock are required")
	}
	sources := Keys{cfg.Keys}
	if ks, ok := cfg.Keys.(Keys); ok {
		sources = ks
	}
	for _, src := range sources {
		if k, ok := src.(HMACKey); ok && len(k.Secret) < MinSecretBytes {
			return nil, agent.E(agent.KindInternal, CodeWeakSecret, "auth: HS256 secret has %d bytes, want at least %d", len(k.Secret), MinSecretBytes)
		}
	}
	leeway := cfg.Leeway
	switch {
	case leeway == 0:
		leeway = DefaultLeeway
	case leeway < 0:
		leeway = 0
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(slices.Clone(cfg.Keys.Algorithms())),
		jwt.WithTimeFunc(cfg.Clock.Now),
		jwt.WithLeeway(leeway),
		jwt.WithIssuedAt(),
	}
	if !cfg.AllowNoExpiry {
		opts = append(opts, jwt.WithExpirationRequired())
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.MaxAge < 0 {
		return nil, agent.E(agent.KindInternal, agent.CodeInvalidConfig, "auth: MaxAge %s is negative", cfg.MaxAge)
	}
	return &Verifier{keys: cfg.Keys, parser: jwt.NewParser(opts...), clock: cfg.Clock, leeway: leeway,
		devTokens: cfg.DevTokens || cfg.Audience == DevAudience, maxAge: cfg.MaxAge, subject: cfg.SubjectClaim}, nil
}

// NewHS256Verifier is NewVerifier with an HMACKey and the default checks.
func NewHS256Verifier(secret []byte, clock agent.Clock) (*Verifier, error) {
	return NewVerifier(Config{Keys: HMACKey{Secret: secret}, Clock: clock})
}

// Verify authenticates r by its bearer token.
func (v *Verifier) Verify(ctx context.Context, r *http.Request) (Principal, error) {
	token, err := BearerToken(r)
	if err != nil {
		return Principal{}, err
	}
	return v.VerifyToken(ctx, token)
}

// VerifyToken authenticates a raw JWT.
func (v *Verifier) VerifyToken(ctx context.Context, token string) (Principal, error) {
	if len(token) > MaxTokenBytes {
		return Principal{}, agent.E(agent.KindUnauthenticated, CodeInvalidToken, "token longer than %d bytes", MaxTokenBytes)
	}
	var claims tokenClaims
	_, err := v.parser.ParseWithClaims(token, &claims, func(t *jwt.Token) (any, error) {
		return v.keys.Key(ctx, t)
	})
	if err == nil && v.subject != "" && v.subject != "sub" {
		claims.Subject = ""
		_ = json.Unmarshal(claims.raw[v.subject], &claims.Subject)
	}
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Principal{}, agent.Wrap(err, agent.KindUnauthenticated, CodeTokenExpired, "token expired")
	case err != nil:
		return Principal{}, agent.Wrap(err, agent.KindUnauthenticated, CodeInvalidToken, "invalid token")
	case claims.Subject == "":
		return Principal{}, agent.E(agent.KindUnauthenticated, CodeInvalidToken, "token has no subject")
	case !v.devTokens && slices.Contains(claims.Audience, DevAudience):
		return Principal{}, agent.E(agent.KindUnauthenticated, CodeInvalidToken, "token was minted for agentloop dev")
	case v.maxAge > 0 && claims.IssuedAt == nil:
		return Principal{}, agent.E(agent.KindUnauthenticated, CodeInvalidToken, "token has no iat")
	case v.maxAge > 0 && v.clock.Now().Sub(claims.IssuedAt.Time) > v.maxAge+v.leeway:
		return Principal{}, agent.E(agent.KindUnauthenticated, CodeTokenExpired, "token is older than %s", v.maxAge)
	}
	return Principal{Subject: claims.Subject, Token: token}, nil
}

// tokenClaims are the registered claims and, for Config.SubjectClaim, every claim as it came.
type tokenClaims struct {
	jwt.RegisteredClaims
	raw map[string]json.RawMessage
}

func (c *tokenClaims) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &c.RegisteredClaims); err != nil {
		return err
	}
	return json.Unmarshal(b, &c.raw)
}

// BearerToken extracts the token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
func BearerToken(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		if h == "" {
			return "", agent.E(agent.KindUnauthenticated, CodeMissingToken, "missing Authorization header")
		}
		return "", agent.E(agent.KindUnauthenticated, CodeMissingToken, "Authorization header is not a Bearer token")
	}
	return token, nil
}

// MintOption adds claims to a minted token.
type MintOption func(*jwt.RegisteredClaims)

// WithIssuer sets iss.
func WithIssuer(iss string) MintOption { return func(c *jwt.RegisteredClaims) { c.Issuer = iss } }

// WithAudience sets aud.
func WithAudience(aud ...string) MintOption {
	return func(c *jwt.RegisteredClaims) { c.Audience = slices.Clone(aud) }
}

// MintHS256 returns an HS256 JWT for subject, issued at now and expiring ttl later.
func MintHS256(secret []byte, subject string, ttl time.Duration, now time.Time, opts ...MintOption) (string, error) {
	switch {
	case len(secret) < MinSecretBytes:
		return "", agent.E(agent.KindInternal, CodeWeakSecret, "HS256 secret has %d bytes, want at least %d", len(secret), MinSecretBytes)
	case subject == "":
		return "", agent.E(agent.KindInvalid, agent.CodeInvalidSubject, "subject is required")
	case ttl <= 0:
		return "", agent.E(agent.KindInvalid, agent.CodeInvalidTTL, "ttl must be positive, got %s", ttl)
	}
	claims := jwt.RegisteredClaims{
		Subject:   subject,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}
	for _, o := range opts {
		o(&claims)
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
	if err != nil {
		return "", agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "sign token")
	}
	return s, nil
}

// DerivedKeyBytes is the length of DeriveKey's keys.
const DerivedKeyBytes = 32

// DeriveKey derives a 32-byte key for one purpose from the application secret with HKDF-SHA256 (RFC 5869,
// no salt, label as info). Distinct labels give independent keys, so one secret serves token signing,
// approval signatures and anything else without a key ever doing two jobs.
func DeriveKey(secret []byte, label string) []byte {
	key, err := hkdf.Key(sha256.New, secret, nil, label, DerivedKeyBytes)
	if err != nil {
		// hkdf.Key fails only for lengths above 255 hash blocks; 32 bytes is one block.
		panic("auth: hkdf: " + err.Error())
	}
	return key
}
