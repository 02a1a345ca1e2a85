// Package tools holds the demo tool set offered to the model: add_note, list_notes, delete_note (needs approval),
// ask_user_question (a client tool). Notes live in the store's key/value area (agent.ValueStore, the narrow port)
// under "notes/<owner>".
//
// # A crash never lies (DESIGN principle 9)
//
// Every execution of one tool call carries the same agent.ToolInvocation.IdempotencyKey (thread + tool call id),
// across retries, runs and crashes. The tools with side effects use it twice:
//
//   - add_note derives the note's id from the key, so a re-executed call finds its note instead of adding a
//     second one, in whichever thread the same provider call id turns up (REVIEW L22);
//   - add_note and delete_note record their outcome under the key in "effects/<owner>", and a re-executed call
//     returns the recorded output without touching the notes again (a re-run add_note does not bring back a note
//     deleted since; a re-run delete_note reports what it deleted rather than "no such note"). Tool.Recorded reads
//     the same records, so recovery after a crash reports what really happened.
//
// Writes are ordered so that every record tells the truth: add_note writes the note, then its effect record;
// delete_note records its intent, deletes, then records that it is done. Recorded settles the window between two
// writes by looking at the note itself.
package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// MaxNoteBytes bounds one note's text.
const MaxNoteBytes = 16 << 10

// Note is one stored note.
type Note struct {
	ID        string    `json:"id"`
	Text      string    `json:"text"`
	CreatedAt time.Time `json:"createdAt"`
}

// Demo returns the demo tool set over values, using clock for note timestamps. They are always-on: a router
// that narrows a large catalog (lib/toolrouter) offers them in every step.
func Demo(values agent.ValueStore, clock agent.Clock) []agent.Tool {
	tools := []agent.Tool{AddNote(values, clock), ListNotes(values), DeleteNote(values), AskUserQuestion()}
	for i := range tools {
		tools[i].AlwaysOn = true
	}
	return tools
}

func notesNS(owner string) string   { return "notes/" + owner }
func effectsNS(owner string) string { return "effects/" + owner }

// idempotencyKey is the invocation's key; an engine that predates the field gets the same key derived here. A
// side effect without a key could not be made idempotent, so it is refused.
func idempotencyKey(inv agent.ToolInvocation) (string, error) {
	if inv.IdempotencyKey != "" {
		return inv.IdempotencyKey, nil
	}
	if inv.ThreadID == "" || inv.ToolCallID == "" {
		return "", errors.New("the call has no idempotency key")
	}
	return agent.IdempotencyKey(inv.ThreadID, inv.MessageID, inv.ToolCallID), nil
}

// noteID is the id of the note a call adds: a digest of the call's key, so it is scoped by thread and call, and
// short, and gives nothing of the thread id away to the model.
func noteID(key string) string {
	sum := sha256.Sum256([]byte("add_note\x00" + key))
	return "note_" + hex.EncodeToString(sum[:8])
}

// effect is what a tool records under a call's key.
type effect struct {
	State  string          `json:"state"`            // effectPending or effectDone
	Target string          `json:"target,omitempty"` // the note the effect is about
	Output json.RawMessage `json:"output,omitempty"` // the call's output, once done
}

const (
	effectPending = "pending" // the effect may have been applied; the target's state decides
	effectDone    = "done"
)

// effects reads and writes the records of one owner.
type effects struct{ values agent.ValueStore }

// get returns the call's record; ok is false when there is none.
func (e effects) get(ctx context.Context, owner, key string) (effect, bool, error) {
	b, err := e.values.GetValue(ctx, effectsNS(owner), key)
	if agent.IsKind(err, agent.KindNotFound) {
		return effect{}, false, nil
	}
	if err != nil {
		return effect{}, false, err
	}
	var ef effect
	if err := json.Unmarshal(b, &ef); err != nil {
		return effect{}, false, fmt.Errorf("effect record %s: %w", key, err)
	}
	return ef, true, nil
}

func (e effects) put(ctx context.Context, owner, key string, ef effect) error {
	b, err := json.Marshal(ef)
	if err != nil {
		return err
	}
	return e.values.PutValue(ctx, effectsNS(owner), key, b)
}

// note reads one note; ok is false when it does not exist.
func note(ctx context.Context, values agent.ValueStore, owner, id string) (json.RawMessage, bool, error) {
	b, err := values.GetValue(ctx, notesNS(owner), id)
	if agent.IsKind(err, agent.KindNotFound) {
		return nil, false, nil
	}
	return b, err == nil, err
}

