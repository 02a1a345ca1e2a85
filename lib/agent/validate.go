package agent

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The boundary's rules for the newest message of a request, the only one a client authors (its copy of the
// history is never read). Stored history is never validated again: rows written by older versions are read as
// they are.
//
// The schema is the AI SDK's UIMessage (packages/ai/src/ui/validate-ui-messages.ts): fields it requires are
// required here with the same JSON types, and fields it does not know are ignored, as zod ignores them. On top of
// it, what each role may send:
//
//   - user (a new message, or an edit): text {text}, file {mediaType, url, filename?} and data-* {data?, id?}, with
//     something the model sees: a text not only of white space, or a file.
//     A file reaches the model, so its media type must be one ModelFileType accepts (images and PDFs) and its
//     url a base64 data URL of that same media type with at least one byte, starting with that type's magic
//     bytes, or an https URL (PDFs by URL: MaxLinkedPDFs at most). At most Limits.MaxParts parts.
//   - assistant (a continuation: tool outputs and approval answers on the newest assistant message): every part
//     type of the schema (text, reasoning, source-url, source-document, file, step-start, data-*, tool-*,
//     dynamic-tool), each with its fields; a tool part's state is one of the AI SDK's and carries what that
//     state requires (approval {id} for the approval states, approved false for output-denied; an
//     approval-responded part without approved is the engine's missing_decision). Being the server's own parts
//     sent back, perhaps as stored (agent.EncodePart leaves empty strings out), a text or reasoning part may
//     lack its text and an output-error part its errorText; present, they are strings.
//
// Ids: the message id is 1-200 bytes of UTF-8 without '#', '/' or control characters (it is a key in the store
// and in URLs); tool call ids, approval ids and data part ids are 1-200 bytes without control characters.

// Limits bound one incoming message. Zero fields mean no bound.
type Limits struct {
	// MaxBytes bounds the message's parts and metadata, in bytes of JSON (KindTooLarge, CodeMessageTooLarge).
	MaxBytes int
	// MaxParts bounds the parts of a user message (KindTooLarge, CodeMessageTooLarge). An assistant message's
	// parts are the server's own, sent back: only MaxBytes bounds them.
	MaxParts int
}

const maxIDLen = 200

// MaxLinkedPDFs bounds the PDFs a user message names by https URL: each is downloaded for every model request
// that shows it, up to 20 MiB (REVIEW S4).
const MaxLinkedPDFs = 10

// linkedPDFs counts the PDF file parts of m given by an https URL.
func linkedPDFs(m Message) int {
	n := 0
	for _, raw := range m.Parts {
		var p struct{ Type, MediaType, URL string }
		if json.Unmarshal(raw, &p) == nil && p.Type == "file" && p.MediaType == "application/pdf" && strings.HasPrefix(p.URL, "https:") {
			n++
		}
	}
	return n
}

// ValidMessageID reports whether id can name a message: 1-200 bytes of UTF-8 without '#', '/' or control
// characters.
func ValidMessageID(id string) bool {
	return validID(id) && !strings.ContainsAny(id, "#/")
}

func validID(id string) bool {
	return id != "" && len(id) <= maxIDLen && utf8.ValidString(id) && !strings.ContainsFunc(id, unicode.IsControl)
}

