// Package tools holds the demo tool set offered to the model: add_note, list_notes, delete_note (needs approval),
// ask_user_question (a client tool). Notes live in the store's key/value area under "notes/<owner>", keyed by an id
// derived from the tool call id, so a retried call converges instead of adding a second note.
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// KV is the part of agent.Store the notes tools use.
type KV interface {
	PutValue(ctx context.Context, ns, key string, value []byte) error
	GetValue(ctx context.Context, ns, key string) ([]byte, error)
	ListValues(ctx context.Context, ns string) ([]agent.KV, error)
	DeleteValue(ctx context.Context, ns, key string) error
}

// MaxNoteBytes bounds one note's text.
const MaxNoteBytes = 16 << 10

// Note is one stored note.
type Note struct {
	ID        string    `json:"id"`
	Text      string    `json:"text"`
	CreatedAt time.Time `json:"createdAt"`
}

// Demo returns the demo tool set over kv, using clock for note timestamps.
func Demo(kv KV, clock agent.Clock) []agent.Tool {
	return []agent.Tool{AddNote(kv, clock), ListNotes(kv), DeleteNote(kv), AskUserQuestion()}
}

func notesNS(owner string) string { return "notes/" + owner }

// AddNote stores a note for the thread's owner.
func AddNote(kv KV, clock agent.Clock) agent.Tool {
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
				return nil, fmt.Errorf("input must be {\"text\": string}: %w", err)
			}
			in.Text = strings.TrimSpace(in.Text)
			if in.Text == "" {
				return nil, errors.New("text must not be empty")
			}
			if len(in.Text) > MaxNoteBytes {
				return nil, fmt.Errorf("text is %d bytes, the limit is %d", len(in.Text), MaxNoteBytes)
			}
			id := "note_" + inv.ToolCallID
			if old, err := kv.GetValue(ctx, notesNS(inv.Owner), id); err == nil {
				return old, nil // a retried call: the note exists already
			} else if !agent.IsKind(err, agent.KindNotFound) {
				return nil, err
			}
			b, err := json.Marshal(Note{ID: id, Text: in.Text, CreatedAt: clock.Now()})
			if err != nil {
				return nil, err
			}
			if err := kv.PutValue(ctx, notesNS(inv.Owner), id, b); err != nil {
				return nil, err
			}
			return b, nil
		},
	}
}

// ListNotes lists the owner's notes, oldest first.
func ListNotes(kv KV) agent.Tool {
	return agent.Tool{
		Name:        "list_notes",
		Description: "List the user's saved notes.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		Kind:        agent.ToolServer,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			kvs, err := kv.ListValues(ctx, notesNS(inv.Owner))
			if err != nil {
				return nil, err
			}
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

// DeleteNote deletes a note by id; it always needs the user's approval.
func DeleteNote(kv KV) agent.Tool {
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
				return nil, errors.New(`input must be {"id": string}`)
			}
			if _, err := kv.GetValue(ctx, notesNS(inv.Owner), in.ID); err != nil {
				if agent.IsKind(err, agent.KindNotFound) {
					return nil, fmt.Errorf("no note with id %q", in.ID)
				}
				return nil, err
			}
			if err := kv.DeleteValue(ctx, notesNS(inv.Owner), in.ID); err != nil {
				return nil, err
			}
			return json.Marshal(map[string]any{"deleted": in.ID})
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
