package offline

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Bounds on the numbers the commands take, so a typo cannot make the server stream for hours.
const (
	maxWords      = 10000
	maxFlaky      = 1000
	maxFlakyTurns = 4096 // turns remembered for /flaky before the counters are reset
)

// reply is what the model says to one request, before it is written in either wire form.
type reply struct {
	status    int    // > 0: fail the request with this HTTP status before any output
	message   string // error message for status and failAfter
	reasoning string
	pieces    []string      // the text, split into streamed pieces ("You", " said:", " hi")
	delay     time.Duration // wait before each text piece
	calls     []wireToolCall
	finish    string // stop | length | tool_calls
	failAfter int    // > 0: after the text pieces, send an in-band error with this status
	drop      bool   // after the text pieces, cut the connection
}

func (r reply) text() string { return strings.Join(r.pieces, "") }

// turn is the part of a request the script reads.
type turn struct {
	text    string          // the newest user message's text, trimmed
	content json.RawMessage // the newest user message's content, as sent (for /received)
	after   []wireMessage   // the messages after it
	key     string          // identifies the turn: a hash of the messages up to and including the newest user message
	reqHash string          // a hash of all the request's messages, for ids
	offered []string        // the names of the tools the request offers, in order (for /tools)
}

func textReply(s string) reply {
	return reply{pieces: splitWords(s), finish: "stop"}
}

func errorReply(status int, format string, args ...any) reply {
	return reply{status: status, message: fmt.Sprintf(format, args...)}
}

// answer scripts the reply to text within turn t. It is called again with the rest of the text by the commands
// that wrap another answer (/flaky, /think).
func (s *Server) answer(t turn, text string) reply {
	if strings.HasPrefix(text, titleInstruction) {
		return titleReply(text)
	}
	cmd, rest := cutWord(text)
	switch cmd {
	case "/tool":
		return toolReply(t, cmd, rest, false)
	case "/loop":
		return toolReply(t, cmd, rest, true)
	case "/slow":
		n, ok := wordCount(rest)
		if !ok {
			return textReply(fmt.Sprintf("Usage: /slow N, with N from 0 to %d.", maxWords))
		}
		return reply{pieces: numberedWords(n), delay: s.wordDelay, finish: "stop"}
	case "/error":
		return errorCommand(rest)
	case "/drop":
		n, ok := wordCount(rest)
		if !ok {
			return textReply(fmt.Sprintf("Usage: /drop N, with N from 0 to %d.", maxWords))
		}
		return reply{pieces: numberedWords(n), drop: true}
	case "/flaky":
		return s.flakyCommand(t, text, rest)
	case "/received":
		return textReply(received(t.content))
	case "/tools":
		if len(t.offered) == 0 {
			return textReply("No tools were offered.")
		}
		return textReply(strings.Join(t.offered, "\n"))
	case "/think":
		inner := strings.TrimSpace(rest)
		r := s.answer(t, inner)
		if inner == "" {
			r.reasoning = "Nothing to think about."
		} else {
			r.reasoning = "Thinking about: " + inner
		}
		return r
	}
	return textReply("You said: " + text)
}

const toolUsage = "Usage: %[1]s NAME {json}, where {json} is a JSON object of arguments (default {}); " +
	"repeat \"%[1]s NAME {json}\" for parallel calls."

func toolReply(t turn, cmd, rest string, loop bool) reply {
	calls, ok := parseCalls(cmd, rest)
	if !ok {
		return textReply(fmt.Sprintf(toolUsage, cmd))
	}
	if !loop {
		if results, ok := toolResults(t.after); ok {
			return textReply(results)
		}
	}
	out := make([]wireToolCall, len(calls))
	for i, c := range calls {
		out[i] = wireToolCall{
			ID:       fmt.Sprintf("call_%s%d", t.reqHash[:20], i),
			Type:     "function",
			Function: c,
		}
	}
	return reply{calls: out, finish: "tool_calls"}
}

