package openai

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// decodeChunk is the streamed chunk's decoder for what providers send (issue 18: encoding/json's reflective
// decoding, twice per chunk with the error probe, was the largest share of the dev server's CPU per streamed
// word). It reads data into c exactly as json.Unmarshal would (after c = chunk{}), and reports whether it
// could: anything it does not fully understand (an error event, an escaped key, a key in another case or given
// twice, a number written as a float, invalid JSON, deep nesting) is refused, and the caller decodes that chunk
// with encoding/json (decodeChunkSlow). TestChunkDecoderAgrees and FuzzChunkDecoder hold the two to the same
// results. It keeps c's Choices storage and, when the model is the one c names already, its string.
func decodeChunk(data []byte, c *chunk) bool {
	model := c.Model
	*c = chunk{Choices: c.Choices[:0]}
	d := jsonReader{data: data}
	var seen keys
	ok := d.object(func(key []byte) bool {
		switch string(key) {
		case "model":
			s, isNull, ok := d.str()
			switch {
			case !ok || !seen.first(0):
				return false
			case isNull:
			case string(s) == model: // most chunks name the model the one before named: no new string
				c.Model = model
			default:
				c.Model = string(s)
			}
			return true
		case "choices":
			if !seen.first(1) {
				return false
			}
			if d.null() {
				c.Choices = nil
				return true
			}
			return d.array(func() bool {
				c.Choices = append(c.Choices, chunkChoice{})
				return d.choice(&c.Choices[len(c.Choices)-1])
			})
		case "usage":
			if !seen.first(2) {
				return false
			}
			if d.null() {
				return true
			}
			c.Usage = new(chunkUsage)
			return d.usage(c.Usage)
		}
		return d.other(key, "model", "choices", "usage", "error")
	})
	return ok && d.end()
}

// keys are the known keys of one object seen so far: a key given twice is refused (encoding/json merges a
// repeated object into the first, which is not worth copying).
type keys uint32

func (k *keys) first(bit uint) bool {
	if *k&(1<<bit) != 0 {
		return false
	}
	*k |= 1 << bit
	return true
}

func (d *jsonReader) choice(ch *chunkChoice) bool {
	var seen keys
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "index":
			return seen.first(0) && d.count(&ch.Index)
		case "finish_reason":
			return seen.first(1) && d.text(&ch.FinishReason)
		case "delta":
			return seen.first(2) && (d.null() || d.delta(&ch.Delta))
		}
		return d.other(key, "index", "finish_reason", "delta")
	})
}

func (d *jsonReader) delta(dl *chunkDelta) bool {
	var seen keys
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "content":
			return seen.first(0) && d.text(&dl.Content)
		case "refusal":
			return seen.first(1) && d.text(&dl.Refusal)
		case "reasoning_content":
			return seen.first(2) && d.raw(&dl.ReasoningContent)
		case "reasoning":
			return seen.first(3) && d.raw(&dl.Reasoning)
		case "tool_calls":
			if !seen.first(4) {
				return false
			}
			if d.null() {
				return true
			}
			dl.ToolCalls = []chunkToolCall{} // as encoding/json leaves an empty array: empty, not nil
			return d.array(func() bool {
				dl.ToolCalls = append(dl.ToolCalls, chunkToolCall{})
				return d.toolCall(&dl.ToolCalls[len(dl.ToolCalls)-1])
			})
		}
		return d.other(key, "content", "refusal", "reasoning_content", "reasoning", "tool_calls")
	})
}

func (d *jsonReader) toolCall(tc *chunkToolCall) bool {
	var seen keys
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "index":
			return seen.first(0) && d.count(&tc.Index)
		case "id":
			return seen.first(1) && d.text(&tc.ID)
		case "function":
			var fseen keys
			return seen.first(2) && (d.null() || d.object(func(key []byte) bool {
				switch string(key) {
				case "name":
					return fseen.first(0) && d.text(&tc.Function.Name)
				case "arguments":
					return fseen.first(1) && d.text(&tc.Function.Arguments)
				}
				return d.other(key, "name", "arguments")
			}))
		}
		return d.other(key, "index", "id", "function")
	})
}

