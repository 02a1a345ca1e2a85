package openairesponses

// Files: package openai's policy, in lib/modelfiles (shared, since adapters do not import each other). PDFs named by
// https URL are downloaded and sent as data (the budget then counts their size: ModelResult.FileBytes), and so are
// older messages' images by URL (an expired pre-signed URL would otherwise fail every later turn); the newest
// message's images by URL go as they are. An older message's file that cannot be downloaded, or that would pass
// Config.MaxRequestFileBytes, is sent as a line saying so.

import (
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelfiles"
)

// userParts is a user message's content: its text, then each file as the request sends it (an image as
// input_image, a PDF as input_file with its data URL), or the line that stands in for it.
func userParts(msg agent.ModelMessage, files []modelfiles.Sent) []any {
	parts := make([]any, 0, 1+len(msg.Files))
	if msg.Text != "" || len(msg.Files) == 0 {
		parts = append(parts, textPart{Type: "input_text", Text: msg.Text})
	}
	for j, f := range msg.Files {
		sent := files[j]
		switch {
		case sent.Stub != "":
			parts = append(parts, textPart{Type: "input_text", Text: sent.Stub})
		case strings.HasPrefix(f.MediaType, "image/"):
			parts = append(parts, imagePart{Type: "input_image", ImageURL: sent.URL, Detail: "auto"})
		default:
			name := f.Filename
			if name == "" {
				name = "document.pdf"
			}
			parts = append(parts, filePart{Type: "input_file", Filename: name, FileData: sent.URL})
		}
	}
	return parts
}
