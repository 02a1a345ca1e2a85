package openai

import (
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelfiles"
)

func userParts(msg agent.ModelMessage, files []modelfiles.Sent) []contentPart {
	var parts []contentPart
	if msg.Text != "" {
		parts = append(parts, textPart(msg.Text))
	}
	for j, f := range msg.Files {
		sent := files[j]
		switch {
		case sent.Stub != "":
			parts = append(parts, textPart(sent.Stub))
		case strings.HasPrefix(f.MediaType, "image/"):
			parts = append(parts, contentPart{Type: "image_url", ImageURL: &imageURL{URL: sent.URL}})
		default:
			name := f.Filename
			if name == "" {
				name = "document.pdf"
			}
			parts = append(parts, contentPart{Type: "file", File: &fileData{FileData: sent.URL, Filename: name}})
		}
	}
	return parts
}
