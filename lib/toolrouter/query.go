package toolrouter

import (
	"strings"
	"unicode"
)

// queryWords returns the content words of a user's text, and apart the words a negation applies to, which the
// query leaves out (the package doc states the rule; TestNegationScope holds its cases).
//
// A negator opens a scope whose first content word is negated. The scope then holds a coordinated list: a word
// right after "or", "and" or "nor" is negated too, and so is a word after a comma when the word is itself
// followed by a comma or a conjunction ("erase, remove or drop": a comma list is closed by a conjunction). The
// list ends at the first word that is not joined to it (the verb's object: "the files", "it"), at a comma that
// does not continue it ("don't delete it, just archive it"), at a clause break (. ; : ! ? "but", "instead",
// "then"), and a new negator opens a new scope.
func queryWords(text string) (query, negated []string) {
	const (
		free   = iota // outside a negation
		expect        // after a negator: the next content word is negated
		listed        // after a negated word: a conjunction or a list comma continues the list
		joined        // after a conjunction of the list: the next content word is negated
	)
	state := free
	toks := tokens(text)
	for i, tok := range toks {
		switch {
		case isNegator(tok):
			state = expect
		case isBreak(tok):
			state = free
		case tok == ",":
			if state == listed && listItemFollows(toks[i+1:]) {
				state = joined
			} else if state != free {
				state = free
			}
		case tok == "or" || tok == "and":
			if state == listed {
				state = joined
			}
		default:
			w, ok := normalize(tok)
			switch {
			case !ok: // a common word: an object pronoun ("it", "them") ends a list, others are skipped
				if state == listed {
					state = free
				}
			case state == expect || state == joined:
				negated = append(negated, w)
				state = listed
			default:
				query = append(query, w)
				state = free
			}
		}
	}
	return query, negated
}

// listItemFollows reports whether the tokens after a comma continue a negated list: they start with a
// conjunction, or their next content word (common words before it skipped) is followed at once by a comma or a
// conjunction.
func listItemFollows(rest []string) bool {
	for i, tok := range rest {
		if i == 0 && (tok == "or" || tok == "and") { // the serial comma: "erase, remove, or drop"
			return true
		}
		if tok == "," || tok == "or" || tok == "and" || isNegator(tok) || isBreak(tok) {
			return false
		}
		if _, ok := normalize(tok); !ok {
			continue
		}
		if i+1 == len(rest) {
			return false
		}
		next := rest[i+1]
		return next == "," || next == "or" || next == "and" || next == "nor"
	}
	return false
}

// isNegator reports the words that open a negation (any word ending in n't is one: "don't", "won't").
func isNegator(tok string) bool {
	switch tok {
	case "not", "no", "never", "without", "avoid", "dont", "cannot", "nor", "neither":
		return true
	}
	return strings.HasSuffix(tok, "n't")
}

// isBreak reports the tokens that end a clause, and so a negation's scope: the sentence marks (tokens gives
// them as ".") and "but", "instead", "then".
func isBreak(tok string) bool {
	switch tok {
	case ".", "but", "instead", "then":
		return true
	}
	return false
}

// rawWords cuts s into lowered words at word boundaries: runs of letters and digits, with an apostrophe inside
// a word kept ("don't"; a typographic one is read as ').
func rawWords(s string) []string { return scan(s, false) }

// tokens is rawWords with the punctuation a negation's scope reads: "," and, for . ; : ! ?, ".". A mark
// between two letters or digits is part of a word's spelling ("1,000", "notes.txt", "a:b"), not punctuation.
func tokens(s string) []string { return scan(s, true) }

func scan(s string, punct bool) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	rs := []rune(s)
	for i, r := range rs {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			cur.WriteRune(unicode.ToLower(r))
			continue
		case (r == '\'' || r == '’') && cur.Len() > 0 && i+1 < len(rs) && unicode.IsLetter(rs[i+1]):
			cur.WriteRune('\'')
			continue
		}
		flush()
		if !punct || !strings.ContainsRune(",.;:!?", r) {
			continue
		}
		if i > 0 && i+1 < len(rs) && isWordRune(rs[i-1]) && isWordRune(rs[i+1]) {
			continue
		}
		if r == ',' {
			out = append(out, ",")
		} else {
			out = append(out, ".")
		}
	}
	flush()
	return out
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }
