package bedrockconverse

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/document"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// input builds the ConverseStream request.
func (m *Model) input(req agent.ModelRequest) (*bedrockruntime.ConverseStreamInput, error) {
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
	msgs, err := messages(req.Messages, len(req.Tools) > 0)
	if err != nil {
		return nil, err
	}
	in := &bedrockruntime.ConverseStreamInput{ModelId: aws.String(model), Messages: msgs,
		InferenceConfig: &types.InferenceConfiguration{MaxTokens: aws.Int32(int32(min(maxTokens, 1<<30)))}}
	cache := !m.cfg.NoPromptCache && PromptCaching(model)
	if req.System != "" {
		in.System = []types.SystemContentBlock{&types.SystemContentBlockMemberText{Value: req.System}}
		if cache {
			in.System = append(in.System, &types.SystemContentBlockMemberCachePoint{Value: cachePoint()})
		}
	}
	if n := len(msgs); cache && n > 0 {
		// The request's whole transcript is the next step's prefix: written now, read back then.
		msgs[n-1].Content = append(msgs[n-1].Content, &types.ContentBlockMemberCachePoint{Value: cachePoint()})
	}
	if len(req.Tools) > 0 {
		tc := &types.ToolConfiguration{}
		for _, t := range req.Tools {
			spec, err := toolSpec(t)
			if err != nil {
				return nil, err
			}
			tc.Tools = append(tc.Tools, &types.ToolMemberToolSpec{Value: spec})
		}
		if cache && toolCaching(model) {
			// The tools come first in the prompt: their own point caches them when the system prompt changes.
			tc.Tools = append(tc.Tools, &types.ToolMemberCachePoint{Value: cachePoint()})
		}
		in.ToolConfig = tc
	}
	return in, nil
}

func cachePoint() types.CachePointBlock {
	return types.CachePointBlock{Type: types.CachePointTypeDefault}
}

// PromptCaching reports whether Bedrock caches prompts for model (a model id or an inference profile of one):
// Amazon Nova's and Anthropic Claude's. Bedrock refuses a cache point in a request for a model without prompt
// caching, so other models (Llama, Mistral, an application inference profile's ARN) get none.
func PromptCaching(model string) bool {
	return strings.Contains(model, "amazon.nova") || strings.Contains(model, "anthropic.claude")
}

// toolCaching reports whether Bedrock takes a cache point after model's tools: Claude's (Amazon Nova caches
// the system prompt and messages only).
func toolCaching(model string) bool { return strings.Contains(model, "anthropic.claude") }

// toolSpec is a tool as Converse takes it; input examples are folded into the description (Converse has no
// field for them), one compact JSON value per line.
func toolSpec(t agent.ToolSpec) (types.ToolSpecification, error) {
	var schema any = map[string]any{"type": "object", "properties": map[string]any{}}
	if len(t.Parameters) > 0 && string(t.Parameters) != "null" {
		var obj map[string]any
		if err := json.Unmarshal(t.Parameters, &obj); err != nil || obj == nil {
			return types.ToolSpecification{}, agent.E(agent.KindInternal, agent.CodeInternal, "tool %s: parameters are not a JSON object", t.Name)
		}
		schema = obj
	}
	spec := types.ToolSpecification{Name: aws.String(t.Name), InputSchema: &types.ToolInputSchemaMemberJson{Value: document.NewLazyDocument(schema)}}
	desc := t.Description
	if len(t.InputExamples) > 0 {
		var b strings.Builder
		b.WriteString(desc)
		if b.Len() > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString("Input examples:")
		for _, ex := range t.InputExamples {
			var v any
			if json.Unmarshal(ex, &v) != nil {
				continue
			}
			c, _ := json.Marshal(v)
			b.WriteString("\n")
			b.Write(c)
		}
		desc = b.String()
	}
	if desc != "" {
		spec.Description = aws.String(desc)
	}
	return spec, nil
}

