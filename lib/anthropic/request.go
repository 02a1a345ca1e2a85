package anthropic

import (
	"encoding/json"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"github.com/agentloop/agentloop/lib/agent"
)

// params builds the request.
func (m *Model) params(req agent.ModelRequest) (sdk.MessageNewParams, error) {
	model := req.Model
	if model == "" {
		model = m.cfg.Model
	}
	if model == "" {
		return sdk.MessageNewParams{}, agent.E(agent.KindInternal, agent.CodeModelError, "no model configured (AGENT_MODEL)")
	}
	maxTokens := int64(req.MaxOutputTokens)
	if maxTokens <= 0 {
		maxTokens = int64(m.cfg.MaxOutputTokens)
	}
	msgs, err := messages(req.Messages)
	if err != nil {
		return sdk.MessageNewParams{}, err
	}
	p := sdk.MessageNewParams{Model: sdk.Model(model), MaxTokens: maxTokens, Messages: msgs}
	if budget := int64(m.cfg.ThinkingBudget); budget > 0 && !unthoughtToolRound(msgs) {
		p.Thinking = sdk.ThinkingConfigParamOfEnabled(budget)
		if p.MaxTokens <= budget {
			p.MaxTokens = budget + maxTokens // the budget counts against max_tokens, which must exceed it
		}
	}
	if req.System != "" {
		p.System = []sdk.TextBlockParam{{Text: req.System}}
	}
	if !m.cfg.NoPromptCache {
		markCache(&p)
	}
	for _, t := range req.Tools {
		tool, err := toolParam(t)
		if err != nil {
			return sdk.MessageNewParams{}, err
		}
		p.Tools = append(p.Tools, sdk.ToolUnionParam{OfTool: &tool})
	}
	return p, nil
}

// toolParam is a tool as Anthropic takes it: the input schema sent as given (byte-stable across requests), the
// examples as input_examples.
func toolParam(t agent.ToolSpec) (sdk.ToolParam, error) {
	schema := json.RawMessage(`{"type":"object","properties":{}}`)
	if len(t.Parameters) > 0 && string(t.Parameters) != "null" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(t.Parameters, &obj); err != nil || obj == nil {
			return sdk.ToolParam{}, agent.E(agent.KindInternal, agent.CodeInternal, "tool %s: parameters are not a JSON object", t.Name)
		}
		schema = t.Parameters
	}
	tool := sdk.ToolParam{Name: t.Name, InputSchema: param.Override[sdk.ToolInputSchemaParam](schema)}
	if t.Description != "" {
		tool.Description = sdk.String(t.Description)
	}
	for _, ex := range t.InputExamples {
		var obj map[string]any
		if json.Unmarshal(ex, &obj) == nil && obj != nil {
			tool.InputExamples = append(tool.InputExamples, obj)
		}
	}
	return tool, nil
}

// messages converts the provider-neutral transcript. Tool results join the user message after their assistant
// message, and so does a user message that follows them: roles alternate.
func messages(in []agent.ModelMessage) ([]sdk.MessageParam, error) {
	var out []sdk.MessageParam
	add := func(role string, blocks ...sdk.ContentBlockParamUnion) {
		if len(blocks) == 0 {
			return
		}
		if n := len(out); n > 0 {
			if last := out[n-1]; role == "user" && last.OfUser != nil {
				last.OfUser.Content = append(last.OfUser.Content, blocks...)
				return
			} else if role == "assistant" && last.OfAssistant != nil {
				last.OfAssistant.Content = append(last.OfAssistant.Content, blocks...)
				return
			}
		}
		if role == "user" {
			out = append(out, sdk.NewUserMessage(blocks...))
		} else {
			out = append(out, sdk.NewAssistantMessage(blocks...))
		}
	}
	for i, msg := range in {
		switch msg.Role {
		case "user":
			var blocks []sdk.ContentBlockParamUnion
			if msg.Text != "" {
				blocks = append(blocks, sdk.NewTextBlock(msg.Text))
			}
			for _, f := range msg.Files {
				blocks = append(blocks, fileBlock(f))
			}
			if len(blocks) == 0 {
				blocks = append(blocks, sdk.NewTextBlock(" ")) // Anthropic refuses empty content; the engine sends none
			}
			add("user", blocks...)
		case "assistant":
			blocks := replay(msg.ReasoningData)
			if msg.Text != "" {
				blocks = append(blocks, sdk.NewTextBlock(msg.Text))
			}
			for _, c := range msg.ToolCalls {
				blocks = append(blocks, sdk.NewToolUseBlock(c.ID, toolInput(c.Arguments), c.Name))
			}
			add("assistant", blocks...)
		case "tool":
			r := sdk.ToolResultBlockParam{ToolUseID: msg.ToolCallID}
			if msg.Text != "" {
				r.Content = []sdk.ToolResultBlockParamContentUnion{{OfText: &sdk.TextBlockParam{Text: msg.Text}}}
			}
			add("user", sdk.ContentBlockParamUnion{OfToolResult: &r})
		default:
			return nil, agent.E(agent.KindInternal, agent.CodeInternal, "message %d: unknown role %q", i, msg.Role)
		}
	}
	return out, nil
}

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
func replay(data json.RawMessage) []sdk.ContentBlockParamUnion {
	if len(data) == 0 {
		return nil
	}
	var raw []json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return nil
	}
	var out []sdk.ContentBlockParamUnion
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
			out = append(out, sdk.NewThinkingBlock(*head.Signature, head.Thinking))
		case "redacted_thinking":
			out = append(out, sdk.NewRedactedThinkingBlock(head.Data))
		default:
			return nil
		}
	}
	return out
}