// parseCalls reads "NAME {json}" followed by any number of "CMD NAME {json}".
func parseCalls(cmd, s string) ([]wireFunction, bool) {
	var calls []wireFunction
	rest := strings.TrimSpace(s)
	for {
		i := strings.IndexFunc(rest, func(r rune) bool { return unicode.IsSpace(r) || r == '{' })
		if i < 0 {
			i = len(rest)
		}
		name := rest[:i]
		if name == "" {
			return nil, false
		}
		rest = strings.TrimLeftFunc(rest[i:], unicode.IsSpace)
		args := "{}"
		if strings.HasPrefix(rest, "{") {
			dec := json.NewDecoder(strings.NewReader(rest))
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, false
			}
			var buf bytes.Buffer
			if err := json.Compact(&buf, raw); err != nil {
				return nil, false
			}
			args = buf.String()
			rest = rest[dec.InputOffset():]
		}
		calls = append(calls, wireFunction{Name: name, Arguments: args})
		next, more := cutWord(rest)
		switch next {
		case "":
			return calls, true
		case cmd:
			rest = strings.TrimSpace(more)
		default:
			return nil, false
		}
	}
}

// toolResults renders the results of the newest tool-call round in after, one line per result; ok is false
// when after holds no tool result.
func toolResults(after []wireMessage) (string, bool) {
	start, names := 0, map[string]string{}
	for i, m := range after {
		if m.Role == "assistant" && len(m.ToolCalls) > 0 {
			start = i + 1
			names = map[string]string{}
			for _, c := range m.ToolCalls {
				names[c.ID] = c.Function.Name
			}
		}
	}
	var lines []string
	for _, m := range after[start:] {
		if m.Role != "tool" {
			continue
		}
		name := names[m.ToolCallID]
		if name == "" {
			name = "?"
		}
		lines = append(lines, fmt.Sprintf("Tool %s returned: %s", name, m.text()))
	}
	if len(lines) == 0 {
		// The newest round has no result yet; fall back to any result in the turn.
		for _, m := range after {
			if m.Role == "tool" {
				lines = append(lines, fmt.Sprintf("Tool %s returned: %s", "?", m.text()))
			}
		}
	}
	return strings.Join(lines, "\n"), len(lines) > 0
}

func errorCommand(rest string) reply {
	const usage = "Usage: /error STATUS, or /error STATUS after N, with STATUS from 400 to 599 and N from 0 to %d."
	f := strings.Fields(rest)
	if len(f) != 1 && (len(f) != 3 || f[1] != "after") {
		return textReply(fmt.Sprintf(usage, maxWords))
	}
	status, err := strconv.Atoi(f[0])
	if err != nil || status < 400 || status > 599 {
		return textReply(fmt.Sprintf(usage, maxWords))
	}
	if len(f) == 1 {
		return errorReply(status, "offline model: injected error %d", status)
	}
	n, ok := wordCount(f[2])
	if !ok {
		return textReply(fmt.Sprintf(usage, maxWords))
	}
	return reply{
		pieces:    numberedWords(n),
		failAfter: status,
		message:   fmt.Sprintf("offline model: injected error %d after %d words", status, n),
	}
}

func (s *Server) flakyCommand(t turn, text, rest string) reply {
	const usage = "Usage: /flaky K STATUS [message], with K from 1 to %d and STATUS from 400 to 599."
	kWord, rest := cutWord(rest)
	statusWord, rest := cutWord(rest)
	k, err1 := strconv.Atoi(kWord)
	status, err2 := strconv.Atoi(statusWord)
	if err1 != nil || err2 != nil || k < 1 || k > maxFlaky || status < 400 || status > 599 {
		return textReply(fmt.Sprintf(usage, maxFlaky))
	}
	s.mu.Lock()
	n := s.flaky[t.key]
	if n < k {
		if len(s.flaky) >= maxFlakyTurns {
			clear(s.flaky)
		}
		s.flaky[t.key] = n + 1
	}
	s.mu.Unlock()
	if n < k {
		return errorReply(status, "offline model: flaky error %d (%d of %d)", status, n+1, k)
	}
	if rest = strings.TrimSpace(rest); rest == "" {
		return textReply("You said: " + text)
	}
	return s.answer(t, rest)
}

// limit cuts the text to maxTokens words and marks the reply as cut for length.
func (r *reply) limit(maxTokens int) {
	if maxTokens > 0 && len(r.pieces) > maxTokens {
		r.pieces = r.pieces[:maxTokens]
		r.finish = "length"
	}
}