func (d *jsonReader) usage(u *chunkUsage) bool {
	var seen keys
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "prompt_tokens":
			return seen.first(0) && d.count(&u.PromptTokens)
		case "completion_tokens":
			return seen.first(1) && d.count(&u.CompletionTokens)
		case "total_tokens":
			return seen.first(2) && d.count(&u.TotalTokens)
		case "prompt_tokens_details":
			var dseen keys
			return seen.first(3) && (d.null() || d.object(func(key []byte) bool {
				if string(key) == "cached_tokens" {
					return dseen.first(0) && d.count(&u.PromptTokensDetails.CachedTokens)
				}
				return d.other(key, "cached_tokens")
			}))
		case "completion_tokens_details":
			var dseen keys
			return seen.first(4) && (d.null() || d.object(func(key []byte) bool {
				if string(key) == "reasoning_tokens" {
					return dseen.first(0) && d.count(&u.CompletionTokensDetails.ReasoningTokens)
				}
				return d.other(key, "reasoning_tokens")
			}))
		}
		return d.other(key, "prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "completion_tokens_details")
	})
}

// jsonReader reads JSON values from data, strictly: every method returns false at anything that is not valid
// JSON of the expected kind.
type jsonReader struct {
	data  []byte
	pos   int
	depth int
}

// maxSkipDepth bounds the nesting of values skipped (encoding/json's own bound is far higher: deeper input is
// left to it).
const maxSkipDepth = 64

func (d *jsonReader) ws() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// end reports whether nothing but white space is left.
func (d *jsonReader) end() bool {
	d.ws()
	return d.pos == len(d.data)
}

// peek returns the next byte after white space, 0 at the end.
func (d *jsonReader) peek() byte {
	d.ws()
	if d.pos == len(d.data) {
		return 0
	}
	return d.data[d.pos]
}

// object reads an object, calling field with each key (keys without escapes only) positioned before its value.
func (d *jsonReader) object(field func(key []byte) bool) bool {
	if d.peek() != '{' {
		return false
	}
	d.pos++
	if d.peek() == '}' {
		d.pos++
		return true
	}
	for {
		if d.peek() != '"' {
			return false
		}
		key, escaped, ok := d.rawString()
		if !ok || escaped || d.peek() != ':' {
			return false
		}
		d.pos++
		if !field(key) {
			return false
		}
		switch d.peek() {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return true
		default:
			return false
		}
	}
}

// array reads an array (not null), calling elem positioned before each element.
func (d *jsonReader) array(elem func() bool) bool {
	if d.peek() != '[' {
		return false
	}
	d.pos++
	if d.peek() == ']' {
		d.pos++
		return true
	}
	for {
		if !elem() {
			return false
		}
		switch d.peek() {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return true
		default:
			return false
		}
	}
}

// null consumes a null if one is next.
func (d *jsonReader) null() bool {
	if d.peek() == 'n' && bytes.HasPrefix(d.data[d.pos:], []byte("null")) {
		d.pos += 4
		return true
	}
	return false
}

// other skips the value of a key the caller does not read. A key that differs only in case from one of known
// is refused: encoding/json would read it as that field.
func (d *jsonReader) other(key []byte, known ...string) bool {
	for _, k := range known {
		if bytes.EqualFold(key, []byte(k)) {
			return false
		}
	}
	return d.skip()
}

// text reads a string into *dst; null leaves *dst as it is.
func (d *jsonReader) text(dst *string) bool {
	s, isNull, ok := d.str()
	if ok && !isNull {
		*dst = string(s)
	}
	return ok
}

// raw reads any value into *dst as its JSON text, as json.RawMessage does.
func (d *jsonReader) raw(dst *json.RawMessage) bool {
	d.ws()
	start := d.pos
	if !d.skip() {
		return false
	}
	*dst = bytes.Clone(d.data[start:d.pos])
	return true
}

