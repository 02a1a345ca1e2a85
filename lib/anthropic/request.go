package anthropic

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// request builds the request body's fields (Stream, Model and AnthropicVersion are the transport's).
func (m *Model) request(req agent.ModelRequest) (*messagesRequest, error) {
	model := req.Model
	if model == "" {
		model = m.cfg.Model
	}
	if model == "" {
		return nil, agent.E(agent.KindInternal, agent.CodeModelError, "no model configured (AGENT_MODEL)")
	}
	maxTokens := req.MaxOutputTokens
	if maxTokens <= 0 {
		maxTokens = m.cfg.MaxOutputTokens
	}
	msgs, err := messages(req.Messages)
	if err != nil {
		return nil, err
	}
	p := &messagesRequest{Model: model, MaxTokens: maxTokens, Messages: msgs}
	if budget := m.cfg.ThinkingBudget; budget > 0 && !unthoughtToolRound(msgs) {
		p.Thinking = &thinking{Type: "enabled", BudgetTokens: budget}
		if p.MaxTokens <= budget {
			p.MaxTokens = budget + maxTokens // the budget counts against max_tokens, which must exceed it
		}
	}
	if req.System != "" {
		p.System = []block{{Type: "text", Text: req.System}}
	}
	for _, t := range req.Tools {
		tool, err := toolParam(t)
		if err != nil {
			return nil, err
		}
		p.Tools = append(p.Tools, tool)
	}
	if !m.cfg.NoPromptCache {
		markCache(p)
	}
	return p, nil
}

// toolParam is a tool as Anthropic takes it: the input schema sent as given (byte-stable across requests), the
// examples that are JSON objects as input_examples.
func toolParam(t agent.ToolSpec) (toolSpec, error) {
	schema := json.RawMessage(`{"type":"object","properties":{}}`)
	if len(t.Parameters) > 0 && string(t.Parameters) != "null" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(t.Parameters, &obj); err != nil || obj == nil {
			return toolSpec{}, agent.E(agent.KindInternal, agent.CodeInternal, "tool %s: parameters are not a JSON object", t.Name)
		}
		schema = t.Parameters
	}
	tool := toolSpec{Name: t.Name, Description: t.Description, InputSchema: schema}
	for _, ex := range t.InputExamples {
		var obj map[string]json.RawMessage
		if json.Unmarshal(ex, &obj) == nil && obj != nil {
			var c bytes.Buffer
			if json.Compact(&c, ex) == nil {
				tool.InputExamples = append(tool.InputExamples, c.Bytes())
			}
		}
	}
	return tool, nil
}

// messages converts the provider-neutral transcript. Tool results join the user message after their assistant
// message, and so does a user message that follows them: roles alternate.
func messages(in []agent.ModelMessage) ([]message, error) {
	var out []message
	add := func(role string, blocks ...block) {
		if len(blocks) == 0 {
			return
		}
		if n := len(out); n > 0 && out[n-1].Role == role {
			out[n-1].Content = append(out[n-1].Content, blocks...)
			return
		}
		out = append(out, message{Role: role, Content: blocks})
	}
	for i, msg := range in {
		switch msg.Role {
		case "user":
			var blocks []block
			if msg.Text != "" {
				blocks = append(blocks, textBlock(msg.Text))
			}
			for _, f := range msg.Files {
				blocks = append(blocks, fileBlock(f))
			}
			if len(blocks) == 0 {
				blocks = append(blocks, textBlock(" ")) // Anthropic refuses empty content; the engine sends none
			}
			add("user", blocks...)
		case "assistant":
			blocks := replay(msg.ReasoningData)
			if msg.Text != "" {
				blocks = append(blocks, textBlock(msg.Text))
			}
			for _, c := range msg.ToolCalls {
				blocks = append(blocks, block{Type: "tool_use", ID: c.ID, Name: c.Name, Input: toolInput(c.Arguments)})
			}
			add("assistant", blocks...)
		case "tool":
			r := block{Type: "tool_result", ToolUseID: msg.ToolCallID}
			if msg.Text != "" {
				r.Content = []block{textBlock(msg.Text)}
			}
			add("user", r)
		default:
			return nil, agent.E(agent.KindInternal, agent.CodeInternal, "message %d: unknown role %q", i, msg.Role)
		}
	}
	return out, nil
}

func textBlock(text string) block { return block{Type: "text", Text: text} }

// toolInput is a call's arguments as the object Anthropic takes back ({} when they are none, or not an object:
// the call was answered with an error already).
func toolInput(args string) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &obj) != nil || obj == nil {
		return json.RawMessage(`{}`)
	}
	return json.RawMessage(args)
}

// replay returns the thinking blocks that ReasoningData holds (this adapter's own: a JSON array of thinking and
// redacted_thinking blocks), as Anthropic sent them. Anything else is another adapter's and is left out.
func replay(data json.RawMessage) []block {
	if len(data) == 0 {
		return nil
	}
	var raw []json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return nil
	}
	var out []block
	for _, b := range raw {
		var head struct {
			Type      string  `json:"type"`
			Thinking  string  `json:"thinking"`
			Signature *string `json:"signature"`
			Data      string  `json:"data"`
		}
		if json.Unmarshal(b, &head) != nil {
			return nil
		}
		switch head.Type {
		case "thinking":
			if head.Signature == nil {
				return nil
			}
			out = append(out, block{Type: "thinking", Thinking: &head.Thinking, Signature: head.Signature})
		case "redacted_thinking":
			out = append(out, block{Type: "redacted_thinking", Data: head.Data})
		default:
			return nil
		}
	}
	return out
}

