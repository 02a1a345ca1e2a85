// Package interrupts holds the rules of human-in-the-loop decisions: how an approval request is signed and
// verified (the AI SDK v7 format), how interrupt ids are derived, and how the answers a client posts on the
// newest assistant message are matched to the interrupts the server stored (the idempotency ladder of DESIGN
// "Human in the loop"). It is pure: the engine applies what it decides to the store.
package interrupts

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
)

// keyLabel is the HKDF info of the approval key: the application secret signs tokens, and this label gives the
// approval signatures a key of their own, so no second secret exists and neither key can stand in for the other.
const keyLabel = "agentloop tool approval v1"

// payloadTag is the AI SDK v7 signature payload's first element (tool-approval-signature.ts).
const payloadTag = "ai-sdk-tool-approval-v1"

// Signer signs and verifies approval requests with a key derived from the application secret.
type Signer struct{ key []byte }

// NewSigner derives the approval key from the application secret (HKDF-SHA256, info keyLabel).
func NewSigner(secret []byte) (*Signer, error) {
	if len(secret) == 0 {
		return nil, agent.E(agent.KindInvalid, agent.CodeWeakSecret, "the approval key needs the application secret")
	}
	key, err := hkdf.Key(sha256.New, secret, nil, keyLabel, sha256.Size)
	if err != nil {
		return nil, fmt.Errorf("derive approval key: %w", err)
	}
	return &Signer{key: key}, nil
}

// Sign returns the AI SDK v7 signature of an approval request: base64url (no padding) of HMAC-SHA256 over
// JSON.stringify(["ai-sdk-tool-approval-v1", approvalId, toolCallId, toolName, inputDigest]), where inputDigest is
// base64url(SHA-256(canonical JSON of the input)).
func (s *Signer) Sign(approvalID, toolCallID, toolName string, input json.RawMessage) (string, error) {
	digest, err := InputDigest(input)
	if err != nil {
		return "", err
	}
	var payload bytes.Buffer
	payload.WriteByte('[')
	for i, f := range []string{payloadTag, approvalID, toolCallID, toolName, digest} {
		if i > 0 {
			payload.WriteByte(',')
		}
		writeJSString(&payload, f)
	}
	payload.WriteByte(']')
	mac := hmac.New(sha256.New, s.key)
	mac.Write(payload.Bytes())
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}

// Verify reports whether in.Signature is the signature of in's own request fields.
func (s *Signer) Verify(in agent.Interrupt) bool {
	want, err := s.Sign(in.ID, in.ToolCallID, in.ToolName, in.Input)
	return err == nil && hmac.Equal([]byte(want), []byte(in.Signature))
}

// InputDigest is base64url(SHA-256(Canonical(input))).
func InputDigest(input json.RawMessage) (string, error) {
	c, err := Canonical(input)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// ID derives an interrupt id from the thread, the asking run and the tool call: a retried insert converges on
// it, and a model that repeats a tool call id in a later run (a deterministic model answering a regenerate) gets
// a different one.
func ID(threadID, runID, toolCallID string) string {
	sum := sha256.Sum256([]byte(threadID + "\x00" + runID + "\x00" + toolCallID))
	return "apr_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:15]))
}

// Canonical is the AI SDK's canonicalJSON: JSON with object keys sorted (by UTF-16 code units, as JavaScript's
// sort does), no insignificant whitespace, numbers and strings written as JSON.stringify writes them. Two inputs
// that differ only in key order or spacing have the same canonical form. An empty input is "null" (undefined in
// JavaScript stringifies as nothing, which the SDK never signs).
func Canonical(input json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(input)) == 0 {
		return []byte("null"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "tool input is not valid JSON")
	}
	if dec.More() {
		return nil, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "tool input is not one JSON value")
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || math.IsInf(f, 0) {
			return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "tool input has a number JavaScript cannot hold")
		}
		b.WriteString(jsNumber(f))
	case string:
		writeJSString(b, v)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return utf16Less(keys[i], keys[j]) })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	}
	return nil
}

// jsNumber formats f as JavaScript's Number.prototype.toString does (shortest round-trip digits; exponent form
// at and above 1e21 and below 1e-6).
func jsNumber(f float64) string {
	if f == 0 {
		return "0" // -0 too
	}
	abs := math.Abs(f)
	if abs >= 1e21 || abs < 1e-6 {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		// Go writes e+21 / e-07; JavaScript writes e+21 / e-7.
		mant, exp, _ := strings.Cut(s, "e")
		sign := exp[0]
		exp = strings.TrimLeft(exp[1:], "0")
		return mant + "e" + string(sign) + exp
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// writeJSString writes s as JSON.stringify does: only '"', '\\' and control characters are escaped (Go's
// encoder also escapes <, >, & and U+2028/U+2029, which would change the digest).
func writeJSString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[r>>4])
			b.WriteByte(hex[r&0xF])
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\ufffd`) // invalid UTF-8 cannot come from JSON text; keep the output valid anyway
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
}

// utf16Less orders strings by UTF-16 code units, as JavaScript's default sort does (it differs from byte order
// only for characters above U+FFFF against U+E000-U+FFFF).
func utf16Less(a, b string) bool {
	ra, rb := []rune(a), []rune(b)
	for i := 0; i < len(ra) && i < len(rb); i++ {
		if ra[i] == rb[i] {
			continue
		}
		if ka, kb := utf16Key(ra[i]), utf16Key(rb[i]); ka != kb {
			return ka < kb
		}
		return ra[i] < rb[i] // same high surrogate: the low one, monotonic in the rune, decides
	}
	return len(ra) < len(rb)
}

func utf16Key(r rune) uint32 {
	if r >= 0x10000 {
		// The first code unit of a surrogate pair (0xD800-0xDBFF) decides.
		return 0xD800 + uint32((r-0x10000)>>10)
	}
	return uint32(r)
}