func wordCount(s string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	return n, err == nil && n >= 0 && n <= maxWords
}

func numberedWords(n int) []string {
	out := make([]string, n)
	for i := range out {
		if i == 0 {
			out[i] = "word1"
		} else {
			out[i] = " word" + strconv.Itoa(i+1)
		}
	}
	return out
}

// cutWord returns the first whitespace-separated word of s and what follows it.
func cutWord(s string) (word, rest string) {
	s = strings.TrimLeftFunc(s, unicode.IsSpace)
	i := strings.IndexFunc(s, unicode.IsSpace)
	if i < 0 {
		return s, ""
	}
	return s[:i], s[i:]
}

// splitWords splits s into pieces that each hold one word and the whitespace before it, so that the pieces
// concatenate back to s exactly.
func splitWords(s string) []string {
	var out []string
	start, prevSpace := 0, true
	for i, r := range s {
		space := unicode.IsSpace(r)
		if space && !prevSpace && i > start {
			out = append(out, s[start:i])
			start = i
		}
		prevSpace = space
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func countWords(s string) int64 { return int64(len(strings.Fields(s))) }

// received describes content (a user message's, validated) one line per content part: "text",
// "image_url image/png 68 bytes" (a data URL: its type and decoded size), "image_url https://…" (a URL, as is),
// "file application/pdf report.pdf 1234 bytes" (file_data; the filename "-" when there is none) or
// "file file-abc" (a file_id). A string content is one text part.
func received(content json.RawMessage) string {
	var parts []struct {
		Type     string `json:"type"`
		ImageURL struct {
			URL string `json:"url"`
		} `json:"image_url"`
		File struct {
			FileData string `json:"file_data"`
			FileID   string `json:"file_id"`
			Filename string `json:"filename"`
		} `json:"file"`
	}
	if json.Unmarshal(content, &parts) != nil {
		return "text"
	}
	lines := make([]string, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "image_url":
			lines = append(lines, "image_url "+describeURL(p.ImageURL.URL))
		case "file":
			if p.File.FileID != "" {
				lines = append(lines, "file "+p.File.FileID)
				continue
			}
			name := p.File.Filename
			if name == "" {
				name = "-"
			}
			mt, size := dataURL(p.File.FileData)
			lines = append(lines, fmt.Sprintf("file %s %s %d bytes", mt, name, size))
		default:
			lines = append(lines, p.Type)
		}
	}
	return strings.Join(lines, "\n")
}

func describeURL(u string) string {
	if !strings.HasPrefix(u, "data:") {
		return u
	}
	mt, size := dataURL(u)
	return fmt.Sprintf("%s %d bytes", mt, size)
}

// dataURL returns a validated data URL's media type and decoded size.
func dataURL(u string) (string, int) {
	head, payload, _ := strings.Cut(strings.TrimPrefix(u, "data:"), ",")
	mt, _, _ := strings.Cut(head, ";")
	return mt, base64.StdEncoding.DecodedLen(len(payload)) - strings.Count(payload[max(0, len(payload)-2):], "=")
}

// titleInstruction opens a thread title request (lib/titles.Instruction, which lib/titles' tests hold equal to
// this): the answer is a deterministic title.
const titleInstruction = "Title this conversation."

// titleWords is how many of the user text's first words a title keeps.
const titleWords = 6

// titleReply is the title of a title request: the first titleWords words of the text between <user> and </user>
// (the conversation's first user message; the whole text when there are no such tags), its first letter upper
// case; "Untitled conversation" when that text is empty.
func titleReply(text string) reply {
	user := text
	if _, after, ok := strings.Cut(text, "<user>"); ok {
		user, _, _ = strings.Cut(after, "</user>")
	}
	words := strings.Fields(user)
	if len(words) > titleWords {
		words = words[:titleWords]
	}
	title := strings.Join(words, " ")
	if title == "" {
		return textReply("Untitled conversation")
	}
	r, n := utf8.DecodeRuneInString(title)
	return textReply(string(unicode.ToUpper(r)) + title[n:])
}
