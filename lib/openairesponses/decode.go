package openairesponses

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// Per-word events (text, reasoning summary and argument deltas) are most of a stream. decodeDelta reads them
// without encoding/json when they have the shape OpenAI (and the offline model) writes: one flat object, its
// values strings, integers, literals or empty arrays. Anything else (a nested object, another event type, a
// malformed value) is left to encoding/json (decodeEvent), and a fuzzed test holds the two to the same result.

// deltaTypes are the event types decodeDelta reads, as constants so that a decoded type allocates nothing.
var deltaTypes = [...]string{
	"response.output_text.delta",
	"response.reasoning_summary_text.delta",
	"response.function_call_arguments.delta",
	"response.refusal.delta",
	"response.reasoning_text.delta",
}

// decodeEvent decodes one event's data into ev.
func decodeEvent(data []byte, ev *event) error {
	*ev = event{}
	if decodeDelta(data, ev) {
		return nil
	}
	*ev = event{}
	return json.Unmarshal(data, ev)
}

func decodeDelta(data []byte, ev *event) bool {
	d := deltaReader{b: data}
	d.ws()
	if !d.byte('{') {
		return false
	}
	var seen [3]bool // type, delta, item_id: a key twice (encoding/json keeps the last) is left to it
	first := true
	for {
		d.ws()
		if d.byte('}') {
			break
		}
		if !first && !(d.byte(',') && d.wsThen()) {
			return false
		}
		first = false
		key, ok := d.plainString()
		if !ok || hasUpper(key) { // encoding/json matches keys case-insensitively: such a key is left to it
			return false
		}
		d.ws()
		if !d.byte(':') {
			return false
		}
		d.ws()
		switch string(key) {
		case "type", "delta", "item_id":
			k := 0
			switch string(key) {
			case "delta":
				k = 1
			case "item_id":
				k = 2
			}
			if seen[k] {
				return false
			}
			seen[k] = true
			s, ok := d.str()
			if !ok {
				return false
			}
			switch string(key) {
			case "type":
				ev.Type = ""
				for _, t := range deltaTypes {
					if string(s) == t {
						ev.Type = t
					}
				}
				if ev.Type == "" {
					return false
				}
			case "delta":
				ev.Delta = string(s)
			case "item_id":
				ev.ItemID = string(s)
			}
		case "summary_index":
			n, ok := d.integer()
			if !ok {
				return false
			}
			ev.SummaryIndex = n
		case "item", "arguments", "response", "code", "message":
			return false // fields of other events: encoding/json reads them
		default:
			if !d.skip() {
				return false
			}
		}
	}
	d.ws()
	return d.i == len(d.b) && ev.Type != ""
}

// deltaReader scans the flat objects decodeDelta takes.
type deltaReader struct {
	b []byte
	i int
}

func (d *deltaReader) ws() {
	for d.i < len(d.b) && (d.b[d.i] == ' ' || d.b[d.i] == '\t' || d.b[d.i] == '\n' || d.b[d.i] == '\r') {
		d.i++
	}
}

func (d *deltaReader) wsThen() bool { d.ws(); return true }

func (d *deltaReader) byte(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// plainString reads a string without escapes or control characters (a key), as its bytes.
func (d *deltaReader) plainString() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return d.b[start : d.i-1], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
		d.i++
	}
	return nil, false
}

// str reads a string value; one with escapes is unquoted by encoding/json (it also checks the UTF-8).
func (d *deltaReader) str() ([]byte, bool) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return nil, false
	}
	start := d.i
	if s, ok := d.plainString(); ok {
		if !validUTF8(s) {
			return nil, false
		}
		return s, true
	}
	d.i = start + 1
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '\\':
			d.i += 2
			continue
		case c == '"':
			d.i++
			var s string
			if json.Unmarshal(d.b[start:d.i], &s) != nil {
				return nil, false
			}
			return []byte(s), true
		case c < 0x20:
			return nil, false
		}
		d.i++
	}
	return nil, false
}

// validUTF8 reports whether s is valid UTF-8 (encoding/json replaces invalid bytes; such a string goes to it).
func validUTF8(s []byte) bool { return utf8.Valid(s) }

func hasUpper(s []byte) bool {
	for _, c := range s {
		if c >= 'A' && c <= 'Z' || c >= 0x80 {
			return true
		}
	}
	return false
}

// integer reads a non-negative integer that fits an int.
func (d *deltaReader) integer() (int, bool) {
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	if d.i == start || (d.b[start] == '0' && d.i-start > 1) || d.i-start > 9 {
		return 0, false
	}
	n, err := strconv.Atoi(string(d.b[start:d.i]))
	return n, err == nil
}

// skip passes over a value the adapter does not read: a string, an integer, true, false, null or [].
func (d *deltaReader) skip() bool {
	if d.i >= len(d.b) {
		return false
	}
	switch c := d.b[d.i]; {
	case c == '"':
		_, ok := d.str()
		return ok
	case c >= '0' && c <= '9':
		_, ok := d.integer()
		return ok
	case c == '[':
		d.i++
		d.ws()
		return d.byte(']')
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(d.b)-d.i >= len(lit) && string(d.b[d.i:d.i+len(lit)]) == lit {
			d.i += len(lit)
			return true
		}
	}
	return false
}
