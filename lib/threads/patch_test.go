package threads_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/threads"
)

// A title the owner sets is trimmed and bounded, one line of text (issue 20 item 5: the generated title's rival);
// a refused one changes nothing.
func TestPatchTitle(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, title, want string
		ok                bool
	}{
		{"plain", "Trip to Lisbon", "Trip to Lisbon", true},
		{"trimmed", "  Trip to Lisbon \n", "Trip to Lisbon", true},
		{"empty clears it", "", "", true},
		{"unicode", "Voyage à Lisbonne 🚆", "Voyage à Lisbonne 🚆", true},
		{"at the bound", strings.Repeat("x", threads.MaxTitleBytes), strings.Repeat("x", threads.MaxTitleBytes), true},
		{"over the bound", strings.Repeat("x", threads.MaxTitleBytes+1), "", false},
		{"two lines", "Trip\nto Lisbon", "", false},
		{"a tab", "Trip\tto Lisbon", "", false},
		{"NUL", "Trip\x00", "", false},
		{"C1 control", "Trip\u0085to", "", false},
		{"invalid UTF-8", "Trip \xff", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			now := time.Now()
			before, _, err := f.store.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", Title: "first", CreatedAt: now, UpdatedAt: now})
			if err != nil {
				t.Fatal(err)
			}
			title := tc.title
			got, err := f.svc.Patch(ctx, "alice", "th", agent.ThreadPatch{Title: &title})
			if !tc.ok {
				if !agent.IsKind(err, agent.KindInvalid) || agent.CodeOf(err) != agent.CodeInvalidTitle {
					t.Fatalf("Patch(%q) = %+v, %v; want invalid_title", tc.title, got, err)
				}
				if th, _ := f.store.GetThread(ctx, "th"); th != before {
					t.Fatalf("a refused title changed the thread: %+v", th)
				}
				return
			}
			if err != nil || got.Title != tc.want {
				t.Fatalf("Patch(%q) = %q, %v; want %q", tc.title, got.Title, err, tc.want)
			}
		})
	}
}
