package offline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

// DefaultFileTimeout bounds the download of one image URL (OpenAI gives up on a slow host too: "Timeout while
// downloading …").
const DefaultFileTimeout = 10 * time.Second

// OpenAI's answers to an image_url it cannot use (Chat Completions: param null).
const (
	msgImageDownload = "Error while downloading %s."
	msgImageTimeout  = "Timeout while downloading %s."
	msgImageFormat   = "You uploaded an unsupported image. Please make sure your image has of one the following formats: ['png', 'jpeg', 'gif', 'webp']."
	codeImageURL     = "invalid_image_url"
	codeImageFormat  = "invalid_image_format"
)

// checkImages downloads every image a request names by http(s) URL, as OpenAI does before it answers, and refuses
// the request as OpenAI does when one cannot be downloaded (an expired pre-signed URL: 404; a host that does not
// answer) or is not an image of a type it reads. The body is validated already.
func (s *Server) checkImages(ctx context.Context, msgs []wireMessage) *invalidRequest {
	for _, m := range msgs {
		if m.Role != "user" {
			continue
		}
		var parts []struct {
			Type     string `json:"type"`
			ImageURL struct {
				URL string `json:"url"`
			} `json:"image_url"`
		}
		if json.Unmarshal(m.Content, &parts) != nil {
			continue // a string content
		}
		for _, p := range parts {
			u := p.ImageURL.URL
			if p.Type != "image_url" || !(strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")) {
				continue
			}
			if bad := s.fetchImage(ctx, u); bad != nil {
				return bad
			}
		}
	}
	return nil
}

func (s *Server) fetchImage(ctx context.Context, u string) *invalidRequest {
	ctx, cancel := context.WithTimeout(ctx, s.fileTimeout)
	defer cancel()
	failed := &invalidRequest{message: fmt.Sprintf(msgImageDownload, u), code: codeImageURL}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return failed
	}
	res, err := s.fileClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
			return &invalidRequest{message: fmt.Sprintf(msgImageTimeout, u), code: codeImageURL}
		}
		return failed
	}
	defer res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return failed
	}
	head, err := io.ReadAll(io.LimitReader(res.Body, 512))
	if err != nil {
		return failed
	}
	if !slices.Contains(imageTypes, http.DetectContentType(head)) {
		return &invalidRequest{message: msgImageFormat, code: codeImageFormat}
	}
	return nil
}