// fileBlock is a user file as an image or document block.
func fileBlock(f agent.ModelFile) block {
	if f.MediaType == "application/pdf" {
		d := block{Type: "document", Title: f.Filename}
		if data, ok := strings.CutPrefix(f.URL, "data:"); ok {
			_, payload, _ := strings.Cut(data, ",")
			d.Source = &source{Type: "base64", MediaType: "application/pdf", Data: payload}
		} else {
			d.Source = &source{Type: "url", URL: f.URL}
		}
		return d
	}
	if data, ok := strings.CutPrefix(f.URL, "data:"); ok {
		head, payload, _ := strings.Cut(data, ",")
		mt, _, _ := strings.Cut(head, ";")
		return block{Type: "image", Source: &source{Type: "base64", MediaType: mt, Data: payload}}
	}
	return block{Type: "image", Source: &source{Type: "url", URL: f.URL}}
}

// unthoughtToolRound reports whether the request ends on a tool round whose assistant message has no thinking
// block to replay (another model made the calls: a model switched mid-turn, or a failover). With thinking on,
// Anthropic refuses such a request, so it goes without thinking, as Anthropic's own message advises.
func unthoughtToolRound(msgs []message) bool {
	n := len(msgs)
	if n < 2 || msgs[n-1].Role != "user" || msgs[n-2].Role != "assistant" {
		return false
	}
	for _, b := range msgs[n-1].Content {
		if b.Type != "tool_result" {
			return false // a new user turn: earlier thinking may be left out
		}
	}
	first := msgs[n-2].Content
	return len(first) > 0 && first[0].Type != "thinking" && first[0].Type != "redacted_thinking"
}

// MaxBreakpoints is how many cache_control breakpoints Anthropic takes in one request.
const MaxBreakpoints = 4

// markCache puts the prompt cache breakpoints on the request (see "Prompt cache" in the package doc), at most
// MaxBreakpoints: on the last tool (the tools, the same in every request of a deployment, are read across threads
// even when the system prompt differs), on the system prompt (tools and system), on the last block of the newest
// message of the stable prefix, and on the last block of the last message.
//
// The stable prefix is what the previous request of the thread sent: everything before the step's new content.
// Messages alternate and a request ends on a user message, so the new content is the last two messages (the
// assistant's reply to the previous request, and the tool results or the new user message after it) and the
// prefix ends at the third from last. Its breakpoint sits exactly where the previous request's last breakpoint
// was, so the cache that request wrote is read even when the new content is more than the 20 blocks Anthropic
// looks back from a breakpoint (a step of many parallel tool calls); the last message's breakpoint writes the
// whole prompt for the next step or turn.
func markCache(p *messagesRequest) {
	if n := len(p.Tools); n > 0 {
		p.Tools[n-1].CacheControl = ephemeral
	}
	if n := len(p.System); n > 0 {
		p.System[n-1].CacheControl = ephemeral
	}
	n := len(p.Messages)
	if n >= 3 {
		markLast(p.Messages[n-3].Content)
	}
	if n > 0 {
		markLast(p.Messages[n-1].Content)
	}
}

// markLast puts a breakpoint on the last block of content that may carry one.
func markLast(content []block) {
	for i := len(content) - 1; i >= 0; i-- {
		if content[i].cacheable() {
			content[i].CacheControl = ephemeral
			return
		}
	}
}

// breakpoints counts the request's cache_control breakpoints.
func breakpoints(p *messagesRequest) int {
	n := 0
	for _, t := range p.Tools {
		if t.CacheControl != nil {
			n++
		}
	}
	for _, b := range p.System {
		if b.CacheControl != nil {
			n++
		}
	}
	for _, m := range p.Messages {
		for _, b := range m.Content {
			if b.CacheControl != nil {
				n++
			}
		}
	}
	return n
}

// dropStaleFile replaces the file block at (message, block) with a line saying it is no longer available, when
// it is a file by URL of a user message older than the newest one (whose files are the person's own to fix: a
// refusal of those fails the request). It reports whether it replaced one.
func dropStaleFile(p *messagesRequest, at [2]int) bool {
	i, j := at[0], at[1]
	newest := -1
	for k, m := range p.Messages {
		if m.Role != "user" {
			continue
		}
		for _, b := range m.Content {
			if b.Type != "tool_result" {
				newest = k
				break
			}
		}
	}
	if i < 0 || i >= newest || p.Messages[i].Role != "user" || j < 0 || j >= len(p.Messages[i].Content) {
		return false
	}
	b := &p.Messages[i].Content[j]
	if b.Source == nil || b.Source.Type != "url" {
		return false
	}
	cc := b.CacheControl
	switch b.Type {
	case "image":
		*b = textBlock("[attachment (image) no longer available]")
	case "document":
		name := cmpOr(b.Title, "document.pdf")
		*b = textBlock("[attachment " + name + " (application/pdf) no longer available]")
	default:
		return false
	}
	b.CacheControl = cc
	return true
}
