package auth

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/agentloop/agentloop/lib/agent"
)

// JWKS defaults: how the deployer's identity provider's key set is fetched and kept.
const (
	// DefaultJWKSRefresh is how often the key set is fetched again, rotated keys included.
	DefaultJWKSRefresh = time.Hour
	// DefaultJWKSUnknownKIDEvery bounds the fetches a token with an unknown key id causes: one at most this often,
	// so tokens with made-up key ids cannot make the server hammer the provider.
	DefaultJWKSUnknownKIDEvery = 5 * time.Minute
	// DefaultJWKSTimeout bounds one fetch of the key set.
	DefaultJWKSTimeout = 5 * time.Second
)

// JWKSConfig configures a JWKSKeys.
type JWKSConfig struct {
	// URL of the provider's JSON Web Key Set (e.g. https://cognito-idp.<region>.amazonaws.com/<pool>/.well-known/jwks.json).
	URL string
	// Client fetches the key set; nil means a client with DefaultJWKSTimeout.
	Client *http.Client
	// Refresh, UnknownKIDEvery: 0 means DefaultJWKSRefresh, DefaultJWKSUnknownKIDEvery.
	Refresh, UnknownKIDEvery time.Duration
	Logger                   *slog.Logger
}

// JWKSKeys verifies RS256 and ES256 tokens signed by an identity provider, with the public keys of its JWKS URL
// (github.com/MicahParks/keyfunc/v3 over jwkset: fetched at start, cached, refreshed every Refresh, and fetched
// again at most once per UnknownKIDEvery when a token names a key id the cache does not hold, which is how a
// rotated key is picked up between refreshes).
type JWKSKeys struct {
	kf keyfunc.Keyfunc
}

// NewJWKSKeys starts the key set's refresh, which runs until ctx ends. A key set that cannot be fetched at start
// is not an error (the provider may be down for a moment): tokens fail until a fetch succeeds.
func NewJWKSKeys(ctx context.Context, cfg JWKSConfig) (*JWKSKeys, error) {
	if cfg.URL == "" {
		return nil, agent.E(agent.KindInternal, agent.CodeInvalidConfig, "auth: a JWKS needs a URL")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Timeout: DefaultJWKSTimeout}
	}
	every := cfg.UnknownKIDEvery
	if every <= 0 {
		every = DefaultJWKSUnknownKIDEvery
	}
	kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.URL}, keyfunc.Override{
		Client:          client,
		HTTPTimeout:     DefaultJWKSTimeout,
		RefreshInterval: cfg.Refresh,
		// A token with an unknown key id waits for no refresh the limiter does not allow at once: rate.Limiter
		// refuses at once a wait longer than this deadline, so such a token fails now and holds no request (or
		// Lambda) open. The same deadline bounds the refresh itself.
		RefreshUnknownKID: rate.NewLimiter(rate.Every(every), 1),
		RateLimitWaitMax:  DefaultJWKSTimeout,
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(ctx context.Context, err error) {
				log.WarnContext(ctx, "auth.jwks_refresh_failed", "url", u, "err", err)
			}
		},
	})
	if err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeInvalidConfig, "auth: the JWKS URL cannot be used")
	}
	return &JWKSKeys{kf: kf}, nil
}

// Algorithms implements KeySource.
func (*JWKSKeys) Algorithms() []string {
	return []string{jwt.SigningMethodRS256.Alg(), jwt.SigningMethodES256.Alg()}
}

// Key implements KeySource: the public key the token's kid names, of the token's algorithm.
func (k *JWKSKeys) Key(ctx context.Context, t *jwt.Token) (any, error) {
	if !slices.Contains(k.Algorithms(), t.Method.Alg()) {
		return nil, errors.New("unexpected signing method " + t.Method.Alg())
	}
	return k.kf.KeyfuncCtx(ctx)(t)
}

// Keys verifies tokens of several sources, each for its own algorithms: the application secret's HS256 and an
// identity provider's RS256/ES256 side by side. A token is checked only with the source of its alg, so a
// public key can never serve as an HMAC secret (the algorithm confusion attack).
type Keys []KeySource

// Algorithms implements KeySource.
func (ks Keys) Algorithms() []string {
	var algs []string
	for _, k := range ks {
		algs = append(algs, k.Algorithms()...)
	}
	return algs
}

// Key implements KeySource.
func (ks Keys) Key(ctx context.Context, t *jwt.Token) (any, error) {
	for _, k := range ks {
		if slices.Contains(k.Algorithms(), t.Method.Alg()) {
			return k.Key(ctx, t)
		}
	}
	return nil, errors.New("unexpected signing method " + t.Method.Alg())
}
