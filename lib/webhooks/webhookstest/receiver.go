// Package webhookstest is a Standard Webhooks receiver for tests: an httptest server that verifies every
// request's signature with the algorithm written out again here (independently of lib/webhooks), fails the
// first attempts on request, and deduplicates deliveries by webhook-id, as a real receiver would.
package webhookstest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Secret is the receiver's signing secret ("whsec_" + base64 of 32 bytes).
const Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// Request is one request the receiver saw.
type Request struct {
	ID, Timestamp, Signature string
	Body                     []byte
	Valid                    bool // the signature verified
	Status                   int  // what the receiver answered
}

// Payload is the Standard Webhooks body as the receiver decodes it.
type Payload struct {
	Type      string          `json:"type"`
	Timestamp string          `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// Receiver is the test server.
type Receiver struct {
	*httptest.Server
	mu       sync.Mutex
	fail     int // answer 500 to this many more requests
	requests []Request
	seen     map[string]bool
	unique   []Payload
	down     bool
}

// New starts a receiver that fails the first failFirst requests with 500.
func New(t testing.TB, failFirst int) *Receiver {
	r := &Receiver{fail: failFirst, seen: map[string]bool{}}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

// Down makes every request fail with 503 (true) or serves again (false).
func (r *Receiver) Down(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	got := Request{ID: req.Header.Get("webhook-id"), Timestamp: req.Header.Get("webhook-timestamp"),
		Signature: req.Header.Get("webhook-signature"), Body: body}
	got.Valid = Verify(Secret, got.ID, got.Timestamp, got.Signature, body)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !got.Valid:
		got.Status = http.StatusUnauthorized
	case r.down:
		got.Status = http.StatusServiceUnavailable
	case r.fail > 0:
		r.fail--
		got.Status = http.StatusInternalServerError
	default:
		got.Status = http.StatusNoContent
		if !r.seen[got.ID] { // idempotent by webhook-id: a repeated delivery is acknowledged and ignored
			r.seen[got.ID] = true
			var p Payload
			_ = json.Unmarshal(body, &p)
			r.unique = append(r.unique, p)
		}
	}
	r.requests = append(r.requests, got)
	w.WriteHeader(got.Status)
}

// Requests is every request so far.
func (r *Receiver) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.requests...)
}

// Delivered is each webhook-id's first accepted payload, in order.
func (r *Receiver) Delivered() []Payload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Payload(nil), r.unique...)
}

// Verify checks a Standard Webhooks signature: the key is the secret after "whsec_", base64-decoded; the signed
// content is id.timestamp.body; the header holds space-separated "v1,<base64 HMAC-SHA256>" signatures, any of
// which may match.
func Verify(secret, id, timestamp, header string, body []byte) bool {
	if id == "" || timestamp == "" {
		return false
	}
	if _, err := strconv.ParseInt(timestamp, 10, 64); err != nil {
		return false
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte("."))
	mac.Write([]byte(timestamp))
	mac.Write([]byte("."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(header) {
		version, value, ok := strings.Cut(sig, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(value)
		if err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}
