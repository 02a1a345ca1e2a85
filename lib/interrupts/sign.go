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
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
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

// Canonical is the AI SDK's canonicalJSON of the value JSON.parse makes of input: object keys sorted by UTF-16
// code units (as JavaScript's sort compares them), no insignificant whitespace, numbers and strings written as
// JSON.stringify writes them (a lone surrogate escape stays an escape, as JavaScript strings hold UTF-16 code
// units; a duplicate key keeps its last value). Two inputs that differ only in key order or spacing have the
// same canonical form. An empty input is "null".
func Canonical(input json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(input)) == 0 {
		return []byte("null"), nil
	}
	if !json.Valid(input) {
		return nil, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "tool input is not one valid JSON value")
	}
	p := &jsonParser{in: input}
	v, err := p.value()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	writeCanonical(&b, v)
	return b.Bytes(), nil
}

// jsString is a string as JavaScript holds it: UTF-16 code units.
type jsString []uint16

// jsMember is one object member.
type jsMember struct {
	key jsString
	val any
}

// jsonParser reads JSON that json.Valid accepted into nil, bool, float64, jsString, []any and []jsMember values.
type jsonParser struct {
	in  []byte
	pos int
}

func (p *jsonParser) skip() {
	for p.pos < len(p.in) && strings.IndexByte(" \t\n\r", p.in[p.pos]) >= 0 {
		p.pos++
	}
}

func (p *jsonParser) value() (any, error) {
	p.skip()
	switch c := p.in[p.pos]; {
	case c == '{':
		p.pos++
		var members []jsMember
		for {
			p.skip()
			if p.in[p.pos] == '}' {
				p.pos++
				return members, nil
			}
			if p.in[p.pos] == ',' {
				p.pos++
				p.skip()
			}
			key := p.str()
			p.skip()
			p.pos++ // ':'
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			members = append(members, jsMember{key: key, val: v})
			p.skip()
		}
	case c == '[':
		p.pos++
		var elems []any
		for {
			p.skip()
			if p.in[p.pos] == ']' {
				p.pos++
				return elems, nil
			}
			if p.in[p.pos] == ',' {
				p.pos++
			}
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			elems = append(elems, v)
			p.skip()
		}
	case c == '"':
		return p.str(), nil
	case c == 't':
		p.pos += 4
		return true, nil
	case c == 'f':
		p.pos += 5
		return false, nil
	case c == 'n':
		p.pos += 4
		return nil, nil
	default:
		start := p.pos
		for p.pos < len(p.in) && strings.IndexByte("+-0123456789.eE", p.in[p.pos]) >= 0 {
			p.pos++
		}
		f, err := strconv.ParseFloat(string(p.in[start:p.pos]), 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "tool input has a number JavaScript cannot hold")
		}
		return f, nil
	}
}

// str reads a string literal (the parser is at its opening quote) into UTF-16 code units.
func (p *jsonParser) str() jsString {
	p.pos++
	var out jsString
	for {
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return out
		case c == '\\':
			e := p.in[p.pos+1]
			p.pos += 2
			switch e {
			case 'u':
				u, _ := strconv.ParseUint(string(p.in[p.pos:p.pos+4]), 16, 16)
				out = append(out, uint16(u))
				p.pos += 4
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			default: // " \ /
				out = append(out, uint16(e))
			}
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			p.pos += size
			out = utf16.AppendRune(out, r)
		}
	}
}

func writeCanonical(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case float64:
		b.WriteString(jsNumber(v))
	case jsString:
		writeUTF16(b, v)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, e)
		}
		b.WriteByte(']')
	case []jsMember:
		// JSON.parse keeps a duplicate key's last value.
		last := map[string]int{}
		for i, m := range v {
			last[fmt.Sprint([]uint16(m.key))] = i
		}
		var keep []jsMember
		for i, m := range v {
			if last[fmt.Sprint([]uint16(m.key))] == i {
				keep = append(keep, m)
			}
		}
		sort.Slice(keep, func(i, j int) bool { return slices.Compare(keep[i].key, keep[j].key) < 0 })
		b.WriteByte('{')
		for i, m := range keep {
			if i > 0 {
				b.WriteByte(',')
			}
			writeUTF16(b, m.key)
			b.WriteByte(':')
			writeCanonical(b, m.val)
		}
		b.WriteByte('}')
	}
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

// writeJSString writes a Go string as JSON.stringify writes it.
func writeJSString(b *bytes.Buffer, s string) { writeUTF16(b, utf16.Encode([]rune(s))) }

// writeUTF16 writes code units as JSON.stringify does: '"', '\\' and control characters escaped, a lone
// surrogate as a \u escape (well-formed JSON.stringify), everything else as UTF-8 (Go's encoder also escapes <, >, &
// and U+2028/U+2029, which would change the digest).
func writeUTF16(b *bytes.Buffer, s jsString) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		u := s[i]
		switch {
		case u == '"':
			b.WriteString(`\"`)
		case u == '\\':
			b.WriteString(`\\`)
		case u == '\b':
			b.WriteString(`\b`)
		case u == '\f':
			b.WriteString(`\f`)
		case u == '\n':
			b.WriteString(`\n`)
		case u == '\r':
			b.WriteString(`\r`)
		case u == '\t':
			b.WriteString(`\t`)
		case u < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[u>>4])
			b.WriteByte(hex[u&0xF])
		case utf16.IsSurrogate(rune(u)):
			if u < 0xDC00 && i+1 < len(s) && s[i+1] >= 0xDC00 && s[i+1] <= 0xDFFF {
				b.WriteString(string(utf16.DecodeRune(rune(u), rune(s[i+1]))))
				i++
				continue
			}
			b.WriteString(`\u`)
			for shift := 12; shift >= 0; shift -= 4 {
				b.WriteByte(hex[(u>>shift)&0xF])
			}
		default:
			b.WriteString(string(rune(u)))
		}
	}
	b.WriteByte('"')
}