// messages converts the provider-neutral transcript. Tool results join the user message after their assistant
// message, and so does a user message that follows them: roles alternate. Without tools (a request that offers
// none, e.g. a title's), Bedrock refuses toolUse and toolResult blocks, so the history's calls and results go as
// text lines instead ("[called NAME with ARGS]", "[NAME returned: TEXT]").
func messages(in []agent.ModelMessage, tools bool) ([]types.Message, error) {
	names := map[string]string{} // tool call id → name, for results as text
	var out []types.Message
	add := func(role types.ConversationRole, blocks ...types.ContentBlock) {
		if len(blocks) == 0 {
			return
		}
		if n := len(out); n > 0 && out[n-1].Role == role {
			out[n-1].Content = append(out[n-1].Content, blocks...)
			return
		}
		out = append(out, types.Message{Role: role, Content: blocks})
	}
	for i, msg := range in {
		switch msg.Role {
		case "user":
			var blocks []types.ContentBlock
			if msg.Text != "" {
				blocks = append(blocks, &types.ContentBlockMemberText{Value: msg.Text})
			}
			for _, f := range msg.Files {
				blocks = append(blocks, fileBlock(f))
			}
			if len(blocks) == 0 {
				blocks = append(blocks, &types.ContentBlockMemberText{Value: "(empty message)"}) // Bedrock refuses blank text
			}
			add(types.ConversationRoleUser, blocks...)
		case "assistant":
			blocks := replay(msg.ReasoningData)
			if msg.Text != "" {
				blocks = append(blocks, &types.ContentBlockMemberText{Value: msg.Text})
			}
			for _, c := range msg.ToolCalls {
				if !tools {
					names[c.ID] = c.Name
					blocks = append(blocks, &types.ContentBlockMemberText{Value: fmt.Sprintf("[called %s with %s]", c.Name, argsText(c.Arguments))})
					continue
				}
				blocks = append(blocks, &types.ContentBlockMemberToolUse{Value: types.ToolUseBlock{
					ToolUseId: aws.String(c.ID), Name: aws.String(c.Name), Input: document.NewLazyDocument(toolInput(c.Arguments))}})
			}
			if len(blocks) == 0 {
				continue // an empty step (e.g. cancelled before any output): Bedrock refuses empty content
			}
			add(types.ConversationRoleAssistant, blocks...)
		case "tool":
			text := msg.Text
			if strings.TrimSpace(text) == "" {
				text = "(no output)" // Bedrock refuses blank text
			}
			if !tools {
				add(types.ConversationRoleUser, &types.ContentBlockMemberText{Value: fmt.Sprintf("[%s returned: %s]", cmpName(names[msg.ToolCallID]), text)})
				continue
			}
			add(types.ConversationRoleUser, &types.ContentBlockMemberToolResult{Value: types.ToolResultBlock{
				ToolUseId: aws.String(msg.ToolCallID),
				Content:   []types.ToolResultContentBlock{&types.ToolResultContentBlockMemberText{Value: text}}}})
		default:
			return nil, agent.E(agent.KindInternal, agent.CodeInternal, "message %d: unknown role %q", i, msg.Role)
		}
	}
	return out, nil
}

func argsText(args string) string {
	if strings.TrimSpace(args) == "" {
		return "{}"
	}
	return args
}

func cmpName(name string) string {
	if name == "" {
		return "a tool"
	}
	return name
}

// toolInput is a call's arguments as the object Converse takes back ({} when they are none, or not an object:
// the call was answered with an error already).
func toolInput(args string) map[string]any {
	var obj map[string]any
	if json.Unmarshal([]byte(args), &obj) != nil || obj == nil {
		return map[string]any{}
	}
	return obj
}

// reasoningState is ModelResult.ReasoningData of this adapter: the reply's reasoningContent blocks.
type reasoningState struct {
	Converse []reasoningBlock `json:"converse"`
}

type reasoningBlock struct {
	Text      string `json:"text,omitempty"`
	Signature string `json:"signature,omitempty"`
	Redacted  []byte `json:"redacted,omitempty"`
}

// replay returns the reasoningContent blocks ReasoningData holds (this adapter's own), as the model sent them.
// Anything else is another adapter's and is left out.
func replay(data json.RawMessage) []types.ContentBlock {
	if len(data) == 0 {
		return nil
	}
	var st reasoningState
	if json.Unmarshal(data, &st) != nil {
		return nil
	}
	var out []types.ContentBlock
	for _, b := range st.Converse {
		if len(b.Redacted) > 0 {
			out = append(out, &types.ContentBlockMemberReasoningContent{Value: &types.ReasoningContentBlockMemberRedactedContent{Value: b.Redacted}})
			continue
		}
		rt := types.ReasoningTextBlock{Text: aws.String(b.Text)}
		if b.Signature != "" {
			rt.Signature = aws.String(b.Signature)
		}
		out = append(out, &types.ContentBlockMemberReasoningContent{Value: &types.ReasoningContentBlockMemberReasoningText{Value: rt}})
	}
	return out
}

// fileBlock is a user file: an image or document block of its bytes for a data URL, a line of text for a URL
// (Converse reads bytes and S3 locations only).
func fileBlock(f agent.ModelFile) types.ContentBlock {
	data, ok := strings.CutPrefix(f.URL, "data:")
	var payload []byte
	if ok {
		_, enc, _ := strings.Cut(data, ",")
		b, err := base64.StdEncoding.DecodeString(enc)
		ok = err == nil
		payload = b
	}
	if !ok {
		return &types.ContentBlockMemberText{Value: fmt.Sprintf("\n[attachment %s (%s): %s]", displayName(f), f.MediaType, f.URL)}
	}
	if f.MediaType == "application/pdf" {
		return &types.ContentBlockMemberDocument{Value: types.DocumentBlock{Format: types.DocumentFormatPdf,
			Name: aws.String(documentName(f.Filename)), Source: &types.DocumentSourceMemberBytes{Value: payload}}}
	}
	format := types.ImageFormat(strings.TrimPrefix(f.MediaType, "image/"))
	return &types.ContentBlockMemberImage{Value: types.ImageBlock{Format: format, Source: &types.ImageSourceMemberBytes{Value: payload}}}
}

func displayName(f agent.ModelFile) string {
	if f.Filename != "" {
		return f.Filename
	}
	return "file"
}

// documentName is a file name in the characters Bedrock allows a document's name (letters, digits, single
// spaces, hyphens, parentheses and square brackets), "document" when none is left.
func documentName(name string) string {
	name = strings.TrimSuffix(name, ".pdf")
	var b strings.Builder
	space := false
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("-()[]", r):
			b.WriteRune(r)
			space = false
		default:
			if !space && b.Len() > 0 {
				b.WriteByte(' ')
				space = true
			}
		}
		if b.Len() >= 200 {
			break
		}
	}
	if s := strings.TrimSpace(b.String()); s != "" {
		return s
	}
	return "document"
}