// ValidateIncoming checks the newest message of a submit request strictly (see the rules above). Errors are
// KindInvalid with CodeInvalidMessage (CodeUnsupportedFileType for a file the model cannot read, CodeUserRequired
// for a role other than user or assistant, CodeReservedMessageID for an id in the server's steer_ namespace), or KindTooLarge with CodeMessageTooLarge; the message names the part,
// e.g. "parts[2] (file): media type text/plain is not accepted (images and PDFs only)".
func ValidateIncoming(m Message, lim Limits) error {
	if !ValidMessageID(m.ID) {
		return E(KindInvalid, CodeInvalidMessage, "message id must be 1-200 characters without '#', '/' or control characters")
	}
	if strings.HasPrefix(m.ID, SteerIDPrefix) {
		// The server's job results (REVIEW H7): a client message must never take, replace or edit a steer.
		return E(KindInvalid, CodeReservedMessageID, "message ids starting with %q are reserved for the server's job results", SteerIDPrefix)
	}
	if m.Role != RoleUser && m.Role != RoleAssistant {
		return E(KindInvalid, CodeUserRequired, "the newest message must have role user or assistant, got %q", m.Role)
	}
	if lim.MaxBytes > 0 {
		size := len(m.Metadata)
		for _, p := range m.Parts {
			size += len(p)
		}
		if size > lim.MaxBytes {
			return E(KindTooLarge, CodeMessageTooLarge, "message is %d bytes, the limit is %d", size, lim.MaxBytes)
		}
	}
	if m.Role == RoleUser {
		if len(m.Parts) == 0 {
			return E(KindInvalid, CodeInvalidMessage, "a user message needs at least one part")
		}
		if lim.MaxParts > 0 && len(m.Parts) > lim.MaxParts {
			return E(KindTooLarge, CodeMessageTooLarge, "message has %d parts, the limit is %d", len(m.Parts), lim.MaxParts)
		}
	}
	for i, raw := range m.Parts {
		if err := checkPart(m.Role, raw); err != nil {
			err.Message = fmt.Sprintf("parts[%d] %s", i, err.Message)
			return err
		}
	}
	if n := linkedPDFs(m); m.Role == RoleUser && n > MaxLinkedPDFs {
		return E(KindTooLarge, CodeMessageTooLarge, "message names %d PDFs by URL, the limit is %d", n, MaxLinkedPDFs)
	}
	if m.Role == RoleUser && !modelSees(m.Parts) {
		return E(KindInvalid, CodeInvalidMessage, "a user message needs a text with something in it, or a file: the model would see nothing")
	}
	return nil
}

// modelSees reports whether a user message's parts (already checked) give the model something: a text that is
// not only white space, or a file. data-* parts are for the UI alone (REVIEW S8: a message of those was stored
// and then left out of the transcript, and the model answered nothing, or its last reply again).
func modelSees(parts []json.RawMessage) bool {
	for _, raw := range parts {
		var p struct{ Type, Text string }
		if json.Unmarshal(raw, &p) == nil && (p.Type == "file" || (p.Type == "text" && strings.TrimSpace(p.Text) != "")) {
			return true
		}
	}
	return false
}

// fields is a part as its JSON fields.
type fields map[string]json.RawMessage

func (f fields) present(k string) bool {
	v, ok := f[k]
	return ok && string(bytes.TrimSpace(v)) != "null"
}

// str reads a string field (null counts as absent); the error says it is missing though required, or not a
// string.
func (f fields) str(k string, required bool) (string, *Error) {
	if !f.present(k) {
		if required {
			return "", E(KindInvalid, CodeInvalidMessage, "%s is required", k)
		}
		return "", nil
	}
	var s string
	if json.Unmarshal(f[k], &s) != nil {
		return "", E(KindInvalid, CodeInvalidMessage, "%s must be a string", k)
	}
	return s, nil
}

func (f fields) enum(k string, required bool, allowed ...string) (string, *Error) {
	s, err := f.str(k, required)
	if err != nil || (s == "" && !f.present(k)) {
		return s, err
	}
	if !slices.Contains(allowed, s) {
		return "", E(KindInvalid, CodeInvalidMessage, "%s must be one of %s, got %q", k, strings.Join(allowed, ", "), s)
	}
	return s, nil
}

func (f fields) id(k string, required bool) *Error {
	s, err := f.str(k, required)
	if err != nil || !f.present(k) {
		return err
	}
	if !validID(s) {
		return E(KindInvalid, CodeInvalidMessage, "%s must be 1-200 characters without control characters", k)
	}
	return nil
}

// The fields this package checks and the engine reads (agent.Part, a file's mediaType, url and filename).
var (
	partFields = []string{"type", "text", "state", "toolCallId", "toolName", "input", "output", "errorText",
		"approval", "data", "id", "mediaType", "url", "filename", "sourceId", "title", "providerMetadata"}
	approvalFields = []string{"id", "approved", "reason", "signature"}
)

// spelled refuses a key that differs only in case from a known field: encoding/json matches struct fields
// case-insensitively, so {"type":"text","TYPE":"x"} would be a text part to this check and something else to
// the engine's decoder. (A key repeated exactly is read alike by both: the last one wins.)
func (f fields) spelled(known []string) *Error {
	for k := range f {
		for _, name := range known {
			if k != name && strings.EqualFold(k, name) {
				return E(KindInvalid, CodeInvalidMessage, "has field %q, which must be spelled %q", k, name)
			}
		}
	}
	return nil
}

// userType reports whether a person may author parts of type typ.
func userType(typ string) bool {
	return typ == "text" || typ == "file" || strings.HasPrefix(typ, "data-")
}