// AddNote stores a note for the thread's owner, at most once per tool call.
func AddNote(values agent.ValueStore, clock agent.Clock) agent.Tool {
	fx := effects{values}
	return agent.Tool{
		Name:        "add_note",
		Description: "Save a short note for the user. Returns the stored note.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","description":"the note"}},"required":["text"],"additionalProperties":false}`),
		Kind:        agent.ToolServer,
		Approval:    agent.ApprovalMutating,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			var in struct {
				Text string `json:"text"`
			}
			if err := json.Unmarshal(inv.Input, &in); err != nil {
				return nil, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "input must be {\"text\": string}: %v", err)
			}
			in.Text = strings.TrimSpace(in.Text)
			if in.Text == "" {
				return nil, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "text must not be empty")
			}
			if len(in.Text) > MaxNoteBytes {
				return nil, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "text is %d bytes, the limit is %d", len(in.Text), MaxNoteBytes)
			}
			key, err := idempotencyKey(inv)
			if err != nil {
				return nil, err
			}
			if ef, ok, err := fx.get(ctx, inv.Owner, key); err != nil {
				return nil, err
			} else if ok && ef.State == effectDone {
				return ef.Output, nil // executed before: the same answer, and the notes stay as they are
			}
			id := noteID(key)
			out, exists, err := note(ctx, values, inv.Owner, id)
			if err != nil {
				return nil, err
			}
			if !exists {
				// A crash between this write and the record below leaves the note, which the next execution
				// (or Recorded) finds by its id.
				if out, err = json.Marshal(Note{ID: id, Text: in.Text, CreatedAt: clock.Now()}); err != nil {
					return nil, err
				}
				if err := values.PutValue(ctx, notesNS(inv.Owner), id, out); err != nil {
					return nil, err
				}
			}
			if err := fx.put(ctx, inv.Owner, key, effect{State: effectDone, Target: id, Output: out}); err != nil {
				return nil, err
			}
			return out, nil
		},
		Recorded: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, bool, error) {
			key, err := idempotencyKey(inv)
			if err != nil {
				return nil, false, err
			}
			if ef, ok, err := fx.get(ctx, inv.Owner, key); err != nil || (ok && ef.State == effectDone) {
				return ef.Output, err == nil, err
			}
			// No record: the note, if it exists, was written by this call just before a crash.
			return note(ctx, values, inv.Owner, noteID(key))
		},
	}
}

// ListNotes lists the owner's notes, oldest first.
func ListNotes(values agent.ValueStore) agent.Tool {
	return agent.Tool{
		Name:        "list_notes",
		Description: "List the user's saved notes.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		Kind:        agent.ToolServer,
		// Each output lists every note: an older list is only wrong now (transcript tier 0).
		Snapshot: true,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			// The demo of a server tool's progress (issue 19 item 6): the client sees the stage while the read
			// runs and how many notes there are before the list itself; the model sees only the output.
			report(inv, "reading", "Reading your notes")
			kvs, err := values.ListValues(ctx, notesNS(inv.Owner))
			if err != nil {
				return nil, err
			}
			found := fmt.Sprintf("Found %d notes", len(kvs))
			if len(kvs) == 1 {
				found = "Found 1 note"
			}
			report(inv, "found", found)
			notes := make([]Note, 0, len(kvs))
			for _, e := range kvs {
				var n Note
				if err := json.Unmarshal(e.Value, &n); err == nil {
					notes = append(notes, n)
				}
			}
			sortNotes(notes)
			return json.Marshal(map[string]any{"notes": notes})
		},
	}
}

// report sends a progress report when the engine asked for them (inv.Progress is nil otherwise, e.g. in recovery).
func report(inv agent.ToolInvocation, stage, message string) {
	if inv.Progress != nil {
		inv.Progress(stage, message)
	}
}

// DeleteNote deletes a note by id, at most once per tool call; it always needs the user's approval.
func DeleteNote(values agent.ValueStore) agent.Tool {
	fx := effects{values}
	deleted := func(id string) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"deleted": id})
		return b
	}
	// finish applies a recorded intent: the delete is idempotent, and "done" is recorded only after it.
	finish := func(ctx context.Context, owner, key, id string) (json.RawMessage, error) {
		if err := values.DeleteValue(ctx, notesNS(owner), id); err != nil {
			return nil, err
		}
		out := deleted(id)
		if err := fx.put(ctx, owner, key, effect{State: effectDone, Target: id, Output: out}); err != nil {
			return nil, err
		}
		return out, nil
	}
	return agent.Tool{
		Name:        "delete_note",
		Description: "Delete one of the user's notes by id. The user must approve.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`),
		Kind:        agent.ToolServer,
		Approval:    agent.ApprovalAlways,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			var in struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(inv.Input, &in); err != nil || in.ID == "" {
				return nil, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, `input must be {"id": string}`)
			}
			key, err := idempotencyKey(inv)
			if err != nil {
				return nil, err
			}
			ef, ok, err := fx.get(ctx, inv.Owner, key)
			switch {
			case err != nil:
				return nil, err
			case ok && ef.State == effectDone:
				return ef.Output, nil
			case ok: // pending: an earlier execution may have deleted the note already; finish its work
				return finish(ctx, inv.Owner, key, ef.Target)
			}
			if _, exists, err := note(ctx, values, inv.Owner, in.ID); err != nil {
				return nil, err
			} else if !exists {
				return nil, agent.E(agent.KindNotFound, agent.CodeToolFailed, "no note with id %q", in.ID)
			}
			// The intent first: once the note is gone, nothing else would show that this call removed it.
			if err := fx.put(ctx, inv.Owner, key, effect{State: effectPending, Target: in.ID}); err != nil {
				return nil, err
			}
			return finish(ctx, inv.Owner, key, in.ID)
		},
		Recorded: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, bool, error) {
			key, err := idempotencyKey(inv)
			if err != nil {
				return nil, false, err
			}
			ef, ok, err := fx.get(ctx, inv.Owner, key)
			if err != nil || !ok {
				return nil, false, err
			}
			if ef.State == effectDone {
				return ef.Output, true, nil
			}
			// Pending: the note's absence says the delete went through; its presence, that it did not.
			if _, exists, err := note(ctx, values, inv.Owner, ef.Target); err != nil || exists {
				return nil, false, err
			}
			return deleted(ef.Target), true, nil
		},
	}
}

// AskUserQuestion is a client tool: the browser shows the question and posts the answer as the tool output.
func AskUserQuestion() agent.Tool {
	return agent.Tool{
		Name:        "ask_user_question",
		Description: "Ask the user a question and wait for the answer.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"question":{"type":"string"},"options":{"type":"array","items":{"type":"string"}}},"required":["question"],"additionalProperties":false}`),
		Kind:        agent.ToolClient,
	}
}

func sortNotes(ns []Note) {
	slices.SortStableFunc(ns, func(a, b Note) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}
