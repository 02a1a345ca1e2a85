package threads

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Pages of a thread's messages (GET /threads/{id}) and runs (GET /threads/{id}/runs), written once here.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 500
	// maxCursorBytes bounds a cursor as a client sends it: one this list gave holds an id of at most 200 bytes
	// (agent.ValidMessageID; run ids are shorter), a longer one is forged and must not reach the store as a key
	// (REVIEW S11).
	maxCursorBytes = 1024
	// DefaultPageBytes bounds a page of messages by size as well (REVIEW S12): the page ends early, with hasMore,
	// before the message that would take its messages' JSON past it; a single message over it is a page alone.
	// 4 MiB: a page of a thread of 1 MB tool outputs stays a few MB on a 512 MB Lambda, and a page of ordinary
	// messages (a few KB) is still bounded by its count. AGENT_PAGE_BYTES overrides it.
	DefaultPageBytes = 4 << 20
	// PageRead is the most messages a page asks the store for in one read: a page is read in such reads until it
	// is full or over its byte budget, so reading it holds at most the budget plus one read of messages.
	PageRead = 25
)

// PageQuery asks for one page of a thread's messages or runs. The first page (no cursor) starts at the thread's
// beginning, or with Newest at its end; each page's NextCursor reads on the same way (towards newer messages, or
// with Newest towards older ones). Within a page, items are always in thread order, oldest first, so a thread
// that fits one page reads as it always did.
type PageQuery struct {
	Limit  int    // 0: DefaultPageLimit; 1 to MaxPageLimit
	Cursor string // a NextCursor of an earlier page of the same list (it carries the direction)
	Newest bool   // without a cursor: the newest page first
}

// PageInfo says how to read on: NextCursor is set when HasMore.
type PageInfo struct {
	NextCursor string `json:"nextCursor,omitempty"`
	HasMore    bool   `json:"hasMore"`
}

// cursor is what a NextCursor holds (JSON, base64url): opaque to clients, who only hand it back.
type cursor struct {
	List   string `json:"l"` // "m" (messages), "r" (runs) or "t" (threads)
	Newest bool   `json:"n,omitempty"`
	Seq    int64  `json:"s,omitempty"`
	At     int64  `json:"t,omitempty"` // a run's CreatedAt or a thread's UpdatedAt, Unix nanoseconds
	ID     string `json:"i"`
}

func (c cursor) encode() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func invalidCursor() error {
	return agent.E(agent.KindInvalid, agent.CodeInvalidCursor, "cursor is not one this list gave")
}

// decode reads q's cursor for list ("m" or "r"), checking the limit on the way. No cursor: the zero cursor in
// the direction q asks.
func (q PageQuery) decode(list string) (cursor, int, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultPageLimit
	}
	if limit < 1 || limit > MaxPageLimit {
		return cursor{}, 0, agent.E(agent.KindInvalid, agent.CodeInvalidLimit, "limit must be an integer from 1 to %d", MaxPageLimit)
	}
	if q.Cursor == "" {
		return cursor{List: list, Newest: q.Newest}, limit, nil
	}
	c, err := decodeCursor(q.Cursor, list)
	return c, limit, err
}