// checkPart checks one part; the error's message starts with "(type): " or, when the type is unreadable, ": ".
func checkPart(role Role, raw json.RawMessage) *Error {
	var f fields
	if b := bytes.TrimSpace(raw); len(b) == 0 || b[0] != '{' || json.Unmarshal(raw, &f) != nil {
		return E(KindInvalid, CodeInvalidMessage, "must be an object with a type")
	}
	if err := f.spelled(partFields); err != nil {
		return err
	}
	typ, err := f.str("type", true)
	if err != nil || typ == "" {
		return E(KindInvalid, CodeInvalidMessage, "must be an object with a type")
	}
	err = checkFields(role, typ, f)
	if err != nil {
		err.Message = fmt.Sprintf("(%s): %s", typ, err.Message)
	}
	return err
}

func checkFields(role Role, typ string, f fields) *Error {
	if role == RoleUser && !userType(typ) {
		return E(KindInvalid, CodeInvalidMessage, "a user message may hold text, file and data-* parts only")
	}
	switch {
	case typ == "text" || typ == "reasoning":
		// An assistant message is the server's own sent back, perhaps as GET /threads/{id} read it: EncodePart
		// leaves empty strings out, so an empty text may come without its field.
		if _, err := f.str("text", role == RoleUser); err != nil {
			return err
		}
		_, err := f.enum("state", false, "streaming", "done")
		return err
	case typ == "file":
		return checkFile(role, f)
	case typ == "step-start":
		return nil
	case typ == "source-url":
		if _, err := f.str("sourceId", true); err != nil {
			return err
		}
		if _, err := f.str("url", true); err != nil {
			return err
		}
		_, err := f.str("title", false)
		return err
	case typ == "source-document":
		for _, k := range []string{"sourceId", "mediaType", "title"} {
			if _, err := f.str(k, true); err != nil {
				return err
			}
		}
		_, err := f.str("filename", false)
		return err
	case strings.HasPrefix(typ, "data-"):
		if len(typ) == len("data-") {
			return E(KindInvalid, CodeInvalidMessage, "a data part type names its data: data-<name>")
		}
		return f.id("id", false)
	case IsToolPart(typ):
		return checkTool(typ, f)
	}
	return E(KindInvalid, CodeInvalidMessage, "unknown part type")
}

// checkFile checks a file part; a user's must be something the model reads.
func checkFile(role Role, f fields) *Error {
	mediaType, err := f.str("mediaType", true)
	if err != nil {
		return err
	}
	u, err := f.str("url", true)
	if err != nil {
		return err
	}
	if _, err := f.str("filename", false); err != nil {
		return err
	}
	if role != RoleUser {
		return nil
	}
	return CheckModelFile(mediaType, u)
}

// CheckModelFile reports why a file of mediaType at u cannot reach a model, or nil: the media type is one
// ModelFileType accepts and u is a base64 data URL of that media type with at least one byte, or an https URL.
// The boundary refuses such a file part; a transcript shows a line in place of a stored one (written by an older
// version).
func CheckModelFile(mediaType, u string) *Error {
	if !ModelFileType(mediaType) {
		return E(KindInvalid, CodeUnsupportedFileType, "media type %s is not accepted (images and PDFs only)", mediaType)
	}
	if strings.HasPrefix(u, "data:") {
		return checkDataURL(u, mediaType)
	}
	p, perr := url.Parse(u)
	if perr != nil || p.Scheme != "https" || p.Host == "" {
		return E(KindInvalid, CodeInvalidMessage, "url must be a base64 data URL or an https URL")
	}
	return nil
}

// ParseDataURL splits "data:<mediaType>[;params];base64,<data>" and decodes its data (standard base64); ok is false
// for anything else.
func ParseDataURL(u string) (mediaType string, data []byte, ok bool) {
	rest, found := strings.CutPrefix(u, "data:")
	if !found {
		return "", nil, false
	}
	head, payload, found := strings.Cut(rest, ",")
	if !found {
		return "", nil, false
	}
	params := strings.Split(head, ";")
	if len(params) < 2 || params[len(params)-1] != "base64" {
		return "", nil, false
	}
	data, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		return "", nil, false
	}
	return params[0], data, true
}