// str reads a string, or null; the bytes are valid until the reader's data changes.
func (d *jsonReader) str() (s []byte, isNull, ok bool) {
	if d.null() {
		return nil, true, true
	}
	if d.peek() != '"' {
		return nil, false, false
	}
	raw, escaped, ok := d.rawString()
	if !ok {
		return nil, false, false
	}
	if !escaped && utf8.Valid(raw) {
		return raw, false, true
	}
	// Escapes, or bytes that are not UTF-8 (which encoding/json replaces): encoding/json reads the string.
	var v string
	if json.Unmarshal(d.data[d.pos-len(raw)-2:d.pos], &v) != nil {
		return nil, false, false
	}
	return []byte(v), false, true
}

// rawString reads a string token positioned at its opening quote: what is between the quotes, whether it holds
// escapes, and whether it is a valid JSON string.
func (d *jsonReader) rawString() (raw []byte, escaped, ok bool) {
	start := d.pos + 1
	for i := start; i < len(d.data); i++ {
		switch c := d.data[i]; {
		case c == '"':
			d.pos = i + 1
			return d.data[start:i], escaped, true
		case c == '\\':
			escaped = true
			i++
			if i == len(d.data) {
				return nil, false, false
			}
			switch d.data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(d.data) {
					return nil, false, false
				}
				for _, h := range d.data[i+1 : i+5] {
					if !isHex(h) {
						return nil, false, false
					}
				}
				i += 4
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		}
	}
	return nil, false, false
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// count reads an integer without fraction or exponent that fits int64 comfortably, or null (leaving *dst);
// anything else (12.0, which count's UnmarshalJSON takes) is refused.
func (d *jsonReader) count(dst *count) bool {
	if d.null() {
		return true
	}
	if d.peek() == 0 {
		return false
	}
	neg := d.data[d.pos] == '-'
	if neg {
		d.pos++
	}
	digits := d.pos
	var n int64
	for d.pos < len(d.data) && '0' <= d.data[d.pos] && d.data[d.pos] <= '9' {
		if n > (1<<63-1)/10-1 {
			return false
		}
		n = n*10 + int64(d.data[d.pos]-'0')
		d.pos++
	}
	switch {
	case d.pos == digits, d.pos-digits > 1 && d.data[digits] == '0': // no digits, or a leading zero
		return false
	case d.pos < len(d.data) && (d.data[d.pos] == '.' || d.data[d.pos] == 'e' || d.data[d.pos] == 'E'):
		return false
	}
	if neg {
		n = -n
	}
	*dst = count(n)
	return true
}

// skip reads any one value without keeping it.
func (d *jsonReader) skip() bool {
	switch d.peek() {
	case '{':
		if d.depth++; d.depth > maxSkipDepth {
			return false
		}
		ok := d.object(func([]byte) bool { return d.skip() })
		d.depth--
		return ok
	case '[':
		if d.depth++; d.depth > maxSkipDepth {
			return false
		}
		ok := d.array(d.skip)
		d.depth--
		return ok
	case '"':
		_, _, ok := d.rawString()
		return ok
	case 't':
		return d.literal("true")
	case 'f':
		return d.literal("false")
	case 'n':
		return d.null()
	default:
		return d.number()
	}
}

func (d *jsonReader) literal(s string) bool {
	if !bytes.HasPrefix(d.data[d.pos:], []byte(s)) {
		return false
	}
	d.pos += len(s)
	return true
}

// number reads a JSON number.
func (d *jsonReader) number() bool {
	p := d.pos
	if p < len(d.data) && d.data[p] == '-' {
		p++
	}
	switch {
	case p < len(d.data) && d.data[p] == '0':
		p++
	case p < len(d.data) && '1' <= d.data[p] && d.data[p] <= '9':
		for p < len(d.data) && '0' <= d.data[p] && d.data[p] <= '9' {
			p++
		}
	default:
		return false
	}
	if p < len(d.data) && d.data[p] == '.' {
		p++
		q := p
		for p < len(d.data) && '0' <= d.data[p] && d.data[p] <= '9' {
			p++
		}
		if p == q {
			return false
		}
	}
	if p < len(d.data) && (d.data[p] == 'e' || d.data[p] == 'E') {
		p++
		if p < len(d.data) && (d.data[p] == '+' || d.data[p] == '-') {
			p++
		}
		q := p
		for p < len(d.data) && '0' <= d.data[p] && d.data[p] <= '9' {
			p++
		}
		if p == q {
			return false
		}
	}
	d.pos = p
	return true
}
