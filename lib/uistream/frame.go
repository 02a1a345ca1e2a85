package uistream

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
)

// Response headers of a UI message stream.
const (
	ContentType   = "text/event-stream"
	VersionHeader = "x-vercel-ai-ui-message-stream"
	Version       = "v1"
)

// SetHeaders sets the headers of a UI message stream response: the SSE content type, no caching, keep-alive,
// the protocol version the AI SDK checks, and x-accel-buffering: no so proxies do not hold chunks back.
func SetHeaders(h http.Header) {
	h.Set("Content-Type", ContentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set(VersionHeader, Version)
	h.Set("X-Accel-Buffering", "no")
}

// DoneFrame ends every stream.
const DoneFrame = "data: [DONE]\n\n"

const framePrefix = "data: "

// AppendFrame appends the SSE frame of c (`data: <json>\n\n`) to b. On error b is returned unchanged in
// length; the error is an *agent.Error with CodeInvalidChunk.
func AppendFrame(b []byte, c Chunk) ([]byte, error) {
	n := len(b)
	b = append(b, framePrefix...)
	b = append(b, `{"type":`...)
	b = appendString(b, c.ChunkType())
	b, err := c.appendFields(b)
	if err != nil {
		return b[:n], err
	}
	return append(b, '}', '\n', '\n'), nil
}

// AppendDone appends the final `data: [DONE]` frame to b.
func AppendDone(b []byte) []byte { return append(b, DoneFrame...) }

// Frames encodes chunks as consecutive frames, e.g. for a segment written outside an Encoder (the reaper's
// final error + finish segment). Add AppendDone when the frames end the stream.
func Frames(chunks ...Chunk) ([]byte, error) {
	var b []byte
	for _, c := range chunks {
		var err error
		if b, err = AppendFrame(b, c); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// CodeInvalidStream is the code of ParseFrames errors.
const CodeInvalidStream = agent.CodeInvalidStream

// ParseFrames splits a complete stream body (as written by an Encoder, or replayed from segments) into the
// JSON payloads of its chunks, and reports whether it ended with [DONE]. It accepts exactly the format this
// package writes: `data: <one-line JSON>\n\n` frames, nothing after [DONE], no partial frame at the end.
func ParseFrames(body []byte) (chunks []json.RawMessage, done bool, err error) {
	for pos := 0; pos < len(body); {
		end := bytes.Index(body[pos:], []byte("\n\n"))
		if end < 0 {
			return chunks, done, agent.E(agent.KindInvalid, CodeInvalidStream, "partial frame at offset %d", pos)
		}
		frame := body[pos : pos+end]
		payload, ok := bytes.CutPrefix(frame, []byte(framePrefix))
		switch {
		case !ok || bytes.ContainsAny(payload, "\r\n"):
			return chunks, done, agent.E(agent.KindInvalid, CodeInvalidStream, "malformed frame at offset %d", pos)
		case done:
			return chunks, done, agent.E(agent.KindInvalid, CodeInvalidStream, "frame after [DONE] at offset %d", pos)
		case string(payload) == "[DONE]":
			done = true
		case !json.Valid(payload):
			return chunks, done, agent.E(agent.KindInvalid, CodeInvalidStream, "invalid JSON in frame at offset %d", pos)
		default:
			chunks = append(chunks, json.RawMessage(payload))
		}
		pos += end + 2
	}
	return chunks, done, nil
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Like encoding/json it replaces invalid UTF-8 with U+FFFD and
// escapes U+2028/U+2029; unlike it, it leaves <, > and & alone (the stream is never embedded in HTML).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

var errInvalidUTF8 = errors.New("invalid UTF-8")

// appendCompactJSON appends raw with insignificant whitespace removed (a frame must stay on one line),
// rejecting invalid JSON and invalid UTF-8.
func appendCompactJSON(b []byte, raw []byte) ([]byte, error) {
	if !utf8.Valid(raw) {
		return b, errInvalidUTF8
	}
	if !bytes.ContainsAny(raw, " \t\r\n") {
		// Already compact (the common case: values built by json.Marshal); only validate.
		if !json.Valid(raw) {
			return b, errors.New("invalid JSON")
		}
		return append(b, raw...), nil
	}
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, raw); err != nil {
		return b, err
	}
	return buf.Bytes(), nil
}