// fileBlock is a user file as an image or document block.
func fileBlock(f agent.ModelFile) sdk.ContentBlockParamUnion {
	if f.MediaType == "application/pdf" {
		var d sdk.DocumentBlockParam
		if data, ok := strings.CutPrefix(f.URL, "data:"); ok {
			_, payload, _ := strings.Cut(data, ",")
			d.Source.OfBase64 = &sdk.Base64PDFSourceParam{Data: payload}
		} else {
			d.Source.OfURL = &sdk.URLPDFSourceParam{URL: f.URL}
		}
		if f.Filename != "" {
			d.Title = sdk.String(f.Filename)
		}
		return sdk.ContentBlockParamUnion{OfDocument: &d}
	}
	if data, ok := strings.CutPrefix(f.URL, "data:"); ok {
		head, payload, _ := strings.Cut(data, ",")
		mt, _, _ := strings.Cut(head, ";")
		return sdk.NewImageBlockBase64(mt, payload)
	}
	return sdk.NewImageBlock(sdk.URLImageSourceParam{URL: f.URL})
}

// unthoughtToolRound reports whether the request ends on a tool round whose assistant message has no thinking
// block to replay (another model made the calls: a model switched mid-turn, or a failover). With thinking on,
// Anthropic refuses such a request, so it goes without thinking, as Anthropic's own message advises.
func unthoughtToolRound(msgs []sdk.MessageParam) bool {
	n := len(msgs)
	if n < 2 || msgs[n-1].OfUser == nil || msgs[n-2].OfAssistant == nil {
		return false
	}
	for _, b := range msgs[n-1].OfUser.Content {
		if b.OfToolResult == nil {
			return false // a new user turn: earlier thinking may be left out
		}
	}
	first := msgs[n-2].OfAssistant.Content
	return len(first) > 0 && first[0].OfThinking == nil && first[0].OfRedactedThinking == nil
}

// markCache puts prompt cache breakpoints on the request: one on the system prompt (tools and system, the same
// in every request of a deployment, are read from the cache across threads and turns) and one on the last block
// of the last message (the whole transcript is written to the cache, and the next step or turn, which repeats
// it, reads it back: Anthropic looks back from a breakpoint for the longest prefix it cached). Anthropic caches
// nothing without them.
func markCache(p *sdk.MessageNewParams) {
	if n := len(p.System); n > 0 {
		p.System[n-1].CacheControl = sdk.NewCacheControlEphemeralParam()
	}
	if n := len(p.Messages); n > 0 {
		var blocks []sdk.ContentBlockParamUnion
		if u := p.Messages[n-1].OfUser; u != nil {
			blocks = u.Content
		} else if a := p.Messages[n-1].OfAssistant; a != nil {
			blocks = a.Content
		}
		for i := len(blocks) - 1; i >= 0; i-- {
			if cc := blocks[i].GetCacheControl(); cc != nil {
				*cc = sdk.NewCacheControlEphemeralParam()
				return
			}
		}
	}
}

// dropStaleFile replaces the file block at (message, block) with a line saying it is no longer available, when
// it is a file by URL of a user message older than the newest one (whose files are the person's own to fix: a
// refusal of those fails the request). It reports whether it replaced one.
func dropStaleFile(p *sdk.MessageNewParams, at [2]int) bool {
	i, j := at[0], at[1]
	newest := -1
	for k, m := range p.Messages {
		if m.OfUser == nil {
			continue
		}
		for _, b := range m.OfUser.Content {
			if b.OfToolResult == nil {
				newest = k
				break
			}
		}
	}
	if i < 0 || i >= newest || p.Messages[i].OfUser == nil || j < 0 || j >= len(p.Messages[i].OfUser.Content) {
		return false
	}
	b := &p.Messages[i].OfUser.Content[j]
	switch {
	case b.OfImage != nil && b.OfImage.Source.OfURL != nil:
		*b = sdk.NewTextBlock("[attachment (image) no longer available]")
	case b.OfDocument != nil && b.OfDocument.Source.OfURL != nil:
		name := "document.pdf"
		if b.OfDocument.Title.Valid() {
			name = b.OfDocument.Title.Value
		}
		*b = sdk.NewTextBlock("[attachment " + name + " (application/pdf) no longer available]")
	default:
		return false
	}
	return true
}