// decodeCursor reads a cursor a page of list gave; anything else is invalidCursor.
func decodeCursor(s, list string) (cursor, error) {
	if len(s) > maxCursorBytes {
		return cursor{}, invalidCursor()
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	var c cursor
	if err != nil || json.Unmarshal(b, &c) != nil || c.List != list || !agent.ValidMessageID(c.ID) {
		return cursor{}, invalidCursor()
	}
	return c, nil
}

// ListQuery asks for one page of a caller's threads (GET /threads), most recently updated first. Each page's
// NextCursor reads on towards older threads; a thread updated meanwhile moves to the top, above the walk.
type ListQuery struct {
	Limit  int    // 0: DefaultListLimit; 1 to MaxListLimit
	Cursor string // a NextCursor of an earlier page of the list
}

// threadPage is the store read a list query asks for.
func (q ListQuery) threadPage() (agent.ThreadPage, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 1 || limit > MaxListLimit {
		return agent.ThreadPage{}, agent.E(agent.KindInvalid, agent.CodeInvalidLimit, "limit must be an integer from 1 to %d", MaxListLimit)
	}
	p := agent.ThreadPage{Limit: limit}
	if q.Cursor != "" {
		c, err := decodeCursor(q.Cursor, "t")
		if err != nil {
			return agent.ThreadPage{}, err
		}
		p.From = agent.ThreadCursor{UpdatedAt: time.Unix(0, c.At).UTC(), ID: c.ID}
	}
	return p, nil
}

func threadCursor(t agent.Thread) cursor {
	return cursor{List: "t", At: t.UpdatedAt.UnixNano(), ID: t.ID}
}

// messagePage is the store read a message query asks for.
func (q PageQuery) messagePage() (agent.MessagePage, bool, error) {
	c, limit, err := q.decode("m")
	if err != nil {
		return agent.MessagePage{}, false, err
	}
	p := agent.MessagePage{Oldest: !c.Newest, Limit: limit}
	if c.ID != "" {
		p.From = agent.MessageCursor{Seq: c.Seq, ID: c.ID}
	}
	return p, c.Newest, nil
}

// runPage is the store read a runs query asks for.
func (q PageQuery) runPage() (agent.RunPage, bool, error) {
	c, limit, err := q.decode("r")
	if err != nil {
		return agent.RunPage{}, false, err
	}
	p := agent.RunPage{Oldest: !c.Newest, Limit: limit}
	if c.ID != "" {
		p.From = agent.RunCursor{CreatedAt: time.Unix(0, c.At).UTC(), ID: c.ID}
	}
	return p, c.Newest, nil
}

// inThreadOrder returns a page's items oldest first (a newest-first read comes back reversed), with the page's
// info: the cursor past the last item read.
func inThreadOrder[T any](p agent.Page[T], newest bool, next func(T) cursor) ([]T, PageInfo) {
	items := append([]T{}, p.Items...)
	info := PageInfo{HasMore: p.More}
	if p.More && len(items) > 0 {
		c := next(items[len(items)-1])
		c.Newest = newest
		info.NextCursor = c.encode()
	}
	if newest {
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	}
	return items, info
}

func messageCursor(r agent.MessageRecord) cursor {
	return cursor{List: "m", Seq: r.Seq, ID: r.Message.ID}
}

func runCursor(r agent.Run) cursor {
	return cursor{List: "r", At: r.CreatedAt.UnixNano(), ID: r.ID}
}

// readMessages reads page p of a thread's messages in reads of at most PageRead messages, and ends it early,
// with More, before the message that would take it past the byte budget (a first message over it makes the page
// alone).
func (s *Service) readMessages(ctx context.Context, id string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	out := agent.Page[agent.MessageRecord]{}
	size := 0
	for {
		read := p
		read.Limit = min(p.Limit-len(out.Items), PageRead)
		page, err := s.store.ListMessagesPage(ctx, id, read)
		if err != nil {
			return agent.Page[agent.MessageRecord]{}, err
		}
		for _, r := range page.Items {
			n := messageBytes(r.Message)
			if len(out.Items) > 0 && size+n > s.cfg.PageBytes {
				out.More = true
				return out, nil
			}
			size += n
			out.Items = append(out.Items, r)
		}
		out.More = page.More
		if !page.More || len(out.Items) >= p.Limit || len(page.Items) == 0 {
			return out, nil
		}
		p.From = page.Items[len(page.Items)-1].Cursor()
	}
}

// messageBytes is about what m takes in a page's JSON: its parts and metadata as stored, and a little for the rest.
func messageBytes(m agent.Message) int {
	n := len(m.ID) + len(m.Role) + len(m.Metadata) + 40
	for _, p := range m.Parts {
		n += len(p) + 1
	}
	return n
}
