// Package webhooks is the agent.SignalSink of an HTTPS webhook signed per Standard Webhooks
// (https://www.standardwebhooks.com, spec version 1): every completion signal is one POST of
//
//	{"type": "agentloop.run.finished", "timestamp": "<RFC 3339>", "data": <agent.SignalDetail>}
//
// with the headers
//
//	webhook-id:        the signal's id (agent.SignalID: the same on every attempt; receivers deduplicate by it)
//	webhook-timestamp: the attempt's time, in whole seconds since the Unix epoch
//	webhook-signature: "v1," + base64(HMAC-SHA256(key, id + "." + timestamp + "." + body))
//
// where key is the secret's bytes: the secret is "whsec_" + base64(key), as Standard Webhooks writes it (a secret
// without the prefix is taken as base64 too). A 2xx answer delivers the signal; anything else (a redirect
// included: none is followed), or no answer within Config.Timeout, is a failed attempt that lib/signals retries
// with backoff. The URL must be https; http is accepted only for localhost and loopback addresses (tests, dev).
package webhooks

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// DefaultTimeout bounds one POST.
const DefaultTimeout = 10 * time.Second

// SecretPrefix starts a Standard Webhooks secret.
const SecretPrefix = "whsec_"

// Config configures the sink.
type Config struct {
	// URL receives the POSTs: https, or http to localhost or a loopback address.
	URL string
	// Secret is "whsec_" + base64 of the signing key (at least 24 bytes).
	Secret string
	// Timeout bounds one POST (DefaultTimeout).
	Timeout time.Duration
	// Client sends the requests (nil: a client of its own that follows no redirect).
	Client *http.Client
	Clock  agent.Clock
}

// Sender posts signed signals to one URL.
type Sender struct {
	url    string
	key    []byte
	client *http.Client
	clock  agent.Clock
	to     time.Duration
}

var _ agent.SignalSink = (*Sender)(nil)

// New checks cfg and builds the sender.
func New(cfg Config) (*Sender, error) {
	if err := CheckURL(cfg.URL); err != nil {
		return nil, err
	}
	key, err := ParseSecret(cfg.Secret)
	if err != nil {
		return nil, err
	}
	s := &Sender{url: cfg.URL, key: key, client: cfg.Client, clock: cfg.Clock, to: cmp.Or(cfg.Timeout, DefaultTimeout)}
	if s.client == nil {
		s.client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if s.clock == nil {
		s.clock = agent.SystemClock{}
	}
	return s, nil
}

// CheckURL accepts an https URL with a host, or an http one to localhost or a loopback address.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("webhook URL %q: not an absolute URL", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
	}
	return fmt.Errorf("webhook URL %q: must be https (http only to localhost or a loopback address)", raw)
}

// ParseSecret decodes a "whsec_" secret into its key.
func ParseSecret(secret string) ([]byte, error) {
	if secret == "" {
		return nil, errors.New("webhook secret is empty")
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil {
		return nil, fmt.Errorf("webhook secret: not %s followed by base64: %w", SecretPrefix, err)
	}
	if len(key) < 24 {
		return nil, fmt.Errorf("webhook secret: %d bytes, want at least 24", len(key))
	}
	return key, nil
}

// Sign is the webhook-signature value of body sent as id at ts.
func Sign(key []byte, id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + strconv.FormatInt(ts, 10) + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// payload is the Standard Webhooks body.
type payload struct {
	Type      string             `json:"type"`
	Timestamp time.Time          `json:"timestamp"`
	Data      agent.SignalDetail `json:"data"`
}

// Send POSTs f, signed, and succeeds on a 2xx answer.
func (s *Sender) Send(ctx context.Context, f agent.RunFinished) error {
	now := s.clock.Now()
	body, err := json.Marshal(payload{Type: agent.SignalEvent, Timestamp: now.UTC().Truncate(time.Second), Data: f.Detail()})
	if err != nil {
		return err
	}
	ctx, cancel := agent.TimersOf(s.clock).WithTimeoutCause(ctx, s.to, errors.New("webhook timed out"))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	ts := now.Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "agentloop-webhooks/1")
	req.Header.Set("webhook-id", f.ID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", Sign(s.key, f.ID, ts, body))
	res, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return fmt.Errorf("webhook: %s answered %d", s.url, res.StatusCode)
	}
	return nil
}