func checkDataURL(u, mediaType string) *Error {
	got, data, ok := ParseDataURL(u)
	switch {
	case !ok:
		return E(KindInvalid, CodeInvalidMessage, "url is not a base64 data URL (data:%s;base64,…)", mediaType)
	case got != mediaType:
		return E(KindInvalid, CodeInvalidMessage, "the data URL holds %s, the part says %s", cmpOr(got, "no media type"), mediaType)
	case len(data) == 0:
		return E(KindInvalid, CodeInvalidMessage, "the data URL holds no bytes")
	case !signed(mediaType, data):
		return E(KindInvalid, CodeInvalidMessage, "the data URL's bytes are not an %s file", mediaType)
	}
	return nil
}

// signed reports whether data starts as a file of mediaType does (its magic bytes): a provider refuses an image
// or PDF it cannot decode, and a stored one would be sent again on every later turn (REVIEW S4). A PDF's header
// may follow up to 1024 bytes of anything, as readers allow.
func signed(mediaType string, data []byte) bool {
	switch mediaType {
	case "image/png":
		return bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n"))
	case "image/jpeg":
		return bytes.HasPrefix(data, []byte{0xff, 0xd8, 0xff})
	case "image/gif":
		return bytes.HasPrefix(data, []byte("GIF87a")) || bytes.HasPrefix(data, []byte("GIF89a"))
	case "image/webp":
		return len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP"
	case "application/pdf":
		return bytes.Contains(data[:min(len(data), 1024)], []byte("%PDF-"))
	}
	return true
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

var toolStates = []string{StateInputStreaming, StateInputAvailable, StateApprovalRequested, StateApprovalResponded,
	StateOutputAvailable, StateOutputError, StateOutputDenied}

// checkTool checks a tool part against the schema of its state.
func checkTool(typ string, f fields) *Error {
	if typ == "dynamic-tool" {
		if name, err := f.str("toolName", true); err != nil || name == "" {
			return cmpErr(err, "toolName is required")
		}
	} else if len(typ) == len("tool-") {
		return E(KindInvalid, CodeInvalidMessage, "a tool part type names its tool: tool-<name>")
	}
	if err := f.id("toolCallId", true); err != nil {
		return err
	}
	state, err := f.enum("state", true, toolStates...)
	if err != nil {
		return err
	}
	// errorText is a string; absent only as the server stores an empty one (see text above).
	if _, err := f.str("errorText", false); err != nil {
		return err
	}
	// approval: required for approval-requested (unanswered), approval-responded and output-denied (approved
	// false), optional (approved true) on output-available and output-error. An approval-responded part without
	// approved is left to the engine, which names it missing_decision (its code since before this check).
	need := state == StateApprovalRequested || state == StateApprovalResponded || state == StateOutputDenied
	if !f.present("approval") {
		if need {
			return E(KindInvalid, CodeInvalidMessage, "approval is required in state %s", state)
		}
		return nil
	}
	var a fields
	if b := bytes.TrimSpace(f["approval"]); b[0] != '{' || json.Unmarshal(b, &a) != nil {
		return E(KindInvalid, CodeInvalidMessage, "approval must be an object")
	}
	if err := a.spelled(approvalFields); err != nil {
		err.Message = "approval " + err.Message
		return err
	}
	if err := a.id("id", true); err != nil {
		err.Message = "approval." + err.Message
		return err
	}
	if _, err := a.str("reason", false); err != nil {
		err.Message = "approval." + err.Message
		return err
	}
	var approved *bool
	if a.present("approved") {
		var b bool
		if json.Unmarshal(a["approved"], &b) != nil {
			return E(KindInvalid, CodeInvalidMessage, "approval.approved must be a boolean")
		}
		approved = &b
	}
	switch {
	case state == StateApprovalRequested && approved != nil:
		return E(KindInvalid, CodeInvalidMessage, "approval.approved must be absent in state %s", state)
	case state == StateOutputDenied && (approved == nil || *approved):
		return E(KindInvalid, CodeInvalidMessage, "approval.approved must be false in state %s", state)
	case (state == StateOutputAvailable || state == StateOutputError) && (approved == nil || !*approved):
		return E(KindInvalid, CodeInvalidMessage, "approval.approved must be true in state %s", state)
	case state == StateInputStreaming || state == StateInputAvailable:
		return E(KindInvalid, CodeInvalidMessage, "approval must be absent in state %s", state)
	}
	return nil
}

func cmpErr(err *Error, msg string) *Error {
	if err != nil {
		return err
	}
	return E(KindInvalid, CodeInvalidMessage, "%s", msg)
}
